"""BERT masking and the collator that pads and masks each batch.

In:  padded token ids, which tokens may be masked (not special, not padding), optionally word numbers
     for whole-word masking, the masking options and a generator.
Out: (corrupted input ids, labels with -100 outside the targets): ``mlm_probability`` of the tokens are
     targets, of which ``mask_replace_prob`` become the mask token, ``random_replace_prob`` a random
     token, the rest stay; special tokens never. :class:`MaskingCollator` draws the masks of every
     training batch from ``(seed, the batch's token ids)``, so every epoch sees new masks and a resumed run
     the same ones; evaluation masks are drawn once per example from
     :func:`eval_masking_rng` ``(seed, example index)``, so two evaluations of a model agree.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from tasks.mlm.examples import NO_WORD
from tasks.mlm.options import MlmOptions

IGNORE_INDEX = -100


def choose_mask_targets(
    maskable: np.ndarray, word_ids: np.ndarray | None, probability: float, rng: np.random.Generator
) -> np.ndarray:
    """Boolean (batch, length) of prediction targets: tokens, or whole words, each chosen with ``probability``.

    ``maskable`` is False on special and padding tokens; ``word_ids`` (same shape, -1 outside words)
    groups the tokens of one word, which are then chosen together.
    """
    if word_ids is None:
        return (rng.random(maskable.shape) < probability) & maskable
    rows = np.broadcast_to(np.arange(maskable.shape[0])[:, None], maskable.shape)
    keys = np.where(maskable & (word_ids >= 0), rows * (int(word_ids.max()) + 2) + word_ids, -1)
    unique, inverse = np.unique(keys, return_inverse=True)
    chosen_words = rng.random(len(unique)) < probability
    chosen_words[unique < 0] = False
    return chosen_words[inverse.reshape(keys.shape)] & maskable


def mask_tokens(
    input_ids: np.ndarray,
    maskable: np.ndarray,
    word_ids: np.ndarray | None,
    *,
    rng: np.random.Generator,
    mlm_probability: float,
    mask_replace_prob: float,
    random_replace_prob: float,
    mask_token_id: int,
    random_token_ids: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT masking: (corrupted input ids, labels with -100 outside the targets).

    Of the targets, ``mask_replace_prob`` become ``mask_token_id``, ``random_replace_prob`` a token
    drawn from ``random_token_ids``, the rest keep their id. If no token of the whole batch was
    chosen, one maskable token is, so the loss is never an average over nothing.
    """
    targets = choose_mask_targets(maskable, word_ids, mlm_probability, rng)
    if not targets.any() and maskable.any():
        candidates = np.argwhere(maskable)
        row, position = candidates[rng.integers(len(candidates))]
        targets[row, position] = True
        if word_ids is not None and word_ids[row, position] >= 0:
            # Whole-word masking: all of that word, never one piece of it.
            targets[row] |= maskable[row] & (word_ids[row] == word_ids[row, position])
    labels = np.where(targets, input_ids, IGNORE_INDEX)
    draw = rng.random(input_ids.shape)
    replaced = targets & (draw < mask_replace_prob)
    randomised = targets & (draw >= mask_replace_prob) & (draw < mask_replace_prob + random_replace_prob)
    corrupted = input_ids.copy()
    corrupted[replaced] = mask_token_id
    corrupted[randomised] = random_token_ids[rng.integers(0, len(random_token_ids), size=int(randomised.sum()))]
    return corrupted, labels


def eval_masking_rng(seed: int, index: int) -> np.random.Generator:
    """The generator for example ``index`` of an evaluation split: masks depend on nothing else."""
    return np.random.default_rng([seed, 0x6D6C6D, index])


_PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "special_tokens_mask": 1, "word_ids": NO_WORD, "labels": IGNORE_INDEX}


def pad_batch(features: list[dict[str, Any]], pad_token_id: int) -> dict[str, np.ndarray]:
    """Right-pad every per-token column to the batch's longest row; scalars are stacked."""
    batch = {}
    for key in features[0]:
        values = [feature[key] for feature in features]
        if isinstance(values[0], (list, tuple, np.ndarray)):
            width = max(len(v) for v in values)
            pad = pad_token_id if key == "input_ids" else _PAD_VALUES.get(key, 0)
            array = np.full((len(values), width), pad, dtype=np.int64)
            for row, value in enumerate(values):
                array[row, : len(value)] = value
            batch[key] = array
        else:
            batch[key] = np.asarray(values, dtype=np.int64)
    return batch


class MaskingCollator:
    """Pads features and, for training, draws fresh BERT masks for every batch.

    Without ``masking`` (evaluation, prediction) it only pads: evaluation features already carry
    their fixed masks and labels. Helper columns (``word_ids``, ``special_tokens_mask``) are used
    here and dropped, so the batch holds exactly the model's forward arguments.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, options: MlmOptions | None, seed: int) -> None:
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.options = options
        self.seed = seed
        self.mask_token_id = tokenizer.mask_token_id
        self.random_token_ids = random_token_ids(tokenizer)

    def _generator(self, input_ids: np.ndarray) -> np.random.Generator:
        # The masks are a function of the run's seed and of the batch itself, not of how many batches
        # this collator drew before: a resumed run (whose skipped batches are never collated), a
        # DataLoader worker (a copy of this collator, in a process of its own) and an uninterrupted run
        # all mask the same batch alike. Shuffling gives an example other batch-mates every epoch, so it
        # still gets fresh masks each epoch.
        digest = hashlib.blake2b(np.ascontiguousarray(input_ids).tobytes(), digest_size=8).digest()
        return np.random.default_rng([self.seed, 0x62617463, int.from_bytes(digest, "little")])

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad_batch(features, self.pad_token_id)
        word_ids = batch.pop("word_ids", None)
        special = batch.pop("special_tokens_mask", None)
        if self.options is not None:
            maskable = (batch["attention_mask"] == 1) & (special == 0)
            batch["input_ids"], batch["labels"] = mask_tokens(
                batch["input_ids"], maskable, word_ids if self.options.whole_word_mask else None, rng=self._generator(batch["input_ids"]),
                mlm_probability=self.options.mlm_probability, mask_replace_prob=self.options.mask_replace_prob,
                random_replace_prob=self.options.random_replace_prob, mask_token_id=self.mask_token_id,
                random_token_ids=self.random_token_ids,
            )
        return {key: torch.from_numpy(value) for key, value in batch.items()}


def random_token_ids(tokenizer: PreTrainedTokenizerBase) -> np.ndarray:
    special = set(tokenizer.all_special_ids)
    return np.array([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)

"""Batch samplers and dataloaders: padding per batch, never to the model maximum.

In:  tokenised features (a ``datasets.Dataset`` with ``input_ids``), a collator, a batch size.
Out: DataLoaders whose batch order is a pure function of (seed, epoch), so a resumed run sees the
     same batches as an uninterrupted one without touching the global RNG.

Training batches optionally group examples of similar length (``group_by_length``): the epoch's
random permutation is cut into mega-batches of ``batch_size * mega_batch_factor`` examples, each
sorted by length and cut into batches, and then the order of *all* batches is shuffled. Padding
drops sharply while every batch is still a random draw from a random stretch of the data.
Evaluation batches are sorted by length; :attr:`SortedBatchSampler.order` lets the caller put
predictions back into dataset order. A model whose outputs change with padding is evaluated one example
per batch (:func:`exact_eval_batch_size`).
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, Sampler

from pipelines.config import TRAINER_LENGTH_GROUP_BATCHES

logger = logging.getLogger(__name__)


def feature_lengths(features: Dataset, column: str = "input_ids") -> np.ndarray:
    return np.fromiter((len(ids) for ids in features[column]), dtype=np.int64, count=len(features))


class ShuffledBatchSampler(Sampler[list[int]]):
    """Random batches for training, optionally grouped by length; call :meth:`set_epoch` each epoch."""

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        seed: int,
        group_by_length: bool,
        mega_batch_factor: int = TRAINER_LENGTH_GROUP_BATCHES,
    ) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.drop_last = False
        self.seed = seed
        self.group_by_length = group_by_length
        self.mega_batch_factor = mega_batch_factor
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def batches(self) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths))
        if not self.group_by_length:
            return [order[i : i + self.batch_size].tolist() for i in range(0, len(order), self.batch_size)]
        mega = self.batch_size * self.mega_batch_factor
        batches = []
        for start in range(0, len(order), mega):
            chunk = order[start : start + mega]
            # Stable sort keeps the random order among equal lengths.
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
            batches.extend(chunk[i : i + self.batch_size].tolist() for i in range(0, len(chunk), self.batch_size))
        # Only the last batch may be short; keep it last so every process sees full batches first.
        full = [b for b in batches if len(b) == self.batch_size]
        short = [b for b in batches if len(b) < self.batch_size]
        full = [full[i] for i in rng.permutation(len(full))]
        return full + short

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())


class SortedBatchSampler(Sampler[list[int]]):
    """Deterministic batches of similar length for evaluation (longest first)."""

    def __init__(self, lengths: Sequence[int], batch_size: int) -> None:
        lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.drop_last = False
        self.order = np.argsort(-lengths, kind="stable")
        self._batches = [self.order[i : i + batch_size].tolist() for i in range(0, len(self.order), batch_size)]

    def __len__(self) -> int:
        return len(self._batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches)


def loader_options(num_workers: int) -> dict:
    """DataLoader settings that only pay off in some places.

    Pinned memory speeds up host-to-GPU copies and is a wasted extra copy when the model is on the
    CPU. Workers, when there are any, live across epochs instead of being started again for each
    one; the default stays 0 because features are tokenised ahead of time and padding a batch is
    cheap (~2 ms for 32 SST-2 sentences, against ~0.5 s for a MiniLM training step on 2 CPU cores),
    so a worker would only compete with the intra-op threads for the same cores.
    """
    return {"num_workers": num_workers, "pin_memory": torch.cuda.is_available(), "persistent_workers": num_workers > 0}


def train_dataloader(
    features: Dataset, collator: Callable, batch_size: int, *, seed: int, group_by_length: bool,
    length_group_batches: int = TRAINER_LENGTH_GROUP_BATCHES, num_workers: int = 0,
) -> tuple[DataLoader, ShuffledBatchSampler]:
    sampler = ShuffledBatchSampler(
        feature_lengths(features), batch_size, seed=seed, group_by_length=group_by_length,
        mega_batch_factor=length_group_batches,
    )
    loader = DataLoader(
        features, batch_sampler=sampler, collate_fn=collator, **loader_options(num_workers),
        # Its own generator keeps worker seeding off the global RNG that dropout draws from.
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, sampler


def eval_dataloader(features: Dataset, collator: Callable, batch_size: int, *, num_workers: int = 0) -> tuple[DataLoader, SortedBatchSampler]:
    sampler = SortedBatchSampler(feature_lengths(features), batch_size)
    loader = DataLoader(
        features, batch_sampler=sampler, collate_fn=collator, **loader_options(num_workers),
        generator=torch.Generator().manual_seed(0),
    )
    return loader, sampler


# Larger than fp32 round-off between batch shapes (~1e-6 on BERT logits), far below what a model that mixes
# padding into its outputs shows (Funnel's pooling: ~0.5 on a 2-layer model).
PADDING_TOLERANCE = 1e-4


def padding_change(predict_step: Callable, model: torch.nn.Module, collator: Callable, features: Dataset, *, probes: int = 4) -> float:
    """The largest change in ``predict_step``'s outputs for a few features of different lengths when each is
    predicted beside the others (padded to the longest) rather than alone; 0.0 with fewer than two lengths.

    Most encoders mask padding out exactly. A model that does not (Funnel pools neighbouring positions,
    FNet mixes every position by Fourier transform, remote code may do anything) gives an example other
    outputs in an eval batch than alone, as ``pipeline()`` runs it, so its metrics and ``predict`` depend on
    which examples share a batch. Runs in eval mode without gradients, on the model's device.
    """
    lengths = feature_lengths(features)
    by_length = {int(length): index for index, length in enumerate(lengths)}
    if len(by_length) < 2:
        return 0.0
    chosen = [by_length[length] for length in sorted(by_length)]
    # The shortest and longest, and lengths between: the shortest gets the most padding.
    picked = sorted({chosen[round(i * (len(chosen) - 1) / (probes - 1))] for i in range(probes)})
    rows = [features[index] for index in picked]
    device = next(model.parameters(), torch.empty(0)).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            def outputs(batch_rows):
                batch = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in collator(batch_rows).items()}
                return {key: value.float().cpu() for key, value in predict_step(model, batch).items()}

            together = outputs(rows)
            change = 0.0
            for position, row in enumerate(rows):
                for key, alone in outputs([row]).items():
                    beside = together[key][position][tuple(slice(0, size) for size in alone.shape[1:])]
                    if beside.shape != alone.shape[1:]:  # e.g. a generation that went on longer alone
                        return float("inf")
                    change = max(change, (alone[0] - beside).abs().max().item())
    finally:
        model.train(was_training)
    return change


def exact_eval_batch_size(predict_step: Callable, model: torch.nn.Module, collator: Callable, features: Dataset, batch_size: int,
                          *, where: str, accelerator=None) -> int:
    """``batch_size``, or 1 (with a warning naming ``where``) when padding changes the model's outputs
    (:func:`padding_change`): each example is then evaluated and predicted as it is alone, as ``pipeline()``
    runs it, whatever shares its batch. With an ``accelerator`` of several processes, every process gets the
    same answer: the largest change any of them measured."""
    # An ONNX export is not checked here: int8 scales follow each batch's values, and `bertpipe export`
    # measures its own error across batchings.
    if batch_size == 1 or not isinstance(model, torch.nn.Module):
        return batch_size
    change = padding_change(predict_step, model, collator, features)
    if accelerator is not None and accelerator.num_processes > 1:
        # Each process probes alike, but a change near the tolerance can round to either side of it; processes
        # that chose different eval batch sizes would wait for each other's collectives forever.
        change = accelerator.gather(torch.tensor([change], device=accelerator.device)).max().item()
    if change <= PADDING_TOLERANCE:
        return batch_size
    logger.warning(
        "%s: this %s model's outputs change by up to %.3g when an example is padded beside longer ones (its padding is "
        "not masked out exactly); evaluating and predicting one example per batch instead of %d, so that every "
        "example gets the outputs it has alone, as pipeline() gives them",
        where, getattr(getattr(model, "config", None), "model_type", type(model).__name__), change, batch_size,
    )
    return 1

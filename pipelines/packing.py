"""Sequence packing for token-level tasks: a random batch's examples share rows instead of padding.

In:  a batch of tokenised features (the task's own collator pads each one alone) and the model.
Out: one batch with several examples per row, each attending only to itself
     (``attention_mask`` of shape ``(rows, 1, L, L)``, block-diagonal), positions restarting at
     every example, per-token labels where they were, padding only at the ends of rows.

Why: length-grouped batches remove padding but make each batch a set of similar sentences; on
CoNLL-2003 that costs about a point of F1 in a one-epoch run (``docs/benchmark.md``). Packing keeps
random batch composition (the same examples per update as ``group_by_length=false``) at about the
padding of length grouping. Every example's forward is the one it gets alone, up to float summation
order: attention never crosses examples, absolute positions restart, relative positions (DeBERTa)
are translation-invariant. :func:`check_packing_is_exact` proves that for the model at hand before
training, since families place positions differently (RoBERTa counts from ``padding_idx + 1``).

Mask convention (so that samples and tokens stay countable from the batch alone): a real token
attends to the tokens of its own example, itself included; a padding token attends only to the
first token of its row (never to itself, and never a fully masked row, which would give NaN).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from pipelines.config import ConfigError

PackedBatch = dict[str, torch.Tensor]


def position_offset(model: torch.nn.Module) -> int:
    """Where the model's absolute positions start: ``padding_idx + 1`` for RoBERTa-style embeddings, else 0."""
    # Searched, not reached by attribute path: peft and distillation wrappers nest the embeddings deeper.
    for module in model.modules():
        padding_idx = getattr(module, "padding_idx", None)
        if hasattr(module, "position_embeddings") and isinstance(padding_idx, int):
            return padding_idx + 1
    return 0


# How much longer than the batch's longest example a row may be. Rows a quarter longer pack away most of the
# padding first fit leaves at the longest example's width (CoNLL-2003: rows 90.6% -> 96.7% real tokens for 4%
# more attention work; a MiniLM step 0.97x, docs/benchmark.md); longer still, attention grows faster.
ROW_SLACK = 1.25


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices grouped into rows of total length <= capacity (longest first, each into the first row with room)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for row, free in enumerate(room):
            if lengths[index] <= free:
                rows[row].append(index)
                room[row] -= lengths[index]
                break
        else:
            rows.append([index])
            room.append(capacity - lengths[index])
    return rows


def fewest_positions_layout(lengths: list[int], slack: float = ROW_SLACK) -> list[list[int]]:
    """The :func:`first_fit_decreasing` rows that compute the fewest positions (rows × the fullest row's
    length) over capacities from the longest example to ``slack`` times it; among equals, the shortest rows."""
    longest = max(lengths)
    best, fewest = None, None
    for capacity in range(longest, max(longest, int(longest * slack)) + 1):  # shortest first: it wins ties
        rows = first_fit_decreasing(lengths, capacity)
        positions = len(rows) * max(sum(lengths[i] for i in row) for row in rows)
        if fewest is None or positions < fewest:
            best, fewest = rows, positions
    return best


def packing_probe(lengths: Sequence[int], size: int = 8) -> list[int] | None:
    """Indices of ``size`` training features (the longest, then the shortest) whose packed rows hold several examples,
    for :func:`check_packing_is_exact`; None when no two features can ever share a row (a batch's rows hold at most
    :data:`ROW_SLACK` times its longest example), so that packing lays each example in a row of its own.

    The first 8 features were the probe: 8 sentences of similar length each got a row of their own, so nothing of a
    row's neighbours reached the comparison, and MobileBERT, MPNet and BigBird, whose packed forwards differ, trained
    packed without a word.
    """
    order = sorted(range(len(lengths)), key=lambda index: (lengths[index], index))
    if len(order) < 2 or lengths[order[0]] + lengths[order[1]] > ROW_SLACK * lengths[order[-1]]:
        return None
    probe = [order[-1], *order[: size - 1]]
    if not any(len(row) > 1 for row in fewest_positions_layout([lengths[index] for index in probe])):
        raise ConfigError("train.pack_sequences: no probe of the training examples packs two into one row, so packing cannot "
                          "be shown exact for this model; set train.pack_sequences=false")
    return probe


class PackingCollator:
    """Wraps a task's collator: each feature is collated alone (no padding), then rows are packed.

    Rows hold at most :data:`ROW_SLACK` times the batch's longest example (:func:`fewest_positions_layout`):
    longer rows would leave less padding still, but a row's attention and its dropout cost grow with its
    length squared. Keys the task's collator returns per token (shape ``(1, length)``) are joined; any
    other key means the task's batches cannot be packed.
    """

    def __init__(self, collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]], *, pad_token_id: int,
                 position_offset: int, label_pad: int = -100) -> None:
        self.collate = collate
        self.pad_token_id = pad_token_id
        self.position_offset = position_offset
        self.label_pad = label_pad

    @staticmethod
    def layout(lengths: list[int]) -> list[list[int]]:
        """Which examples share each row, in row order: what :func:`check_packing_is_exact` reads back."""
        return fewest_positions_layout(lengths)

    def __call__(self, features: list[dict[str, Any]]) -> PackedBatch:
        singles = [self.collate([feature]) for feature in features]
        lengths = [int(single["input_ids"].shape[1]) for single in singles]
        rows = self.layout(lengths)
        width = max(sum(lengths[i] for i in row) for row in rows)
        keys = [key for key in singles[0] if key != "attention_mask"]
        for key in keys:
            if singles[0][key].shape != singles[0]["input_ids"].shape:
                raise ValueError(f"cannot pack batches with the per-example key {key!r} (shape {tuple(singles[0][key].shape)})")
        pad_values = {"input_ids": self.pad_token_id, "labels": self.label_pad}
        batch = {key: torch.full((len(rows), width), pad_values.get(key, 0), dtype=singles[0][key].dtype) for key in keys}
        position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), 1, width, width), dtype=torch.bool)
        for row_index, row in enumerate(rows):
            start = 0
            for index in row:
                end = start + lengths[index]
                for key in keys:
                    batch[key][row_index, start:end] = singles[index][key][0]
                position_ids[row_index, start:end] = torch.arange(self.position_offset, self.position_offset + lengths[index])
                mask[row_index, 0, start:end, start:end] = True
                start = end
            mask[row_index, 0, start:, 0] = True
        batch["position_ids"] = position_ids
        batch["attention_mask"] = mask
        return batch


def count_samples_and_tokens(batch: dict[str, torch.Tensor]) -> tuple[int | torch.Tensor, int | torch.Tensor]:
    """(examples, non-padding tokens) in a batch, packed or padded. Counts read from tensors stay tensors:
    an ``int()`` per step would wait for the device on accelerators."""
    mask = batch.get("attention_mask")
    if mask is None:
        return batch["input_ids"].shape[0], batch["input_ids"].numel()
    if mask.dim() == 2:
        return batch["input_ids"].shape[0], mask.sum()
    pairs = mask[:, 0]
    real = pairs.diagonal(dim1=-2, dim2=-1)
    # An example starts at a real token that cannot see the token before it.
    continues = torch.zeros_like(real)
    continues[:, 1:] = pairs.diagonal(offset=-1, dim1=-2, dim2=-1)
    return (real & ~continues).sum(), real.sum()


def check_packing_is_exact(model: torch.nn.Module, collate: Callable, packing: PackingCollator, features: list[dict[str, Any]],
                           *, family: str, atol: float = 1e-4) -> None:
    """Refuses ``train.pack_sequences`` for a model whose packed forward differs from the unpacked one.

    Runs ``features`` alone and packed (eval mode, fp32, no grad) and compares each example's
    per-token logits; a family that places positions in a way :func:`position_offset` does not
    know, or ignores ``position_ids`` or 4-D masks, fails here instead of training on wrong inputs.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type="cpu", enabled=False):
            device = next(model.parameters()).device
            alone = [model(**{k: v.to(device) for k, v in collate([f]).items() if k != "labels"}).logits[0].float() for f in features]
            batch = packing(features)
            packed_logits = model(**{k: v.to(device) for k, v in batch.items() if k != "labels"}).logits.float()
    except (TypeError, ValueError, RuntimeError) as error:
        raise ConfigError(
            f"train.pack_sequences: the {family} model cannot run packed batches ({error}); set train.pack_sequences=false"
        ) from None
    finally:
        model.train(was_training)
    lengths = [logits.shape[0] for logits in alone]
    rows = packing.layout(lengths)
    worst = 0.0
    for row_index, row in enumerate(rows):
        start = 0
        for index in row:
            worst = max(worst, float((packed_logits[row_index, start : start + lengths[index]] - alone[index]).abs().max()))
            start += lengths[index]
    if worst > atol:
        raise ConfigError(
            f"train.pack_sequences: packed and unpacked {family} forwards differ by up to {worst:.2e} "
            f"(tolerance {atol:g}): this model family places positions or masks in a way packing does not reproduce; "
            "set train.pack_sequences=false"
        )

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
per batch (:func:`exact_eval_batch_size`); one that rewrites itself in a forward pass (BigBird) is put back
after every call (:func:`undo_rewrites_after_each_call`).
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, Sampler

from pipelines.config import TRAINER_LENGTH_GROUP_BATCHES
from pipelines.errors import ModelError, failures_named

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


def _module_state(model: torch.nn.Module) -> list[tuple[torch.nn.Module, dict, dict]]:
    """Each module's children and text settings: what a model that rewrites itself in its forward pass changes."""
    return [(module, dict(module._modules), {key: value for key, value in vars(module).items() if isinstance(value, str)})
            for module in model.modules()]


def _restore_module_state(state: list[tuple[torch.nn.Module, dict, dict]]) -> bool:
    """Put back what :func:`_module_state` recorded; whether anything had changed."""
    changed = False
    for module, children, settings in state:
        if module._modules.keys() != children.keys() or any(module._modules[key] is not child for key, child in children.items()):
            module._modules.clear()
            module._modules.update(children)
            changed = True
        if any(getattr(module, key, None) != value for key, value in settings.items()):
            module.__dict__.update(settings)
            changed = True
    return changed


class _EachWarningOnce(logging.Filter):
    """Lets the first of each warning through, and no repeat of it with other numbers in it (lengths, sizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = re.sub(r"\d+", "#", record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def undo_rewrites_after_each_call(model: torch.nn.Module) -> None:
    """Make every forward pass of ``model`` start from the model as it was before the first one.

    transformers' BigBird, given an input too short for its blocks, swaps its block-sparse attention for full
    attention *for good* (``set_attention_type``, not in its config): from then on, long inputs that a freshly
    loaded model, such as ``pipeline()``'s, runs block-sparse were run with full attention, and the outputs of
    an example depended on which examples the model had seen before. With forward hooks that put each module's
    children and text settings back after every call, each call runs as on the model as loaded. Idempotent.
    """
    if getattr(model, "_bertpipe_undoes_rewrites", False):
        return
    # Put back after each call, a model that announces its rewrite in its log (BigBird: "Changing attention type
    # to 'original_full'") announced it again on every short input: a warning per batch instead of one.
    for name in {type(module).__module__ for module in model.modules()} - {None}:
        if not name.startswith("torch.") and not any(isinstance(known, _EachWarningOnce) for known in logging.getLogger(name).filters):
            logging.getLogger(name).addFilter(_EachWarningOnce())
    saved: list = []

    def before(module, args):
        saved.append(_module_state(module))

    def after(module, args, output):
        _restore_module_state(saved.pop())

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after, always_call=True)
    model._bertpipe_undoes_rewrites = True


def padding_change(predict_step: Callable, model: torch.nn.Module, collator: Callable, features: Dataset, *, probes: int = 4) -> float:
    """The largest change in ``predict_step``'s outputs for a few features of different lengths when each is
    predicted beside the others (padded to the longest) rather than alone; 0.0 with fewer than two lengths.

    Most encoders mask padding out exactly. A model that does not (Funnel pools neighbouring positions,
    FNet mixes every position by Fourier transform, BigBird's block-sparse attention lays its blocks out over
    the padded length, remote code may do anything) gives an example other outputs in an eval batch than
    alone, as ``pipeline()`` runs it, so its metrics and ``predict`` depend on which examples share a batch.
    The longest feature is always probed, so the padded batch is the model's longest input of the split (a model
    that changes its computation with the input length, as BigBird does above its block threshold, shows it).
    Runs in eval mode without gradients, on the model's device. A model that rewrites itself in a forward pass
    (BigBird, on an input too short for blocks) is put back after each probe and from then on after every call
    (:func:`undo_rewrites_after_each_call`): otherwise the first short probe decided how every later input ran.
    The shortest feature is also run cut to three pieces, so that a split of only long inputs finds it too
    (else a run's short training batches switched the model before its final evaluation).
    """
    lengths = feature_lengths(features)
    by_length = {int(length): index for index, length in enumerate(lengths)}
    if not by_length:
        return 0.0
    chosen = [by_length[length] for length in sorted(by_length)]
    # The shortest and longest, and lengths between: the shortest gets the most padding.
    picked = sorted({chosen[round(i * (len(chosen) - 1) / (probes - 1))] for i in range(probes)}) if len(chosen) > 1 else []
    rows = [features[index] for index in picked]
    device = next(model.parameters(), torch.empty(0)).device
    was_training = model.training
    model.eval()
    rewrites = False
    try:
        with torch.no_grad():
            def outputs(batch_rows):
                nonlocal rewrites
                batch = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in collator(batch_rows).items()}
                state = _module_state(model)
                try:
                    return {key: value.float().cpu() for key, value in predict_step(model, batch).items()}
                finally:
                    rewrites = _restore_module_state(state) or rewrites

            # A model that rewrites itself on short inputs (BigBird below its block threshold) shows it only on
            # one: whatever the split's lengths, its shortest feature is also run cut to three pieces. A model may
            # refuse the cut input (Longformer's QA head counts the separators around the question); it then
            # tells nothing, and its state is put back all the same.
            try:
                outputs([_three_pieces(features[chosen[0]])])
            except Exception:  # noqa: BLE001 - only a probe for rewrites; the real inputs follow
                pass
            if not rows:
                return 0.0
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
        if rewrites:
            undo_rewrites_after_each_call(model)
    return change


def _three_pieces(feature: dict) -> dict:
    """``feature`` with every per-piece column (the input ids, their mask, per-piece labels or offsets) cut to
    its first, middle and last piece: the special tokens that frame it and one between. Three, not two:
    transformers' Funnel fails on inputs of one or two pieces."""
    length = len(feature["input_ids"])
    if length <= 3:
        return feature
    return {key: [value[0], value[length // 2], value[-1]] if isinstance(value, list) and len(value) == length else value
            for key, value in feature.items()}


def exact_eval_batch_size(predict_step: Callable, model: torch.nn.Module, collator: Callable, features: Dataset, batch_size: int,
                          *, where: str, accelerator=None) -> int:
    """``batch_size``, or 1 (with a warning naming ``where``) when padding changes the model's outputs
    (:func:`padding_change`): each example is then evaluated and predicted as it is alone, as ``pipeline()``
    runs it, whatever shares its batch. With an ``accelerator`` of several processes, every process gets the
    same answer: the largest change any of them measured."""
    # An ONNX export is not checked here: int8 scales follow each batch's values, and `bertpipe export`
    # measures its own error across batchings.
    if not isinstance(model, torch.nn.Module):
        return batch_size
    # Probed with a batch size of 1 too: the probe is also what finds a model that rewrites itself in a
    # forward pass (and makes it run as loaded from then on), which one example per batch does not prevent.
    family = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    # The first forward passes of a run: a family that cannot run these inputs at all (Nystromformer runs inputs of
    # exactly segment_means_seq_len pieces) ended here in a traceback.
    with failures_named(ModelError, f"{where}: the {family} model cannot run these inputs"):
        change = padding_change(predict_step, model, collator, features)
    if accelerator is not None and accelerator.num_processes > 1:
        # Each process probes alike, but a change near the tolerance can round to either side of it; processes
        # that chose different eval batch sizes would wait for each other's collectives forever.
        change = accelerator.gather(torch.tensor([change], device=accelerator.device)).max().item()
    if change <= PADDING_TOLERANCE or batch_size == 1:
        return batch_size
    logger.warning(
        "%s: this %s model's outputs change by up to %.3g when an example is padded beside longer ones (its padding is "
        "not masked out exactly); evaluating and predicting one example per batch instead of %d, so that every "
        "example gets the outputs it has alone, as pipeline() gives them",
        where, getattr(getattr(model, "config", None), "model_type", type(model).__name__), change, batch_size,
    )
    return 1

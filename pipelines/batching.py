"""Batch samplers and dataloaders: padding per batch, never to the model maximum.

In:  tokenised features (a ``datasets.Dataset`` with ``input_ids``), a collator, a batch size.
Out: DataLoaders whose batch order is a pure function of (seed, epoch), so a resumed run sees the
     same batches as an uninterrupted one without touching the global RNG.

Training batches optionally group examples of similar length (``group_by_length``): the epoch's
random permutation is cut into mega-batches of ``batch_size * mega_batch_factor`` examples, each
sorted by length and cut into batches, and then the order of *all* batches is shuffled. Padding
drops sharply while every batch is still a random draw from a random stretch of the data.
Evaluation batches are sorted by length; :attr:`SortedBatchSampler.order` lets the caller put
predictions back into dataset order.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from datasets import Dataset
from torch.utils.data import DataLoader, Sampler

from pipelines.config import TRAINER_LENGTH_GROUP_BATCHES


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

from __future__ import annotations

import numpy as np

from pipelines.batching import ShuffledBatchSampler, SortedBatchSampler


def lengths(count=1000, seed=0):
    return np.random.default_rng(seed).integers(3, 120, size=count)


def test_batching_group_by_length_keeps_every_example_once_per_epoch():
    sampler = ShuffledBatchSampler(lengths(), 32, seed=1, group_by_length=True)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = [index for batch in sampler for index in batch]
        assert sorted(seen) == list(range(1000))
        assert len(list(sampler)) == len(sampler) == 32


def test_batching_order_is_a_function_of_seed_and_epoch():
    first = ShuffledBatchSampler(lengths(), 32, seed=1, group_by_length=True)
    second = ShuffledBatchSampler(lengths(), 32, seed=1, group_by_length=True)
    first.set_epoch(2), second.set_epoch(2)
    assert list(first) == list(second)
    second.set_epoch(3)
    assert list(first) != list(second)


def test_batching_grouping_cuts_padding_but_batches_stay_random():
    data = lengths()
    grouped = ShuffledBatchSampler(data, 32, seed=1, group_by_length=True)
    plain = ShuffledBatchSampler(data, 32, seed=1, group_by_length=False)

    def padding(sampler):
        return sum(int(data[b].max()) * len(b) - int(data[b].sum()) for b in sampler)

    assert padding(grouped) < 0.3 * padding(plain)
    # Batch order is shuffled: the longest batch is not always first, and lengths are not monotone.
    maxima = [int(data[b].max()) for b in grouped]
    assert maxima != sorted(maxima, reverse=True) and maxima != sorted(maxima)


def test_batching_only_the_last_batch_is_short():
    sampler = ShuffledBatchSampler(lengths(70), 32, seed=0, group_by_length=True)
    assert [len(b) for b in sampler] == [32, 32, 6]


def test_batching_sorted_eval_batches_cover_all_and_expose_order():
    data = lengths(101)
    sampler = SortedBatchSampler(data, 16)
    flattened = [index for batch in sampler for index in batch]
    assert flattened == sampler.order.tolist()
    assert sorted(flattened) == list(range(101))
    assert list(data[flattened]) == sorted(data, reverse=True)


def test_batching_length_group_window_trades_padding_for_varied_batches():
    data = lengths()

    def padding(sampler):
        return sum(int(data[b].max()) * len(b) - int(data[b].sum()) for b in sampler)

    def grouped(window):
        return ShuffledBatchSampler(data, 32, seed=1, group_by_length=True, mega_batch_factor=window)

    plain = ShuffledBatchSampler(data, 32, seed=1, group_by_length=False)
    assert padding(grouped(50)) < padding(grouped(4)) < padding(grouped(1)) == padding(plain)
    # Each batch is drawn from one window of the epoch's permutation: with a window of 2 batches,
    # every batch's examples sit within 64 consecutive positions of that permutation.
    order = np.random.default_rng([1, 0]).permutation(len(data))
    position = np.empty(len(data), dtype=np.int64)
    position[order] = np.arange(len(data))
    for batch in grouped(2):
        assert len({int(position[i]) // 64 for i in batch}) == 1
        assert sorted(batch) == sorted(set(batch))

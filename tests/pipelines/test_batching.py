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


def _token_classifier_and_features(family, folder):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification

    from tests.families.builders import build_family, family_corpus

    checkpoint = build_family(family, folder)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(checkpoint, num_labels=3)
    texts = [" ".join(line.split()[:words]) for words, line in zip((3, 9, 5, 14, 7), family_corpus(5, seed=2))]
    features = Dataset.from_list([dict(tokenizer(text)) for text in texts])
    return model, DataCollatorForTokenClassification(tokenizer), features


def _logits(model, batch):
    return {"logits": model(**batch).logits}


def test_batching_padding_change_is_round_off_for_a_masking_model_and_large_for_funnel(tmp_path, caplog):
    """Funnel pools neighbouring positions, padding included: an example batched beside longer ones got other
    logits than alone (~0.5 on this 2-layer model), so its metrics and `predict` depended on its batch-mates and
    disagreed with pipeline(), without an error. Such a model is evaluated one example per batch, with a warning."""
    from pipelines.batching import PADDING_TOLERANCE, exact_eval_batch_size, padding_change

    model, collator, features = _token_classifier_and_features("bert", tmp_path / "bert")
    assert model.training is False and padding_change(_logits, model, collator, features) < 1e-5
    model.train()
    assert exact_eval_batch_size(_logits, model, collator, features, 16, where="run") == 16
    assert model.training, "the check leaves the model in the mode it found it in"

    model, collator, features = _token_classifier_and_features("funnel", tmp_path / "funnel")
    assert padding_change(_logits, model, collator, features) > 100 * PADDING_TOLERANCE
    with caplog.at_level("WARNING", logger="pipelines.batching"):
        assert exact_eval_batch_size(_logits, model, collator, features, 16, where="runs/funnel") == 1
    assert "runs/funnel: this funnel model's outputs change" in caplog.text and "one example per batch instead of 16" in caplog.text


def test_batching_a_model_that_rewrites_itself_is_probed_and_run_as_loaded(tmp_path):
    """BigBird runs inputs longer than (5 + 2 * 3) * block_size pieces block-sparse and shorter ones with full attention,
    and the first short input switched the loaded model to full attention for good: the probe's short example left
    it so, and every later long input (predict's, a run's final evaluation's) got other outputs than a freshly loaded
    model, such as pipeline()'s, gives it. The probe still sees the block layout change with padding."""
    import copy
    import logging

    import torch
    from datasets import Dataset
    from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification

    from pipelines.batching import PADDING_TOLERANCE, padding_change
    from tests.families.builders import build_family, family_corpus

    logging.getLogger("transformers.models.big_bird.modeling_big_bird").setLevel(logging.ERROR)  # the switch's warning
    checkpoint = build_family("big_bird", tmp_path / "big_bird")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(checkpoint, num_labels=3, block_size=2).eval()  # threshold 22
    loaded = copy.deepcopy(model)
    words = " ".join(family_corpus(12, seed=2)).split()
    features = Dataset.from_list([dict(tokenizer(" ".join(words[:count]))) for count in (3, 30, 12, 24)])
    assert min(map(len, features["input_ids"])) <= 22 < max(map(len, features["input_ids"]))
    collator = DataCollatorForTokenClassification(tokenizer)

    assert padding_change(_logits, model, collator, features) > PADDING_TOLERANCE
    long, short = collator([features[1]]), collator([features[0]])
    with torch.no_grad():
        expected = copy.deepcopy(loaded)(**long).logits
        model(**short)
        assert torch.allclose(model(**long).logits, expected, atol=1e-6)

    # A run evaluated one example per batch (train.eval_batch_size=1) is probed too: one example per batch
    # does not stop the first short one from switching the model for the long ones after it.
    from pipelines.batching import exact_eval_batch_size

    one_per_batch = copy.deepcopy(loaded)
    assert exact_eval_batch_size(_logits, one_per_batch, collator, features, 1, where="run") == 1
    with torch.no_grad():
        one_per_batch(**short)
        assert torch.allclose(one_per_batch(**long).logits, expected, atol=1e-6)

    # An eval split of only long inputs (none below the threshold, all of one length too) is probed on a short
    # input as well: else a run's short training batches switched the model before its final evaluation.
    only_long = Dataset.from_list([features[1], features[1]])
    assert min(map(len, only_long["input_ids"])) > 22
    probed = copy.deepcopy(loaded)
    padding_change(_logits, probed, collator, only_long)
    with torch.no_grad():
        probed(**short)
        assert torch.allclose(probed(**long).logits, expected, atol=1e-6)


def test_batching_a_rewrite_the_model_announces_is_announced_once_not_on_every_call(tmp_path, monkeypatch):
    """Put back after every call, BigBird announced its switch to full attention ("Changing attention type to
    'original_full'", with the input's length in it) on every short input: a warning per eval batch. Once now."""
    import logging

    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from pipelines.batching import undo_rewrites_after_each_call
    from tests.families.builders import build_family, family_corpus

    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    big_bird_log = logging.getLogger("transformers.models.big_bird.modeling_big_bird")
    monkeypatch.setattr(big_bird_log, "filters", [])  # another test's model may have announced it in this process
    level, records = big_bird_log.level, Records()
    big_bird_log.setLevel(logging.WARNING)  # setLevel, not the attribute: it clears the logger's cached answers
    big_bird_log.addHandler(records)
    try:
        checkpoint = build_family("big_bird", tmp_path / "big_bird")
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        model = AutoModelForTokenClassification.from_pretrained(checkpoint, num_labels=3, block_size=2).eval()  # threshold 22
        undo_rewrites_after_each_call(model)
        words = " ".join(family_corpus(12, seed=2)).split()
        with torch.no_grad():
            for count in (3, 5, 3, 8):  # three lengths, all below the threshold
                model(**tokenizer(" ".join(words[:count]), return_tensors="pt"))
    finally:
        big_bird_log.removeHandler(records)
        big_bird_log.setLevel(level)
    switches = [message for message in records.messages if "Changing attention type" in message]
    assert len(switches) == 1, records.messages

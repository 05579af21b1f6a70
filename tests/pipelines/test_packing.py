"""pipelines.packing: rows hold whole examples, each computed as if alone; counts survive packing."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoTokenizer, BertForTokenClassification, DataCollatorForTokenClassification

from pipelines.config import ConfigError
from pipelines.packing import (
    ROW_SLACK, PackingCollator, check_packing_is_exact, count_samples_and_tokens, first_fit_decreasing,
    fewest_positions_layout, position_offset,
)
from tests.conftest import corpus_sentences


def test_first_fit_decreasing_places_every_example_once_within_capacity():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 20))]
        capacity = max(lengths) + rng.randint(0, 20)
        rows = first_fit_decreasing(lengths, capacity)
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
        # No two rows could be merged: first fit leaves at most one row at most half full.
        assert sum(sum(lengths[i] for i in row) <= capacity / 2 for row in rows) <= 1


def _positions(lengths: list[int], rows: list[list[int]]) -> tuple[int, int]:
    """(positions a packed batch computes, its row width) for a layout."""
    width = max(sum(lengths[i] for i in row) for row in rows)
    return len(rows) * width, width


def test_fewest_positions_layout_never_computes_more_than_first_fit_at_the_longest_width():
    rng = random.Random(3)
    fewer = 0
    for _ in range(300):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 24))]
        rows = fewest_positions_layout(lengths)
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        positions, width = _positions(lengths, rows)
        assert max(lengths) <= width <= max(lengths) * ROW_SLACK
        tight, _ = _positions(lengths, first_fit_decreasing(lengths, max(lengths)))
        assert positions <= tight
        fewer += positions < tight
    assert fewer > 50  # the slack pays in a good share of random batches, not in a corner case


def test_fewest_positions_layout_widens_rows_only_when_that_saves_positions():
    # At width 10: [10] [6 2] [6] [6] = 4 rows x 10 = 40 positions; at 12: [10 2] [6 6] [6] = 3 x 12 = 36.
    rows = fewest_positions_layout([10, 6, 6, 6, 2])
    assert _positions([10, 6, 6, 6, 2], rows) == (36, 12)
    assert sorted(sorted(row) for row in rows) == [[0, 4], [1, 2], [3]]
    # Widening saves nothing here (2 rows at 10 either way): the rows stay at the longest example's width.
    assert _positions([10, 5, 5], fewest_positions_layout([10, 5, 5])) == (20, 10)
    # 6 rows x 10 or 5 rows x 12: as many positions, and the shorter rows attend over less.
    tied = [10, 10, 10, 10, 8, 2, 2, 2, 2, 2]
    assert _positions(tied, fewest_positions_layout(tied)) == (60, 10)
    # The slack bounds the width: 12 would hold [10 2] in one row, but 10 x 1.1 allows 11 at most.
    assert _positions([10, 2], fewest_positions_layout([10, 2], slack=1.1)) == (20, 10)


@pytest.fixture(scope="module")
def tiny_ner(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    torch.manual_seed(0)
    model = BertForTokenClassification.from_pretrained(tiny_bert, num_labels=4)
    rng = random.Random(1)
    features = []
    for words in (2, 11, 3, 6, 1, 4, 8, 2):
        encoded = tokenizer(" ".join(corpus_sentences(1, seed=words)[0].split()[:words]))
        features.append({**encoded, "labels": [rng.randrange(4) for _ in encoded["input_ids"]]})
        features[-1]["labels"][0] = features[-1]["labels"][-1] = -100  # [CLS] and [SEP] carry no tag
    return tokenizer, model, features


def test_packed_batch_layout_positions_labels_and_mask(tiny_ner):
    tokenizer, _, features = tiny_ner
    packing = PackingCollator(DataCollatorForTokenClassification(tokenizer), pad_token_id=tokenizer.pad_token_id, position_offset=0)
    batch = packing(features)
    lengths = [len(f["input_ids"]) for f in features]
    rows, width = batch["input_ids"].shape
    assert max(lengths) <= width <= max(lengths) * ROW_SLACK and rows < len(features)
    mask = batch["attention_mask"][:, 0]
    seen = []
    for row in range(rows):
        start = 0
        while start < width and mask[row, start, start]:
            end = start + int(mask[row, start].sum())
            example = next(i for i, f in enumerate(features) if i not in seen and f["input_ids"] == batch["input_ids"][row, start:end].tolist())
            seen.append(example)
            assert batch["labels"][row, start:end].tolist() == features[example]["labels"]
            assert batch["position_ids"][row, start:end].tolist() == list(range(end - start))
            # Attention stays inside the example: its block is all True, nothing outside it.
            assert mask[row, start:end, start:end].all() and not mask[row, start:end, :start].any() and not mask[row, start:end, end:].any()
            start = end
        assert (batch["input_ids"][row, start:] == tokenizer.pad_token_id).all()
        assert (batch["labels"][row, start:] == -100).all()
        assert mask[row, start:, 0].all() and mask[row, start:].sum() == width - start  # padding sees token 0 only
    assert sorted(seen) == list(range(len(features)))
    samples, tokens = count_samples_and_tokens(batch)
    assert (int(samples), int(tokens)) == (len(features), sum(lengths))


def test_count_samples_and_tokens_of_padded_batches(tiny_ner):
    tokenizer, _, features = tiny_ner
    batch = DataCollatorForTokenClassification(tokenizer)(features)
    samples, tokens = count_samples_and_tokens(batch)
    assert (samples, int(tokens)) == (len(features), sum(len(f["input_ids"]) for f in features))
    assert count_samples_and_tokens({"input_ids": torch.ones(3, 5, dtype=torch.long)})[0] == 3


def test_packed_loss_and_gradients_equal_the_padded_batch(tiny_ner):
    """The training step sees the same examples: with dropout off, the same loss and the same gradients."""
    tokenizer, model, features = tiny_ner
    collate = DataCollatorForTokenClassification(tokenizer)
    packing = PackingCollator(collate, pad_token_id=tokenizer.pad_token_id, position_offset=position_offset(model))
    model.eval()

    def loss_and_grads(batch):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    padded_loss, padded_grads = loss_and_grads(collate(features))
    packed_loss, packed_grads = loss_and_grads(packing(features))
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    assert padded_grads.keys() == packed_grads.keys()
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    model.zero_grad()


def test_check_packing_is_exact_passes_bert_and_refuses_wrong_positions(tiny_ner):
    tokenizer, model, features = tiny_ner
    collate = DataCollatorForTokenClassification(tokenizer)
    assert position_offset(model) == 0
    check_packing_is_exact(model, collate, PackingCollator(collate, pad_token_id=tokenizer.pad_token_id, position_offset=0), features, family="bert")
    shifted = PackingCollator(collate, pad_token_id=tokenizer.pad_token_id, position_offset=2)
    with pytest.raises(ConfigError, match=r"train\.pack_sequences: packed and unpacked bert forwards differ"):
        check_packing_is_exact(model, collate, shifted, features, family="bert")
    assert model.training is False  # the probe restores the mode it found (eval here)


def test_collator_with_per_example_keys_is_refused(tiny_ner):
    tokenizer, model, features = tiny_ner

    def with_sentence_label(batch_features):
        batch = DataCollatorForTokenClassification(tokenizer)(batch_features)
        batch["sentence_label"] = torch.zeros(len(batch_features), dtype=torch.long)
        return batch

    packing = PackingCollator(with_sentence_label, pad_token_id=tokenizer.pad_token_id, position_offset=0)
    with pytest.raises(ConfigError, match=r"cannot run packed batches .*sentence_label"):
        check_packing_is_exact(model, with_sentence_label, packing, features, family="bert")

"""``train.pack_sequences`` on every encoder family: packed rows give each example its unpacked logits, or
the run is refused before training.

Families place positions differently (BERT from 0, RoBERTa and XLM-R from ``padding_idx + 1``,
DeBERTa (v1 and v2), MPNet and XLNet relatively, ModernBERT by rotation) and take attention masks differently (XLNet
cannot run a packed mask at all; Longformer's sliding-window attention takes only a 2-D mask of 0/1/2 per
token, so a block-diagonal one cannot keep packed examples apart), so the
only trustworthy check is the one ``train()`` runs itself: :func:`check_packing_is_exact` on the
family's tiny checkpoint with sentences of its own tokenizer. The expected outcome per family is
pinned, so a transformers change that breaks (or fixes) packing for a family shows up here.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification

from pipelines.config import ConfigError
from pipelines.packing import PackingCollator, check_packing_is_exact, position_offset
from tests.families.builders import ENCODER_FAMILIES, family_corpus

# BigBird: packed rows are ~2.8e-4 off the unpacked logits (the check's ConfigError; `bertpipe train` exits 2).
# MobileBERT: its trigram input embeds each piece with its neighbours', so a packed example's edge pieces see
# the next example (3.2e-4 off; `bertpipe train` exits 2).
REFUSED = {"deberta", "deberta-v2", "modernbert", "mpnet", "xlnet", "longformer", "big_bird", "mobilebert"}


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
def test_families_packing_is_exact_or_refused(family, family_checkpoint):
    checkpoint = family_checkpoint(family)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(checkpoint, num_labels=3)
    features = []
    for words, text in zip((2, 9, 3, 5, 1, 4), family_corpus(6, seed=4)):
        encoded = tokenizer(" ".join(text.split()[:words]), truncation=True, max_length=24)
        features.append({**encoded, "labels": [1] * len(encoded["input_ids"])})
    assert len({len(f["input_ids"]) for f in features}) > 1, "the probe needs examples of different lengths"
    collate = DataCollatorForTokenClassification(tokenizer)
    packing = PackingCollator(collate, pad_token_id=tokenizer.pad_token_id, position_offset=position_offset(model))
    assert packing(features)["input_ids"].shape[0] < len(features), "rows must hold several examples"
    if family in REFUSED:
        with pytest.raises(ConfigError, match=r"train\.pack_sequences"):
            check_packing_is_exact(model, collate, packing, features, family=family)
    else:
        check_packing_is_exact(model, collate, packing, features, family=family)


@pytest.mark.parametrize("family,refused", [("roberta", False), ("deberta-v2", True), ("longformer", True)])
def test_families_packed_ner_run_trains_or_exits_2_before_writing(family, refused, family_checkpoint, tmp_path):
    """Through ``bertpipe train`` (a fresh process, as a user runs it): RoBERTa (positions from ``padding_idx + 1``)
    trains packed; DeBERTa-v2 and Longformer (sliding windows over a 2-D mask) end with exit status 2, one message
    naming the key, and nothing written."""
    from tests.conftest import run_cli, write_jsonl
    from tests.families.matrix import ner_rows, write_config

    files = {"train": write_jsonl(tmp_path / "train.jsonl", ner_rows(40, seed=1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", ner_rows(8, seed=2))}
    config = write_config(tmp_path, "ner", family_checkpoint(family), files, train="  max_steps: 3\n  pack_sequences: true")
    result = run_cli("train", str(config), check=not refused)
    if refused:
        assert result.returncode == 2, result.stderr
        assert "train.pack_sequences" in result.stderr and "set train.pack_sequences=false" in result.stderr
        assert "Traceback" not in result.stderr
        assert not any((tmp_path / "run").glob("*"))  # the folder check leaves output_dir created, empty
    else:
        assert json.loads((tmp_path / "run" / "metrics.json").read_text())["train_samples"] == 3 * 8


def test_families_packing_probe_packs_several_examples_into_a_row_whatever_the_files_first_rows(family_checkpoint, tmp_path):
    """The first 8 training features were the probe: 8 sentences of similar length each got a row of their own, and
    MPNet (refused above) trained packed, exit status 0. The probe is the longest and the shortest features."""
    from tests.conftest import run_cli, write_jsonl
    from tests.families.matrix import ner_rows, write_config

    similar = [{"tokens": ["Alice", "met", "Bob", "in", "Paris", "today"], "tags": ["B-PER", "O", "B-PER", "O", "B-LOC", "O"]}] * 8
    files = {"train": write_jsonl(tmp_path / "train.jsonl", similar + ner_rows(32, seed=1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", ner_rows(8, seed=2))}
    config = write_config(tmp_path, "ner", family_checkpoint("mpnet"), files, train="  max_steps: 3\n  pack_sequences: true")
    result = run_cli("train", str(config), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "train.pack_sequences: packed and unpacked mpnet forwards differ" in result.stderr


def test_families_packing_probe_is_none_where_no_two_examples_can_share_a_row():
    from pipelines.packing import packing_probe

    assert packing_probe([20, 21, 22, 23]) is None  # 20 + 21 > 1.25 x 23: every row holds one example
    probe = packing_probe([13, 13, 14, 12, 13, 15, 14, 13, 3, 25, 4])
    assert probe[0] == 9 and {8, 10} <= set(probe) and len(probe) == 8  # the longest, then the shortest

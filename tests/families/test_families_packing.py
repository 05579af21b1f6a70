"""``train.pack_sequences`` on every encoder family: packed rows give each example its unpacked logits, or
the run is refused before training.

Families place positions differently (BERT from 0, RoBERTa and XLM-R from ``padding_idx + 1``,
DeBERTa-v2 only relatively, ModernBERT by rotation) and take attention masks differently, so the
only trustworthy check is the one ``train()`` runs itself: :func:`check_packing_is_exact` on the
family's tiny checkpoint with sentences of its own tokenizer. The expected outcome per family is
pinned, so a transformers change that breaks (or fixes) packing for a family shows up here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification

from pipelines.config import ConfigError
from pipelines.packing import PackingCollator, check_packing_is_exact, position_offset
from tests.families.builders import ENCODER_FAMILIES, family_corpus

REFUSED = {"deberta-v2", "modernbert"}


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

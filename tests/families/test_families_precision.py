"""Every encoder family (each head) and every seq2seq family (a step and generate()) under a bf16 autocast, as
``train.mixed_precision=auto`` runs them on a CPU with native bf16 (and ``--precision bf16|auto`` predicts): the
rest of the family matrix pins fp32, so that its numbers do not depend on the CPU, and a family whose transformers
code fails in bf16 (DeBERTa v1) went unseen there.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoModelForSequenceClassification
from transformers import AutoModelForTokenClassification, AutoTokenizer

from pipelines.autocast_safety import make_autocast_safe
from pipelines.files import json_lines
from tests.conftest import write_jsonl
from tests.families.builders import ENCODER_FAMILIES, SEQ2SEQ_FAMILIES
from tests.families.matrix import run_bertpipe, sentiment_rows, train

HEADS = [AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoModelForQuestionAnswering, AutoModelForMaskedLM]


def _labels(head, batch: dict) -> dict:
    rows = batch["input_ids"].shape[0]
    if head is AutoModelForSequenceClassification:
        return {"labels": torch.arange(rows) % 2}
    if head is AutoModelForTokenClassification:
        return {"labels": torch.ones_like(batch["input_ids"])}
    if head is AutoModelForQuestionAnswering:
        return {"start_positions": torch.ones(rows, dtype=torch.long), "end_positions": torch.full((rows,), 2)}
    return {"labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)}


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
def test_families_every_head_trains_a_step_under_bf16_autocast(family, family_checkpoint):
    checkpoint = family_checkpoint(family)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    texts = ["the film was good and long", "bad"]
    for head in HEADS:
        # QA reads question and context pairs (Longformer finds its global attention at the separators).
        pairs = (["who was good", "what"],) if head is AutoModelForQuestionAnswering else ()
        batch = dict(tokenizer(*pairs, texts, padding=True, return_tensors="pt"))
        try:
            model = head.from_pretrained(checkpoint, num_labels=2) if head is not AutoModelForMaskedLM else head.from_pretrained(checkpoint)
        except ValueError:  # the family has no such head in transformers
            continue
        make_autocast_safe(model)
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch, **_labels(head, batch)).loss
        loss.backward()
        assert torch.isfinite(loss), f"{family} {head.__name__}: loss {loss}"


@pytest.mark.parametrize("family", [family for family in SEQ2SEQ_FAMILIES if family != "bert2bert"])  # bert2bert: BERT's heads above
def test_families_seq2seq_trains_a_step_and_generates_under_bf16_autocast(family, family_checkpoint):
    from transformers import AutoModelForSeq2SeqLM

    checkpoint = family_checkpoint(family)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    make_autocast_safe(model)
    batch = dict(tokenizer(["der mann ist gut", "gut"], text_target=["the man is good", "good"], padding=True, return_tensors="pt",
                           return_token_type_ids=False))
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss), f"{family}: loss {loss}"
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        generated = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=4, num_beams=2)
    assert generated.shape[0] == 2


def test_families_deberta_trains_and_predicts_in_bf16(family_checkpoint, tmp_path):
    """train.mixed_precision=bf16 and predict --precision bf16 on DeBERTa v1 stopped with a traceback (exit 1)."""
    files = {"train": write_jsonl(tmp_path / "train.jsonl", sentiment_rows(24, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", sentiment_rows(8, 2))}
    run = train(tmp_path, "classification", family_checkpoint("deberta"), files, "train.mixed_precision=bf16", train="  max_steps: 2")
    import json

    assert json.loads((run / "metrics.json").read_text())["mixed_precision"] == "bf16"
    source, target = write_jsonl(tmp_path / "in.jsonl", sentiment_rows(4, 3)), tmp_path / "out.jsonl"
    run_bertpipe("predict", str(run), "--input", str(source), "--output", str(target), "--precision", "bf16")
    predicted = [json.loads(line) for _, line in json_lines(target.read_text(encoding="utf-8"))]
    assert len(predicted) == 4 and all(row["label"] in ("negative", "positive") for row in predicted)
    # A DeBERTa teacher runs under the student's autocast too (the distillation wrapper does not hold it as a submodule).
    student = tmp_path / "student"
    student.mkdir()
    distilled = train(student, "classification", run, files, "train.mixed_precision=bf16", train="  max_steps: 2",
                      section=f"distill:\n  teacher: {run}\n  num_layers: 1")
    assert json.loads((distilled / "metrics.json").read_text())["mixed_precision"] == "bf16"

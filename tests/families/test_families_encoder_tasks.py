"""Classification, QA and MLM on every encoder family: a few training steps each, then the checks that
can go wrong per family (exact QA spans, predict == pipeline(), whole-word masks), LoRA and FSDP.

QA: DeBERTa-v2's and ModernBERT's offsets include the space before a word; every answer in predict,
``predictions.json``, ``nbest_predictions.json`` and ``pipeline("question-answering")`` must still be
exactly ``context[start:end]``, without surrounding whitespace.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForQuestionAnswering, AutoModelForSequenceClassification, AutoModelForTokenClassification
from transformers import AutoTokenizer, pipeline

from pipelines.adapters import apply_peft
from pipelines.config import ModelConfig, PeftConfig
from pipelines.modeling import count_parameters, load_model
from pipelines.runtime import layer_classes_to_wrap
from tests.conftest import write_jsonl
from tests.families.builders import ENCODER_FAMILIES, MLM_FAMILIES, PADDING_DEPENDENT_FAMILIES, WORD_SPACE_FAMILIES
from tests.families.matrix import card_code, head_at_labelled_positions_agrees, mlm_lines, run_card_code, piece_word, predict, qa_rows, run_bertpipe, sentiment_rows, train, word_spans

LABELS = {"num_labels": 3, "id2label": {0: "O", 1: "B-PER", 2: "I-PER"}, "label2id": {"O": 0, "B-PER": 1, "I-PER": 2}}
HEADS = {
    "text-classification": AutoModelForSequenceClassification, "token-classification": AutoModelForTokenClassification,
    "question-answering": AutoModelForQuestionAnswering, "fill-mask": AutoModelForMaskedLM,
}
PEFT_TASK_TYPES = {"text-classification": "SEQ_CLS", "token-classification": "TOKEN_CLS", "question-answering": "QUESTION_ANS", "fill-mask": None}


@pytest.mark.parametrize("family", ENCODER_FAMILIES + WORD_SPACE_FAMILIES)
def test_families_classification_predict_and_pipeline_agree(family, family_checkpoint, tmp_path):
    files = {"train": write_jsonl(tmp_path / "train.jsonl", sentiment_rows(48, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", sentiment_rows(16, 2))}
    run = train(tmp_path, "classification", family_checkpoint(family), files, train="  max_steps: 4")
    texts = [row["text"] for row in sentiment_rows(6, 3)]
    predicted = predict(run, [{"text": text} for text in texts], tmp_path)
    # In batches larger than the model's layer count: XLNet's saved use_mems_eval returned one cached state per layer,
    # which pipeline() split as if it were one per row (an IndexError past the second row of a 2-layer model).
    served = pipeline("text-classification", model=str(run))(texts, batch_size=4)
    assert [row["label"] for row in predicted] == [row["label"] for row in served]
    assert [row["score"] for row in predicted] == pytest.approx([row["score"] for row in served], abs=1e-4)


@pytest.mark.parametrize("family", ENCODER_FAMILIES + WORD_SPACE_FAMILIES)
def test_families_pair_classification_predict_pipeline_and_the_cards_call_agree(family, family_checkpoint, tmp_path):
    """Sentence pairs (MRPC, STS-B, NLI): each family joins them its own way (BERT's token types, RoBERTa's
    doubled separator, none at all); predict, pipeline() on {"text", "text_pair"} and the model card's call
    must read them alike, with pairs cut at data.max_seq_length as in training."""
    import re

    def pair_rows(count, seed):
        firsts = sentiment_rows(count, seed + 100)
        return [{"text": first["text"], "text_pair": row["text"], "label": row["label"]} for first, row in zip(firsts, sentiment_rows(count, seed))]

    files = {"train": write_jsonl(tmp_path / "train.jsonl", pair_rows(48, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", pair_rows(16, 2))}
    run = train(tmp_path, "classification", family_checkpoint(family), files, "data.max_seq_length=12",
                data="  text_pair_column: text_pair", train="  max_steps: 4")
    pairs = [{"text": row["text"], "text_pair": row["text_pair"]} for row in pair_rows(6, 3)]
    pairs.append({"text": "the film " * 8, "text_pair": "the story was very good " * 3})  # cut: longer than 12 pieces
    predicted = predict(run, pairs, tmp_path)
    classifier = pipeline("text-classification", model=str(run), top_k=None)
    card_call = re.search(r"predictor\((.*)\)\)", (run / "README.md").read_text()).group(1)
    assert card_call.startswith('{"text": ') and card_call.endswith("truncation=True, max_length=12"), card_call
    served = [classifier(pair, truncation=True, max_length=12) for pair in pairs]
    assert [row["scores"] for row in predicted] == [pytest.approx({s["label"]: s["score"] for s in scores}, abs=1e-4) for scores in served]
    assert {s["label"] for s in eval(f"classifier({card_call})", {"classifier": classifier})} == {"positive", "negative"}


@pytest.mark.parametrize("family", ["bert", "roberta", "modernbert"])
def test_families_multi_label_predict_pipeline_and_the_cards_call_agree(family, family_checkpoint, tmp_path):
    """Multi-label heads (sigmoid per label): predict's per-label scores are what pipeline() gives with
    top_k=None, its labels are those at or above classification.multi_label_threshold, and the model card's
    call returns every label's score (pipeline()'s default top_k=1 gives one label of a multi-label model)."""
    import re

    def tagged(count, seed):
        return [{"text": row["text"], "label": [row["label"], *(["film"] if "film" in row["text"] else [])]}
                for row in sentiment_rows(count, seed)]

    files = {"train": write_jsonl(tmp_path / "train.jsonl", tagged(48, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", tagged(16, 2))}
    run = train(tmp_path, "classification", family_checkpoint(family), files, train="  max_steps: 6",
                section="classification: {multi_label_threshold: 0.4}")
    texts = [row["text"] for row in sentiment_rows(6, 3)]
    predicted = predict(run, [{"text": text} for text in texts], tmp_path)
    classifier = pipeline("text-classification", model=str(run))
    served = [{s["label"]: s["score"] for s in scores} for scores in classifier(texts, top_k=None)]
    assert [row["scores"] for row in predicted] == [pytest.approx(scores, abs=1e-4) for scores in served]
    assert [row["labels"] for row in predicted] == [[name for name in ("film", "negative", "positive") if row["scores"][name] >= 0.4]
                                                   for row in predicted]
    # The run's card, and the card `bertpipe publish` writes (it built a fresh task, which never learnt the
    # problem type: its call showed one label).
    run_bertpipe("publish", str(run), "--repo-id", "me/tagger", "--dry-run", "--out", str(tmp_path / "published"))
    for card in (run / "README.md", tmp_path / "published" / "README.md"):
        card_call = re.search(r"predictor\((.*)\)\)", card.read_text()).group(1)
        assert {s["label"] for s in eval(f"classifier({card_call})", {"classifier": classifier})} == {"film", "negative", "positive"}, card
    assert "- classification.multi_label_threshold: 0.4" in (run / "README.md").read_text()


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_families_pair_regression_predict_and_pipeline_give_the_same_raw_score(family, family_checkpoint, tmp_path):
    """STS-B-style similarity scores: pipeline() must apply no sigmoid to a regression head, and predict's score is the raw output."""
    def scored_pairs(count, seed):
        firsts = sentiment_rows(count, seed + 100)
        return [{"text": first["text"], "text_pair": row["text"], "label": 4.5 if row["label"] == "positive" else 0.5}
                for first, row in zip(firsts, sentiment_rows(count, seed))]

    files = {"train": write_jsonl(tmp_path / "train.jsonl", scored_pairs(48, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", scored_pairs(16, 2))}
    run = train(tmp_path, "classification", family_checkpoint(family), files, data="  text_pair_column: text_pair", train="  max_steps: 8")
    pairs = [{"text": row["text"], "text_pair": row["text_pair"]} for row in scored_pairs(6, 3)]
    predicted = [row["score"] for row in predict(run, pairs, tmp_path)]
    served = [row["score"] for row in pipeline("text-classification", model=str(run))(pairs, truncation=True, max_length=64)]
    assert predicted == pytest.approx(served, abs=1e-4)
    # The head's raw output, not a probability.
    tokenizer, model = AutoTokenizer.from_pretrained(run), AutoModelForSequenceClassification.from_pretrained(run).eval()
    with torch.no_grad():
        raw = [float(model(**tokenizer(pair["text"], pair["text_pair"], return_tensors="pt")).logits) for pair in pairs]
    assert predicted == pytest.approx(raw, abs=1e-4)


@pytest.mark.parametrize("family", ENCODER_FAMILIES + PADDING_DEPENDENT_FAMILIES + WORD_SPACE_FAMILIES)
def test_families_qa_spans_are_exact_everywhere(family, family_checkpoint, tmp_path):
    from tasks import load_tasks

    load_tasks()  # registers pipeline("question-answering")

    files = {"train": write_jsonl(tmp_path / "train.jsonl", qa_rows(32, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", qa_rows(12, 2))}
    run = train(tmp_path, "qa", family_checkpoint(family), files, train="  max_steps: 4", section="qa: {doc_stride: 16}")
    contexts = {row["id"]: row["context"] for row in qa_rows(12, 2)}

    def exact(context: str, text: str, start: int, end: int) -> None:
        assert text and context[start:end] == text == text.strip(), (family, text, start, end)

    best = json.loads((run / "predictions.json").read_text())
    nbest = json.loads((run / "nbest_predictions.json").read_text())
    for qid, candidates in nbest.items():
        assert best[qid] == candidates[0]["text"]
        for candidate in candidates:
            exact(contexts[qid], candidate["text"], candidate["start"], candidate["end"])
    questions = qa_rows(6, 3)
    predicted = predict(run, [{"id": q["id"], "question": q["question"], "context": q["context"]} for q in questions], tmp_path)
    answerer = pipeline("question-answering", model=str(run))
    for question, row in zip(questions, predicted):
        exact(question["context"], row["answer"], row["start"], row["end"])
        served = answerer(question=question["question"], context=question["context"])
        assert (served["answer"], served["start"], served["end"]) == (row["answer"], row["start"], row["end"])
    # The model card's code (no pipeline needed) answers as predict does.
    code = card_code(run)
    asked = 'question, context = "Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."'
    assert asked in code
    for question, row in zip(questions, predicted):
        printed = run_card_code(code.replace(asked, f"question, context = {question['question']!r}, {question['context']!r}"))
        assert printed.strip() == row["answer"], (family, question["question"])


@pytest.mark.parametrize("family", MLM_FAMILIES + PADDING_DEPENDENT_FAMILIES)
def test_families_mlm_whole_word_masks_and_fill_mask_agree(family, family_checkpoint, tmp_path):
    from pipelines.config_loading import load_config
    from tasks import get_task

    files = {"train": (tmp_path / "train.txt"), "validation": (tmp_path / "validation.txt")}
    files["train"].write_text("\n".join(mlm_lines(60, 1)) + "\n")
    files["validation"].write_text("\n".join(mlm_lines(12, 2)) + "\n")
    run = train(tmp_path, "mlm", family_checkpoint(family), files, train="  max_steps: 3",
                section="mlm: {whole_word_mask: true, packing: false, mlm_probability: 0.4}")

    # Whole words by character offsets, not by the word_ids() the collator itself uses.
    task = get_task("mlm")(load_config(tmp_path / "mlm.yaml", [], lambda name: get_task(name).Options))
    examples = task.load()["train"].select(range(40))
    tokenizer = task.build_tokenizer(None)
    features = task.preprocess(examples, train=True)
    batch = task.collator(train=True)([features[i] for i in range(len(features))])
    masked_words = partly = 0
    for row, text in enumerate(examples["text"]):
        encoded = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert batch["input_ids"].shape[1] >= len(encoded["input_ids"])
        spans, chosen = word_spans(text), {}
        for position, ((start, end), special) in enumerate(zip(encoded["offset_mapping"], encoded["special_tokens_mask"])):
            if not special:
                chosen.setdefault(piece_word(text, start, end, spans), []).append(int(batch["labels"][row, position]) != -100)
        for flags in chosen.values():
            masked_words += all(flags)
            partly += any(flags) and not all(flags)
    assert masked_words > 0 and partly == 0, (family, masked_words, partly)

    mask = AutoTokenizer.from_pretrained(run).mask_token
    texts = [f"the man {mask} in Berlin", f"Alice visited {mask} today"]
    predicted = predict(run, [{"text": text} for text in texts], tmp_path)
    filler = pipeline("fill-mask", model=str(run), top_k=5)
    for text, row in zip(texts, predicted):
        served = filler(text)
        assert [c["token_id"] for c in row["masks"][0]["predictions"]] == [c["token"] for c in served], family
        assert [c["score"] for c in row["masks"][0]["predictions"]] == pytest.approx([c["score"] for c in served], abs=1e-4)


@pytest.mark.parametrize("family", MLM_FAMILIES + PADDING_DEPENDENT_FAMILIES)
def test_families_mlm_head_at_labelled_positions_gives_the_familys_loss_and_gradients(family, family_checkpoint):
    """Every family's masked-LM trains with its head at the labelled positions only (pipelines/labelled_positions.py):
    the same loss and gradients as the family's own forward, on its own tokenizer's padded batch."""
    checkpoint = family_checkpoint(family)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    whole = AutoModelForMaskedLM.from_pretrained(checkpoint).eval()  # no dropout: the two forwards see the same network
    batch = dict(tokenizer(mlm_lines(3, 4), padding=True, return_special_tokens_mask=True, return_tensors="pt"))
    ordinary = (batch.pop("special_tokens_mask") == 0) & batch["attention_mask"].bool()
    labelled = ordinary & (torch.rand(ordinary.shape, generator=torch.Generator().manual_seed(0)) < 0.3)
    batch["labels"] = torch.where(labelled, batch["input_ids"], -100)
    head_at_labelled_positions_agrees(family, whole, batch, labelled)


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
@pytest.mark.parametrize("tag", sorted(HEADS))
def test_families_lora_attaches_without_naming_target_modules(family, tag, family_checkpoint):
    if tag == "fill-mask" and family not in MLM_FAMILIES:
        pytest.skip(f"{family} has no masked-LM head")
    checkpoint = family_checkpoint(family)
    labels = LABELS if tag in ("text-classification", "token-classification") else None
    model = load_model(HEADS[tag], ModelConfig(name_or_path=str(checkpoint)), label_maps=labels)
    wrapped = apply_peft(model, PeftConfig(method="lora", r=4), PEFT_TASK_TYPES[tag], base_model_name_or_path=str(checkpoint))
    adapted = [name for name, _ in wrapped.named_modules() if name.endswith("lora_A")]
    assert adapted, family
    trainable, total = count_parameters(wrapped)
    assert 0 < trainable < total / 2
    if tag == "question-answering":  # a real question/context pair: Longformer's QA head finds the question by its separators
        pair = AutoTokenizer.from_pretrained(checkpoint)("where does Alice live ?", "Alice lives in Paris .", return_tensors="pt")
        ids = pair["input_ids"]
    else:
        ids = torch.tensor([[2, 10, 11, 12, 3]])
    out = wrapped(input_ids=ids, attention_mask=torch.ones_like(ids))
    (out.start_logits if tag == "question-answering" else out.logits).float().sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in wrapped.named_parameters() if "lora_B" in n)


@pytest.mark.parametrize("family", ENCODER_FAMILIES)
def test_families_fsdp_wraps_the_models_own_layers(family, family_checkpoint):
    from accelerate.utils.dataclasses import get_module_class_from_name

    model = load_model(AutoModelForTokenClassification, ModelConfig(name_or_path=str(family_checkpoint(family))), label_maps=LABELS)
    names = layer_classes_to_wrap(model)
    assert names and all(get_module_class_from_name(model, name) is not None for name in names), (family, names)
    layers = [module for module in model.modules() if type(module).__name__ in names]
    assert len(layers) >= 2 and not any(isinstance(layer, (torch.nn.Linear, torch.nn.Embedding)) for layer in layers)
    assert np.sum([p.numel() for layer in layers for p in layer.parameters()]) > 0

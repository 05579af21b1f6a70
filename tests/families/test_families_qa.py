"""QA on a family whose tokenizer pads on the left (XLNet: context first, ``<cls>`` last).

Windows of one batch differ in length; whatever the tokenizer's ``padding_side``, ``bertpipe predict``
and ``pipeline("question-answering")`` must decode exactly what each window, run alone without any
padding, gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import write_jsonl
from tests.families.builders import FILLER, PERSONS, PLACES, _unigram_vocab
from tests.families.matrix import predict, qa_rows, train


@pytest.fixture(scope="module")
def xlnet_checkpoint(tmp_path_factory) -> Path:
    from transformers import XLNetConfig, XLNetLMHeadModel, XLNetTokenizer

    directory = tmp_path_factory.mktemp("family-xlnet")
    tokenizer = XLNetTokenizer(vocab=_unigram_vocab(["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"]), unk_id=0,
                               model_max_length=128)
    assert tokenizer.padding_side == "left"
    config = XLNetConfig(vocab_size=len(tokenizer), d_model=32, n_layer=2, n_head=2, d_inner=64, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    XLNetLMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_families_qa_left_padding_tokenizer_decodes_each_window_as_if_alone(xlnet_checkpoint, tmp_path):
    from transformers import pipeline

    from tasks import load_tasks
    from tasks.qa import postprocess_qa_predictions, prepare_features

    load_tasks()  # registers pipeline("question-answering")
    files = {"train": write_jsonl(tmp_path / "train.jsonl", qa_rows(16, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", qa_rows(4, 2))}
    run = train(tmp_path, "qa", xlnet_checkpoint, files, "data.max_seq_length=24", train="  max_steps: 4", section="qa: {doc_stride: 6}")
    questions = qa_rows(6, 3)
    predicted = predict(run, [{"id": q["id"], "question": q["question"], "context": q["context"]} for q in questions], tmp_path)
    answerer = pipeline("question-answering", model=str(run))
    widths: set[int] = set()
    for question, row in zip(questions, predicted):
        features = prepare_features({"question": [question["question"]], "context": [question["context"]]}, [0],
                                    tokenizer=answerer.tokenizer, max_length=24, doc_stride=6, train=False)
        widths.update(len(ids) for ids in features["input_ids"])
        with torch.no_grad():
            alone = [answerer.model(input_ids=torch.tensor([ids])) for ids in features["input_ids"]]
        (expected,) = postprocess_qa_predictions(
            [question["context"]], features["example_index"], features["offset_mapping"],
            [out.start_logits[0].numpy() for out in alone], [out.end_logits[0].numpy() for out in alone], features["cls_index"],
        )
        served = answerer(question=question["question"], context=question["context"])
        assert (row["answer"], row["start"], row["end"]) == (expected["prediction_text"], expected["start"], expected["end"])
        assert (served["answer"], served["start"], served["end"]) == (row["answer"], row["start"], row["end"])
        assert row["score"] == pytest.approx(expected["score"], abs=1e-4)
        assert served["score"] == pytest.approx(expected["score"], abs=1e-4)
    assert len(widths) > 1  # windows of unequal length, so padding


def _answers_of_each_window_alone(answerer, question: str, context: str, max_length: int, doc_stride: int) -> dict:
    from tasks.qa import postprocess_qa_predictions, prepare_features

    features = prepare_features({"question": [question], "context": [context]}, [0], tokenizer=answerer.tokenizer,
                                max_length=max_length, doc_stride=doc_stride, train=False)
    names = [name for name in answerer.tokenizer.model_input_names if name in features]
    with torch.no_grad():
        alone = [answerer.model(**{name: torch.tensor([features[name][window]]) for name in names})
                 for window in range(len(features["input_ids"]))]
    (expected,) = postprocess_qa_predictions(
        [context], features["example_index"], features["offset_mapping"],
        [out.start_logits[0].numpy() for out in alone], [out.end_logits[0].numpy() for out in alone], features["cls_index"],
    )
    return {**expected, "windows": len(features["input_ids"])}


@pytest.mark.parametrize(("family", "max_length", "doc_stride", "words"), [
    ("funnel", 64, 16, (30, 60)),  # pools neighbouring positions: padding shows in every output
    ("big_bird", 120, 32, (60, 140)),  # windows above its 88-piece block threshold run block-sparse, shorter ones in full
])
def test_families_qa_pipeline_answers_long_contexts_as_predict_does_for_models_padding_changes(
    family, max_length, doc_stride, words, family_checkpoint, tmp_path,
):
    """pipeline("question-answering") padded a long context's windows to the longest and ran them as one batch; for
    Funnel and BigBird (whose outputs padding changes) its answers then differed from predict's, which runs each
    window as it is alone (6 of 300 Funnel answers, 116 scores). And BigBird switched itself to full attention for
    good on a short last window, so the questions after it ran otherwise."""
    import random

    from transformers import pipeline

    from tasks import load_tasks

    load_tasks()
    files = {"train": write_jsonl(tmp_path / "train.jsonl", qa_rows(32, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", qa_rows(8, 2))}
    run = train(tmp_path, "qa", family_checkpoint(family), files, f"data.max_seq_length={max_length}", train="  max_steps: 4",
                section=f"qa: {{doc_stride: {doc_stride}}}")
    rng = random.Random(0)
    questions = [{"id": f"q{index}", "question": f"where does {rng.choice(PERSONS)} live ?",
                  "context": " ".join(rng.choice(FILLER + PERSONS + PLACES) for _ in range(rng.randint(*words)))} for index in range(24)]
    predicted = predict(run, questions, tmp_path)
    answerer = pipeline("question-answering", model=str(run))  # one pipeline for every question, as a user keeps it
    served = [answerer(question=q["question"], context=q["context"]) for q in questions]
    several = 0
    for question, row, answer in zip(questions, predicted, served):
        expected = _answers_of_each_window_alone(answerer, question["question"], question["context"], max_length, doc_stride)
        several += expected["windows"] > 1
        assert (row["answer"], row["start"], row["end"]) == (expected["prediction_text"], expected["start"], expected["end"])
        assert (answer["answer"], answer["start"], answer["end"]) == (row["answer"], row["start"], row["end"]), question["id"]
        assert row["score"] == pytest.approx(expected["score"], abs=1e-4) and answer["score"] == pytest.approx(row["score"], abs=1e-4)
    assert several >= 12  # most contexts span several windows, the last one shorter


def test_families_qa_no_answer_position_is_the_templates_cls_not_a_cls_in_the_text(xlnet_checkpoint):
    """XLNet's template puts its <cls> last; the text "<cls>" in a context encodes to the same id. The first such id was
    taken for the no-answer position: windows without the answer were trained to point at the text's token, and its
    span's score was read as the null score, so a SQuAD v2 run could never answer "no answer"."""
    from transformers import AutoTokenizer

    from tasks.qa import prepare_features

    tokenizer = AutoTokenizer.from_pretrained(xlnet_checkpoint)
    batch = {"question": ["who saw it"], "context": ["the man saw <cls> in Paris today"], "answers": [{"text": [], "answer_start": []}]}
    for train_features in (True, False):
        features = prepare_features(batch, [0], tokenizer=tokenizer, max_length=64, doc_stride=16, train=train_features)
        ids = features["input_ids"][0]
        assert ids.count(tokenizer.cls_token_id) == 2  # the context's and the template's, last
        assert features["cls_index"] == [len(ids) - 1]
        if train_features:
            assert features["start_positions"] == features["end_positions"] == [len(ids) - 1]

"""Units of the QA task: readers, window labelling, n-best postprocessing, SQuAD metrics, bad input, pipeline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset

from pipelines.config_loading import load_config
from pipelines.errors import DataError
from pipelines.metrics import load_metric
from pipelines.metrics.squad_scoring import f1_score, normalize_answer, squad_v1_scores, squad_v2_scores
from pipelines.modeling import load_tokenizer
from tasks import get_task
from tasks.qa import (
    QACollator,
    answer_token_span,
    flatten_squad_json,
    postprocess_qa_predictions,
    prepare_features,
    read_squad_file,
    register_qa_pipeline,
    rows_to_dataset,
)
from tests.conftest import REPO_ROOT, write_jsonl

WORDS = "the film was a story with very and plot actors it is of scenes".split()


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    return load_tokenizer(str(tiny_bert))


def qa_config(tmp_path: Path, model: Path, files: dict[str, Path], **qa) -> object:
    qa_yaml = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in qa.items()) or "  {}"
    path = tmp_path / "qa.yaml"
    path.write_text(f"""task: qa
output_dir: {tmp_path / 'run'}
model:
  name_or_path: {model}
data:
  files:
    train: {files['train']}
    validation: {files['validation']}
  max_seq_length: 24
qa:
{qa_yaml}
""")
    return load_config(path, [], lambda name: get_task(name).Options)


def context_with(answer_at: int, answer: str = "plot actors", length: int = 40) -> tuple[str, int]:
    """``length`` filler words with ``answer`` inserted as word ``answer_at``; returns (context, answer_start)."""
    words = [WORDS[i % len(WORDS)] for i in range(length)]
    words.insert(answer_at, answer)
    before = " ".join(words[:answer_at])
    return " ".join(words), len(before) + 1 if before else 0


# ----- readers ---------------------------------------------------------------------------------
def test_qa_nested_json_reader_flattens_and_honours_is_impossible(tmp_path):
    document = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{"context": "alice met bob", "qas": [
        {"id": "a", "question": "who met bob?", "answers": [{"text": "alice", "answer_start": 0}, {"text": "alice", "answer_start": 0}]},
        {"id": "b", "question": "who met carol?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "bob", "answer_start": 10}]},
    ]}]}]}
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(document))
    rows = read_squad_file(path)
    assert [row["id"] for row in rows] == ["a", "b"]
    assert rows[0] == {"id": "a", "title": "T", "context": "alice met bob", "question": "who met bob?",
                       "answers": {"text": ["alice", "alice"], "answer_start": [0, 0]}}
    assert rows[1]["answers"] == {"text": [], "answer_start": []}


def test_qa_reader_takes_is_impossible_only_as_a_boolean(tmp_path):
    row = {"id": "a", "question": "who met bob?", "context": "alice met bob", "answers": {"text": ["alice"], "answer_start": [0]}}
    path = tmp_path / "flat.jsonl"
    for flag, answers in ((False, ["alice"]), (0, ["alice"]), (None, ["alice"]), (True, []), (1, [])):
        path.write_text(json.dumps({**row, "is_impossible": flag}) + "\n")
        assert read_squad_file(path)[0]["answers"]["text"] == answers
    # A string is refused, not read as true: "False" emptied the answer of an answered question.
    for flag in ("False", "true", 2, [False]):
        path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "b", "is_impossible": flag}) + "\n")
        with pytest.raises(DataError, match=rf"{re.escape(str(path))}.*line 2.*'is_impossible' must be true or false \(a JSON boolean\), "
                                            rf"not {re.escape(repr(flag))}"):
            read_squad_file(path)


def test_qa_reader_takes_a_byte_order_mark_and_parquet_rows(tmp_path):
    # A BOM made json refuse the file ("Unexpected UTF-8 BOM"); a parquet file was decoded as text (a traceback).
    import pandas

    rows = [{"id": "a", "question": "who met bob?", "context": "alice met bob", "answers": {"text": ["alice"], "answer_start": [0]}},
            {"id": "b", "question": "who met ann?", "context": "carl met ann", "answers": {"text": ["carl"], "answer_start": [0]}}]
    jsonl, nested, table = tmp_path / "flat.jsonl", tmp_path / "nested.json", tmp_path / "flat.parquet"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8-sig")
    nested.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "alice met bob", "qas": [
        {"id": "a", "question": "who met bob?", "answers": [{"text": "alice", "answer_start": 0}]}]}]}]}), encoding="utf-8-sig")
    pandas.DataFrame(rows).to_parquet(table)
    assert [row["answers"]["text"] for row in read_squad_file(jsonl)] == [["alice"], ["carl"]]
    assert read_squad_file(nested)[0]["answers"] == {"text": ["alice"], "answer_start": [0]}
    read = read_squad_file(table)
    assert [(row["id"], row["context"], row["answers"]) for row in read] == [(row["id"], row["context"], row["answers"]) for row in rows]
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not a table")
    with pytest.raises(DataError, match=rf"{re.escape(str(broken))} cannot be read as parquet"):
        read_squad_file(broken)


def test_qa_reader_takes_a_single_flat_row_with_a_data_field_as_a_row(tmp_path):
    # It was taken for nested SQuAD JSON and refused ("needs a 'data' list of articles"); two such rows were read.
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"id": "q", "question": "who met bob?", "context": "alice met bob", "data": "source 7"}) + "\n")
    assert [(row["id"], row["question"]) for row in read_squad_file(path)] == [("q", "who met bob?")]


def test_qa_reader_honours_the_encoding(tmp_path):
    document = {"data": [{"title": "T", "paragraphs": [{"context": "Zoë met Bob", "qas": [
        {"id": "a", "question": "who met Bob?", "answers": [{"text": "Zoë", "answer_start": 0}]}]}]}]}
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(document, ensure_ascii=False).encode("latin-1"))
    assert read_squad_file(path, encoding="latin-1")[0]["answers"]["text"] == ["Zoë"]
    with pytest.raises(DataError, match="0xeb is not valid utf-8.*data.encoding"):
        read_squad_file(path)


def test_qa_load_inputs_honours_data_encoding(tmp_path, tiny_bert):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps({"id": "a", "question": "who met Bob?", "context": "Zoë met Bob"}, ensure_ascii=False).encode("latin-1"))
    config_path = tmp_path / "qa.yaml"
    config_path.write_text(f"""task: qa
output_dir: {tmp_path / 'run'}
model:
  name_or_path: {tiny_bert}
data:
  files: {{train: {path}, validation: {path}}}
  encoding: latin-1
""")
    task = get_task("qa")(load_config(config_path, [], lambda name: get_task(name).Options))
    assert task.load_inputs(str(path))["context"] == ["Zoë met Bob"]
    utf8 = get_task("qa")(load_config(config_path, ["data.encoding=utf-8"], lambda name: get_task(name).Options))
    with pytest.raises(DataError, match="0xeb is not valid utf-8.*data.encoding"):
        utf8.load_inputs(str(path))


def test_qa_reader_detects_jsonl_with_either_answer_layout(tmp_path):
    path = write_jsonl(tmp_path / "flat.json", [
        {"id": 7, "question": "q1", "context": "c one", "answers": {"text": ["one"], "answer_start": [2]}},
        {"question": "q2", "context": "c two", "answers": [{"text": "two", "answer_start": 2}]},
        {"question": "q3", "context": "c three"},
    ])
    rows = read_squad_file(path)
    assert [row["id"] for row in rows] == [7, "2", "3"]  # as written; a missing one counts rows from 1, as every message does
    assert rows_to_dataset(rows)["id"] == ["7", "2", "3"]  # the examples' ids are text (they key predictions.json)
    assert rows[1]["answers"] == {"text": ["two"], "answer_start": [2]}
    assert rows[2]["answers"] == {"text": [], "answer_start": []}


def test_qa_reader_blank_answer_text_is_no_answer(tmp_path, tokenizer):
    # Kept, {"text": [""], "answer_start": [0]} labelled a window with its start token after its end token.
    path = write_jsonl(tmp_path / "blank.jsonl", [
        {"question": "who ?", "context": "alice met bob", "answers": {"text": [""], "answer_start": [0]}},
        {"question": "who ?", "context": "alice met bob", "answers": [{"text": " ", "answer_start": 5}]},
        {"question": "who ?", "context": "alice met bob", "answers": {"text": ["", "bob"], "answer_start": [-1, 10]}},
    ])
    rows = read_squad_file(path)
    assert [row["answers"] for row in rows] == [{"text": [], "answer_start": []}] * 2 + [{"text": ["bob"], "answer_start": [10]}]
    batch = {key: [row[key] for row in rows] for key in ("question", "context", "answers")}
    features = prepare_features(batch, [0, 1, 2], tokenizer=tokenizer, train=True, max_length=24, doc_stride=8)
    assert features["start_positions"][:2] == features["end_positions"][:2] == [0, 0]


def test_qa_load_refuses_evaluation_examples_that_share_an_id(tmp_path, tiny_bert):
    row = {"question": "who ?", "context": "alice met bob", "answers": {"text": ["bob"], "answer_start": [10]}}
    files = {"train": write_jsonl(tmp_path / "train.jsonl", [{**row, "id": "a"}, {**row, "id": "a"}]),  # harmless there
             "validation": write_jsonl(tmp_path / "validation.jsonl", [{**row, "id": "q1"}, {**row, "id": "q2"}, {**row, "id": "q1"}])}
    task = get_task("qa")(qa_config(tmp_path, tiny_bert, files))
    with pytest.raises(DataError, match=r"split 'validation': examples 0 and 2 share the id 'q1'"):
        task.load()


def test_qa_jsonl_reader_keeps_a_line_separator_inside_a_string(tmp_path):
    # ensure_ascii=False writes U+2028 raw; str.splitlines() would cut the record there.
    path = tmp_path / "flat.jsonl"
    rows = [{"question": "q", "context": "first\u2028second", "answers": {"text": ["second"], "answer_start": [6]}}] * 2
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert [row["context"] for row in read_squad_file(path)] == ["first\u2028second"] * 2


def test_qa_reader_errors_name_the_place(tmp_path):
    with pytest.raises(DataError, match=r"data\[0\]\.paragraphs\[0\]\.qas\[1\].*'question'"):
        flatten_squad_json({"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q"}, {"id": "x"}]}]}]}, "f.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "context": "c"}\nnot json\n')
    with pytest.raises(DataError, match="line 2"):
        read_squad_file(bad)



@pytest.mark.parametrize("answers, message", [
    ({"text": "Paris", "answer_start": 15}, "must hold lists"),  # scalars, not lists
    ({"text": ["Paris"], "answer_start": [None]}, "answer_start must be whole numbers"),
    ([{"text": "Paris", "answer_start": "fifteen"}], "answer_start must be whole numbers"),
])
def test_qa_reader_malformed_answers_name_the_row(tmp_path, answers, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"question": "where ?", "context": "Alice lives in Paris", "answers": {"text": ["Paris"], "answer_start": [15]}},
        {"question": "where ?", "context": "Alice lives in Paris", "answers": answers},
    ])
    with pytest.raises(DataError, match=f"bad.jsonl: line 2: .*{message}"):
        read_squad_file(path)

# ----- windows and labels ------------------------------------------------------------------------
def test_qa_answer_token_span_on_hand_made_offsets():
    # [CLS] q [SEP] "aa" "bb" "cc" [SEP] over the context "aa bb cc"
    offsets = [None, None, None, [0, 2], [3, 5], [6, 8], None]
    assert answer_token_span(offsets, 3, 8, cls_index=0) == (4, 5)
    assert answer_token_span(offsets, 0, 2, cls_index=0) == (3, 3)
    assert answer_token_span(offsets, 6, 12, cls_index=0) == (0, 0)  # runs past the window's end
    # "(paris)": the answer touches the pieces before and after it; neither belongs to the span.
    touching = [None, None, None, [0, 1], [1, 6], [6, 7], None]
    assert answer_token_span(touching, 1, 6, cls_index=0) == (4, 4)


def label_windows(tokenizer, context: str, answer: str, start: int | None, **window) -> list[str | None]:
    """The text each window's label points at (None = the CLS position)."""
    answers = {"text": [answer], "answer_start": [start]} if start is not None else {"text": [], "answer_start": []}
    batch = {"question": ["who is it ?"], "context": [context], "answers": [answers]}
    features = prepare_features(batch, [0], tokenizer=tokenizer, train=True, **window)
    eval_features = prepare_features(batch, [0], tokenizer=tokenizer, train=False, **window)
    texts = []
    for window_index, (s, e) in enumerate(zip(features["start_positions"], features["end_positions"])):
        cls = eval_features["cls_index"][window_index]
        assert len(features["input_ids"][window_index]) <= window["max_length"]
        if (s, e) == (cls, cls):
            texts.append(None)
        else:
            offsets = eval_features["offset_mapping"][window_index]
            texts.append(context[offsets[s][0] : offsets[e][1]])
    return texts


def test_qa_labels_answer_in_first_second_and_no_window(tokenizer):
    window = {"max_length": 24, "doc_stride": 8}
    context, start = context_with(2)
    labels = label_windows(tokenizer, context, "plot actors", start, **window)
    assert len(labels) >= 3 and labels[0] == "plot actors" and labels[-1] is None

    context, start = context_with(22)
    labels = label_windows(tokenizer, context, "plot actors", start, **window)
    assert labels[0] is None and "plot actors" in labels[1:]

    labels = label_windows(tokenizer, context, "", None, **window)
    assert labels == [None] * len(labels)


def test_qa_answer_across_a_window_edge_is_labelled_only_where_whole(tokenizer):
    window = {"max_length": 24, "doc_stride": 8}
    question_tokens = len(tokenizer("who is it ?", add_special_tokens=False)["input_ids"])
    room = 24 - 3 - question_tokens  # context tokens per window
    words = [WORDS[i % len(WORDS)] for i in range(40)]
    # The two answer words sit on the first window's last and the second window's tokens.
    answer_at = room - 1
    context = " ".join(words[:answer_at] + ["plot", "actors"] + words[answer_at:])
    start = len(" ".join(words[:answer_at])) + 1
    labels = label_windows(tokenizer, context, "plot actors", start, **window)
    assert labels[0] is None
    assert labels[1] == "plot actors"


def test_qa_eval_features_keep_context_only_offsets(tokenizer):
    context, _ = context_with(3)
    batch = {"question": ["who is it ?"], "context": [context], "answers": [{"text": [], "answer_start": []}]}
    features = prepare_features(batch, [5], tokenizer=tokenizer, train=False, max_length=24, doc_stride=8)
    assert set(features["example_index"]) == {5}
    for ids, offsets, cls in zip(features["input_ids"], features["offset_mapping"], features["cls_index"]):
        assert ids[cls] == tokenizer.cls_token_id
        assert offsets[0] is None and offsets[-1] is None  # CLS and the final SEP
        assert offsets[1] is None  # a question token
        assert any(offset is not None for offset in offsets)
    assert "start_positions" not in features


# ----- postprocessing ----------------------------------------------------------------------------
CONTEXT = "aa bb cc dd ee ff"
# [CLS] q [SEP] aa bb cc [SEP]  and  [CLS] q [SEP] cc dd ee ff [SEP]   (windows overlap on "cc")
WINDOW_1 = [None, None, None, [0, 2], [3, 5], [6, 8], None]
WINDOW_2 = [None, None, None, [6, 8], [9, 11], [12, 14], [15, 17], None]


def logits(width: int, **values: float) -> np.ndarray:
    array = np.full(width, -10.0)
    for key, value in values.items():
        array[int(key[1:])] = value
    return array


def test_qa_postprocess_nbest_order_and_probabilities():
    (result,) = postprocess_qa_predictions(
        [CONTEXT], [0], [WINDOW_1], [logits(7, p3=5.0, p4=4.0)], [logits(7, p4=5.0, p5=3.0)], [0], n_best_size=4,
    )
    assert [c["text"] for c in result["nbest"]] == ["aa bb", "bb", "aa bb cc", "bb cc"]
    assert [c["score"] for c in result["nbest"]] == [10.0, 9.0, 8.0, 7.0]
    assert result["prediction_text"] == "aa bb" and (result["start"], result["end"]) == (0, 5)
    probabilities = [c["probability"] for c in result["nbest"]]
    assert sum(probabilities) == pytest.approx(1.0) and probabilities == sorted(probabilities, reverse=True)
    assert result["score"] == pytest.approx(probabilities[0]) and result["no_answer_probability"] == 0.0


def test_qa_postprocess_spans_exclude_the_space_a_piece_offset_includes():
    # DeBERTa-v2/ModernBERT offsets: "▁bb" covers " bb", a lone "▁" piece covers the space before "cc".
    context = "aa bb cc"
    offsets = [None, [0, 2], [2, 5], [5, 6], [6, 8], None]
    starts, ends = logits(6, p2=5.0, p3=4.0, p1=1.0), logits(6, p2=5.0, p3=4.5, p4=1.0)
    (result,) = postprocess_qa_predictions([context], [0], [offsets], [starts], [ends], [0], n_best_size=6)
    assert (result["prediction_text"], result["start"], result["end"]) == ("bb", 3, 5)
    assert result["nbest"] and "" not in [c["text"] for c in result["nbest"]]  # the lone space is no answer
    for candidate in result["nbest"]:
        assert context[candidate["start"] : candidate["end"]] == candidate["text"] == candidate["text"].strip()
    assert len({(c["start"], c["end"]) for c in result["nbest"]}) == len(result["nbest"])


def test_qa_postprocess_spans_are_whole_graphemes():
    # Uncased WordPiece (strip_accents), ALBERT and DeBERTa leave combining marks out of every piece's
    # offsets: "Jose" of "Jose\u0301" (NFD) and "नमस्त" of "नमस्ते" (a vowel sign) once ended the answer.
    context = "met Jose\u0301 in नमस्ते today"
    offsets = [None, [0, 3], [4, 8], [10, 12], [13, 18], [20, 25], None]
    for token, answer in ((2, "Jose\u0301"), (4, "नमस्ते")):
        (result,) = postprocess_qa_predictions(
            [context], [0], [offsets], [logits(7, **{f"p{token}": 9.0})], [logits(7, **{f"p{token}": 9.0})], [0], n_best_size=3,
        )
        assert result["prediction_text"] == answer == context[result["start"] : result["end"]]
    # A byte-level piece of the mark alone does not start an answer mid-character either.
    (result,) = postprocess_qa_predictions(
        [context], [0], [[None, [4, 7], [7, 8], [8, 9], None]], [logits(5, p3=9.0)], [logits(5, p3=9.0)], [0], n_best_size=1,
    )
    assert result["prediction_text"] == "e\u0301"


def test_qa_postprocess_spans_leave_out_invisible_characters_at_their_edges():
    # Byte-level BPE gives a zero-width space or a byte-order mark a piece of its own: a span starting or
    # ending on it read "\u200bParis", which the SQuAD scoring counts as another answer than "Paris".
    context = "in \u200bParis\ufeff today"
    offsets = [None, [0, 2], [3, 4], [4, 9], [9, 10], [11, 16], None]
    (result,) = postprocess_qa_predictions([context], [0], [offsets], [logits(7, p2=9.0)], [logits(7, p4=9.0)], [0], n_best_size=3)
    assert result["prediction_text"] == "Paris" == context[result["start"] : result["end"]]


def test_qa_postprocess_spans_widened_to_whole_graphemes_regain_no_space_or_joiner():
    # Trimmed before being widened, a span regained what the trim took: a combining mark after a space is one
    # cluster with it (XLM-R gives the mark a piece of its own: "\u0301Paris" read " \u0301Paris"), and a
    # joiner ends the cluster of the letter before it ("Paris" of "Paris\u200d❤️" read "Paris\u200d").
    for context, offsets, first, last in (
        ("Alice lives in \u0301Paris .", [None, [0, 5], [6, 11], [12, 14], [15, 16], [16, 21], [22, 23], None], 4, 5),
        ("Alice lives in Paris\u200d\u2764\ufe0f .", [None, [0, 5], [6, 11], [12, 14], [15, 20], [20, 23], [24, 25], None], 4, 4),
    ):
        (result,) = postprocess_qa_predictions(
            [context], [0], [offsets], [logits(8, **{f"p{first}": 9.0})], [logits(8, **{f"p{last}": 9.0})], [0], n_best_size=5,
        )
        assert result["prediction_text"] == "Paris" == context[result["start"] : result["end"]]
        for candidate in result["nbest"]:
            assert candidate["text"] == candidate["text"].strip() and "\u200d" not in candidate["text"][-1:]


@pytest.mark.parametrize("answer", ["Jose\u0301", "नमस्ते", "plot "])
def test_qa_answer_at_the_context_end_is_labelled_and_decoded_whole(tokenizer, answer):
    # The uncased tiny BERT strips the final mark (and no piece covers a trailing space): the answer's
    # last characters lay past the window's last piece, so the only window holding it trained as "no answer".
    context = "the film was a story with " + answer
    start = context.index(answer)
    batch = {"question": ["who is it ?"], "context": [context], "answers": [{"text": [answer], "answer_start": [start]}]}
    window = {"max_length": 64, "doc_stride": 8}
    train = prepare_features(batch, [0], tokenizer=tokenizer, train=True, **window)
    evaluation = prepare_features(batch, [0], tokenizer=tokenizer, train=False, **window)
    (s,), (e,), (cls,) = train["start_positions"], train["end_positions"], evaluation["cls_index"]
    assert (s, e) != (cls, cls)
    width = len(evaluation["input_ids"][0])
    (result,) = postprocess_qa_predictions(
        [context], [0], evaluation["offset_mapping"], [logits(width, **{f"p{s}": 9.0})], [logits(width, **{f"p{e}": 9.0})],
        evaluation["cls_index"],
    )
    assert result["prediction_text"] == answer.strip()
    squad = load_metric("squad").compute(
        predictions=[{"id": "0", "prediction_text": result["prediction_text"]}], references=[{"id": "0", "answers": batch["answers"][0]}],
    )
    assert squad["exact_match"] == 100.0


def test_qa_postprocess_respects_max_answer_length_and_order():
    (result,) = postprocess_qa_predictions(
        [CONTEXT], [0], [WINDOW_1], [logits(7, p3=5.0, p5=1.0)], [logits(7, p3=-1.0, p5=5.0)], [0],
        n_best_size=3, max_answer_length=1,
    )
    texts = [c["text"] for c in result["nbest"]]
    assert texts[0] == "cc"  # "aa bb cc" (score 10) is 3 tokens long
    assert "aa bb cc" not in texts and all(" " not in text for text in texts)
    # an end before the start is never a span: the best valid one ("bb", 2 + 1) is the answer
    starts, ends = logits(7, p5=9.0, p4=2.0), logits(7, p3=9.0, p4=1.0)
    (result,) = postprocess_qa_predictions([CONTEXT], [0], [WINDOW_1], [starts], [ends], [0], n_best_size=1)
    assert (result["prediction_text"], result["start"], result["end"], result["nbest"][0]["score"]) == ("bb", 3, 5, 3.0)


def test_qa_postprocess_never_answers_from_question_or_padding():
    padded_start = np.concatenate([logits(7, p3=1.0), [50.0, 50.0]])  # positions 7, 8 are padding
    padded_end = np.concatenate([logits(7, p3=1.0), [50.0, 50.0]])
    (result,) = postprocess_qa_predictions([CONTEXT], [0], [WINDOW_1], [padded_start], [padded_end], [0])
    assert result["prediction_text"] == "aa"
    (result,) = postprocess_qa_predictions([CONTEXT], [0], [WINDOW_1], [logits(7, p1=20.0, p3=1.0)], [logits(7, p1=20.0, p3=1.0)], [0])
    assert result["prediction_text"] == "aa"


def test_qa_postprocess_answer_spanning_a_window_edge_comes_from_the_window_that_holds_it():
    starts = [logits(7, p5=6.0), logits(8, p3=6.0)]  # "cc" starts the answer in both windows
    ends = [logits(7, p5=2.0), logits(8, p5=7.0)]  # window 1 ends at its edge, window 2 reaches "ee"
    (result,) = postprocess_qa_predictions([CONTEXT], [0, 0], [WINDOW_1, WINDOW_2], starts, ends, [0, 0])
    assert result["prediction_text"] == "cc dd ee"
    # the span "cc" is proposed by both windows but listed once, with its best score
    texts = [c["text"] for c in result["nbest"]]
    assert texts.count("cc") == 1
    assert next(c for c in result["nbest"] if c["text"] == "cc")["score"] == pytest.approx(8.0)


def test_qa_postprocess_v2_null_answer_uses_the_minimum_null_over_windows():
    # Window 1 is sure there is no answer here; window 2 holds a good span and a low null score.
    starts = [logits(7, p0=8.0, p3=1.0), logits(8, p0=1.0, p4=5.0)]
    ends = [logits(7, p0=8.0, p3=1.0), logits(8, p0=1.0, p4=5.0)]
    (result,) = postprocess_qa_predictions([CONTEXT], [0, 0], [WINDOW_1, WINDOW_2], starts, ends, [0, 0], version_2_with_negative=True)
    assert result["prediction_text"] == "dd"
    assert result["null_score_diff"] == pytest.approx(2.0 - 10.0)
    null = next(c for c in result["nbest"] if c["text"] == "")
    assert result["no_answer_probability"] == pytest.approx(null["probability"])
    assert 0.0 < result["no_answer_probability"] < 0.01

    starts = [logits(7, p0=8.0, p3=3.0)]
    ends = [logits(7, p0=8.0, p3=3.0)]
    (result,) = postprocess_qa_predictions([CONTEXT], [0], [WINDOW_1], starts, ends, [0], version_2_with_negative=True)
    assert result["prediction_text"] == "" and (result["start"], result["end"]) == (0, 0)
    assert result["null_score_diff"] == pytest.approx(16.0 - 6.0)
    assert result["no_answer_probability"] > 0.99 and result["score"] == result["no_answer_probability"]
    (answered,) = postprocess_qa_predictions(
        [CONTEXT], [0], [WINDOW_1], starts, ends, [0], version_2_with_negative=True, null_score_diff_threshold=11.0
    )
    assert answered["prediction_text"] == "aa"
    assert answered["no_answer_probability"] == pytest.approx(result["no_answer_probability"])


def test_qa_postprocess_v2_no_answer_probability_is_real_with_n_best_size_1():
    starts, ends = [logits(7, p0=1.0, p3=5.0)], [logits(7, p0=1.0, p3=5.0)]  # null 2.0, "aa" 10.0
    (result,) = postprocess_qa_predictions([CONTEXT], [0], [WINDOW_1], starts, ends, [0], n_best_size=1, version_2_with_negative=True)
    assert result["prediction_text"] == "aa"
    assert result["no_answer_probability"] == pytest.approx(1 / (1 + np.exp(8.0)))
    assert result["score"] == pytest.approx(1 - result["no_answer_probability"])
    (abstained,) = postprocess_qa_predictions([CONTEXT], [0], [WINDOW_1], ends, starts, [0], n_best_size=1, version_2_with_negative=True,
                                              null_score_diff_threshold=-9.0)
    assert abstained["prediction_text"] == "" and abstained["score"] == abstained["no_answer_probability"] < 0.01

def test_qa_postprocess_groups_windows_by_example():
    contexts = ["aa bb cc", CONTEXT]
    results = postprocess_qa_predictions(
        contexts, [1, 0], [WINDOW_2, WINDOW_1], [logits(8, p6=5.0), logits(7, p4=5.0)], [logits(8, p6=5.0), logits(7, p4=5.0)], [0, 0],
    )
    assert [r["prediction_text"] for r in results] == ["bb", "ff"]


# ----- metrics -----------------------------------------------------------------------------------
def test_qa_metric_normalisation_and_f1_by_hand():
    assert normalize_answer("The  Cat, sat!  ") == "cat sat"
    assert normalize_answer("an Apple a day") == "apple day"
    # The official order: punctuation out first, then articles ("the-cat" is one word, "thecat", not "cat").
    assert normalize_answer("the-cat") == "thecat" and normalize_answer("a.m. show") == "am show"
    assert f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)  # P 2/2, R 2/3
    assert f1_score("", "") == 1.0 and f1_score("cat", "") == 0.0


def test_qa_squad_metric_on_hand_made_predictions():
    predictions = {"1": "The Cat", "2": "in Paris, France", "3": "blue"}
    references = {"1": ["cat", "a dog"], "2": ["Paris", "France"], "3": ["red"]}
    # EM: 1, 0, 0; F1: 1, max(2*(1/3)*1/(4/3)=0.5, 0.5), 0
    scores = squad_v1_scores(predictions, references)
    assert scores == {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(50.0)}
    metric = load_metric("squad")
    module = metric.compute(
        predictions=[{"id": k, "prediction_text": v} for k, v in predictions.items()],
        references=[{"id": k, "answers": {"text": v, "answer_start": [0] * len(v)}} for k, v in references.items()],
    )
    assert module == pytest.approx(scores)
    # A question without a prediction scores 0: the mean is over the references, as the official script takes it.
    assert squad_v1_scores({"1": "cat"}, {"1": ["cat"], "2": ["dog"]}) == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(50.0)}


def test_qa_squad_v2_metric_splits_and_best_threshold():
    predictions = {"q1": "alice", "q2": "x", "q3": "y", "q4": ""}
    references = {"q1": ["Alice"], "q2": [], "q3": ["bob"], "q4": []}
    na = {"q1": 0.1, "q2": 0.6, "q3": 0.8, "q4": 0.9}
    scores = squad_v2_scores(predictions, references, na)
    assert scores["exact"] == pytest.approx(50.0) and scores["f1"] == pytest.approx(50.0)
    assert scores["HasAns_exact"] == pytest.approx(50.0) and scores["HasAns_total"] == 2
    assert scores["NoAns_f1"] == pytest.approx(50.0) and scores["NoAns_total"] == 2
    # Abstaining on everything scores 2/4; answering q1 (na 0.1) only scores 3/4; q2 then costs 1.
    assert scores["best_exact"] == pytest.approx(75.0) and scores["best_exact_thresh"] == pytest.approx(0.1)
    assert scores["best_f1"] == pytest.approx(75.0) and scores["best_f1_thresh"] == pytest.approx(0.1)
    module = load_metric("squad_v2").compute(
        predictions=[{"id": k, "prediction_text": v, "no_answer_probability": na[k]} for k, v in predictions.items()],
        references=[{"id": k, "answers": {"text": v, "answer_start": [0] * len(v)}} for k, v in references.items()],
    )
    assert module == pytest.approx(scores)
    # An explicit threshold turns confident no-answer predictions into abstentions.
    strict = squad_v2_scores(predictions, references, na, no_answer_threshold=0.5)
    assert strict["exact"] == pytest.approx(75.0)


def test_qa_v2_metrics_absent_from_an_eval_split_are_the_groups_it_holds_no_question_of():
    """train.metric_for_best_model=eval_NoAns_f1 on an eval split of answerable questions was refused only at the
    first evaluation, after eval_steps of training."""
    config = load_config(REPO_ROOT / "configs/qa/squad_v2.yaml", ["data.files.train=t.json", "data.files.validation=d.json"],
                         lambda task: get_task(task).Options)
    task = get_task("qa")(config)
    answered = Dataset.from_dict({"answers": [{"text": ["alice"], "answer_start": [0]}, {"text": ["bob"], "answer_start": [10]}]})
    mixed = Dataset.from_dict({"answers": [{"text": ["alice"], "answer_start": [0]}, {"text": [], "answer_start": []}]})
    unanswered = Dataset.from_dict({"answers": [{"text": [], "answer_start": []}]})
    why = "the eval split holds no unanswerable question, and SQuAD v2 scores the NoAns group over those alone"
    assert task.metrics_absent_from(answered) == {f"NoAns_{name}": why for name in ("exact", "f1", "total")}
    assert set(task.metrics_absent_from(unanswered)) == {"HasAns_exact", "HasAns_f1", "HasAns_total"}
    assert task.metrics_absent_from(mixed) == {}
    for examples in (answered, mixed, unanswered):  # what the metric reports on each, whatever the predictions
        predictions = [{"prediction_text": "alice", "no_answer_probability": 0.3}] * len(examples)
        reported = task.compute_metrics(predictions, examples)
        assert set(reported) == set(task.metric_names()) - set(task.metrics_absent_from(examples))
    version_1 = get_task("qa")(load_config(REPO_ROOT / "configs/qa/squad.yaml", ["data.files.train=t.json", "data.files.validation=d.json"],
                                           lambda task: get_task(task).Options))
    assert version_1.metrics_absent_from(unanswered) == {}


# ----- configs and bad input ---------------------------------------------------------------------
@pytest.mark.parametrize("name, v2", [("squad", False), ("squad_v2", True)])
def test_qa_configs_load(name, v2):
    path = REPO_ROOT / "configs" / "qa" / f"{name}.yaml"
    assert path.read_text().startswith("# Run:")
    config = load_config(path, ["data.files.train=t.json", "data.files.validation=d.json"], lambda task: get_task(task).Options)
    assert config.task == "qa" and config.task_options.version_2_with_negative is v2
    assert config.data.path == f"rajpurkar/{name}" and config.data.files == {"train": "t.json", "validation": "d.json"}
    assert config.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2"
    assert (config.data.max_seq_length, config.task_options.doc_stride) == (384, 128)


def squad_file(path: Path, items: list[tuple[str, str, list]]) -> Path:
    qas = [{"id": f"q{i}", "question": q, "answers": answers} for i, (q, c, answers) in enumerate(items)]
    paragraphs = [{"context": c, "qas": [qa]} for (q, c, answers), qa in zip(items, qas)]
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


def build_task(tmp_path, tiny_bert, train_items, **qa):
    valid = squad_file(tmp_path / "dev.json", [("who is it ?", "the film was good", [{"text": "film", "answer_start": 4}])])
    qa = {"doc_stride": 8, **qa}
    config = qa_config(tmp_path, tiny_bert, {"train": squad_file(tmp_path / "train.json", train_items), "validation": valid}, **qa)
    task = get_task("qa")(config)
    raw = task.load()
    task.build_tokenizer(raw)
    return task, raw


def test_qa_answer_mismatch_fails_or_is_skipped_with_a_count(tmp_path, tiny_bert, caplog):
    items = [
        ("who is it ?", "the film was good", [{"text": "film", "answer_start": 4}]),
        ("who is it ?", "the plot was good", [{"text": "plot", "answer_start": 5}]),
        ("who is it ?", "the story was good", [{"text": "actors", "answer_start": 4}]),
    ]
    task, raw = build_task(tmp_path, tiny_bert, items)
    with pytest.raises(DataError, match=r"2 training example\(s\).*example 2 \(id 'q1'\).*'plot' at 5.*'lot '"):
        task.preprocess(raw["train"], train=True)
    task, raw = build_task(tmp_path, tiny_bert, items, answer_mismatch="skip")
    features = task.preprocess(raw["train"], train=True)
    assert len(features) == 1
    assert "2 training example(s)" in caplog.text and "'q1'" in caplog.text


def test_qa_answers_that_no_window_holds_are_counted_in_a_warning(tmp_path, tiny_bert, caplog):
    words = [WORDS[i % len(WORDS)] for i in range(40)]
    long_answer = " ".join(words[10:30])  # 20 words: more than a 24-token window's room for context
    short = ("who is it ?", "the film was good", [{"text": "film", "answer_start": 4}])
    items = [("who is it ?", " ".join(words), [{"text": long_answer, "answer_start": len(" ".join(words[:10])) + 1}]), short]
    task, raw = build_task(tmp_path, tiny_bert, items)
    features = task.preprocess(raw["train"], train=True)
    assert all(start == cls for start, cls, index in zip(features["start_positions"], features["cls_index"], features["example_index"]) if index == 0)
    assert "1 of 2 answered training example(s)" in caplog.text and "example 1 (id 'q0')" in caplog.text
    caplog.clear()
    task, raw = build_task(tmp_path, tiny_bert, [short, short])
    task.preprocess(raw["train"], train=True)
    assert "no window" not in caplog.text


def test_qa_long_question_and_empty_context_name_the_example(tmp_path, tiny_bert):
    long_question = " ".join(WORDS * 2)
    task, raw = build_task(tmp_path, tiny_bert, [("who ?", "film", [{"text": "film", "answer_start": 0}]), (long_question, "the film", [{"text": "film", "answer_start": 4}])])
    with pytest.raises(DataError, match=r"split 'train' \(data.files.train: .*\), example 2 \(id 'q1'\): the question has \d+ tokens"):
        task.preprocess(raw["train"], train=True)
    with pytest.raises(DataError, match=r"split 'train' \(data.files.train: .*\), example 2 \(id 'q1'\): the context is empty"):
        build_task(tmp_path, tiny_bert, [("who ?", "film", [{"text": "film", "answer_start": 0}]), ("who ?", "  ", [])])


@pytest.mark.parametrize("question, context, message", [
    ("", "the film", r"example 2 \(id 'q1'\): the question is blank"),
    (" \t\u200b", "the film", r"example 2 \(id 'q1'\): the question is blank"),
    ("who ?", "\u200b\ufeff\u200f", r"example 2 \(id 'q1'\): the context is empty"),
])
def test_qa_blank_question_or_invisible_context_names_the_example(tmp_path, tiny_bert, question, context, message):
    # Both were answered in silence: a blank question from the context alone; a context of zero-width
    # characters (it passes str.strip) with "" here, and with an invisible piece on byte-level BPE.
    good = ("who ?", "film", [{"text": "film", "answer_start": 0}])
    with pytest.raises(DataError, match=rf"split 'train' \(data.files.train: .*\), {message}"):
        build_task(tmp_path, tiny_bert, [good, (question, context, [])], version_2_with_negative=True)
    task, _ = build_task(tmp_path, tiny_bert, [good])
    inputs = write_jsonl(tmp_path / "input.jsonl", [{"question": "who ?", "context": "the film"},
                                                     {"id": "q1", "question": question, "context": context}])
    with pytest.raises(DataError, match=rf"--input {re.escape(str(inputs))}, {message}"):
        task.load_inputs(str(inputs))


def test_qa_unanswerable_question_needs_v2(tmp_path, tiny_bert):
    items = [("who ?", "the film", [{"text": "film", "answer_start": 4}]), ("who ?", "the film", [])]
    with pytest.raises(DataError, match=r"id 'q1'.*version_2_with_negative=true"):
        build_task(tmp_path, tiny_bert, items)
    task, raw = build_task(tmp_path, tiny_bert, items, version_2_with_negative=True)
    features = task.preprocess(raw["train"], train=True)
    assert features["start_positions"][1] == 0 and features["end_positions"][1] == 0


def test_qa_collator_drops_postprocessing_columns(tmp_path, tiny_bert):
    task, raw = build_task(tmp_path, tiny_bert, [("who ?", "the film", [{"text": "film", "answer_start": 4}])])
    features = task.preprocess(raw["validation"], train=False)
    assert {"example_index", "offset_mapping", "cls_index"} <= set(features.column_names)
    batch = task.collator(train=False)([features[0]])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    train_batch = task.collator(train=True)([task.preprocess(raw["train"], train=True)[0]])
    assert set(train_batch) == {"input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions"}



def test_qa_collator_pads_on_the_right_for_a_left_padding_tokenizer(tiny_bert):
    # XLNet's tokenizer pads on the left; labels, cls_index and offsets count a window's tokens from 0.
    tokenizer = load_tokenizer(str(tiny_bert))
    tokenizer.padding_side = "left"
    contexts = [context_with(answer_at, length=length) for answer_at, length in [(2, 4), (3, 12), (20, 30)]]
    batch = {"question": ["who is it ?"] * 3, "context": [context for context, _ in contexts],
             "answers": [{"text": ["plot actors"], "answer_start": [start]} for _, start in contexts]}
    features = prepare_features(batch, [0, 1, 2], tokenizer=tokenizer, train=True, max_length=24, doc_stride=8)
    rows = [{key: features[key][i] for key in features} for i in range(len(features["input_ids"]))]
    assert len({len(row["input_ids"]) for row in rows}) > 1
    collated = QACollator(tokenizer)(rows)
    for i, row in enumerate(rows):
        width = len(row["input_ids"])
        assert collated["input_ids"][i, :width].tolist() == row["input_ids"]
        assert collated["attention_mask"][i, :width].tolist() == [1] * width
        assert int(collated["start_positions"][i]) == row["start_positions"]


# ----- the registered pipeline -------------------------------------------------------------------
def test_qa_pipeline_is_registered_idempotently_and_answers_with_spans(tmp_path, tiny_bert):
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline
    from transformers.pipelines import PIPELINE_REGISTRY

    register_qa_pipeline()
    register_qa_pipeline()
    assert "question-answering" in PIPELINE_REGISTRY.get_supported_tasks()
    torch.manual_seed(0)
    AutoModelForQuestionAnswering.from_pretrained(tiny_bert).save_pretrained(tmp_path / "qa")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "qa")
    qa = pipeline("question-answering", model=str(tmp_path / "qa"), max_seq_len=24, doc_stride=8)
    context, _ = context_with(25)
    answer = qa(question="who is it ?", context=context)
    assert set(answer) == {"score", "start", "end", "answer"}
    assert context[answer["start"] : answer["end"]] == answer["answer"] and 0 < answer["score"] <= 1
    answers = qa(question="who is it ?", context=context, top_k=3)
    assert len(answers) == 3 and answers[0] == answer
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    batch = qa([{"question": "who is it ?", "context": context}, {"question": "what ?", "context": "the film was good"}])
    assert len(batch) == 2 and batch[0] == answer
    with pytest.raises(DataError, match="question has"):
        qa(question=" ".join(WORDS * 2), context=context)


def test_qa_pipeline_refuses_a_blank_question_or_an_invisible_context(tmp_path, tiny_bert):
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline

    register_qa_pipeline()
    AutoModelForQuestionAnswering.from_pretrained(tiny_bert).save_pretrained(tmp_path / "qa")
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "qa")
    qa = pipeline("question-answering", model=str(tmp_path / "qa"), max_seq_len=24, doc_stride=8)
    with pytest.raises(ValueError, match="the question is blank"):
        qa(question="  ", context="the film was good")
    with pytest.raises(ValueError, match="the context is empty"):
        qa(question="who ?", context="\u200b\ufeff")


def test_qa_pipeline_windows_fit_a_checkpoint_with_fewer_positions_than_384(tmp_path, tiny_bert):
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline

    register_qa_pipeline()
    torch.manual_seed(0)
    AutoModelForQuestionAnswering.from_pretrained(tiny_bert).save_pretrained(tmp_path / "qa")  # 64 positions
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path / "qa")  # model_max_length 64
    qa = pipeline("question-answering", model=str(tmp_path / "qa"))  # not a bertpipe run: no saved defaults
    context, _ = context_with(60, length=90)
    assert len(qa.tokenizer(context)["input_ids"]) > 64
    answer = qa(question="who is it ?", context=context)
    assert context[answer["start"] : answer["end"]] == answer["answer"] and 0 < answer["score"] <= 1
    # The same as windows of the model's length given explicitly (stride: half of it, as transformers 4).
    assert qa(question="who is it ?", context=context, max_seq_len=64, doc_stride=32) == answer


@pytest.mark.parametrize("family, saved_side, question_first", [("modernbert-gemma", "left", True), ("bert", "left", True),
                                                                  ("xlnet", "right", False)])
def test_qa_new_run_reads_the_pair_in_the_order_its_template_reads_whatever_side_the_tokenizer_pads(
        family, saved_side, question_first, tmp_path):
    # A tokenizer with no CLS token saved to pad left (GemmaTokenizer's default) put the context first, so position 0,
    # the no-answer label of every window without the answer, was a context piece: 34 of 60 answers exact against 59.
    import json

    from tasks.qa.task import QATask
    from tasks.qa.windows import prepare_features
    from tests.families.builders import build_family

    checkpoint = build_family(family, tmp_path / "checkpoint")
    settings = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": saved_side}))
    context = "Alice lives in Paris . " + "the man saw a film today . " * 6 + "Bob works in Berlin today ."
    row = {"id": "q1", "question": "where does Bob work ?", "context": context,
           "answers": {"text": ["Berlin"], "answer_start": [context.index("Berlin")]}}
    files = {split: write_jsonl(tmp_path / f"{split}.jsonl", [row]) for split in ("train", "validation")}
    task = QATask(qa_config(tmp_path, checkpoint, files, doc_stride=8))
    tokenizer = task.build_tokenizer(task.load())
    assert tokenizer.padding_side == ("right" if question_first else "left")
    batch = {key: [row[key]] for key in ("question", "context", "answers")}
    features = prepare_features(batch, [0], tokenizer=tokenizer, max_length=32, doc_stride=8, train=True)
    encoded = tokenizer(row["question"], row["context"], truncation="only_second", max_length=32, stride=8,
                        return_overflowing_tokens=True) if question_first else None
    context_id = 1 if question_first else 0
    answered = 0
    for window, (start, end) in enumerate(zip(features["start_positions"], features["end_positions"])):
        pieces = tokenizer.convert_ids_to_tokens(features["input_ids"][window][start:end + 1])
        if "".join(pieces).replace("▁", "").replace("Ġ", "").replace("##", "").strip().lower() == "berlin":
            answered += 1
        else:  # no answer here: the label is a position no answer can take, never a context piece
            sequence_ids = (encoded.sequence_ids(window) if encoded is not None else
                            tokenizer(row["context"], row["question"], truncation="only_first", max_length=32, stride=8,
                                      return_overflowing_tokens=True).sequence_ids(window))
            assert start == end and sequence_ids[start] != context_id, (window, pieces)
    assert answered >= 1 and len(features["input_ids"]) > 2
    tokenizer.save_pretrained(tmp_path / "saved")  # the run folder's side: predict and pipeline() read the pair alike
    assert json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["padding_side"] == tokenizer.padding_side

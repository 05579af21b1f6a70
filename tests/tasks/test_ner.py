"""Units of the NER task: windows, label alignment, window merging, readers, checks, seqeval, entities."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pipelines.config_loading import load_config
from pipelines.errors import DataError
from pipelines.metrics import load_metric
from tasks import get_task
from tasks.ner import (
    IGNORE_INDEX, NerTask, align_labels, b_to_i_map, check_sentence, first_piece_words, join_words, order_labels,
    read_conll, read_json_rows, select_word_predictions, split_words, tokenize_and_align, word_entities, word_tags, word_windows,
)
from tasks.ner.entities import word_records
from tests.conftest import REPO_ROOT, build_tiny_bert, shared_path

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC"]
L = {name: i for i, name in enumerate(LABELS)}


# ----- label alignment -------------------------------------------------------------------------
def test_ner_b_to_i_map_sends_b_to_its_i_and_keeps_the_rest():
    # B-MISC has no I-MISC in this label set: it stays itself.
    assert b_to_i_map(LABELS) == [0, 2, 2, 4, 4, 5]


def test_ner_align_labels_first_sub_token_ignores_continuations():
    # [CLS] Jo ##hn Smith lives in Ber ##lin [SEP]: words 0..4, pieces of John and Berlin split.
    word_ids = [None, 0, 0, 1, 2, 3, 4, 4, None]
    words = [L["B-PER"], L["I-PER"], L["O"], L["O"], L["B-LOC"]]
    labels = align_labels(word_ids, words, label_all_tokens=False, b_to_i=b_to_i_map(LABELS))
    assert labels == [-100, L["B-PER"], -100, L["I-PER"], L["O"], L["O"], L["B-LOC"], -100, -100]


def test_ner_align_labels_all_tokens_turns_b_continuations_into_i():
    word_ids = [None, 0, 0, 0, 1, 1, 2, 2, None]
    words = [L["B-PER"], L["I-PER"], L["B-MISC"]]
    labels = align_labels(word_ids, words, label_all_tokens=True, b_to_i=b_to_i_map(LABELS))
    assert labels == [-100, L["B-PER"], L["I-PER"], L["I-PER"], L["I-PER"], L["I-PER"], L["B-MISC"], L["B-MISC"], -100]


def test_ner_first_piece_words_marks_only_first_pieces_with_sentence_indices():
    assert first_piece_words([None, 0, 0, 1, 2, 2, None], offset=5) == [-1, 5, -1, 6, 7, -1, -1]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = build_tiny_bert(tmp_path_factory.mktemp("ner-tok"))
    return AutoTokenizer.from_pretrained(folder)


def test_ner_an_entity_word_the_tokenizer_gives_no_piece_is_refused_naming_its_sentence(tokenizer):
    # BERT's tokenizer drops U+FFFD and a lone combining mark: tagged B-MISC, the word could never be predicted and
    # the entity was counted as missed, without a word. Tagged O, it is left out of the windows as before.
    for word in ("\ufffd", "\u0301"):
        assert tokenizer(word, add_special_tokens=False)["input_ids"] == []
        with pytest.raises(DataError, match=rf"^train.txt:4: word 3 '{word}' is tagged 'B-MISC' but the tokenizer gives it no piece"):
            tokenize_and_align(
                {"tokens": [["the", "man", "saw", word, "today"]], "tags": [["O", "O", "O", "B-MISC", "O"]], "location": ["train.txt:4"]},
                [0], tokenizer=tokenizer, max_length=64, stride=8, label2id=L, label_all_tokens=False, b_to_i=b_to_i_map(LABELS),
            )
    features = tokenize_and_align(
        {"tokens": [["the", "\ufffd", "today"]], "tags": [["O", "O", "O"]], "location": ["train.txt:9"]},
        [0], tokenizer=tokenizer, max_length=64, stride=8, label2id=L, label_all_tokens=False, b_to_i=b_to_i_map(LABELS),
    )
    assert [w for w in features["word_index"][0] if w >= 0] == [0, 2]


def test_ner_tokenize_and_align_labels_each_word_once_on_real_word_pieces(tokenizer):
    words = ["Storyfilmwarm", "visited", "Brightplotville", "on", "monday"]  # rare words break into several pieces
    tags = ["B-PER", "O", "B-LOC", "O", "O"]
    features = tokenize_and_align(
        {"tokens": [words], "tags": [tags]}, [0], tokenizer=tokenizer, max_length=64, stride=8,
        label2id=L, label_all_tokens=False, b_to_i=b_to_i_map(LABELS),
    )
    assert len(features["input_ids"]) == 1
    labels, word_index = features["labels"][0], features["word_index"][0]
    assert len(features["input_ids"][0]) > len(words) + 2  # the test really exercises word pieces
    assert [LABELS[label] for label in labels if label != IGNORE_INDEX] == tags
    assert [w for w in word_index if w >= 0] == [0, 1, 2, 3, 4]
    # Labels sit exactly on the first pieces.
    assert [i for i, label in enumerate(labels) if label != IGNORE_INDEX] == [i for i, w in enumerate(word_index) if w >= 0]

    all_pieces = tokenize_and_align(
        {"tokens": [words], "tags": [tags]}, [0], tokenizer=tokenizer, max_length=64, stride=8,
        label2id=L, label_all_tokens=True, b_to_i=b_to_i_map(LABELS),
    )["labels"][0]
    word_ids = tokenizer(words, is_split_into_words=True).word_ids()
    expected = [IGNORE_INDEX if w is None else L[tags[w]] for w in word_ids]
    for position in range(1, len(word_ids)):
        word = word_ids[position]
        if word is not None and word == word_ids[position - 1] and tags[word].startswith("B-"):
            expected[position] = L["I-" + tags[word][2:]]
    assert all_pieces == expected
    assert all_pieces.count(L["I-PER"]) >= 1 and all_pieces.count(L["I-LOC"]) >= 1  # continuations: B -> I


# ----- windows over long sentences -------------------------------------------------------------
def test_ner_word_windows_hand_made():
    # pieces per word:    0  1  2  3  4  5  6
    counts = [1, 2, 3, 1, 1, 2, 1]
    # Budget 4: [0,2) = 3 pieces (word 2 would make 6). Stepping back over word 1 (2 pieces <= stride)
    # would leave no room for word 2, so the next window starts at word 2: [2,4) = 4 pieces. Then the
    # overlap takes word 3 (1 piece) but not word 2 (3 more): [3,6), then word 5 (2 pieces): [5,7).
    assert word_windows(counts, max_pieces=4, stride=2) == [(0, 2), (2, 4), (3, 6), (5, 7)]
    assert word_windows(counts, max_pieces=4, stride=0) == [(0, 2), (2, 4), (4, 7)]
    assert word_windows(counts, max_pieces=100, stride=10) == [(0, 7)]
    assert word_windows([], max_pieces=4, stride=2) == []


def test_ner_word_windows_word_longer_than_the_budget_gets_its_own_window():
    assert word_windows([1, 9, 1], max_pieces=4, stride=0) == [(0, 1), (1, 2), (2, 3)]


def test_ner_word_windows_cover_every_word_within_budget_and_advance():
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = rng.integers(1, 5, size=rng.integers(1, 80)).tolist()
        budget, stride = int(rng.integers(4, 20)), int(rng.integers(0, 12))
        windows = word_windows(counts, budget, stride)
        covered = set()
        for (start, end), following in zip(windows, windows[1:] + [None]):
            assert end > start and (sum(counts[start:end]) <= budget or end - start == 1)
            if following is not None:
                assert start < following[0] <= end  # windows advance and leave no gap
            covered.update(range(start, end))
            if following is not None:
                assert following[1] > end  # no window is contained in the one before
        assert covered == set(range(len(counts)))
        assert windows[-1][1] == len(counts)


def test_ner_long_sentence_windows_lose_no_word(tokenizer):
    words = [f"w{i}" if i % 3 else "Brightplotville" for i in range(150)]
    tags = ["B-LOC" if i % 3 == 0 else "O" for i in range(150)]
    features = tokenize_and_align(
        {"tokens": [words], "tags": [tags]}, [7], tokenizer=tokenizer, max_length=24, stride=6,
        label2id=L, label_all_tokens=False, b_to_i=b_to_i_map(LABELS),
    )
    assert len(features["input_ids"]) > 5
    assert all(len(ids) <= 24 for ids in features["input_ids"])
    assert set(features["example_index"]) == {7}
    seen = {w for window in features["word_index"] for w in window if w >= 0}
    assert seen == set(range(150))
    # Each window labels its words with their own tags.
    for labels, word_index in zip(features["labels"], features["word_index"]):
        assert [LABELS[l] for l in labels if l != IGNORE_INDEX] == [tags[w] for w in word_index if w >= 0]
    # Every word gets a prediction when the windows are merged back.
    widths = max(len(ids) for ids in features["input_ids"])
    tag_ids = np.zeros((len(features["input_ids"]), widths), dtype=np.int64)
    chosen, _, context = select_word_predictions(tag_ids, np.ones_like(tag_ids, dtype=float), [0] * len(tag_ids), features["word_index"], [150])
    assert all(tag >= 0 for tag in chosen[0]) and min(context[0]) >= 0


def test_ner_select_word_predictions_prefers_the_window_with_most_context():
    # Example 0 has 4 words in two windows: [CLS] w0 w1 w2 [SEP] and [CLS] w1 w2 w3 [SEP].
    word_index = [[-1, 0, 1, 2, -1], [-1, 1, 2, 3, -1], [-1, 0, -1]]
    tag_ids = np.array([[9, 1, 1, 1, 9], [9, 2, 2, 2, 9], [9, 5, 9, -100, -100]])  # batches padded on dim 1
    scores = np.array([[0, .1, .2, .3, 0], [0, .4, .5, .6, 0], [0, .7, 0, 0, 0]])
    tags, chosen_scores, context = select_word_predictions(tag_ids, scores, [0, 0, 1], word_index, [4, 2])
    # w1 sits in the middle of window 0 (context 2) but at the edge-1 of window 1 (context 1).
    # w2: context 1 in window 0, 2 in window 1.
    assert tags[0] == [1, 1, 2, 2]
    assert chosen_scores[0] == [.1, .2, .5, .6]
    assert context[0] == [1, 2, 2, 1]
    assert tags[1] == [5, -1]  # example 1's second word has no piece in any window


# ----- readers and checks --------------------------------------------------------------------------
CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC


Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_ner_read_conll_skips_docstart_and_blank_lines(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(CONLL)
    sentences = read_conll(path)
    assert [s["tokens"] for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert [s["tags"] for s in sentences] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"]]
    assert [s["location"] for s in sentences] == [f"{path}:3", f"{path}:8"]
    assert read_conll(path, tag_column=1)[1]["tags"] == ["NNP", "NNP"]
    assert read_conll(path, tag_column=2)[0]["tags"] == ["B-NP", "B-VP", "B-NP"]


def test_ner_read_conll_ignores_a_byte_order_mark_and_crlf_line_ends(tmp_path):
    path = tmp_path / "windows.txt"
    path.write_bytes(b"\xef\xbb\xbf" + CONLL.replace("\n", "\r\n").encode())
    sentences = read_conll(path)  # not a sentence "\ufeff-DOCSTART-" tagged O
    assert [s["tokens"] for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert [s["tags"] for s in sentences] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"]]
    assert [s["location"] for s in sentences] == [f"{path}:3", f"{path}:8"]


def test_ner_read_conll_keeps_a_no_break_space_inside_its_token(tmp_path):
    # str.split() also cut at the no-break space of "10\u00a0000": one column too many, and the file was refused.
    path = tmp_path / "french.conll"
    path.write_text("Il\tO\n10\u00a0000\tO\neuros\tO\n \t \nParis\u00a0Nord B-LOC\n", encoding="utf-8")
    sentences = read_conll(path)
    assert [s["tokens"] for s in sentences] == [["Il", "10\u00a0000", "euros"], ["Paris\u00a0Nord"]]
    assert [s["tags"] for s in sentences] == [["O", "O", "O"], ["B-LOC"]]


def test_ner_predict_reads_a_conll_file_of_tokens_without_tags(tmp_path):
    """Text to tag often comes one token per line: predict takes it (train files still need a tag column)."""
    path = _write(tmp_path / "test.conll", "-DOCSTART-\n\nPeter\nBlackburn\n\nRome\n")
    task = _task(tmp_path, {"train": _write(tmp_path / "train.txt", CONLL)})
    inputs = task.load_inputs(str(path))
    assert inputs["tokens"] == [["Peter", "Blackburn"], ["Rome"]] and inputs["location"] == [f"{path}:3", f"{path}:6"]
    with pytest.raises(DataError, match=rf"{path}:3: a CoNLL line needs a token and a tag column"):
        read_conll(path)


def test_ner_predict_reads_a_txt_of_conll_columns_with_the_runs_tags_as_conll(tmp_path):
    """Training reads a .txt as CoNLL columns; predict read the same eval file as raw text, one "sentence" per
    token line ("Peter NNP B-NP B-PER", an entity "NNP B-NP"), with exit status 0."""
    task = _task(tmp_path, {"train": _write(tmp_path / "train.txt", CONLL)})
    task.label_names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
    inputs = task.load_inputs(str(_write(tmp_path / "valid.txt", CONLL)))
    assert inputs["tokens"] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]] and "text" not in inputs.column_names

    # Raw text stays raw text: lines whose last word is not one of the run's tags, or of one column, or ragged.
    for text in ("Peter visited Rome\nand left\n", "Peter O\nRome\n", "Peter B-PER\nvisited Rome O\n", "Peter\n"):
        inputs = task.load_inputs(str(_write(tmp_path / "raw.txt", text)))
        assert inputs["text"] == text.splitlines(), text


def test_ner_lenient_reading_chunks_bilou_tags_as_bilou():
    """seqeval's lenient reading knows B/I/E/S, not L/U: U-PER U-PER was one entity "Alice Bob", and B-LOC L-LOC
    U-LOC one "New York Paris", in the metric (P/R/F1 0.33/0.5/0.4 for a perfect prediction of four entities
    but one) and in predict's and pipeline()'s entities."""
    text = "Alice Bob in New York Paris"
    offsets = [span for _, span in split_words(text)]
    tags = ["U-PER", "U-PER", "O", "B-LOC", "L-LOC", "U-LOC"]
    entities = word_entities(tags, [0.5] * 6, offsets, text)
    assert [(e["entity_group"], e["word"]) for e in entities] == [("PER", "Alice"), ("PER", "Bob"), ("LOC", "New York"), ("LOC", "Paris")]


def test_ner_lenient_metric_of_bilou_tags_counts_each_entity(tmp_path):
    from datasets import Dataset

    task = _task(tmp_path, {})
    task.label_names = ["O", "B-PER", "I-PER", "L-PER", "U-PER", "B-LOC", "L-LOC", "U-LOC"]
    references = Dataset.from_dict({"tags": [["U-PER", "U-PER", "O", "B-LOC", "L-LOC", "U-LOC"]]})
    metrics = task.compute_metrics({"tags": [["U-PER", "U-PER", "O", "B-LOC", "L-LOC", "O"]]}, references)
    assert (metrics["precision"], metrics["recall"], metrics["PER_recall"], metrics["LOC_recall"]) == (1.0, 0.75, 1.0, 0.5)


def test_ner_strict_runs_report_the_entities_their_metric_counts():
    """With ner.strict the metric drops chunks that are invalid in the scheme (an I- without its B- in IOB2);
    predict reported the lenient reading's entities."""
    text = "Peter Blackburn visited Rome"
    offsets = [span for _, span in split_words(text)]
    tags = ["I-PER", "I-PER", "O", "B-LOC"]
    lenient = word_entities(tags, [0.5] * 4, offsets, text)
    strict = word_entities(tags, [0.5] * 4, offsets, text, strict_scheme="IOB2")
    assert [e["word"] for e in lenient] == ["Peter Blackburn", "Rome"] and [e["word"] for e in strict] == ["Rome"]
    assert strict == lenient[1:]


def test_ner_tags_that_name_no_chunks_are_reported_word_by_word():
    """POS tags are no chunks: NNP NNP VBZ was "entities" NP 'EU Commission' and BZ 'rejects'; and a word no window
    held took the tag set's first tag as if predicted."""
    assert word_tags([0, 2, -1], ["NNP", "VBZ", "JJ"]) == ["NNP", "JJ", None]
    assert word_tags([1, -1], ["O", "B-PER"]) == ["B-PER", "O"]
    text = "EU  rejects"
    records = word_records(["NNP", "VBZ"], [0.91, 0.5], [span for _, span in split_words(text)], text)
    assert records == [{"entity": "NNP", "word": "EU", "start": 0, "end": 2, "score": 0.91},
                       {"entity": "VBZ", "word": "rejects", "start": 4, "end": 11, "score": 0.5}]


def test_ner_rows_of_json_and_parquet_files_count_from_1_as_every_other_message_does(tmp_path):
    # They counted from 0: "row 1" named the second row of a jsonl input, "record 0" the first of a json list.
    task = _task(tmp_path, {"train": _write(tmp_path / "train.txt", CONLL)})
    inputs = _write(tmp_path / "inputs.jsonl", json.dumps({"tokens": ["Rome"]}) + "\n" + json.dumps({"tokens": ["Rome", 7]}) + "\n")
    with pytest.raises(DataError, match=rf"{inputs}, row 2: 'tokens' must be a list of strings"):
        task.load_inputs(str(inputs))
    listed = _write(tmp_path / "listed.json", json.dumps([{"tokens": ["Rome"], "ner_tags": ["B-LOC"]}]))
    assert [row["location"] for row in read_json_rows(listed)] == [f"{listed}, record 1"]


def test_ner_predict_inputs_of_the_wrong_kind_are_refused_naming_the_row_and_csv_text_is_read_as_written(tmp_path):
    # A tokens string was read as its letters (one-letter entities, exit 0); a text number or list, and a row of text
    # among rows of tokens, ended in a TypeError traceback; a csv text of digits was read as a number.
    task = _task(tmp_path, {"train": _write(tmp_path / "train.txt", CONLL)})
    cases = [
        ("string.jsonl", json.dumps({"tokens": "Alice lives in Paris"}) + "\n", r", row 1: 'tokens' must be a list of strings, not 'Alice"),
        ("mixed.jsonl", json.dumps({"tokens": ["Alice", "lives"]}) + "\n" + json.dumps({"text": "Bob works"}) + "\n",
         r", row 2: 'tokens' must be a list of strings, not None \(every row of an input gives a 'tokens' word list, or every row a 'text'"),
        ("number.jsonl", json.dumps({"text": 5}) + "\n", r": 'text' holds int64 values, not text"),
        ("list.jsonl", json.dumps({"text": ["Alice", "lives"]}) + "\n", r": 'text' holds List values, not text"),
    ]
    for name, content, message in cases:
        inputs = _write(tmp_path / name, content)
        with pytest.raises(DataError, match=re.escape(str(inputs)) + message):
            task.load_inputs(str(inputs))
    digits = _write(tmp_path / "years.csv", "text\n007 Bond\n1996\n")
    assert task.load_inputs(str(digits))["tokens"] == [["007", "Bond"], ["1996"]]


def test_ner_predict_inputs_without_a_word_or_with_an_empty_text_cell_are_refused_naming_them(tmp_path):
    # No word at all (a .conll file of -DOCSTART- only, rows of empty word lists) ended in a traceback from batching,
    # exit 1; an empty or missing jsonl/csv text cell was tagged as "" (the README: an empty text cell is an error).
    task = _task(tmp_path, {"train": _write(tmp_path / "train.txt", CONLL)})
    for name, content in (("docstart.conll", "-DOCSTART- -X- -X- O\n\n"), ("empty.conll", ""), ("no_words.jsonl", '{"tokens": []}\n')):
        inputs = _write(tmp_path / name, content)
        with pytest.raises(DataError, match=rf"input file {re.escape(str(inputs))} holds no words to tag"):
            task.load_inputs(str(inputs))
    for name, content in (("empty.jsonl", '{"text": "Alice visited Rome"}\n{"text": ""}\n'), ("null.jsonl", '{"text": "Rome"}\n{"text": null}\n'),
                          ("missing.jsonl", '{"text": "Rome"}\n{"id": 4}\n'), ("cell.csv", "id,text\n1,Alice visited Rome\n2,\n")):
        inputs = _write(tmp_path / name, content)
        with pytest.raises(DataError, match=rf"--input {re.escape(str(inputs))}\), row 2: empty 'text' cell"):
            task.load_inputs(str(inputs))
    # A txt input's blank line is a line without entities, kept in place.
    lines = _write(tmp_path / "lines.txt", "Alice visited Rome\n\nBob\n")
    assert task.load_inputs(str(lines))["tokens"] == [["Alice", "visited", "Rome"], [], ["Bob"]]


def test_ner_read_json_rows_takes_a_byte_order_mark(tmp_path):
    # json refused the first line ("Unexpected UTF-8 BOM") of a file a Windows editor saved.
    for name, text in (("rows.jsonl", json.dumps({"tokens": ["Rome"], "ner_tags": ["B-LOC"]}) + "\n"),
                       ("rows.json", json.dumps([{"tokens": ["Rome"], "ner_tags": ["B-LOC"]}]))):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8-sig")
        assert [(row["tokens"], row["ner_tags"]) for row in read_json_rows(path)] == [(["Rome"], ["B-LOC"])]


def test_ner_read_conll_wrong_column_count_names_file_and_line(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_text(CONLL.replace("rejects VBZ B-VP O", "rejects VBZ O"))
    with pytest.raises(DataError, match=rf"{path}:4: 3 columns where the file has 4 \(as on line 3\)"):
        read_conll(path)
    good = _write(tmp_path / "ok.txt", CONLL)
    with pytest.raises(DataError, match=rf"{good}:3: ner.conll_tag_column=7 but the file has 4 columns"):
        read_conll(good, tag_column=7)


def _write(path, text):
    path.write_text(text)
    return path


def test_ner_check_sentence_errors_name_the_location():
    labels = set(LABELS)
    check_sentence(["Peter", "said"], ["B-PER", "O"], labels, "f.jsonl:3")
    with pytest.raises(DataError, match=r"f.jsonl:3: 2 tokens but 1 tags"):
        check_sentence(["Peter", "said"], ["B-PER"], labels, "f.jsonl:3")
    with pytest.raises(DataError, match=r"f.jsonl:4: word 1 'Acme' has tag 'B-ORG', which is not in the label set"):
        check_sentence(["at", "Acme"], ["O", "B-ORG"], labels, "f.jsonl:4")
    with pytest.raises(DataError, match=r"f.jsonl:5: empty sentence"):
        check_sentence([], [], labels, "f.jsonl:5")
    check_sentence(["Peter", "", "\ufeff", "said"], ["B-PER", "O", "O", "O"], labels, "f.jsonl:6")  # tagged O: as predicted


def test_ner_order_labels_puts_o_first_and_groups_by_type():
    assert order_labels({"I-PER", "B-LOC", "O", "B-PER", "S-LOC", "I-LOC"}) == ["O", "B-LOC", "I-LOC", "S-LOC", "B-PER", "I-PER"]
    assert order_labels({"NN", "DT", "VB"}) == ["DT", "NN", "VB"]


def _task(tmp_path, files: dict, **ner) -> NerTask:
    overrides = [f"data.files.{split}={path}" for split, path in files.items()] + [f"ner.{k}={json.dumps(v)}" for k, v in ner.items()]
    config = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [f"output_dir={tmp_path / 'run'}", *overrides], lambda name: get_task(name).Options)
    return NerTask(config)


def test_ner_load_reads_conll_and_jsonl_and_infers_the_label_set(tmp_path):
    train = _write(tmp_path / "train.txt", CONLL)
    validation = _write(tmp_path / "validation.jsonl", json.dumps({"tokens": ["Peter", "left"], "ner_tags": ["B-PER", "O"]}) + "\n")
    task = _task(tmp_path, {"train": train, "validation": validation})
    raw = task.load()
    # label_all_tokens (the default) adds I-X for B-X: the tag of a one-word entity's later pieces.
    assert task.label_names == ["O", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    first_pieces_only = _task(tmp_path, {"train": train, "validation": validation}, label_all_tokens=False)
    first_pieces_only.load()
    assert first_pieces_only.label_names == ["O", "B-MISC", "B-ORG", "B-PER", "I-PER"]
    assert raw["validation"][0] == {"tokens": ["Peter", "left"], "tags": ["B-PER", "O"], "location": f"{validation}:1"}
    assert raw["train"]["location"] == [f"{train}:3", f"{train}:8"]


def test_ner_tag_set_comes_from_the_whole_train_file_not_the_rows_max_train_samples_keeps(tmp_path):
    # The set was taken after data.max_train_samples cut the rows: a train file whose first sentences hold only
    # ORG had its evaluation file refused for a B-PER, "not in the label set", though the train file holds it.
    rows = [{"tokens": ["Acme", "Corp", "rose"], "ner_tags": ["B-ORG", "I-ORG", "O"]}] * 2 + [{"tokens": ["Peter"], "ner_tags": ["B-PER"]}]
    train = _write(tmp_path / "train.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    validation = _write(tmp_path / "validation.jsonl", json.dumps({"tokens": ["Peter", "left"], "ner_tags": ["B-PER", "O"]}) + "\n")
    overrides = [f"data.files.train={train}", f"data.files.validation={validation}", "data.max_train_samples=2"]
    config = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [f"output_dir={tmp_path / 'run'}", *overrides], lambda name: get_task(name).Options)
    task = NerTask(config)
    raw = task.load()
    assert task.label_names == ["O", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert len(raw["train"]) == 2 and raw["validation"][0]["tags"] == ["B-PER", "O"]


def test_ner_max_seq_length_without_room_for_a_word_is_refused(tmp_path, tiny_bert):
    # At 2 every window held one word whose only piece truncation then cut: no entity, no warning, exit status 0.
    from pipelines.config import ConfigError

    train = _write(tmp_path / "train.txt", CONLL)
    overrides = [f"data.files.train={train}", f"data.files.validation={train}", f"model.name_or_path={tiny_bert}", "data.max_seq_length=2"]
    config = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [f"output_dir={tmp_path / 'run'}", *overrides], lambda name: get_task(name).Options)
    with pytest.raises(ConfigError, match=r"^data.max_seq_length=2 leaves no room for text: the tokenizer adds 2 special token\(s\) to each text; give at least 3"):
        NerTask(config).build_tokenizer(None)


def test_ner_metrics_absent_from_an_eval_split_are_the_types_no_gold_sentence_holds(tmp_path):
    """train.metric_for_best_model=eval_ORG_f1 on an eval split without an ORG: seqeval scored ORG (zeros) at an
    evaluation where the model predicted one, and at the next, where it did not, the run stopped hours in."""
    train = _write(tmp_path / "train.txt", CONLL)
    validation = _write(tmp_path / "validation.jsonl", json.dumps({"tokens": ["Peter", "left"], "ner_tags": ["B-PER", "O"]}) + "\n")
    task = _task(tmp_path, {"train": train, "validation": validation})
    raw = task.load()
    absent = task.metrics_absent_from(raw["validation"])
    assert absent == {f"{entity_type}_{name}": f"the eval split holds no {entity_type} entity"
                      for entity_type in ("MISC", "ORG") for name in ("precision", "recall", "f1")}
    assert set(task.compute_metrics({"tags": [["B-PER", "O"]]}, raw["validation"])) == set(task.metric_names()) - set(absent)
    assert task.compute_metrics({"tags": [["B-ORG", "O"]]}, raw["validation"])["ORG_f1"] == 0.0
    assert task.metrics_absent_from(raw["train"]) == {}
    pos = _task(tmp_path, {"train": train, "validation": validation}, label_names=["NN", "VB"])  # accuracy alone
    assert pos.metrics_absent_from(raw["validation"]) == {}
    # Strict IOB2 counts no entity opened by I- (IOB1 files, as the original CoNLL-2003 writes them): an eval split
    # whose only ORG is one had ORG_f1 pass the check before training and vanish at the first evaluation.
    iob1 = _write(tmp_path / "iob1.jsonl", json.dumps({"tokens": ["Peter", "saw", "the", "EU"], "ner_tags": ["B-PER", "O", "O", "I-ORG"]}) + "\n")
    strict = _task(tmp_path, {"train": train, "validation": iob1}, strict=True)
    raw = strict.load()
    absent = strict.metrics_absent_from(raw["validation"])
    assert absent["ORG_f1"] == "the eval split holds no ORG entity that strict IOB2 chunking counts" and "PER_f1" not in absent
    computed = strict.compute_metrics({"tags": [["B-PER", "O", "O", "I-ORG"]]}, raw["validation"])
    assert set(computed) == set(strict.metric_names()) - set(absent)
    lenient = _task(tmp_path, {"train": train, "validation": iob1})
    assert "ORG_f1" not in lenient.metrics_absent_from(lenient.load()["validation"])  # conlleval reads I-ORG as an entity


@pytest.mark.parametrize(
    "row, message",
    [
        ({"tokens": ["Peter", "left"], "ner_tags": ["B-PER"]}, r"validation.jsonl:2: 2 tokens but 1 tags"),
        ({"tokens": ["Acme", "left"], "ner_tags": ["B-ORGX", "O"]}, r"validation.jsonl:2: word 0 'Acme' has tag 'B-ORGX'"),
        ({"tokens": [], "ner_tags": []}, r"validation.jsonl:2: empty sentence"),
        # No piece, so predicted O: a gold entity no model could find, counted against recall without a word.
        ({"tokens": ["visited", "", "Rome"], "ner_tags": ["O", "B-PER", "O"]},
         r"validation.jsonl:2: word 1 '' holds nothing visible but is tagged 'B-PER'"),
        ({"tokens": ["Peter", "\u200b"], "ner_tags": ["B-PER", "I-PER"]},
         r"validation.jsonl:2: word 1 '\\u200b' holds nothing visible but is tagged 'I-PER'"),
    ],
)
def test_ner_load_bad_sentence_names_file_and_line(tmp_path, row, message):
    train = _write(tmp_path / "train.txt", CONLL)
    good = json.dumps({"tokens": ["Peter"], "ner_tags": ["B-PER"]})
    validation = _write(tmp_path / "validation.jsonl", good + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=message):
        _task(tmp_path, {"train": train, "validation": validation}).load()


@pytest.mark.parametrize("row, message", [
    ({"tokens": ["alice", 5, "paris"], "ner_tags": ["B-PER", "O", "B-LOC"]}, "'tokens' must be a list of strings, not ['alice', 5, 'paris']"),
    ({"tokens": "alice left", "ner_tags": ["B-PER", "O"]}, "'tokens' must be a list of strings, not 'alice left'"),
    ({"tokens": ["alice", "left"], "ner_tags": ["B-PER", 0]}, "'ner_tags' must be a list of tag names (or of tag ids, in every row alike)"),
    ({"tokens": ["alice", "left"], "ner_tags": [1, 0]}, "'ner_tags' must be a list of tag names (or of tag ids, in every row alike)"),
    ({"tokens": ["alice", "left"], "ner_tags": "B-PER O"}, "'ner_tags' must be a list of tag names"),
])
def test_ner_json_rows_of_the_wrong_types_are_refused_naming_the_row(tmp_path, row, message):
    """A number among the words ended in pyarrow's "Expected bytes, got a 'int' object": exit status 1, a traceback."""
    train = _write(tmp_path / "train.txt", CONLL)
    good = json.dumps({"tokens": ["Peter", "left"], "ner_tags": ["B-PER", "O"]})
    validation = _write(tmp_path / "validation.jsonl", good + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{validation}:2: {message}")):
        _task(tmp_path, {"train": train, "validation": validation}).load()


def test_ner_conll2003_config_loads_with_ner_options():
    config = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [], lambda name: get_task(name).Options)
    assert config.task == "ner" and config.data.path == "eriktks/conll2003"
    assert config.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2"
    assert config.task_options.label_all_tokens is True and config.task_options.stride == 32
    assert config.train.learning_rate > 5e-5 and config.train.warmup_fraction > 0


def test_ner_real_conll_files_and_hub_copy_agree(monkeypatch, tmp_path):
    mirror = shared_path("mirror")
    train_txt = shared_path("data", "conll2003", "valid.txt")
    sentences = read_conll(train_txt)
    assert len(sentences) == 3250
    monkeypatch.setenv("BERTPIPE_MIRROR", str(mirror))
    config = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [f"output_dir={tmp_path}", "data.max_train_samples=50"], lambda n: get_task(n).Options)
    task = NerTask(config)
    raw = task.load()
    assert task.label_names == ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    assert len(raw["validation"]) == 3250
    assert raw["validation"][0]["tokens"] == sentences[0]["tokens"] and raw["validation"][0]["tags"] == sentences[0]["tags"]


def test_ner_strict_evaluation_of_bilou_tags_reads_them_as_bilou(tmp_path):
    # Under the IOB2 default seqeval raised "Invalid token is found: L-PER" (a raw ValueError).
    from datasets import Dataset

    task = _task(tmp_path, {}, strict=True)
    task.label_names = ["O", "B-PER", "I-PER", "L-PER", "U-LOC"]
    references = Dataset.from_dict({"tags": [["B-PER", "I-PER", "L-PER", "O", "U-LOC"]]})
    metrics = task.compute_metrics({"tags": [["B-PER", "I-PER", "L-PER", "O", "O"]]}, references)
    assert task._strict_scheme() == "BILOU" and metrics["precision"] == 1.0 and metrics["recall"] == 0.5


# ----- seqeval -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def seqeval():
    return load_metric("seqeval")


def test_seqeval_iob2_micro_and_per_type_against_hand_counts(seqeval):
    references = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "O", "B-PER"]]
    predictions = [["B-PER", "I-PER", "O", "B-ORG", "O"], ["B-ORG", "O", "O", "B-PER"]]
    result = seqeval.compute(predictions=predictions, references=references)
    # Gold: PER x2, LOC, ORG(0-1). Predicted: PER x2 (right), ORG at 3 (wrong), ORG(0) (wrong span).
    assert result["overall_precision"] == pytest.approx(2 / 4)
    assert result["overall_recall"] == pytest.approx(2 / 4)
    assert result["overall_f1"] == pytest.approx(0.5)
    assert result["overall_accuracy"] == pytest.approx(7 / 9)
    assert result["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 2}
    assert result["LOC"]["recall"] == 0.0 and result["LOC"]["number"] == 1
    assert result["ORG"]["precision"] == 0.0


def test_seqeval_iob1_and_iobes_are_chunked_like_conlleval(seqeval):
    # IOB1: I- opens an entity; B- only splits two adjacent entities of one type.
    iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    assert seqeval.compute(predictions=iob2, references=iob1)["overall_f1"] == 1.0
    iobes = [["B-PER", "E-PER", "S-PER", "O", "S-LOC"]]
    assert seqeval.compute(predictions=iob2, references=iobes)["overall_f1"] == 1.0
    # One of three entities merged wrongly: P = 1/2 (1 of 2 predicted), R = 1/3.
    merged = [["B-PER", "I-PER", "I-PER", "O", "S-LOC"]]
    result = seqeval.compute(predictions=merged, references=iobes)
    assert result["overall_precision"] == pytest.approx(1 / 2) and result["overall_recall"] == pytest.approx(1 / 3)


def test_seqeval_strict_mode_rejects_invalid_chunks(seqeval):
    references = [["O", "B-PER", "I-PER", "O"]]
    predictions = [["O", "I-PER", "I-PER", "O"]]  # a lenient reader accepts it; strict IOB2 does not
    assert seqeval.compute(predictions=predictions, references=references)["overall_f1"] == 1.0
    strict = seqeval.compute(predictions=predictions, references=references, mode="strict", scheme="IOB2")
    assert strict["overall_f1"] == 0.0 and strict["overall_accuracy"] == pytest.approx(3 / 4)
    iobes_ref = [["S-PER", "O", "B-LOC", "E-LOC"]]
    iobes_pred = [["S-PER", "O", "B-LOC", "I-LOC"]]  # unterminated entity: invalid in IOBES
    result = seqeval.compute(predictions=iobes_pred, references=iobes_ref, mode="strict", scheme="IOBES")
    assert result["overall_precision"] == 1.0 and result["overall_recall"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="needs a scheme"):
        seqeval.compute(predictions=predictions, references=references, mode="strict")


# ----- words and entities --------------------------------------------------------------------------
def test_ner_split_words_offsets_point_into_the_text():
    text = "EU rejects German call, said Peter  Blackburn in U.S. on 1996-08-22."
    words = split_words(text)
    assert [w for w, _ in words] == ["EU", "rejects", "German", "call", ",", "said", "Peter", "Blackburn", "in", "U.S", ".",
                                     "on", "1996-08-22", "."]
    assert all(text[start:end] == word for word, (start, end) in words)


def test_ner_split_words_keeps_combining_marks_and_joiners_inside_their_word():
    # Devanagari vowel signs and viramas, a decomposed accent (NFD "José"), Thai vowels, a Persian
    # zero-width non-joiner and a soft hyphen all sit inside a word, as a tokenizer's pre-tokenizer reads them.
    text = "नरेंद्र मोदी met Jose\u0301 in กรุงเทพ, می\u200cخواهم Kowal\u00adski."
    words = split_words(text)
    assert [w for w, _ in words] == [
        "नरेंद्र", "मोदी", "met", "Jose\u0301", "in", "กรุงเทพ", ",", "می\u200cخواهم", "Kowal\u00adski", ".",
    ]
    assert all(text[start:end] == word for word, (start, end) in words)


def test_ner_split_words_treats_invisible_characters_between_words_as_spaces():
    # A byte-order mark, a zero-width space, a control character, a bidi mark and a joiner after a
    # space are no words: tagged, they made entities of invisible text or split "Marguerite Kowalski" in two.
    text = "\ufeffMarguerite\u200bKowalski left\x07 Rome\u200f. \u200d👧"
    words = split_words(text)
    assert [w for w, _ in words] == ["Marguerite", "Kowalski", "left", "Rome", ".", "👧"]
    assert all(text[start:end] == word for word, (start, end) in words)
    tags = ["B-PER", "I-PER", "O", "B-LOC", "O", "O"]
    entities = word_entities(tags, [0.5] * len(tags), [span for _, span in words], text)
    assert [(e["word"], e["start"], e["end"]) for e in entities] == [("Marguerite\u200bKowalski", 1, 20), ("Rome", 27, 31)]


def test_ner_split_words_ends_a_word_before_a_joiner_that_joins_nothing_after_it():
    # "Paris\u200d❤️": the joiner joins no word characters, yet the word read "Paris\u200d" and so did its entity.
    text = "I love Paris\u200d\u2764\ufe0f today, AT&T\u200c. می\u200cخواهم"
    words = split_words(text)
    assert [w for w, _ in words] == ["I", "love", "Paris", "\u2764\ufe0f", "today", ",", "AT&T", ".", "می\u200cخواهم"]
    assert all(text[start:end] == word for word, (start, end) in words)


def test_ner_pipeline_trims_transformers_groups_to_visible_whole_graphemes():
    # transformers' own strategies on a run: a group's offsets start at a combining mark after a space (XLM-R's
    # piece for the mark) or end before a joiner; widened after trimming, they read " \u0301Paris", "Paris\u200d".
    from tasks.ner.pipeline import _trim_span
    from pipelines.graphemes import grapheme_boundaries

    for sentence, start, end in (("in \u0301Paris .", 3, 9), ("in Paris\u200d\u2764\ufe0f", 3, 8), ("in  Paris ", 3, 10)):
        group = {"entity_group": "LOC", "word": sentence[start:end].strip(), "start": start, "end": end}
        trimmed = _trim_span(group, sentence, grapheme_boundaries(sentence))
        assert (trimmed["word"], sentence[trimmed["start"] : trimmed["end"]]) == ("Paris", "Paris"), sentence
    lone = _trim_span({"entity_group": "LOC", "word": " \u0301", "start": 2, "end": 4}, "in \u0301 Paris", grapheme_boundaries("in \u0301 Paris"))
    assert lone["start"] == lone["end"]  # nothing visible: postprocess drops it


def test_ner_split_words_keeps_an_emoji_with_its_selector_modifier_or_joined_sequence():
    # Cut after the symbol, a variation selector or skin-tone modifier was a word of its own: tagged on
    # cased and byte-level tokenizers, "\ufe0f" alone could be an entity, and a flag was two words.
    text = "I \u2764\ufe0f Paris 👍\U0001f3fd 🇫🇷 👩\u200d💻 #\ufe0f\u20e3 \u00a9\ufe0f Acme $^"
    words = split_words(text)
    assert [w for w, _ in words] == [
        "I", "\u2764\ufe0f", "Paris", "👍\U0001f3fd", "🇫🇷", "👩\u200d💻", "#\ufe0f\u20e3", "\u00a9\ufe0f", "Acme", "$", "^",
    ]
    assert all(text[start:end] == word for word, (start, end) in words)
    tags = ["O", "O", "B-LOC", "O", "B-MISC", "O", "O", "O", "B-ORG", "O", "O"]
    entities = word_entities(tags, [0.5] * len(tags), [span for _, span in words], text)
    assert [(e["entity_group"], e["word"]) for e in entities] == [("LOC", "Paris"), ("MISC", "🇫🇷"), ("ORG", "Acme")]


def test_ner_split_words_makes_each_cjk_ideograph_a_word(tokenizer):
    # Chinese NER data is tagged character by character and BERT cuts every ideograph into a piece of
    # its own; as one run of word characters, "张三在北京工作" was one word, tagged by its first piece.
    text = "张三在北京工作。iPhone手机 in 東京に住む"
    words = split_words(text)
    assert [w for w, _ in words] == ["张", "三", "在", "北", "京", "工", "作", "。", "iPhone", "手", "机", "in", "東", "京", "に", "住", "む"]
    assert all(text[start:end] == word for word, (start, end) in words)
    tags = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "O", "O", "O", "O", "O", "O", "B-LOC", "I-LOC", "O", "O", "O"]
    entities = word_entities(tags, [0.5] * len(tags), [span for _, span in words], text)
    assert [(e["entity_group"], e["word"]) for e in entities] == [("PER", "张三"), ("LOC", "北京"), ("LOC", "東京")]
    # Every piece of the Chinese sentence is a first piece, so each character gets its own prediction.
    chinese = [w for w, _ in split_words("张三在北京工作")]
    windows = tokenize_and_align({"tokens": [chinese]}, [0], tokenizer=tokenizer, max_length=64, stride=8,
                                 label2id=None, label_all_tokens=False, b_to_i=[])
    assert [w for w in windows["word_index"][0] if w >= 0] == list(range(7))


def test_ner_word_entities_give_character_spans_and_word_spans():
    text = "Peter  Blackburn visited New York"
    offsets = [span for _, span in split_words(text)]
    tags = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]
    entities = word_entities(tags, [0.9, 0.7, 0.99, 0.8, 0.6], offsets, text)
    assert entities == [
        {"entity_group": "PER", "word": "Peter  Blackburn", "start": 0, "end": 16, "score": 0.8, "start_word": 0, "end_word": 2},
        {"entity_group": "LOC", "word": "New York", "start": 25, "end": 33, "score": 0.7, "start_word": 3, "end_word": 5},
    ]
    joined, spans = join_words(["Peter", "Blackburn", "left"])
    assert joined == "Peter Blackburn left" and spans == [(0, 5), (6, 15), (16, 20)]


def test_ner_read_conll_honours_the_encoding_and_names_a_bad_byte(tmp_path):
    path = tmp_path / "latin1.conll"
    path.write_bytes("Müller NNP B-NP B-PER\n".encode("latin-1"))
    assert read_conll(path, encoding="latin-1")[0]["tokens"] == ["Müller"]
    with pytest.raises(DataError, match=rf"{path}, line 1 .*0xfc is not valid utf-8"):
        read_conll(path)


# ----- the token-classification pipeline -----------------------------------------------------------
def test_ner_pipeline_transformers_aggregations_give_whole_graphemes(tmp_path, tiny_bert):
    """An explicit transformers aggregation on a run: the uncased tiny BERT strips accents, so every piece's
    offsets left out the accent of "José" (NFD) and the vowel sign ending "नमस्ते"; entities ended before them."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    import tasks.ner  # noqa: F401  (registers bertpipe's pipeline("token-classification"))

    labels = ["O", "B-PER", "I-PER"]
    model = AutoModelForTokenClassification.from_pretrained(
        tiny_bert, id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)}
    )
    model.config.task_specific_params = {"token-classification": {"aggregation_strategy": "words", "max_seq_length": 24, "stride": 8}}
    with torch.no_grad():  # every piece I-PER: one group over the whole text
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 0.0, 5.0]))
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path)
    for strategy in ("simple", "first", "none"):
        tagger = pipeline("token-classification", model=str(tmp_path), aggregation_strategy=strategy)
        for text in ("Jose\u0301", "met Jose\u0301", "नमस्ते"):
            found = tagger(text)
            assert found and found[-1]["end"] == len(text), (strategy, text, found)
            assert all(0 <= e["start"] < e["end"] <= len(text) for e in found)
        (jose,) = tagger("Jose\u0301")  # one [UNK] piece: its word is the text under its offsets
        assert jose["word"] == "Jose\u0301", strategy


def test_ner_pipeline_words_aggregation_leaves_out_the_labels_the_caller_ignores(tmp_path, tiny_bert):
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    import tasks.ner  # noqa: F401  (registers bertpipe's pipeline("token-classification"))

    labels = ["O", "B-PER", "I-PER"]
    model = AutoModelForTokenClassification.from_pretrained(
        tiny_bert, id2label=dict(enumerate(labels)), label2id={label: i for i, label in enumerate(labels)}
    )
    model.config.task_specific_params = {"token-classification": {"aggregation_strategy": "words", "max_seq_length": 24, "stride": 8}}
    with torch.no_grad():  # every piece B-PER
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 5.0, 0.0]))
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path)
    tagger = pipeline("token-classification", model=str(tmp_path))
    assert {entity["entity_group"] for entity in tagger("alice met bob")} == {"PER"}
    assert tagger("alice met bob", ignore_labels=["PER"]) == []


def test_ner_a_word_of_spaces_alone_neither_makes_nor_bounds_an_entity():
    # A word list holding " " or an NBSP (byte-level BPE gives it a piece, so the model tags it): ('LOC', ' ') came out
    # as an entity, and a B- on such a word before a name put the space into the entity's span.
    from tasks.ner.entities import join_words, word_entities

    words = ["Bob", " ", "met", "\u00a0", "Alice", "Kowalski", " "]
    text, offsets = join_words(words, " ")
    tags = ["B-PER", "B-LOC", "O", "B-PER", "I-PER", "I-PER", "I-PER"]
    entities = word_entities(tags, [0.9] * len(words), offsets, text)
    assert [(e["entity_group"], e["word"], e["start_word"], e["end_word"]) for e in entities] == [
        ("PER", "Bob", 0, 1), ("PER", "Alice Kowalski", 4, 6)]
    for entity in entities:
        assert text[entity["start"]:entity["end"]] == entity["word"] == entity["word"].strip() != ""

from __future__ import annotations

import json
import logging
import sys

import pytest

from pipelines.config import DataConfig
from pipelines.data import KeyedOnCode, finalize_splits, load_raw, require_columns, row_list
from pipelines.errors import DataError
from pipelines.files import read_inputs


def write_rows(path, rows, sep=None):
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        delimiter = "\t" if path.suffix == ".tsv" else ","
        keys = list(rows[0])
        path.write_text(delimiter.join(keys) + "\n" + "".join(delimiter.join(str(r[k]) for k in keys) + "\n" for r in rows))
    return path


ROWS = [{"text": f"sentence {i}", "label": "a" if i % 2 else "b"} for i in range(10)]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
def test_data_local_files_by_suffix(tmp_path, suffix):
    train = write_rows(tmp_path / f"train{suffix}", ROWS)
    valid = write_rows(tmp_path / f"valid{suffix}", ROWS[:3])
    raw = load_raw(DataConfig(files={"train": str(train), "validation": str(valid)}))
    assert raw["train"].column_names == ["text", "label"] and len(raw["validation"]) == 3


def test_data_missing_file_and_mixed_formats(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_raw(DataConfig(files={"train": str(tmp_path / "nope.jsonl")}))
    a = write_rows(tmp_path / "a.jsonl", ROWS)
    b = write_rows(tmp_path / "b.csv", ROWS)
    with pytest.raises(DataError, match="mixes formats"):
        load_raw(DataConfig(files={"train": str(a), "validation": str(b)}))


def test_data_sampling_and_held_out_split(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", ROWS)
    data = DataConfig(files={"train": str(train)}, validation_fraction=0.3, max_train_samples=4)
    splits = finalize_splits(load_raw(data), data, seed=0)
    assert len(splits["train"]) == 4 and len(splits["validation"]) == 3


def test_data_row_lists_count_from_one_and_say_how_many_more():
    assert row_list([0, 4, 9]) == "1, 5, 10"
    assert row_list(list(range(8)), shown=3) == "1, 2, 3 and 5 more"


def test_data_held_out_rows_follow_the_seed(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", [{"text": f"sentence {i}", "label": "a" if i % 2 else "b"} for i in range(40)])
    data = DataConfig(files={"train": str(train)}, validation_fraction=0.25)

    def held_out(seed: int) -> list[str]:
        return finalize_splits(load_raw(data), data, seed=seed)["validation"]["text"]

    assert held_out(42) == held_out(42) and held_out(42) != held_out(7)


def test_data_held_out_share_with_an_eval_split_of_its_own_is_unused_and_says_so(tmp_path, caplog):
    # The saved config records the fraction: the log says no row was held out.
    train, valid = write_rows(tmp_path / "train.jsonl", ROWS), write_rows(tmp_path / "valid.jsonl", ROWS[:3])
    data = DataConfig(files={"train": str(train), "validation": str(valid)}, validation_fraction=0.3)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        splits = finalize_splits(load_raw(data), data, seed=0)
    assert len(splits["train"]) == len(ROWS) and len(splits["validation"]) == 3
    assert [record.getMessage() for record in caplog.records] == [
        f"data.validation_fraction=0.3 unused: the data has its own 'validation' split (data.files.validation: {valid})"]


def test_data_held_out_share_that_leaves_a_side_without_rows_names_the_key_file_and_count(tmp_path):
    for rows, fraction in ((ROWS[:1], 0.5), (ROWS, 0.99)):
        train = write_rows(tmp_path / "train.jsonl", rows)
        data = DataConfig(files={"train": str(train)}, validation_fraction=fraction)
        with pytest.raises(DataError, match=rf"data.validation_fraction={fraction}: the {len(rows)} row\(s\) of split 'train' "
                                            rf"\(data.files.train: {train}\) cannot be split into training and held-out rows"):
            finalize_splits(load_raw(data), data, seed=0)


def test_data_missing_or_empty_split_is_an_error(tmp_path):
    train = write_rows(tmp_path / "train.jsonl", ROWS)
    data = DataConfig(files={"train": str(train)})
    with pytest.raises(DataError, match="split 'validation' not found.*validation_fraction"):
        finalize_splits(load_raw(data), data, seed=0)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    data = DataConfig(files={"train": str(train), "validation": str(empty)})
    with pytest.raises(Exception, match="empty|validation"):
        finalize_splits(load_raw(data), data, seed=0)


def test_data_missing_column_lists_available(tmp_path):
    raw = load_raw(DataConfig(files={"train": str(write_rows(tmp_path / "t.jsonl", ROWS))}))
    with pytest.raises(DataError, match=r"no column\(s\) \['review'\].*\['text', 'label'\]"):
        require_columns(raw["train"], ["review", None], "train")


# ----- text encodings ------------------------------------------------------------------------
# Each builder fails on a bad byte in its own way (a text decode error, pandas, pyarrow's JSON reader).
@pytest.mark.parametrize(
    ("suffix", "header", "row", "line", "offset"),
    [(".txt", "first line\n", "Brunetière, Coppée\n", 2, 18), (".csv", "text\n", "Brunetière\n", 2, 12),
     (".jsonl", '{"text": "a"}\n', '{"text": "Brunetière"}\n', 2, 31)],
)
def test_data_latin1_file_among_utf8_names_file_line_and_the_setting(tmp_path, suffix, header, row, line, offset):
    good = tmp_path / f"good{suffix}"
    good.write_text(header + row.replace("è", "e").replace("é", "e"), encoding="utf-8")
    book = tmp_path / f"book{suffix}"
    book.write_bytes((header + row).encode("latin-1"))
    with pytest.raises(DataError) as error:
        load_raw(DataConfig(files={"train": [str(good)], "validation": [str(book)]}))
    message = str(error.value)
    assert f"data.files.validation: {book}, line {line} (byte {offset}): byte 0xe8 is not valid utf-8" in message
    assert "data.encoding" in message


def test_data_jsonl_in_another_encoding_names_the_byte_after_the_read_fails(tmp_path):
    lines = tmp_path / "rows.jsonl"
    lines.write_bytes('{"text": "ok"}\n{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match=rf"data.files.train: {lines}, line 2 \(byte 28\): byte 0xe9 is not valid ascii"):
        load_raw(DataConfig(files={"train": str(lines)}, encoding="ascii"))


def test_data_files_that_decode_are_read_once_not_scanned_first(tmp_path, monkeypatch):
    def scan(*args, **kwargs):
        raise AssertionError("a file that decodes was scanned")

    monkeypatch.setattr("pipelines.files.check_decodes", scan)
    text = tmp_path / "good.txt"
    text.write_text("naïve café\n", encoding="utf-8")
    assert load_raw(DataConfig(files={"train": str(text)}))["train"]["text"] == ["naïve café"]
    assert read_inputs(text)["text"] == ["naïve café"]


def test_data_encoding_setting_decodes_text_csv_and_jsonl(tmp_path):
    text = tmp_path / "book.txt"
    text.write_bytes("Brunetière\nCoppée\n".encode("latin-1"))
    assert load_raw(DataConfig(files={"train": str(text)}, encoding="latin-1"))["train"]["text"] == ["Brunetière", "Coppée"]
    table = tmp_path / "rows.csv"
    table.write_bytes("text,label\ncafé,a\n".encode("cp1252"))
    assert load_raw(DataConfig(files={"train": str(table)}, encoding="cp1252"))["train"]["text"] == ["café"]
    lines = tmp_path / "rows.jsonl"
    lines.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    assert load_raw(DataConfig(files={"train": str(lines)}, encoding="latin-1"))["train"]["text"] == ["café"]


def test_data_unknown_encoding_is_a_config_error():
    with pytest.raises(ValueError, match="unknown text encoding 'utf-9'"):
        DataConfig(files={"train": "a.txt"}, encoding="utf-9")


class _SplitTask:
    """A stand-in task: the raw splits, a tokenizer marker and features that say which split and mode made them."""

    def __init__(self, config, refuse: str | None = None):
        self.config, self.refuse, self.calls = config, refuse, []

    def load(self, *, include_train=True):
        return load_raw(self.config.data)

    def build_tokenizer(self, raw, model_path=None):
        self.calls.append(("tokenizer", sorted(raw)))
        return "tokenizer"

    def preprocess(self, examples, *, train, inputs=False):
        if not train and self.refuse:
            raise ValueError(self.refuse)
        return examples.map(lambda row: {"made_for_training": train})


def test_data_prepare_data_is_the_raw_splits_tokenizer_and_both_features(tmp_path):
    from pipelines.config_loading import load_config
    from pipelines.data import prepare_data

    train, valid = write_rows(tmp_path / "train.jsonl", ROWS), write_rows(tmp_path / "valid.jsonl", ROWS[:3])
    config = load_config(None, [f"data.files={{train: {train}, dev: {valid}}}", "data.eval_split=dev"],
                         base={"task": "classification", "output_dir": str(tmp_path / "run")})
    task = _SplitTask(config)
    data = prepare_data(task, config)
    assert task.calls == [("tokenizer", ["dev", "train"])] and data.tokenizer == "tokenizer"
    assert len(data.train_examples) == 10 and len(data.eval_examples) == 3 and sorted(data.raw) == ["dev", "train"]
    assert set(data.train_features["made_for_training"]) == {True} and set(data.eval_features["made_for_training"]) == {False}
    with pytest.raises(DataError, match=rf"split 'dev' \(data.files.dev: {valid}\) cannot be preprocessed") as error:
        prepare_data(_SplitTask(config, refuse="a row the tokenizer rejects"), config)
    assert "a row the tokenizer rejects" in str(error.value) + str(error.value.__cause__)


def test_data_tsv_keeps_the_quotes_of_plain_text_and_reads_csv_quoting(tmp_path):
    # Plain TSV (GLUE and most corpora) has no quoting: read as csv, the quotes that open a sentence
    # vanished and an unclosed one swallowed the rest of the file.
    plain = tmp_path / "plain.tsv"
    plain.write_text('text\tlabel\n"Hello" he said\ta\nit\'s "fine"\tb\n"Stop\ta\n')
    assert load_raw(DataConfig(files={"train": str(plain)}))["train"]["text"] == ['"Hello" he said', 'it\'s "fine"', '"Stop']
    assert read_inputs(plain)["text"] == ['"Hello" he said', 'it\'s "fine"', '"Stop']
    # Files written with csv quoting (pandas, R, Python's csv) are still decoded.
    quoted = tmp_path / "quoted.tsv"
    quoted.write_text('"text"\t"label"\n"He said ""hi"""\t"a"\n"tab\there"\t"b"\n')
    assert load_raw(DataConfig(files={"train": str(quoted)}))["train"]["text"] == ['He said "hi"', "tab\there"]
    with pytest.raises(DataError, match=rf"quote differently: data.files.validation: {quoted} wrap.*data.files.train: {plain} hold"):
        load_raw(DataConfig(files={"train": str(plain), "validation": str(quoted)}))


def test_data_csv_reads_text_columns_as_written_and_only_empty_cells_as_missing(tmp_path):
    # pandas' defaults read "None"/"NA"/"null" as missing and a column of numbers as numbers.
    (tmp_path / "train.csv").write_text('text,label\n007,None\nNA,positive\nnull,None\n"1,5",negative\n,positive\n')
    (tmp_path / "test.tsv").write_text("text\tscore\n42\t1\nnan\t2\n")
    loaded = load_raw(DataConfig(files={"train": str(tmp_path / "train.csv")}), text_columns=["text", None])["train"]
    assert loaded["text"] == ["007", "NA", "null", "1,5", None]  # the empty cell is the one missing value
    assert loaded["label"] == ["None", "positive", "None", "negative", "positive"]
    inputs = read_inputs(tmp_path / "test.tsv", text_columns=["text"])
    assert inputs["text"] == ["42", "nan"] and inputs["score"] == [1, 2]  # other columns keep pandas' typing


def test_data_csv_header_naming_a_column_twice_is_an_error(tmp_path):
    # pandas renamed the second "text" to "text.1" without a word: the first column was read as the text.
    (tmp_path / "inputs.csv").write_text("text,label,text\ngood film,positive,awful plot\n")
    with pytest.raises(DataError, match=rf"^input: {tmp_path / 'inputs.csv'}: the header names column 'text' twice \(columns 1 and 3\)"):
        read_inputs(tmp_path / "inputs.csv")
    (tmp_path / "train.tsv").write_text("\ufefftext\tlabel\tlabel\ngood\ta\tb\n")  # after a byte-order mark, too
    with pytest.raises(DataError, match=rf"^data.files.train: {tmp_path / 'train.tsv'}: the header names column 'label' twice"):
        load_raw(DataConfig(files={"train": str(tmp_path / "train.tsv")}))


def test_data_tsv_sentences_opening_a_quote_closed_rows_later_stay_one_row_each(tmp_path):
    # A sentence-split dialogue parses as csv quoting too: the first sentence's field ran on over the next rows,
    # their labels inside it, and five rows were read as three.
    dialogue = tmp_path / "train.tsv"
    dialogue.write_text('sentence\tlabel\n"I will not go home.\tpos\nYou cannot make me.\tneg\nLeave me alone."\tneg\n'
                        'The sun came out.\tpos\n')
    loaded = load_raw(DataConfig(files={"train": str(dialogue)}))["train"]
    assert loaded["sentence"] == ['"I will not go home.', "You cannot make me.", 'Leave me alone."', "The sun came out."]
    assert loaded["label"] == ["pos", "neg", "neg", "pos"]
    # A quoted field that truly holds a line break leaves its lines short of a row: still csv quoting.
    broken = tmp_path / "broken.tsv"
    broken.write_text('text\tlabel\n"line one\nline two"\tpos\nplain\tneg\n')
    assert load_raw(DataConfig(files={"train": str(broken)}))["train"]["text"] == ["line one\nline two", "plain"]


@pytest.mark.parametrize("suffix, content, line, hint", [
    (".csv", "text,label\ngood film,pos,\nbad film,neg,\n", 2, "a delimiter at the end of the line"),
    (".tsv", "sentence\tlabel\ngood film\t1\t\nbad film\t0\t\n", 2, "a delimiter at the end of the line"),
    (".csv", "text,label\ngood film,pos\nbad, film,neg\n", 3, None),
    (".csv", "text,label,source\ngood film,pos,web\nbad film,neg\n", 3, None),
])
def test_data_csv_row_with_another_number_of_fields_than_the_header_names_its_line(tmp_path, suffix, content, line, hint):
    # pandas took the first column of a file whose rows all end in a delimiter as an index: every column then held
    # its neighbour's values (the texts were the labels), and a short row got empty cells.
    path = tmp_path / f"train{suffix}"
    path.write_text(content)
    with pytest.raises(DataError, match=rf"^data.files.train: {path}, line {line}: \d field\(s\) where the header has") as error:
        load_raw(DataConfig(files={"train": str(path)}))
    assert (hint in str(error.value)) if hint else "end of the line" not in str(error.value)
    with pytest.raises(DataError, match=rf"^input: {path}, line {line}:"):
        read_inputs(path)


def test_data_local_folder_is_read_by_the_same_rules_as_data_files(tmp_path):
    # datasets.load_dataset(folder) read csv with pandas' defaults and tsv with csv quoting: "NA" became a missing
    # cell, "true" the label "True", a plain tsv lost its quotes and a sentence opening one swallowed later rows.
    (tmp_path / "csvdir").mkdir()
    (tmp_path / "csvdir" / "train.csv").write_text("text,label\n007,true\nNA,false\n")
    (tmp_path / "csvdir" / "validation.csv").write_text("text,label\nNone,true\n")
    loaded = load_raw(DataConfig(path=str(tmp_path / "csvdir")), text_columns=["text"])
    assert loaded["train"]["text"] == ["007", "NA"] and loaded["train"]["label"] == ["true", "false"]
    assert loaded["validation"]["text"] == ["None"]
    (tmp_path / "tsvdir" / "data").mkdir(parents=True)
    (tmp_path / "tsvdir" / "data" / "train-0.tsv").write_text('text\tlabel\n" the film is good\tpos\nboring\tneg\n"Hi" he said\tpos\n')
    assert load_raw(DataConfig(path=str(tmp_path / "tsvdir")))["train"]["text"] == ['" the film is good', "boring", '"Hi" he said']
    (tmp_path / "tsvdir" / "data" / "train-0.tsv").write_text("text\tlabel\ngood\tpos\t\n")
    with pytest.raises(DataError, match=rf"^data.path={tmp_path / 'tsvdir'}, split train: .*train-0.tsv, line 2: 3 field"):
        load_raw(DataConfig(path=str(tmp_path / "tsvdir")))


def test_data_one_column_tsv_with_csv_quoting_and_lines_of_spaces_read_as_before(tmp_path):
    # With one column every line is a whole row: pandas' quoting (a field with a line break, doubled quotes) was
    # read as plain text, four rows for three. A line of spaces in a csv is blank to pandas, not a short row.
    one = tmp_path / "corpus.tsv"
    one.write_text('text\n"first line\nsecond line"\n"He said ""hi"""\nplain sentence\n')
    assert load_raw(DataConfig(files={"train": str(one)}))["train"]["text"] == ["first line\nsecond line", 'He said "hi"', "plain sentence"]
    spaced = tmp_path / "train.csv"
    spaced.write_text("text,label\ngood film,pos\n   \nbad film,neg\n")
    assert load_raw(DataConfig(files={"train": str(spaced)}))["train"]["text"] == ["good film", "bad film"]


def test_data_folder_whose_card_names_features_or_does_not_parse_goes_to_datasets(tmp_path):
    # A card's dataset_info (ClassLabel names) was dropped by reading the files alone: predictions said "1", not "pos".
    folder = tmp_path / "labelled"
    folder.mkdir()
    (folder / "train.csv").write_text("text,label\ngood film,1\nbad film,0\n")
    (folder / "README.md").write_text("---\ndataset_info:\n  features:\n  - name: text\n    dtype: string\n  - name: label\n"
                                      "    dtype:\n      class_label:\n        names:\n          '0': neg\n          '1': pos\n---\n")
    assert load_raw(DataConfig(path=str(folder)))["train"].features["label"].names == ["neg", "pos"]
    (folder / "README.md").write_text("---\nlicense: [mit\n---\n")  # a traceback, exit status 1
    with pytest.raises(DataError, match=rf"^data.path={folder}: cannot load the dataset from {folder}"):
        load_raw(DataConfig(path=str(folder)))


def test_data_file_rewritten_with_its_old_modification_time_is_read_again(tmp_path):
    # datasets keys a local file's cache by path and modification time: a file replaced with the same name and
    # time (cp -p, rsync -t, an unpacked archive) was read as the old rows.
    import os
    import shutil

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "good film", "label": "pos"}\n')
    stamp = path.stat()
    assert load_raw(DataConfig(files={"train": str(path)}))["train"]["label"] == ["pos"]
    replacement = tmp_path / "new" / "train.jsonl"
    replacement.parent.mkdir()
    replacement.write_text('{"text": "good film", "label": "neg"}\n')  # the same size
    os.utime(replacement, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    shutil.copyfile(replacement, path)  # in place, as cp -p does: the same inode, size and modification time
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_mtime_ns == stamp.st_mtime_ns and path.stat().st_size == stamp.st_size
    assert load_raw(DataConfig(files={"train": str(path)}))["train"]["label"] == ["neg"]


def test_data_csv_files_of_one_split_with_columns_in_another_order_are_named(tmp_path):
    (tmp_path / "a.csv").write_text("text,label\ngood,pos\n")
    (tmp_path / "b.csv").write_text("label,text\nneg,bad\n")
    with pytest.raises(DataError, match=r"list their columns in different orders.*a.csv\): \['text', 'label'\].*b.csv\): \['label', 'text'\]"):
        load_raw(DataConfig(files={"train": [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]}))


def test_data_map_functions_are_cached_by_their_code_not_only_their_name(tmp_path, monkeypatch):
    # datasets keys a module-level function's cache by module and name: features cached by an older bertpipe
    # (another word split, another truncation) were reused after an upgrade, without a word.
    import importlib

    import datasets

    from pipelines import data as data_module

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"text": "ab c"}) + "\n")
    package = tmp_path / "mytasks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    results = {}
    for version, body in (("old", "text.split()"), ("new", "list(text)")):
        (package / "words.py").write_text(f"def split(batch):\n    return {{'words': [{body} for text in batch['text']]}}\n")
        for name in [name for name in sys.modules if name.startswith("mytasks")]:
            del sys.modules[name]
        data_module._source_fingerprint.cache_clear()
        function = importlib.import_module("mytasks.words").split
        split = datasets.load_dataset("json", data_files=str(rows), cache_dir=str(tmp_path / "cache"))["train"]
        results[version] = split.map(function, batched=True)["words"], split.map(KeyedOnCode(function), batched=True)["words"]
    assert results["old"] == ([["ab", "c"]], [["ab", "c"]])
    assert results["new"][0] == [["ab", "c"]]  # datasets alone: the old code's cached features
    assert results["new"][1] == [["a", "b", " ", "c"]]


def test_data_features_digest_follows_the_rows_not_their_chunking():
    from datasets import Dataset, concatenate_datasets

    from pipelines.data import features_digest

    rows = {"input_ids": [[1, 2, 3], [4], [5, 6]], "labels": [0, 1, 0]}
    whole = Dataset.from_dict(rows)
    assert features_digest(concatenate_datasets([whole.select([0]), whole.select([1, 2])])) == features_digest(whole)
    assert features_digest(whole.select([0, 2, 1])) != features_digest(whole)  # order is part of the trajectory
    assert features_digest(Dataset.from_dict({**rows, "labels": [0, 1, 1]})) != features_digest(whole)
    # A token moved between rows keeps the flat values but not the rows.
    assert features_digest(Dataset.from_dict({**rows, "input_ids": [[1, 2], [3, 4], [5, 6]]})) != features_digest(whole)

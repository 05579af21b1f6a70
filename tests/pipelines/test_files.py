from __future__ import annotations

import pytest

from pipelines.errors import DataError
from pipelines.files import check_decodes, load_local_files, read_inputs


def test_files_prediction_inputs_from_text_lines(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("first line\nsecond line\n")
    assert read_inputs(path)["text"] == ["first line", "second line"]


def test_files_read_inputs_drops_a_byte_order_mark_from_a_text_file(tmp_path):
    path = tmp_path / "inputs.txt"
    path.write_bytes("\ufeffgood film\nbad film\n".encode("utf-8"))
    assert read_inputs(path)["text"] == ["good film", "bad film"]
    assert read_inputs(path, encoding="UTF8")["text"] == ["good film", "bad film"]


@pytest.mark.parametrize(("suffix", "content", "offset"), [(".txt", "fine\nCoppée\n", 9), (".jsonl", '{"text": "fine"}\n{"text": "Coppée"}\n', 31)])
def test_files_prediction_inputs_name_a_bad_byte(tmp_path, suffix, content, offset):
    path = tmp_path / f"inputs{suffix}"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(DataError, match=rf"input: {path}, line 2 \(byte {offset}\): byte 0xe9 is not valid utf-8"):
        read_inputs(path)


def test_files_check_decodes_reports_the_right_byte_past_a_chunk_and_accepts_split_characters(tmp_path):
    # A 2-byte character straddling the 1 MiB read boundary is valid; the bad byte after it must be
    # reported at its offset in the file, not in the chunk.
    prefix = b"a" * ((1 << 20) - 1) + b"\n"
    straddling = prefix[:-1] + "é".encode("utf-8") + b"\nok\n"
    path = tmp_path / "big.txt"
    path.write_bytes(straddling)
    check_decodes(path, "utf-8")
    path.write_bytes(straddling + b"x\xff")
    with pytest.raises(DataError, match=rf"line 3 \(byte {len(straddling) + 1}\): byte 0xff"):
        check_decodes(path, "utf-8")
    path.write_bytes(b"ok \xc3")
    with pytest.raises(DataError, match="ends inside a multi-byte utf-8 character"):
        check_decodes(path, "utf-8")


def test_files_prediction_inputs_decode_in_the_encoding_given(tmp_path):
    text = tmp_path / "inputs.txt"
    text.write_bytes("Coppée\n".encode("latin-1"))
    assert read_inputs(text, encoding="latin-1")["text"] == ["Coppée"]
    table = tmp_path / "inputs.csv"
    table.write_bytes("text\ncafé\n".encode("cp1252"))
    assert read_inputs(table, encoding="cp1252")["text"] == ["café"]


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_files_csv_column_is_typed_from_every_row_not_its_first_chunk(tmp_path, suffix):
    """pandas types a column per 10,000-row chunk: a label column of numbers up to there and a word after it was
    refused ("Failed to parse string: 'neutral'"), and true/false became the labels True/False."""
    separator = "\t" if suffix == ".tsv" else ","
    rows = [separator.join(["text", "label", "score", "flag"])]
    rows += [separator.join([f"sentence {i}", str(i % 2), str(i / 4), "true" if i % 2 else "false"]) for i in range(10_005)]
    rows.append(separator.join(["the last one", "neutral", "1e3", "true"]))
    train = tmp_path / f"train{suffix}"
    train.write_text("\n".join(rows) + "\n")
    split = load_local_files({"train": str(train)}, "utf-8", label="data.files.", text_columns=["text"])["train"]
    assert split["label"][:2] + split["label"][-1:] == ["0", "1", "neutral"]
    assert split["flag"][:2] == ["false", "true"]
    # A column of numbers only stays numeric (float labels are a regression).
    assert split.features["score"].dtype == "float64" and split["score"][-1] == 1000.0


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_files_csv_nan_in_a_column_of_numbers_is_a_missing_number_not_a_word(tmp_path, suffix):
    """pandas (default NA values off) reads "inf" as a float and "nan" as text: one "nan" among scores made the whole
    column text, and a regression job a classification into as many classes as there were scores."""
    separator = "\t" if suffix == ".tsv" else ","
    train = tmp_path / f"train{suffix}"
    rows = [["text", "score", "label", "note"], ["nan", "0.5", "1", "nan"], ["b", "nan", "0", "n/a"], ["c", "-inf", "NaN", "x"]]
    train.write_text("".join(separator.join(row) + "\n" for row in rows))
    split = load_local_files({"train": str(train)}, "utf-8", label="data.files.", text_columns=["text"])["train"]
    assert split.features["score"].dtype == "float64" and split["score"] == [0.5, None, float("-inf")]
    assert split["label"] == [1.0, 0.0, None]
    # A text column, and a column holding words, are read as written.
    assert split["text"] == ["nan", "b", "c"] and split["note"] == ["nan", "n/a", "x"]


def test_files_a_json_escape_of_half_a_surrogate_pair_names_the_line_and_key(tmp_path):
    # json.loads keeps "\ud83d" alone as a lone surrogate; pyarrow refused it later in a traceback (exit 1), or
    # datasets named "row 1" for the file's line 2.
    from pipelines.files import json_records
    from tasks.ner.sentences import read_json_rows
    from tasks.qa.squad_files import read_squad_file

    lone = '{"text": "Alice \\ud83d visited Rome"}'
    paired = '{"text": "Alice \\ud83d\\ude00 visited Rome"}'
    assert [record["text"] for _, record in json_records(paired + "\n", "f.jsonl")] == ["Alice \U0001F600 visited Rome"]
    with pytest.raises(DataError, match=r"^f.jsonl, line 2: text holds a \\ud800-\\udfff escape without its pair"):
        list(json_records(paired + "\n" + lone + "\n", "f.jsonl"))
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(paired + "\n" + lone + "\n")
    with pytest.raises(DataError, match=rf"{inputs}, line 2: text holds a \\ud800-\\udfff escape"):
        read_inputs(inputs)
    nested = tmp_path / "squad.json"
    nested.write_text('{"data": [{"title": "t", "paragraphs": [{"context": "Rome \\udc00", "qas": []}]}]}')
    with pytest.raises(DataError, match=rf"{nested}: data\[0\].paragraphs\[0\].context holds"):
        read_squad_file(nested)
    listed = tmp_path / "ner.json"
    listed.write_text('[{"tokens": ["Rome"], "tags": ["B-LOC"]}, {"tokens": ["Alice", "\\ud83d"], "tags": ["B-PER", "O"]}]')
    with pytest.raises(DataError, match=rf"{listed}: \[1\].tokens\[1\] holds"):
        read_json_rows(listed)


def test_files_json_lines_of_spaces_or_crlf_alone_are_blank_not_records():
    from pipelines.files import json_records

    # The file's own line numbers are kept, so a message about record 3 names line 5.
    text = '{"a":1}\n   \n{"a":2}\r\n\r\n{"a":3}'
    assert [(number, record["a"]) for number, record in json_records(text, "f.jsonl")] == [(1, 1), (3, 2), (5, 3)]

from __future__ import annotations

import pytest

from pipelines.errors import DataError
from pipelines.files import check_decodes, read_inputs


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

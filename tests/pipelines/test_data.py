from __future__ import annotations

import json

import pytest

from pipelines.config import DataConfig
from pipelines.data import DataError, finalize_splits, load_raw, read_inputs, require_columns


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


def test_data_prediction_inputs_from_text_lines(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("first line\nsecond line\n")
    assert read_inputs(path)["text"] == ["first line", "second line"]

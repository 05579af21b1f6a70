"""pipelines.input_columns: a predict output row carries its input row's other columns, for table inputs only,
each value in a JSON form that keeps it (carried_input_columns), or an error naming it before any prediction."""

from __future__ import annotations

import datetime
import decimal
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import evaluation
from pipelines.config_loading import load_config
from pipelines.errors import DataError
from pipelines.evaluation import predict_file
from pipelines.files import read_inputs
from pipelines.input_columns import carried_input_columns, with_input_columns


def carried(rows, path):
    return with_input_columns(rows, carried_input_columns(str(path), ("text",), "utf-8"), str(path))


def test_input_columns_only_table_inputs_carry_columns_and_a_row_count_mismatch_is_never_written(tmp_path):
    rows = [{"text": "a", "label": "x"}]
    # A nested SQuAD-style .json file is one object, not rows: nothing of it is copied, even with one prediction.
    nested = tmp_path / "inputs.json"
    nested.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": []}]}))
    assert carried(rows, nested) == rows
    text = tmp_path / "inputs.txt"
    text.write_text("a\n")
    assert carried(rows, text) == rows

    table = tmp_path / "inputs.jsonl"
    table.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate("ab")))
    with pytest.raises(RuntimeError, match="1 predictions for the 2 rows"):
        carried(rows, table)
    two = [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}]
    assert carried(two, table) == [{"text": "a", "label": "x", "id": 0}, {"text": "b", "label": "y", "id": 1}]


def test_input_columns_a_jsonl_input_carries_each_value_as_the_file_wrote_it(tmp_path):
    # pyarrow's reader types ISO date strings as timestamps (dropping a zone), and a column of ints with one
    # decimal as floats: the output failed with "datetime is not JSON serializable", naming no column.
    table = tmp_path / "inputs.jsonl"
    table.write_text(
        '{"text": "good film", "date": "2024-01-02", "id": 1, "meta": {"source": "imdb"}}\n\n'
        '{"text": "bad film", "date": "2024-03-05T10:00:00Z", "id": 2.5, "meta": {}}\n'
    )
    rows = carried([{"label": "pos"}, {"label": "neg"}], table)
    assert rows == [
        {"label": "pos", "date": "2024-01-02", "id": 1, "meta": {"source": "imdb"}},
        {"label": "neg", "date": "2024-03-05T10:00:00Z", "id": 2.5, "meta": {}},
    ]
    json.dumps(rows, allow_nan=False)


def test_input_columns_a_csv_input_carries_cells_as_written_and_parses_no_dates(tmp_path):
    table = tmp_path / "inputs.csv"
    table.write_text("text,date,id\ngood film,2024-01-02,007\nbad film,2024-03-05T10:00:00Z,8\n")
    assert carried([{"label": "pos"}, {"label": "neg"}], table) == [
        {"label": "pos", "date": "2024-01-02", "id": "007"}, {"label": "neg", "date": "2024-03-05T10:00:00Z", "id": "8"}]


def test_input_columns_a_parquet_input_carries_temporal_decimal_and_binary_values_as_exact_json_text(tmp_path):
    table = tmp_path / "inputs.parquet"
    pq.write_table(pa.table({
        "text": ["good film", "bad film"],
        "when": pa.array([1704153600123456789, None], pa.timestamp("ns")),
        "zoned": pa.array([1704153600, 0], pa.timestamp("s", tz="Europe/Paris")),
        "day": pa.array([datetime.date(2024, 1, 2), datetime.date(1, 1, 1)], pa.date32()),
        "clock": pa.array([1, 86399999999999], pa.time64("ns")),  # as_py would cut the nanoseconds
        "took": pa.array([5400, -1], pa.duration("us")),
        "price": pa.array([decimal.Decimal("19.90"), decimal.Decimal("-0.0000001")], pa.decimal128(20, 7)),
        "digest": pa.array([b"\x00\xff", b"hi"], pa.binary()),
        "days": pa.array([[datetime.date(2024, 1, 2)], []], pa.list_(pa.date32())),
        "ratio": pa.array([float("nan"), 0.5]),
    }), table)
    rows = carried([{"label": "pos"}, {"label": "neg"}], table)
    assert rows == [
        {"label": "pos", "when": "2024-01-02T00:00:00.123456789", "zoned": "2024-01-02T01:00:00+01:00", "day": "2024-01-02",
         "clock": "00:00:00.000000001", "took": "PT0.0054S", "price": "19.9000000", "digest": "AP8=", "days": ["2024-01-02"],
         "ratio": None},
        {"label": "neg", "when": None, "zoned": "1970-01-01T01:00:00+01:00", "day": "0001-01-01", "clock": "23:59:59.999999999",
         "took": "-PT0.000001S", "price": "-0.0000001", "digest": "aGk=", "days": [], "ratio": 0.5},
    ]
    json.dumps(rows, allow_nan=False)


def test_input_columns_predict_refuses_a_value_it_cannot_carry_naming_column_and_row_before_the_forward_pass(tmp_path, monkeypatch):
    inputs = tmp_path / "inputs.parquet"
    # Year 10000: no ISO-8601 string Python writes holds it.
    pq.write_table(pa.table({"text": ["good film", "bad film"], "when": pa.array([0, 253402300800000000], pa.timestamp("us"))}), inputs)

    class Task:
        run_files = ()

        def load_inputs(self, path):
            return read_inputs(path)

        def input_columns(self):
            return ("text",)

        def preprocess(self, *args, **kwargs):
            raise AssertionError("reached the forward pass before checking the columns to carry")

    monkeypatch.setattr(evaluation, "_prepare_finished_run", lambda *args: (None, None))
    config = load_config(None, [], base={"task": "classification", "output_dir": str(tmp_path / "run"), "data": {"path": "x"}})
    output = tmp_path / "out.jsonl"
    with pytest.raises(DataError, match=rf"--input {inputs}, row 2: column 'when' \(timestamp\[us\]\) holds a value the output cannot carry"):
        predict_file(config, Task(), str(tmp_path), str(inputs), str(output))
    assert not output.exists()

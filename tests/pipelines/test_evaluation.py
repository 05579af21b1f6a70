"""with_input_columns: a predict output row carries its input row's other columns, for table inputs only."""

from __future__ import annotations

import json

import pytest

from pipelines.evaluation import with_input_columns


def test_evaluation_only_table_inputs_carry_columns_and_a_row_count_mismatch_is_never_written(tmp_path):
    rows = [{"text": "a", "label": "x"}]
    # A nested SQuAD-style .json file is one object, not rows: nothing of it is copied, even with one prediction.
    nested = tmp_path / "inputs.json"
    nested.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": []}]}))
    assert with_input_columns(rows, str(nested), ("text",), "utf-8") == rows
    text = tmp_path / "inputs.txt"
    text.write_text("a\n")
    assert with_input_columns(rows, str(text), ("text",), "utf-8") == rows

    table = tmp_path / "inputs.jsonl"
    table.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate("ab")))
    with pytest.raises(RuntimeError, match="1 predictions for the 2 rows"):
        with_input_columns(rows, str(table), ("text",), "utf-8")
    two = [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}]
    assert with_input_columns(two, str(table), ("text",), "utf-8") == [
        {"text": "a", "label": "x", "id": 0}, {"text": "b", "label": "y", "id": 1}]

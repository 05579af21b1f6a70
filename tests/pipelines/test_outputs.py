"""The run directory's files: strict JSON whatever the metrics hold."""

from __future__ import annotations

import json

from pipelines.outputs import StepLog, write_json


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_outputs_nan_and_infinite_metrics_are_written_as_null(tmp_path):
    # Pearson of constant predictions is NaN: written bare, metrics.json was not JSON to any strict reader.
    write_json(tmp_path / "metrics.json", {"eval_pearson": float("nan"), "curve": [float("inf"), 0.5], "nested": {"x": -float("inf")}})
    assert strict_json((tmp_path / "metrics.json").read_text()) == {"eval_pearson": None, "curve": [None, 0.5], "nested": {"x": None}}
    log = StepLog(tmp_path)
    log.write({"step": 1, "eval_spearmanr": float("nan")})
    log.close()
    assert [strict_json(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [{"step": 1, "eval_spearmanr": None}]

"""The run directory's files: strict JSON whatever the metrics hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_outputs_an_unfinished_replacement_interrupted_while_being_discarded_stays_replaceable(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    # overwrite=true over an unfinished replacement (the last finished run waits aside) deletes the
    # replacement first. A Ctrl-C or kill within that deletion (a folder of checkpoints takes a while)
    # left a folder without config.yaml but with the rest: refused for good as "not a bertpipe run".
    import shutil

    from pipelines.config import load_config
    from pipelines.outputs import check_output_dir, replaced_run_dir, set_aside_run_dir
    from tasks import get_task
    from tests.conftest import classification_config

    run = tmp_path / "run"
    aside = replaced_run_dir(run)
    aside.mkdir()
    (aside / "metrics.json").write_text("{}")
    run.mkdir()
    (run / "config.yaml").write_text(f"task: classification\noutput_dir: {run}\n")
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    (run / "checkpoints" / "step-00000002" / "model.safetensors").write_bytes(b"weights")

    delete = shutil.rmtree

    def interrupted(path, *args, **kwargs):
        if not (Path(path) / "config.yaml").is_file():
            return delete(path, *args, **kwargs)
        (Path(path) / "config.yaml").unlink()  # rmtree's order is the folder's: config.yaml may go first
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        set_aside_run_dir(run)
    monkeypatch.undo()

    config = load_config(classification_config(tmp_path, tiny_bert, sentiment_files), [f"output_dir={run}", "overwrite=true"],
                         lambda name: get_task(name).Options)
    check_output_dir(config)  # the same command again is accepted
    assert (aside / "metrics.json").is_file()

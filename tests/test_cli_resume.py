"""An interrupted run resumed from its last checkpoint ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, classification_config, cli_env, run_cli

TRAIN = dict(num_epochs=3, eval_steps=5, save_steps=4, logging_steps=1, lr_scheduler="linear", warmup_steps=2,
             gradient_accumulation_steps=2, batch_size=8)

# Runs the CLI, hard-killing the process (no cleanup, like a crash) once the second checkpoint is complete.
CRASH_AFTER_SECOND_CHECKPOINT = """
import os, sys
import pipelines.train as train
save = train.save_checkpoint
def save_then_crash(*args, **kwargs):
    folder = save(*args, **kwargs)
    if folder.name == "step-00000008":
        os._exit(9)
    return folder
train.save_checkpoint = save_then_crash
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def final_state(run_dir):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    losses = [record for record in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "loss" in record]
    return metrics, losses


def test_cli_resume_after_interruption_matches_uninterrupted(tmp_path, tiny_bert, sentiment_files):
    reference = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="reference", **TRAIN)
    run_cli("train", str(reference))

    interrupted = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="interrupted", **TRAIN)
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH_AFTER_SECOND_CHECKPOINT, "train", str(interrupted)],
        cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True, timeout=600,
    )
    assert crashed.returncode == 9, crashed.stderr[-3000:]
    assert not (tmp_path / "interrupted" / "metrics.json").exists()

    result = run_cli("train", str(interrupted), "train.resume_from_checkpoint=latest")
    assert "resumed from" in result.stdout and "step-00000008" in result.stdout

    expected_metrics, expected_losses = final_state(tmp_path / "reference")
    metrics, losses = final_state(tmp_path / "interrupted")
    assert expected_metrics["global_step"] == 18  # 12 batches/epoch, 2 per update, 3 epochs
    for key in ("eval_accuracy", "eval_f1_macro", "global_step", "epoch", "train_loss"):
        assert metrics[key] == pytest.approx(expected_metrics[key], rel=1e-5, abs=1e-6), key
    # The whole run's counts, not only the part after the resume (the checkpoint carries them).
    assert expected_metrics["train_samples"] == 288  # 3 epochs of 96
    for key in ("train_samples", "train_tokens"):
        assert metrics[key] == expected_metrics[key], key
    # Every logged step after the checkpoint, through the next epochs, has the same loss.
    steps = [record["step"] for record in losses]
    assert steps == sorted(set(steps)), "log.jsonl repeats steps the interrupted run logged after its checkpoint"
    resumed = {record["step"]: record["loss"] for record in losses if record["step"] > 8}
    assert sorted(resumed) == list(range(9, 19))
    for record in expected_losses:
        if record["step"] > 8:
            assert resumed[record["step"]] == pytest.approx(record["loss"], rel=1e-5, abs=1e-6), record["step"]


def test_cli_resume_from_missing_or_corrupt_checkpoint_is_a_clear_error(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="broken", max_steps=4, save_steps=2)
    result = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "no complete checkpoint" in result.stderr

    run_cli("train", str(config))
    checkpoint = tmp_path / "broken" / "checkpoints" / "step-00000004"
    (checkpoint / "model.safetensors").write_bytes(b"truncated")
    result = run_cli("train", str(config), f"train.resume_from_checkpoint={checkpoint}", check=False)
    assert result.returncode == 2 and "cannot be loaded" in result.stderr and str(checkpoint) in result.stderr

    partial = tmp_path / "broken" / "checkpoints" / "step-00000006.partial"
    partial.mkdir()
    result = run_cli("train", str(config), f"train.resume_from_checkpoint={partial}", check=False)
    assert result.returncode == 2 and "incomplete" in result.stderr

"""A real two-process (gloo) run on CPU through ``accelerate launch --multi_gpu``."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT, classification_config, cli_env


def test_cli_two_process_run_counts_every_eval_example_once(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="ddp", num_epochs=2, eval_steps=6)
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29617",
         "scripts/train.py", str(config)],
        cwd=REPO_ROOT, env=cli_env(), capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert metrics["num_processes"] == 2
    assert metrics["eval_samples"] == 37  # odd: a duplicated last batch would make it 38
    # 96 examples, batch 8 per process: 6 batches per process per epoch, 2 epochs.
    assert metrics["global_step"] == 12
    assert metrics["train_samples"] == 192

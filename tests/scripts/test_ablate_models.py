"""scripts/ablate_models.py: variant selection for parallel lanes and the report built from finished runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("ablate_models", REPO_ROOT / "scripts" / "ablate_models.py")
ablate_models = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablate_models)


def test_only_and_skip_split_the_variants_into_disjoint_lanes():
    lane_a = ablate_models.selected_variants(["additive"], [])
    lane_b = ablate_models.selected_variants([], ["additive"])
    assert lane_a == ["additive score"]
    assert set(lane_a).isdisjoint(lane_b) and set(lane_a) | set(lane_b) == set(ablate_models.VARIANTS)
    with pytest.raises(SystemExit, match="no variant matches"):
        ablate_models.selected_variants(["no-such-variant"], [])


def test_report_only_tabulates_the_finished_runs_in_variant_order(tmp_path):
    finished = {"pre-norm": (512.5, 0.131, 1500.0), "baseline (dot, LayerNorm, learned, post-norm)": (498.31, 0.125, 1700.0)}
    for name, (perplexity, accuracy, tokens_per_second) in finished.items():
        run_dir = ablate_models.run_dir_of(name, tmp_path)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps({
            "eval_perplexity": perplexity, "eval_accuracy": accuracy, "train_tokens_per_second": tokens_per_second}))
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "ablate_models.py"), "--report-only",
                    "--max-steps", "200", "--threads", "1", "--set", "data.max_seq_length=64",
                    "--out", str(tmp_path)], check=True, capture_output=True)
    table = (tmp_path / "ablation.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "variant" not in line and "---" not in line]
    assert rows == ["| baseline (dot, LayerNorm, learned, post-norm) | 498.3 | 0.125 | 1700 |",
                    "| pre-norm | 512.5 | 0.131 | 1500 |"]
    assert "200 updates" in table and "`data.max_seq_length=64`" in table and "1 torch thread(s) per run" in table
    assert (tmp_path / "ablation.png").stat().st_size > 0


def test_a_variants_command_line_gives_each_key_once_the_later_layer_winning(tmp_path):
    # bertpipe train refuses a key given twice; the script layers its settings, --set and the variant's keys.
    import argparse

    from pipelines.config_loading import refuse_repeated_overrides

    args = argparse.Namespace(seed=1, max_steps=100, batch_size=8, threads=1,
                              set=["train.max_steps=5", "model.architecture.num_hidden_layers=2", "data.max_seq_length=64"])
    overrides = ablate_models.variant_overrides("pre-norm", {"num_hidden_layers": "4"}, tmp_path, args)
    refuse_repeated_overrides(overrides)
    assert "train.max_steps=5" in overrides and "train.max_steps=100" not in overrides
    assert "model.architecture.num_hidden_layers=4" in overrides and "model.architecture.num_hidden_layers=2" not in overrides
    assert "data.max_seq_length=64" in overrides and "train.torch_num_threads=1" in overrides

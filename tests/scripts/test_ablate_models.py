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


SETTINGS = {"config": str(REPO_ROOT / "configs" / "pretrain" / "wikitext2_mlm.yaml"), "max_steps": 200, "batch_size": 16,
            "seed": 42, "threads": 1, "set": ["data.max_seq_length=64"]}


def finished_runs(out, settings_by_name):
    for name, (perplexity, accuracy, tokens_per_second, settings) in settings_by_name.items():
        run_dir = ablate_models.run_dir_of(name, out)
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps({
            "eval_perplexity": perplexity, "eval_accuracy": accuracy, "train_tokens_per_second": tokens_per_second}))
        ablate_models.settings_file_of(name, out).write_text(json.dumps(settings))


def test_report_only_tabulates_the_finished_runs_in_variant_order_with_the_settings_they_were_made_with(tmp_path):
    finished_runs(tmp_path, {"pre-norm": (512.5, 0.131, 1500.0, SETTINGS),
                             "baseline (dot, LayerNorm, learned, post-norm)": (498.31, 0.125, 1700.0, SETTINGS)})
    # The docstring's call: no budget flags. The header stated the command line's defaults (40 updates), not the runs'.
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "ablate_models.py"), "--report-only", "--out", str(tmp_path)],
                   check=True, capture_output=True)
    table = (tmp_path / "ablation.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "variant" not in line and "---" not in line]
    assert rows == ["| baseline (dot, LayerNorm, learned, post-norm) | 498.3 | 0.125 | 1700 |",
                    "| pre-norm | 512.5 | 0.131 | 1500 |"]
    assert "200 updates" in table and "`data.max_seq_length=64`" in table and "1 torch thread(s) per run" in table
    assert "config `configs/pretrain/wikitext2_mlm.yaml`" in table
    assert (tmp_path / "ablation.png").stat().st_size > 0


def test_report_only_refuses_runs_made_with_different_settings(tmp_path):
    finished_runs(tmp_path, {"pre-norm": (512.5, 0.131, 1500.0, SETTINGS),
                             "BatchNorm": (498.31, 0.125, 1700.0, {**SETTINGS, "max_steps": 40})})
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "ablate_models.py"), "--report-only", "--out", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr and not (tmp_path / "ablation.md").exists()
    assert "ablate_models.py: error: the runs in" in result.stderr and "were made with different settings" in result.stderr


def test_a_relative_out_is_the_callers_folder_not_the_repositorys(tmp_path):
    # The runs started in the repository with output_dir=rel/..., while the table read rel/... under the caller's folder:
    # a stale metrics.json there made the table, exit 0. A failing run (here: a setting that does not exist) is one message.
    (tmp_path / "rel" / "runs" / "pre_norm").mkdir(parents=True)
    (tmp_path / "rel" / "runs" / "pre_norm" / "metrics.json").write_text(
        json.dumps({"eval_perplexity": 1.0, "eval_accuracy": 0.999, "train_tokens_per_second": 1.0}))
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "ablate_models.py"), "--only", "pre-norm", "--out", "rel",
                             "--set", "train.no_such_key=1"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "ablate_models.py: error: `" in result.stderr and "ended with exit status 2" in result.stderr
    assert f"output_dir={tmp_path / 'rel' / 'runs' / 'pre_norm'}" in result.stderr
    assert not (REPO_ROOT / "rel").exists() and not (tmp_path / "rel" / "ablation.md").exists()


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

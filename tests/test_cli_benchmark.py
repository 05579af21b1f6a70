"""`bertpipe benchmark` end to end: bertpipe and both Trainer settings on a tiny BERT, two steps each;
then `--predict` on the bertpipe run it trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import classification_config, run_cli, sentiment_rows


@pytest.fixture(scope="module")
def benchmark(tmp_path_factory, tiny_bert, sentiment_files) -> tuple[Path, str]:
    tmp_path = tmp_path_factory.mktemp("bench")
    # eval/save steps in the config: the benchmark must switch them off for every setting.
    config = classification_config(tmp_path, tiny_bert, sentiment_files, eval_steps=1, save_steps=1)
    out = tmp_path / "bench"
    result = run_cli("benchmark", str(config), "train.max_steps=2", "--seeds", "1", "--output-dir", str(out))
    return out, result.stdout


def test_cli_benchmark_writes_a_table_with_every_column_and_setting(benchmark):
    out, stdout = benchmark
    table = (out / "benchmark.md").read_text()
    assert table in stdout
    for column in ["setting", "precision", "sampler", "samples/s", "tokens/s", "train s", "wall s", "peak RSS MB",
                   "accuracy", "% of matmul peak"]:
        assert f"| {column} |" in table, column
    for setting in ["bertpipe", "trainer_default", "trainer_best"]:
        assert f"| {setting} |" in table

    results = json.loads((out / "benchmark.json").read_text())
    rows = results["rows"]
    assert rows["trainer_default"]["sampler"] == "random" and rows["trainer_best"]["sampler"] == "length-grouped"
    assert rows["trainer_default"]["precision"] == "fp32" and rows["trainer_best"]["precision"] in {"fp32", "bf16"}
    assert set(results["ratios"]) == {"trainer_default", "trainer_best"}
    assert results["peak"]["fp32"] > 0 and results["non_embedding_params"] > 0
    for run in results["runs"]:
        # Two updates of 8 examples each, on every side; the eval split is scored by the task itself.
        assert run["train_samples"] == 16, run
        assert 16 * 3 <= run["train_tokens"] <= 16 * 32
        assert run["peak_rss_mb"] > 50 and run["wall_time"] >= run["train_runtime"] > 0
        assert 0.0 <= run["metrics"]["accuracy"] <= 1.0 and "matthews_correlation" in run["metrics"]


def test_cli_benchmark_bertpipe_run_is_the_same_job_without_intermediate_evaluation(benchmark):
    out, _ = benchmark
    run_dir = out / "runs" / "bertpipe-seed7"
    assert not (run_dir / "checkpoints").exists()
    log = (run_dir / "log.jsonl").read_text().splitlines()
    assert sum("eval_accuracy" in line for line in log) == 1
    metrics = json.loads((run_dir / "metrics.json").read_text())
    precision = json.loads((out / "benchmark.json").read_text())["rows"]["bertpipe"]["precision"]
    assert metrics["global_step"] == 2 and {"no": "fp32"}.get(metrics["mixed_precision"], metrics["mixed_precision"]) == precision


def test_cli_benchmark_predict_mode_agrees_with_pipeline(benchmark, tmp_path):
    from pipelines.benchmark import run_predict_benchmark
    from tasks import get_task

    out, _ = benchmark
    inputs = tmp_path / "inputs.txt"
    sentences = [row["sentence"] for row in sentiment_rows(40, seed=3)]
    # A line separator inside a line: a txt line and a JSON string may hold it raw; str.splitlines() cuts there.
    sentences[1] = sentences[1].replace(" ", "\u2028", 1)
    inputs.write_text("".join(sentence + "\n" for sentence in sentences), encoding="utf-8")
    result = run_predict_benchmark(str(out / "runs" / "bertpipe-seed7"), str(inputs), get_task, output_dir=str(tmp_path / "pb"),
                                   in_child=False, log=lambda _: None)
    # Length-sorted batches (bertpipe) and file-order batches (pipeline) pad differently: same labels, scores to float noise.
    assert result["agreement"]["identical_labels"], result["agreement"]
    assert result["agreement"]["max_score_difference"] < 1e-4
    assert {row["inputs"] for row in result["rows"].values()} == {40}
    table = (tmp_path / "pb" / "predict_benchmark.md").read_text()
    assert "| bertpipe_predict | 40 |" in table and "| pipeline | 40 |" in table and "Labels identical: True" in table
    written = (tmp_path / "pb" / "pipeline.jsonl").read_text(encoding="utf-8").rstrip("\n").split("\n")
    assert [json.loads(line)["text"] for line in written] == sentences


def test_cli_benchmark_unknown_setting_is_a_clear_error(tmp_path, tiny_bert, sentiment_files, capsys):
    from pipelines.cli import main
    from tasks import get_task

    config = classification_config(tmp_path, tiny_bert, sentiment_files)
    assert main(["benchmark", str(config), "--settings", "bertpipe,trainer_turbo"], get_task=get_task) == 2
    error = capsys.readouterr().err
    assert "trainer_turbo" in error and "trainer_best" in error and "Traceback" not in error


def test_cli_benchmark_scores_the_trainer_on_ner_in_example_order(tmp_path):
    """NER's predict_step reduces logits (argmax + probability) and the Trainer length-groups evaluation
    batches under group_by_length: the Trainer's model must still be scored example by example."""
    from tests.test_cli_ner import toy_ner_config, toy_ner_model

    config = toy_ner_config(tmp_path, toy_ner_model(tmp_path))
    out = tmp_path / "bench"
    run_cli("benchmark", str(config), "--settings", "trainer_best", "--seeds", "1", "--metric", "f1", "--output-dir", str(out))
    (run,) = json.loads((out / "benchmark.json").read_text())["runs"]
    assert run["setting"] == "trainer_best" and run["train_samples"] >= 4 * 240  # long sentences add windows
    assert run["metrics"]["f1"] >= 0.9, run["metrics"]  # the same bar bertpipe's own NER test sets


def test_cli_benchmark_to_accuracy_times_bertpipe_to_the_trainer_defaults_metric(tmp_path, tiny_bert, sentiment_files):
    # The config's own evaluation schedule (every 2 updates) is kept for bertpipe: it is what a user waits for.
    config = classification_config(tmp_path, tiny_bert, sentiment_files, eval_steps=2, mixed_precision="no")
    out = tmp_path / "to-accuracy"
    result = run_cli("benchmark", str(config), "train.max_steps=6", "--to-accuracy", "--seeds", "1", "--output-dir", str(out))
    table = (out / "to_accuracy.md").read_text()
    assert table in result.stdout and "trainer_default s" in table

    results = json.loads((out / "to_accuracy.json").read_text())
    reference = results["reference_runs"][0]
    assert results["target"] == pytest.approx(reference["metrics"]["accuracy"]) and reference["train_samples"] == 6 * 8
    curve = results["bertpipe_runs"][0]["curve"]
    # Scheduled evaluations after updates 2 and 4, then the final one (update 6); the clock runs from process start.
    assert [point["step"] for point in curve] == [2, 4, 6]
    assert all(0 < a["seconds"] < b["seconds"] for a, b in zip(curve, curve[1:]))
    reached = next((point for point in curve if point["metric"] >= results["target"]), None)
    row = results["bertpipe"][0]
    assert row["seconds"] == (reached["seconds"] if reached else None) and row["final_metric"] == curve[-1]["metric"]
    log = (out / "runs" / "bertpipe-seed7" / "log.jsonl").read_text().splitlines()
    assert sum("eval_accuracy" in line for line in log) == 3


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_cli_benchmark_stopped_by_a_signal_ends_its_run_too(tmp_path, tiny_bert, sentiment_files, signal_name):
    """`kill PID` ended the benchmark silently (exit 143) while its spawned run trained on as an orphan, writing into
    --output-dir; `kill -9 PID` left it so too. Now SIGTERM kills the run, discards the staged folder and says so in
    one line; after SIGKILL, which the parent cannot answer, the run notices its parent is gone and ends."""
    import signal

    import psutil

    from tests.conftest import signal_after_logged_losses, start_cli

    number = getattr(signal, signal_name)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=100_000, mixed_precision="no")
    out = tmp_path / "bench"
    benchmark = start_cli("benchmark", str(config), "--seeds", "1", "--output-dir", str(out))
    children = []
    # Once the run in the spawned child has logged a loss, it is training inside the staged folder.
    stderr = signal_after_logged_losses(benchmark, tmp_path / ".bench.partial" / "runs" / "bertpipe-seed7" / "log.jsonl", 1,
                                        number, timeout=300, children=children)
    # Every child is gone (spawn's resource tracker leaves once its parent has), none training on.
    _, alive = psutil.wait_procs(children, timeout=20)
    for process in alive:
        process.kill()
    assert not alive, [process.cmdline() for process in alive]
    assert not out.exists()
    if number == signal.SIGKILL:
        assert benchmark.returncode == -signal.SIGKILL
        return
    assert benchmark.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == (
        "bertpipe benchmark: stopped by SIGTERM; nothing half-written is left, and files that were there are unchanged; "
        "the command has nothing to resume: run it again"), stderr[-3000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run.yaml"]

"""scripts/edge_benchmark.py: the timed call reads the same labels as ``bertpipe predict`` (torch and
ONNX, NER word tags and classification labels), the eval inputs are the evaluated split, and the
report's medians over rounds. Tiny runs trained in fp32 (pinned: predictions are compared)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from pipelines.config_loading import load_config  # noqa: E402
from pipelines.evaluation import predict_file  # noqa: E402
from pipelines.export import export_run  # noqa: E402
from pipelines.outputs import load_saved_config  # noqa: E402
from tasks import get_task  # noqa: E402
from tests.conftest import REPO_ROOT, classification_config, write_jsonl  # noqa: E402
from tests.test_cli_ner import ner_sentences, toy_ner_config, toy_ner_model  # noqa: E402

spec = importlib.util.spec_from_file_location("edge_benchmark", REPO_ROOT / "scripts" / "edge_benchmark.py")
edge_benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(edge_benchmark)

PINNED = ["train.mixed_precision='no'", "train.torch_num_threads=1", "train.eval_steps=null"]


def options_for(name: str):
    return get_task(name).Options


def saved(run_dir: Path):
    config = load_config(None, [], options_for, base=load_saved_config(run_dir))
    return config, get_task(config.task)(config)


def train_and_export(config_path: Path, *overrides: str) -> tuple[Path, Path]:
    from pipelines.train import train

    config = load_config(config_path, [*PINNED, *overrides], options_for)
    train(config, get_task(config.task)(config))
    run_dir = Path(config.output_dir)
    export_run(*saved(run_dir), run_dir, run_dir.parent / "onnx", parity_samples=8)
    return run_dir, run_dir.parent / "onnx"


def bertpipe_predict(folder: Path, inputs: Path, output: Path) -> list[dict]:
    predict_file(*saved(folder), str(folder), str(inputs), str(output))
    return [json.loads(line) for line in output.read_text().splitlines()]


def test_edge_benchmark_ner_call_reads_the_tags_bertpipe_predict_reads(tmp_path):
    (tmp_path / "ner").mkdir()
    run_dir, onnx_dir = train_and_export(toy_ner_config(tmp_path / "ner", toy_ner_model(tmp_path / "ner")), "train.max_steps=30")
    sentences = [words for words, _ in ner_sentences(13, seed=5, long_every=1000)[1:]]  # all within max_seq_length (the first is long)
    expected = [row["tags"] for row in bertpipe_predict(run_dir, write_jsonl(tmp_path / "in.jsonl", [{"tokens": s} for s in sentences]), tmp_path / "out.jsonl")]
    assert any(tag != "O" for tags in expected for tag in tags)  # a model that tags something
    for kind, folder in (("torch", run_dir), ("onnx", onnx_dir)):
        predict, size = edge_benchmark.make_predictor(kind, "ner", folder, 24)
        assert predict(sentences) == expected, kind  # padded batch
        assert [predict([sentence])[0] for sentence in sentences] == expected, kind  # batch 1
        assert size > 0
    assert edge_benchmark.eval_sentences(run_dir) == [row["tokens"] for row in map(json.loads, (tmp_path / "ner" / "validation.jsonl").read_text().splitlines())]


def test_edge_benchmark_classification_call_reads_the_labels_bertpipe_predict_reads(tiny_bert, sentiment_files, tmp_path):
    run_dir, onnx_dir = train_and_export(classification_config(tmp_path, tiny_bert, sentiment_files), "train.max_steps=24")
    texts = ["the film was superb", "awful and dull plot", "grim sad story", "warm and bright scenes"]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(texts) + "\n")
    expected = [row["label"] for row in bertpipe_predict(run_dir, inputs, tmp_path / "out.jsonl")]
    for kind, folder in (("torch", run_dir), ("onnx", onnx_dir)):
        predict, _ = edge_benchmark.make_predictor(kind, "classification", folder, 64)
        assert predict(texts) == expected and [predict([text])[0] for text in texts] == expected, kind
    assert edge_benchmark.run_task(run_dir) == "classification"


def test_edge_benchmark_summary_is_the_median_over_rounds_and_the_largest_rss():
    rounds = [
        {"latency_p50_ms": 9.0, "latency_p95_ms": 12.0, "throughput_b32_per_s": 150.0, "peak_rss_mb": 600.0, "size_mb": 5.0},
        {"latency_p50_ms": 6.0, "latency_p95_ms": 8.0, "throughput_b32_per_s": 210.0, "peak_rss_mb": 610.0, "size_mb": 5.0},
        {"latency_p50_ms": 7.0, "latency_p95_ms": 30.0, "throughput_b32_per_s": 200.0, "peak_rss_mb": 590.0, "size_mb": 5.0},
    ]
    summary = edge_benchmark.summarise(rounds)
    assert summary["latency_p50_ms"] == 7.0 and summary["latency_p95_ms"] == 12.0 and summary["throughput_b32_per_s"] == 200.0
    assert summary["peak_rss_mb"] == 610.0 and summary["latency_p50_ms_range"] == [6.0, 9.0]

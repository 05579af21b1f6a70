"""bf16 end to end on the tiny model, on any CPU (emulated where bf16 is not native), and the
inference-precision rule: evaluations (during training too), ``bertpipe evaluate``, ``bertpipe predict``
and ``pipeline()`` run in fp32 unless ``--precision`` says otherwise, so they agree on every machine.

A regression head, so that the metrics (MSE, Pearson) and the predicted scores are continuous and show
any difference between fp32 and bf16 inference.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import classification_config, resaved_checkpoint, run_cli, sentiment_rows, write_jsonl

STEPS = 6
TRAIN = dict(max_steps=STEPS, save_steps=3, eval_steps=None, mixed_precision="bf16", lr_scheduler="linear", warmup_steps=1,
             torch_num_threads=1)


@pytest.fixture(scope="module")
def scored_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("scored")
    def scored(count: int, seed: int) -> list[dict]:
        return [{"sentence": row["sentence"], "label": float(row["label"] == "positive")} for row in sentiment_rows(count, seed)]
    return {"train": write_jsonl(folder / "train.jsonl", scored(64, 1)), "validation": write_jsonl(folder / "validation.jsonl", scored(21, 2))}


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, tiny_bert, scored_files) -> Path:
    tmp_path = tmp_path_factory.mktemp("bf16")
    run_cli("train", str(classification_config(tmp_path, tiny_bert, scored_files, run_name="bf16", **TRAIN)))
    return tmp_path / "bf16"


def metrics_of(run_dir: Path, name: str = "metrics.json") -> dict:
    return json.loads((run_dir / name).read_text())


def test_cli_bf16_trains_saves_and_checkpoints(bf16_run):
    metrics = metrics_of(bf16_run)
    assert metrics["mixed_precision"] == "bf16" and metrics["global_step"] == STEPS
    assert 0.0 < metrics["train_loss"] < 10.0 and metrics["eval_samples"] == 21
    assert sorted(path.name for path in (bf16_run / "checkpoints").iterdir()) == ["step-00000003", "step-00000006"]
    saved = json.loads((bf16_run / "config.json").read_text())
    # Autocast keeps fp32 weights: the saved model is fp32, which is what pipeline() loads.
    assert saved.get("dtype", saved.get("torch_dtype")) == "float32"


def test_cli_bf16_training_evaluation_evaluate_and_bf16_evaluate(bf16_run):
    trained = metrics_of(bf16_run)
    run_cli("evaluate", str(bf16_run))
    fp32 = metrics_of(bf16_run, "eval_validation.json")
    assert fp32["inference_precision"] == "fp32"
    # Training evaluated in fp32 too: the same MSE to fp32 rounding (~1e-9 here; bf16 moves it ~1e-3).
    assert fp32["eval_mse"] == pytest.approx(trained["eval_mse"], rel=1e-6)
    run_cli("evaluate", str(bf16_run), "--precision", "bf16")
    bf16 = metrics_of(bf16_run, "eval_validation.json")
    assert bf16["inference_precision"] == "bf16"
    assert bf16["eval_mse"] != pytest.approx(trained["eval_mse"], rel=1e-5)
    assert bf16["eval_mse"] == pytest.approx(trained["eval_mse"], rel=0.05)


def test_cli_bf16_run_predict_and_pipeline_agree_in_fp32(bf16_run, tmp_path):
    from transformers import pipeline

    texts = ["the film was superb and lovely", "the plot was awful", "a story with very warm scenes"]
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("\n".join(texts) + "\n")
    scores = {}
    for precision in ("fp32", "bf16"):
        output = tmp_path / f"{precision}.jsonl"
        run_cli("predict", str(bf16_run), "--input", str(inputs), "--output", str(output), "--precision", precision)
        scores[precision] = [json.loads(line)["score"] for line in output.read_text().splitlines()]
    served = pipeline("text-classification", model=str(bf16_run), function_to_apply="none")(texts)
    assert scores["fp32"] == pytest.approx([row["score"] for row in served], abs=1e-6)
    assert scores["bf16"] != scores["fp32"] and scores["bf16"] == pytest.approx(scores["fp32"], abs=0.05)


def test_cli_bf16_resume_from_a_checkpoint_ends_where_the_run_ended(bf16_run, tmp_path, tiny_bert, scored_files):
    config = classification_config(tmp_path, tiny_bert, scored_files, run_name="resumed", **TRAIN)
    result = run_cli("train", str(config), f"train.resume_from_checkpoint={bf16_run / 'checkpoints' / 'step-00000003'}")
    assert "resumed from" in result.stdout
    resumed, reference = metrics_of(tmp_path / "resumed"), metrics_of(bf16_run)
    assert resumed["global_step"] == STEPS and resumed["mixed_precision"] == "bf16"
    # train_loss averages the steps this process ran; the last logged loss is the same step's in both.
    last_loss = lambda run_dir: [r for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "loss" in r][-1]  # noqa: E731
    assert last_loss(tmp_path / "resumed") == last_loss(bf16_run)
    assert resumed["eval_mse"] == pytest.approx(reference["eval_mse"], rel=1e-6)


def bf16_copy(checkpoint: Path, folder: Path) -> Path:
    """``checkpoint`` saved again in bf16 (config.json ``dtype: bfloat16``), as many Hub checkpoints now ship."""
    import torch
    from transformers import AutoModelForMaskedLM

    return resaved_checkpoint(AutoModelForMaskedLM.from_pretrained(checkpoint).to(torch.bfloat16), checkpoint, folder)


def test_cli_a_bf16_checkpoint_trains_from_fp32_weights_without_autocast(tmp_path, tiny_bert, scored_files):
    # transformers 5 loads a bf16 checkpoint as bf16 (dtype="auto"): with mixed_precision=no the run trained bf16
    # weights with bf16 updates and saved them in bf16, while its metrics said "no" and the README fp32 master weights.
    from safetensors import safe_open

    base = bf16_copy(tiny_bert, tmp_path / "bf16-checkpoint")
    assert json.loads((base / "config.json").read_text())["dtype"] == "bfloat16"
    train = {**TRAIN, "mixed_precision": "no", "max_steps": 2, "save_steps": 100}
    run_cli("train", str(classification_config(tmp_path, base, scored_files, run_name="run", **train)))
    with safe_open(tmp_path / "run" / "model.safetensors", "pt") as weights:
        assert {str(weights.get_slice(name).get_dtype()) for name in weights.keys()} == {"F32"}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["dtype"] == "float32"

"""On a CUDA device: bf16 and fp16 (with Accelerate's loss scaling) training, the fused AdamW kernel,
evaluation gathering, and save/resume. Marked ``gpu`` (deselected by default; ``scripts/gpu_check.sh run``
runs them with ``pytest -m gpu tests/gpu``); skipped where torch sees no CUDA device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import classification_config, cli_env, run_cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def metrics_of(run_dir: Path, name: str = "metrics.json") -> dict:
    return json.loads((run_dir / name).read_text())


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, tiny_bert, sentiment_files) -> Path:
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip("this GPU has no native bf16")
    tmp_path = tmp_path_factory.mktemp("gpu-bf16")
    run_cli("train", str(classification_config(tmp_path, tiny_bert, sentiment_files, run_name="bf16", mixed_precision="bf16",
                                               save_steps=60)))
    return tmp_path / "bf16"


def test_gpu_bf16_trains_and_evaluation_gathers_every_example_once(bf16_run):
    metrics = metrics_of(bf16_run)
    assert metrics["mixed_precision"] == "bf16" and metrics["global_step"] == 120
    assert metrics["eval_samples"] == 37 and metrics["eval_accuracy"] >= 0.8, metrics
    run_cli("evaluate", str(bf16_run))
    evaluated = metrics_of(bf16_run, "eval_validation.json")
    assert evaluated["eval_samples"] == 37 and evaluated["eval_accuracy"] == pytest.approx(metrics["eval_accuracy"])


def test_gpu_resume_on_the_device_ends_where_the_run_ended(bf16_run, tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="resumed", mixed_precision="bf16", save_steps=60)
    result = run_cli("train", str(config), f"train.resume_from_checkpoint={bf16_run / 'checkpoints' / 'step-00000060'}")
    assert "resumed from" in result.stdout
    resumed, reference = metrics_of(tmp_path / "resumed"), metrics_of(bf16_run)
    assert resumed["global_step"] == 120 and resumed["eval_accuracy"] == pytest.approx(reference["eval_accuracy"], abs=1 / 37)


def test_gpu_auto_without_native_bf16_trains_in_fp16_with_loss_scaling(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="fp16", mixed_precision="auto")
    run_cli("train", str(config), env=cli_env(BERTPIPE_NATIVE_BF16="0"))  # as on a pre-Ampere GPU
    metrics = metrics_of(tmp_path / "fp16")
    assert metrics["mixed_precision"] == "fp16"
    assert metrics["eval_accuracy"] >= 0.8, metrics  # a loss scaler that never recovered would leave it untrained


def test_gpu_fused_adamw_steps_on_the_device(tiny_bert):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import AutoModelForSequenceClassification

    from pipelines.config import TrainConfig
    from pipelines.optim import build_optimizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    optimizer = build_optimizer(model, TrainConfig(learning_rate=1e-3))
    AcceleratorState._reset_state(True)  # a process-wide singleton: another in-process test may hold one
    try:
        accelerator = Accelerator(mixed_precision="fp16")
        model, optimizer = accelerator.prepare(model, optimizer)
        before = [p.detach().clone() for p in model.parameters()]
        batch = {"input_ids": torch.randint(5, 100, (8, 16), device=accelerator.device), "labels": torch.randint(0, 2, (8,), device=accelerator.device)}
        for _ in range(3):  # the first fp16 steps may be skipped while the scaler finds its scale
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    finally:
        AcceleratorState._reset_state(True)
    assert all(group["fused"] for group in optimizer.param_groups)
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_gpu_packed_ner_trains_and_counts_examples_on_the_device(tmp_path):
    """``train.pack_sequences`` on CUDA: the block-diagonal 4-D masks and restarted positions travel to the device,
    the exactness probe passes before ``prepare`` moves the model, and samples/tokens are counted without a sync."""
    from tests.test_cli_ner import toy_ner_config, toy_ner_model

    config = toy_ner_config(tmp_path, toy_ner_model(tmp_path))
    precision = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    run_cli("train", str(config), "train.pack_sequences=true", f"train.mixed_precision={precision}")
    metrics = metrics_of(tmp_path / "run")
    assert metrics["mixed_precision"] == precision and metrics["eval_f1"] >= 0.9, metrics
    unpacked = tmp_path / "unpacked"
    run_cli("train", str(config), f"output_dir={unpacked}", f"train.mixed_precision={precision}")
    # The same examples per epoch whichever way they are batched.
    assert metrics["train_samples"] == metrics_of(unpacked)["train_samples"]
    assert metrics["train_tokens"] == metrics_of(unpacked)["train_tokens"]

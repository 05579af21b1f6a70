"""The loop's speed levers keep its semantics: forced bf16 trains (fp32 on this CPU: every other CLI
test, and tests/test_cli_benchmark.py checks the recorded precision), tokens are counted exactly
(accumulated as a tensor), attention runs through SDPA, CPU loaders pin nothing, and a compiled model
trains to the same weights as the plain one (through ``aot_eager``: inductor's code generation takes
minutes on a shared CPU; the capture, the autocast wrapper and saving are what bertpipe wires)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pipelines.batching import ShuffledBatchSampler, loader_options
from tests.conftest import classification_config, run_cli

STEPS = 3


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, tiny_bert, sentiment_files):
    tmp_path = tmp_path_factory.mktemp("speed")
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="bf16", max_steps=STEPS,
                                   mixed_precision="bf16", lr_scheduler="linear", warmup_steps=1)
    run_cli("train", str(config))
    return json.loads((tmp_path / "bf16" / "metrics.json").read_text())


def test_cli_speed_forced_bf16_trains(bf16_run):
    assert bf16_run["mixed_precision"] == "bf16"
    assert bf16_run["global_step"] == STEPS and bf16_run["train_samples"] == STEPS * 8
    assert math.isfinite(bf16_run["train_loss"]) and 0.0 <= bf16_run["eval_accuracy"] <= 1.0


def test_cli_speed_counts_exactly_the_non_padding_tokens_of_the_batches_seen(bf16_run, tiny_bert, sentiment_files):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    sentences = [json.loads(line)["sentence"] for line in sentiment_files["train"].read_text().splitlines()]
    lengths = [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=32)["input_ids"]]
    # The run's sampler: seed 7 (classification_config), epoch 0, length-grouped (the default).
    batches = list(ShuffledBatchSampler(lengths, 8, seed=7, group_by_length=True))[:STEPS]
    expected = sum(lengths[index] for batch in batches for index in batch)
    assert bf16_run["train_tokens"] == expected
    # metrics.json rounds the runtime to the millisecond, and this run trains for tens of them.
    runtime = bf16_run["train_runtime"]
    assert expected / (runtime + 5e-4) - 1e-3 <= bf16_run["train_tokens_per_second"] <= expected / (runtime - 5e-4) + 1e-3


def test_cli_speed_bert_attention_runs_through_sdpa(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    from pipelines.config import ModelConfig
    from pipelines.modeling import load_model

    model = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tiny_bert)),
                       label_maps={"num_labels": 2, "id2label": {0: "a", 1: "b"}, "label2id": {"a": 0, "b": 1}})
    assert model.config._attn_implementation == "sdpa"


def test_cli_speed_loaders_pin_memory_only_for_a_gpu():
    assert loader_options(0) == {"num_workers": 0, "pin_memory": torch.cuda.is_available(), "persistent_workers": False}
    assert loader_options(2)["persistent_workers"] is True


def _weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model.safetensors"))


@pytest.mark.parametrize("precision, backend", [("bf16", "eager"), ("no", "aot_eager")])
def test_cli_speed_compiled_training_is_the_uncompiled_training(tmp_path, tiny_bert, sentiment_files, precision, backend):
    """The same weights and metrics, bit for bit, from graphs torch really captured. In bf16 the
    compiled forward runs under Accelerate's autocast wrapper in training and without it (fp32) in the
    evaluation halfway. ``aot_eager`` also captures the backward (as inductor does); it is compared in
    fp32 because under autocast its graphs cast differently (bf16 weights then differ by ~1e-2 after 6
    steps, as they would under inductor). In process, to read torch's count of captured graphs."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from pipelines.cli import load_run_config
    from pipelines.train import train
    from tasks import get_task

    runs = {}
    for name, keys in (("plain", {}), ("compiled", {"compile": True, "compile_backend": backend})):
        config_path = classification_config(tmp_path, tiny_bert, sentiment_files, run_name=name, max_steps=6, eval_steps=3,
                                            mixed_precision=precision, **keys)
        config = load_run_config(get_task, str(config_path), [])
        torch._dynamo.reset()
        counters.clear()
        try:
            metrics = train(config, get_task(config.task)(config))
            graphs = counters["stats"]["unique_graphs"]
        finally:
            torch._dynamo.reset()
        runs[name] = (metrics, _weights(tmp_path / name), graphs)
    (plain_metrics, plain_weights, plain_graphs), (compiled_metrics, compiled_weights, compiled_graphs) = runs["plain"], runs["compiled"]
    assert plain_graphs == 0 and compiled_graphs > 0
    assert compiled_metrics["global_step"] == plain_metrics["global_step"] == 6
    # Saved under the model's own keys (nn.Module.compile in place: no "_orig_mod." prefix), so the
    # run directory loads like any other.
    assert sorted(compiled_weights) == sorted(plain_weights)
    assert all(torch.equal(compiled_weights[key], plain_weights[key]) for key in plain_weights)
    for key in ("train_loss", "eval_accuracy", "eval_f1_macro", "train_tokens"):
        assert compiled_metrics[key] == plain_metrics[key], key


def test_cli_speed_unknown_compile_backend_exits_2_before_anything_is_written(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="nonesuch", compile=True,
                                   compile_backend="nonesuch")
    result = run_cli("train", str(config), check=False)
    assert result.returncode == 2
    assert "train.compile_backend='nonesuch'" in result.stderr and "aot_eager" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "nonesuch").exists()

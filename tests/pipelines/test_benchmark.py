"""Units of pipelines/benchmark/: the job the Trainer reference is given, counting, the table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.benchmark import (
    COLUMNS,
    BenchmarkError,
    MatmulPeak,
    benchmark_config_tree,
    compare_predictions,
    format_table,
    matmul_flops,
    non_embedding_parameters,
    parse_settings,
    predict_in_dataset_order,
    run_config,
    setting_sampler,
    summarize,
    trainer_arguments,
    TrainingCounter,
    trainer_predictions,
    warmup_updates,
)
from pipelines.config import TaskOptions
from pipelines.config_loading import load_config


def make_config(tmp_path, **train):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a", "label": 0}\n')
    overrides = [f"train.{key}={value}" for key, value in train.items()]
    base = {"task": "classification", "output_dir": str(tmp_path / "run"), "seed": 5,
            "data": {"files": {"train": str(data), "validation": str(data)}}}
    return load_config(None, overrides, lambda name: TaskOptions, base=base)


def test_benchmark_trainer_arguments_describe_the_same_job(tmp_path):
    from transformers import TrainingArguments

    config = make_config(tmp_path, num_epochs=2, batch_size=16, learning_rate=3e-5, weight_decay=0.05,
                         lr_scheduler="linear", warmup_fraction=0.1, max_grad_norm=0.5)
    warmup = warmup_updates(config, num_train_features=100)
    assert warmup == math.ceil(0.1 * 2 * 7)  # 7 batches of 16 per epoch, 2 epochs
    default = TrainingArguments(**trainer_arguments(config, "trainer_default", str(tmp_path / "d"), warmup_steps=warmup, bf16=False))
    best = TrainingArguments(**trainer_arguments(config, "trainer_best", str(tmp_path / "b"), warmup_steps=warmup, bf16=False))
    for args in (default, best):
        assert (args.num_train_epochs, args.max_steps, args.per_device_train_batch_size) == (2, -1, 16)
        assert (args.learning_rate, args.weight_decay, args.max_grad_norm, args.seed) == (3e-5, 0.05, 0.5, 5)
        assert args.lr_scheduler_type == "linear" and args.warmup_steps == warmup
        assert args.per_device_eval_batch_size == 32 and args.report_to == []
        assert args.optim == "adamw_torch_fused"  # the default on torch >= 2.8: the fused AdamW bertpipe uses
    assert default.train_sampling_strategy == "random" and best.train_sampling_strategy == "group_by_length"
    assert not default.bf16


def test_benchmark_constant_schedule_keeps_its_warmup_in_the_trainer(tmp_path):
    config = make_config(tmp_path, lr_scheduler="constant", warmup_steps=3, max_steps=10)
    arguments = trainer_arguments(config, "trainer_default", str(tmp_path), warmup_steps=warmup_updates(config, 40), bf16=False)
    assert arguments["lr_scheduler_type"] == "constant_with_warmup"
    assert (arguments["warmup_steps"], arguments["max_steps"]) == (3, 10)


def test_benchmark_config_drops_intermediate_evaluation_and_checkpoints(tmp_path):
    config = make_config(tmp_path, eval_steps=5, save_steps=5, metric_for_best_model="eval_accuracy",
                         load_best_model_at_end=True, early_stopping_patience=2)
    tree = benchmark_config_tree(config)
    rebuilt = run_config(tree, lambda name: type("T", (), {"Options": TaskOptions}), seed=9, output_dir=str(tmp_path / "x: y"))
    assert rebuilt.train.eval_steps is None and rebuilt.train.save_steps is None
    assert not rebuilt.train.load_best_model_at_end and rebuilt.train.early_stopping_patience is None
    assert (rebuilt.seed, rebuilt.output_dir, rebuilt.overwrite) == (9, str(tmp_path / "x: y"), True)
    assert rebuilt.train.metric_for_best_model == "eval_accuracy"  # still names the table's metric


def test_benchmark_training_counter_counts_trained_samples_and_non_padding_tokens():
    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return input_ids

    model = Model()
    counter = TrainingCounter(model)
    model(input_ids=torch.ones(2, 3), attention_mask=torch.tensor([[1, 1, 1], [1, 0, 0]]))
    model(torch.ones(1, 5))  # positional, no mask: every token counts
    model.eval()
    model(input_ids=torch.ones(4, 4), attention_mask=torch.ones(4, 4))  # evaluation is not training
    assert counter.remove() == (3, 9)
    model.train()
    model(input_ids=torch.ones(2, 2))  # removed: no longer counted
    assert (counter.samples, int(counter.tokens)) == (3, 9)


def test_benchmark_trainer_predictions_are_named_like_predict_step():
    logits = np.zeros((4, 2))
    assert trainer_predictions(logits, ["logits"], ["logits"])["logits"] is logits
    start, end = np.ones((4, 9)), np.zeros((4, 9))
    named = trainer_predictions((start, end), ["start_logits", "end_logits"], ["end_logits", "start_logits"])
    assert named["start_logits"] is start and named["end_logits"] is end
    with pytest.raises(BenchmarkError, match="generated"):
        trainer_predictions(logits, ["logits"], ["generated"])


def test_benchmark_non_embedding_parameters_leave_out_embedding_tables():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 4))
    assert non_embedding_parameters(model) == 8 * 4 + 4


def test_benchmark_parse_settings_rejects_unknown_names():
    assert parse_settings("trainer_best, bertpipe,bertpipe") == ["trainer_best", "bertpipe"]
    with pytest.raises(BenchmarkError, match="trainer_fast"):
        parse_settings("bertpipe,trainer_fast")


def test_benchmark_matmul_flops_is_a_positive_rate():
    assert matmul_flops(torch.float32, budget_seconds=0.05, start_size=64, max_size=128) > 0


def run(setting, seed, samples, tokens, runtime, accuracy, precision="fp32"):
    return {"setting": setting, "seed": seed, "precision": precision, "sampler": "random", "train_samples": samples,
            "train_tokens": tokens, "train_runtime": runtime, "wall_time": runtime + 10, "peak_rss_mb": 500.0,
            "metrics": {"accuracy": accuracy, "f1": 0.5}}


def test_benchmark_summarize_gives_spread_share_of_peak_and_ratios():
    runs = [run("bertpipe", 1, 100, 1000, 10.0, 0.90), run("bertpipe", 2, 100, 1000, 5.0, 0.92),
            run("trainer_default", 1, 100, 1500, 20.0, 0.91), run("trainer_default", 2, 100, 1500, 20.0, 0.89)]
    summary = summarize(runs, metric="accuracy", non_embedding_params=1_000, peak=MatmulPeak(fp32=6e6, bf16=1e6))
    ours = summary["rows"]["bertpipe"]
    assert ours["samples_per_second"] == {"mean": 15.0, "min": 10.0, "max": 20.0}
    assert ours["metric"]["mean"] == pytest.approx(0.91) and ours["metric"]["max"] == 0.92
    # 6 * 1000 params * 1000 tokens / 10 s = 6e5 FLOP/s = 10% of a 6e6 FLOP/s peak (20% in 5 s).
    assert ours["share_of_peak"]["min"] == pytest.approx(0.1) and ours["share_of_peak"]["max"] == pytest.approx(0.2)
    ratio = summary["ratios"]["trainer_default"]
    assert ratio["samples_per_second"] == pytest.approx(15.0 / 5.0)
    assert ratio["tokens_per_second"] == pytest.approx(150.0 / 75.0)
    assert ratio["wall_time"] == pytest.approx(17.5 / 30.0)
    assert ratio["metric_difference"] == pytest.approx(0.01)
    with pytest.raises(BenchmarkError, match="entity_f1"):
        summarize(runs, metric="entity_f1", non_embedding_params=1, peak=MatmulPeak(1.0, 1.0))


def test_benchmark_share_of_peak_uses_the_peak_of_the_rows_precision():
    runs = [run("trainer_best", 1, 10, 1000, 1.0, 0.5, precision="bf16")]
    summary = summarize(runs, metric="accuracy", non_embedding_params=1, peak=MatmulPeak(fp32=6e6, bf16=6e3))
    assert summary["rows"]["trainer_best"]["share_of_peak"]["mean"] == pytest.approx(1.0)


def test_benchmark_table_has_every_column_and_ratio():
    runs = [run("bertpipe", 1, 100, 1000, 10.0, 0.9), run("trainer_best", 1, 100, 1000, 12.0, 0.9)]
    summary = summarize(runs, metric="accuracy", non_embedding_params=1_000, peak=MatmulPeak(fp32=1e9, bf16=1e8))
    header = {"config": "c.yaml", "seeds": 1, "seed_values": [1], "train_examples": 100, "eval_examples": 10,
              "non_embedding_params": 1000, "peak": {"fp32": 1e9, "bf16": 1e8}, "native_bf16": False,
              "load_average": {"start": [1.0, 2.0, 3.0], "end": [1.5, 2.0, 3.0]}}
    table = format_table(summary, header)
    header_line = next(line for line in table.splitlines() if line.startswith("| setting"))
    assert [cell.strip() for cell in header_line.strip("|").split("|")] == [c.format(metric="accuracy") for c in COLUMNS]
    assert "| trainer_best | 1.20x | 1.20x |" in table and "1.0/2.0/3.0 at start" in table


def test_benchmark_compare_predictions_names_differing_rows():
    reference = {"setting": "a", "inputs": 3, "labels": ["x", "y", "x"], "scores": [0.9, 0.8, 0.7]}
    other = {"setting": "b", "inputs": 3, "labels": ["x", "x", "x"], "scores": [0.9, 0.8, 0.75]}
    agreement = compare_predictions(reference, other)
    assert not agreement["identical_labels"] and agreement["differing_rows"] == [1]
    assert agreement["max_score_difference"] == pytest.approx(0.05)
    assert compare_predictions(reference, reference)["identical_labels"]
    with pytest.raises(BenchmarkError, match="3 inputs"):
        compare_predictions(reference, {**other, "inputs": 2, "labels": ["x"] * 2, "scores": [0.1] * 2})


def test_benchmark_trainer_predictions_come_back_in_dataset_order_under_length_grouping(tmp_path):
    """The Trainer length-groups evaluation batches too under group_by_length; scoring needs dataset order."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    class LengthAndFirstToken(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return {"logits": torch.stack([attention_mask.sum(dim=1), input_ids[:, 0]], dim=1).float()}

    def pad(features):
        width = max(len(f["input_ids"]) for f in features)
        ids = [f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features]
        mask = [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}

    lengths = [3, 17, 5, 11, 2, 29, 7, 13, 19, 23, 4, 8] * 4
    features = Dataset.from_dict({"input_ids": [[index + 1] * length for index, length in enumerate(lengths)]})
    arguments = TrainingArguments(output_dir=str(tmp_path), train_sampling_strategy="group_by_length",
                                  per_device_eval_batch_size=4, report_to="none", use_cpu=True)
    trainer = Trainer(model=LengthAndFirstToken(), args=arguments, data_collator=pad)
    predicted = predict_in_dataset_order(trainer, features).predictions
    assert predicted[:, 0].tolist() == lengths
    assert predicted[:, 1].tolist() == list(range(1, len(lengths) + 1))
    assert trainer.args.train_sampling_strategy == "group_by_length"  # restored for training


def test_benchmark_sampler_column_names_a_non_default_length_group_window(tmp_path):
    assert setting_sampler(make_config(tmp_path), "bertpipe") == "length-grouped"
    assert setting_sampler(make_config(tmp_path, length_group_batches=4), "bertpipe") == "length-grouped by 4 batches"
    assert setting_sampler(make_config(tmp_path, group_by_length=False), "bertpipe") == "random"
    assert setting_sampler(make_config(tmp_path, length_group_batches=4), "trainer_best") == "length-grouped"
    assert setting_sampler(make_config(tmp_path), "trainer_default") == "random"


@pytest.mark.parametrize("overrides, naming", [
    (["model.peft.method=lora"], "model.peft"),
    (["distill.teacher=/nowhere/teacher", "distill.init=model"], "distill"),
])
def test_benchmark_refuses_a_config_whose_bertpipe_job_is_not_the_trainers(tmp_path, overrides, naming):
    # The Trainer reference trains the task's full model: against a LoRA adapter or a distilled student
    # the table compared two different jobs, without a word, after hours of runs.
    from pipelines.benchmark import run_benchmark
    from pipelines.benchmark.to_accuracy import run_to_accuracy

    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a", "label": 0}\n')
    base = {"task": "classification", "output_dir": str(tmp_path / "run"), "data": {"files": {"train": str(data), "validation": str(data)}}}
    config = load_config(None, overrides, lambda name: TaskOptions, base=base)
    for command in (run_benchmark, run_to_accuracy):
        out = tmp_path / command.__name__
        with pytest.raises(BenchmarkError, match=naming):
            command(config, lambda name: pytest.fail("no run may start"), config_label="c", output_dir=str(out), log=lambda line: None)
        assert not out.exists()


FACTS = {"train_examples": 1, "eval_examples": 1, "train_features": 1, "non_embedding_params": 1}


def fake_job(monkeypatch, started, *, failing_run=None):
    """run_benchmark and run_to_accuracy with the task's metrics given and every run faked (recorded in ``started``)."""
    from pipelines.benchmark import runner, to_accuracy

    def run_in_child(spec, get_task, *entry):
        started.append(spec)
        if len(started) == failing_run:
            raise RuntimeError("this run failed")
        (Path(spec.output_dir)).mkdir(parents=True)
        return run(spec.setting, spec.seed, 1, 1, 1.0, 0.5)

    for module in (runner, to_accuracy):
        monkeypatch.setattr(module, "prepare_job", lambda config, get_task: {**FACTS, "metric_names": ["accuracy", "f1"]})
        monkeypatch.setattr(module, "run_in_child", run_in_child)
    monkeypatch.setattr(runner, "measure_matmul_peak", lambda: MatmulPeak(fp32=1.0, bf16=1.0))
    return runner, to_accuracy


@pytest.mark.parametrize("metric", ["acuracy", "runtime"])
def test_benchmark_metric_the_task_does_not_report_is_refused_before_the_first_run(tmp_path, monkeypatch, metric):
    # A misspelt --metric was reported after every setting and seed had run (hours of a real benchmark), later after
    # the first run; and one that bertpipe's runs report but the Trainer's do not (runtime) passed that first check.
    started = []
    runner, to_accuracy = fake_job(monkeypatch, started)
    for command in (runner.run_benchmark, to_accuracy.run_to_accuracy):
        out = tmp_path / command.__name__
        with pytest.raises(BenchmarkError, match=f"{metric!r} is not among the task's metrics \\['accuracy', 'f1'\\]"):
            command(make_config(tmp_path), None, config_label="c", seeds=3, output_dir=str(out), metric=metric, log=lambda line: None)
        assert started == [] and not out.exists()
    finished = runner.run_benchmark(make_config(tmp_path), None, config_label="c", seeds=2, output_dir=str(tmp_path / "out"),
                                    metric="f1", log=lambda line: None)
    assert len(finished["runs"]) == 2 * len(runner.SETTINGS) and finished["summary"]["metric"] == "f1"


def test_benchmark_failing_run_leaves_the_earlier_benchmark_in_its_folder_as_it_was(tmp_path, monkeypatch):
    from pipelines.benchmark import RESULTS_JSON

    started = []
    runner, to_accuracy = fake_job(monkeypatch, started)
    out = tmp_path / "out"
    runner.run_benchmark(make_config(tmp_path), None, config_label="c", seeds=1, output_dir=str(out), log=lambda line: None)
    before = {path: path.read_bytes() if path.is_file() else None for path in out.rglob("*")}
    assert (out / RESULTS_JSON).is_file() and (out / "runs" / "bertpipe-seed5").is_dir()

    fake_job(monkeypatch, started, failing_run=2)
    for command in (runner.run_benchmark, to_accuracy.run_to_accuracy):
        started.clear()
        with pytest.raises(RuntimeError, match="this run failed"):
            command(make_config(tmp_path), None, config_label="c", seeds=1, output_dir=str(out), overwrite=True, log=lambda line: None)
        assert len(started) == 2
        assert {path: path.read_bytes() if path.is_file() else None for path in out.rglob("*")} == before
        assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "train.jsonl"]


def report_peak_rss(spec, get_task):
    from pipelines.benchmark import peak_rss_mb

    return {"peak_rss_mb": peak_rss_mb()}


def test_benchmark_peak_rss_is_the_spawned_runs_own(tmp_path):
    # getrusage's ru_maxrss survives exec: every run reported the parent's peak when that was higher.
    from pipelines.benchmark import RunSpec, peak_rss_mb, run_in_child

    held = torch.ones(2**30 // 4)  # 1 GiB, touched: the parent's peak stands far above anything a child reaches
    parent = peak_rss_mb()
    child = run_in_child(RunSpec("bertpipe", 1, {}, str(tmp_path)), None, report_peak_rss)["peak_rss_mb"]
    assert held.sum() > 0 and parent > 1024
    assert 10 < child < parent - 600, (child, parent)


def sleep_in_child(spec, get_task):
    import os
    import time

    Path(spec.output_dir, "pid").write_text(str(os.getpid()))
    time.sleep(60)
    return {}


def kill_self_in_child(spec, get_task):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_benchmark_stop_while_a_run_is_in_its_child_kills_the_child(tmp_path):
    # `kill PID` of a benchmark ended the parent alone (exit 143, silently): its run trained on as an orphan.
    import os
    import signal
    import threading
    import time

    from pipelines.benchmark import RunSpec, run_in_child
    from pipelines.preemption import StopNow, stopping_at_once

    pid_file = tmp_path / "pid"

    def signal_once_the_child_runs():
        deadline = time.monotonic() + 60
        while not pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_the_child_runs, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(StopNow), stopping_at_once():
        run_in_child(RunSpec("bertpipe", 3, {}, str(tmp_path)), None, sleep_in_child)
    assert time.monotonic() - started < 40, "the stop waited for the child to finish"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_benchmark_run_whose_process_was_killed_is_named(tmp_path):
    from pipelines.benchmark import RunSpec, run_in_child

    with pytest.raises(BenchmarkError, match="the trainer_best run \\(seed 4\\) ended without a result: its process was killed"):
        run_in_child(RunSpec("trainer_best", 4, {}, str(tmp_path)), None, kill_self_in_child)


def test_benchmark_trainer_reference_freezes_the_input_embeddings_the_config_freezes(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """model.freeze_input_embeddings is the job's, not bertpipe's: the Trainer reference trains with them frozen too."""
    from safetensors.torch import load_file

    from pipelines.benchmark import trainer as trainer_module
    from pipelines.cli import load_run_config
    from tasks import get_task
    from tests.conftest import classification_config

    frozen = []
    original = trainer_module.freeze_input_embeddings
    monkeypatch.setattr(trainer_module, "freeze_input_embeddings", lambda model: frozen.append(model) or original(model))
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=3, eval_steps=None,
                                                                 mixed_precision="no")), ["model.freeze_input_embeddings=true"])
    record = trainer_module._run_trainer(config, get_task(config.task)(config), "trainer_best")
    assert record["train_samples"] > 0 and len(frozen) == 1
    loaded = load_file(tiny_bert / "model.safetensors")
    trained = {name: parameter.detach() for name, parameter in frozen[0].named_parameters()}
    words = next(name for name in loaded if name.endswith("embeddings.word_embeddings.weight"))
    positions = next(name for name in loaded if name.endswith("embeddings.position_embeddings.weight"))
    assert torch.equal(trained["bert.embeddings.word_embeddings.weight"], loaded[words])
    assert not torch.equal(trained["bert.embeddings.position_embeddings.weight"], loaded[positions])


def test_benchmark_trainer_reference_is_scored_in_fp32_after_training_in_bf16(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """trainer_best trains in bf16 where it is native; its model is scored in fp32, as bertpipe's evaluations score
    bertpipe's: the Trainer's Accelerator wraps the model's forward in autocast, and its predictions came out bf16."""
    from pipelines.benchmark import trainer as trainer_module
    from pipelines.cli import load_run_config
    from tasks import get_task
    from tests.conftest import classification_config

    monkeypatch.setenv("BERTPIPE_NATIVE_BF16", "1")
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=2, eval_steps=None,
                                                                 mixed_precision="no")), [])
    calls = []
    original_build = trainer_module.TrainingCounter

    def watching_counter(model):
        head = model.classifier
        head.register_forward_hook(lambda module, args, output: calls.append((module.training, output.dtype)))
        return original_build(model)

    monkeypatch.setattr(trainer_module, "TrainingCounter", watching_counter)
    record = trainer_module._run_trainer(config, get_task(config.task)(config), "trainer_best")
    trained = {dtype for training, dtype in calls if training}
    scored = {dtype for training, dtype in calls if not training}
    assert trained == {torch.bfloat16}, "the setting under test trains in bf16"
    assert scored == {torch.float32} and record["metrics"]


def test_benchmark_trainer_reference_trains_on_the_threads_the_config_gives(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """train.torch_num_threads is the job's: bertpipe's loop took it, the Trainer kept torch's default (every core),
    and samples/s, the ratios and % of peak compared N threads with all of them."""
    from pipelines.benchmark import trainer as trainer_module
    from pipelines.cli import load_run_config
    from tasks import get_task
    from tests.conftest import classification_config

    threads = []
    original_counter = trainer_module.TrainingCounter
    monkeypatch.setattr(trainer_module, "TrainingCounter", lambda model: threads.append(torch.get_num_threads()) or original_counter(model))
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=1, eval_steps=None,
                                                                 mixed_precision="no")), ["train.torch_num_threads=1"])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        trainer_module._run_trainer(config, get_task(config.task)(config), "trainer_default")
    finally:
        torch.set_num_threads(before)
    assert threads == [1]

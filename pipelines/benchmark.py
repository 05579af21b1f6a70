"""Side-by-side speed benchmark: bertpipe against the transformers ``Trainer`` on the same job.

In:  a run config (YAML + ``key=value`` overrides), the task registry lookup (handed in by the CLI;
     ``pipelines/`` never imports ``tasks/``), the settings to compare and a number of seeds.
Out: one table (printed, and written as ``benchmark.md`` + ``benchmark.json`` in the output folder)
     with, per setting: train samples/s, non-padding tokens/s, train and wall time, peak RSS, the
     task's main validation metric (mean and range over seeds), achieved useful FLOP/s as a share
     of this machine's measured matmul peak, and the ratios bertpipe / each Trainer setting.

Settings (the same model, data, examples, epochs, batch size, learning rate, schedule, warmup and
max length everywhere; only the machinery differs):

- ``bertpipe``: ``pipelines.train.train`` on the config as given.
- ``trainer_default``: the transformers docs recipe (AutoTokenizer, ``Dataset.map`` tokenisation,
  the task's collator — ``DataCollatorWithPadding`` for classification,
  ``DataCollatorForTokenClassification`` for NER —, ``TrainingArguments``, ``Trainer.train``,
  ``Trainer.predict``) in fp32 with random batches.
- ``trainer_best``: the same with length-grouped batches and bf16 — where bf16 is native. On CPUs
  without AVX-512 BF16/AMX bf16 is emulated and many times slower than fp32, so "best" stays fp32
  there; the table says which precision every row used.

Both sides are scored by the task's own ``postprocess`` and ``compute_metrics`` (the Trainer's
``predict`` logits go through them), so the metric column compares like with like. Every run is
a fresh spawned process: peak RSS is that run's own (``getrusage`` in the child), and no run
inherits another's warm caches or allocator state. The datasets cache is filled once before the
timed runs so that no setting pays for tokenisation the others get for free; the order of the
settings rotates from seed to seed so that slow drift in machine load is spread over all of them.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import os
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from pipelines.config import TRAINER_LENGTH_GROUP_BATCHES, RunConfig, load_config
from pipelines.optim import plan_steps
from pipelines.runtime import has_accelerator_device, native_bf16, resolve_mixed_precision

SETTINGS = ("bertpipe", "trainer_default", "trainer_best")
RESULTS_JSON = "benchmark.json"
RESULTS_MARKDOWN = "benchmark.md"
FLOPS_PER_TOKEN_PER_PARAMETER = 6
"""Forward (2) + backward (4) multiply-adds per non-embedding parameter per token (Kaplan et al.)."""

TaskLookup = Callable[[str], type]


class BenchmarkError(ValueError):
    """A benchmark request that cannot run as asked (unknown setting, no metric of that name)."""


# ----- what is measured -----------------------------------------------------------------------
@dataclass(frozen=True)
class MatmulPeak:
    fp32: float
    bf16: float
    """FLOP/s of the best timed square matmul in each dtype."""

    def for_precision(self, precision: str) -> float:
        return self.bf16 if precision == "bf16" else self.fp32


def matmul_flops(dtype: torch.dtype, *, budget_seconds: float = 1.0, start_size: int = 256, max_size: int = 4096) -> float:
    """FLOP/s of the fastest square matmul (2·n³ FLOPs) in ``dtype``, within about ``budget_seconds``.

    The size doubles until one product takes an eighth of the budget (large enough to reach the
    kernel's peak) or ``max_size``; then the best of three timings counts. The budget keeps this
    bounded where a dtype is emulated (bf16 on AVX2 CPUs runs at a few percent of fp32).
    """
    size = start_size
    while True:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        torch.mm(a, b)  # first call at a size: kernel selection, page faults
        started = time.perf_counter()
        torch.mm(a, b)
        best = time.perf_counter() - started
        if best > budget_seconds / 8 or size >= max_size:
            break
        size *= 2
    for _ in range(2):
        if best > budget_seconds / 2:
            break
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def measure_matmul_peak(budget_seconds: float = 1.0) -> MatmulPeak:
    """This machine's matmul peak in fp32 and bf16 (intra-op threads as torch sets them)."""
    return MatmulPeak(
        fp32=matmul_flops(torch.float32, budget_seconds=budget_seconds),
        bf16=matmul_flops(torch.bfloat16, budget_seconds=budget_seconds),
    )


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters outside embedding tables: those that cost FLOPs per token (the 6·N·T estimate)."""
    embedding = {id(p) for module in model.modules() if isinstance(module, torch.nn.Embedding) for p in module.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----- the job, made identical for every setting ------------------------------------------------
def benchmark_config_tree(config: RunConfig) -> dict[str, Any]:
    """The config as the benchmark runs it: no intermediate evaluation, checkpoints or trackers.

    Those would cost bertpipe time the Trainer reference (``eval_strategy="no"``,
    ``save_strategy="no"``, ``report_to="none"``) does not spend.
    """
    tree = config.to_yaml_dict()
    tree["train"].update(
        eval_steps=None, eval_on_start=False, save_steps=None, early_stopping_patience=None, load_best_model_at_end=False,
        report_to=[], resume_from_checkpoint=None,
    )
    tree["overwrite"] = True
    return tree


def run_config(tree: dict[str, Any], get_task: TaskLookup, *, seed: int, output_dir: str) -> RunConfig:
    return load_config(None, [], lambda name: get_task(name).Options, base={**tree, "seed": seed, "output_dir": output_dir})


def warmup_updates(config: RunConfig, num_train_features: int) -> int:
    """bertpipe's warmup in optimizer updates, handed to the Trainer as an exact ``warmup_steps``."""
    batches = math.ceil(num_train_features / config.train.batch_size)
    return plan_steps(config.train, batches).warmup_updates


def trainer_arguments(config: RunConfig, setting: str, output_dir: str, *, warmup_steps: int, bf16: bool) -> dict[str, Any]:
    """``TrainingArguments`` keywords (transformers 5.x names) for one Trainer setting of the job."""
    train = config.train
    return {
        "output_dir": output_dir,
        "seed": config.seed,
        "num_train_epochs": train.num_epochs,
        "max_steps": train.max_steps or -1,
        "per_device_train_batch_size": train.batch_size,
        "per_device_eval_batch_size": train.eval_batch_size or train.batch_size * 2,
        "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "learning_rate": train.learning_rate,
        "weight_decay": train.weight_decay,
        "adam_beta1": train.adam_beta1,
        "adam_beta2": train.adam_beta2,
        "adam_epsilon": train.adam_epsilon,
        "max_grad_norm": train.max_grad_norm or 0.0,
        # bertpipe's "constant" warms up too; the Trainer's plain "constant" would ignore warmup_steps.
        "lr_scheduler_type": "constant_with_warmup" if train.lr_scheduler == "constant" else train.lr_scheduler,
        "warmup_steps": warmup_steps,
        "bf16": bf16,
        "train_sampling_strategy": "group_by_length" if setting == "trainer_best" else "random",
        "eval_strategy": "no",
        "save_strategy": "no",
        "logging_steps": train.logging_steps,
        "report_to": "none",
        "use_cpu": not has_accelerator_device(),
        "dataloader_num_workers": train.dataloader_num_workers,
    }


def setting_precision(config: RunConfig, setting: str) -> str:
    if setting == "bertpipe":
        resolved = resolve_mixed_precision(config.train.mixed_precision)
        return "fp32" if resolved == "no" else resolved
    if setting == "trainer_best" and native_bf16():
        return "bf16"
    return "fp32"


def setting_sampler(config: RunConfig, setting: str) -> str:
    window = config.train.length_group_batches
    if setting == "bertpipe" and config.train.group_by_length and window != TRAINER_LENGTH_GROUP_BATCHES:
        return f"length-grouped by {window} batches"
    grouped = config.train.group_by_length if setting == "bertpipe" else setting == "trainer_best"
    return "length-grouped" if grouped else "random"


# ----- one run, in its own process ------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    setting: str
    seed: int
    tree: dict[str, Any]
    output_dir: str


class TrainingCounter:
    """Counts the samples and non-padding tokens the model trains on, as bertpipe's loop does.

    A forward pre-hook, not a collator wrapper: dataloaders build batches ahead of use (Accelerate
    looks one batch ahead to detect the end), so a count at collation overstates what was trained
    on when training stops mid-epoch; and it works whether or not DataLoader workers collate.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.samples = 0
        self.tokens = torch.zeros((), dtype=torch.int64)
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        mask = kwargs.get("attention_mask")
        self.samples += input_ids.shape[0]
        # A tensor sum, no .item(): no device sync per step on accelerators.
        self.tokens += (mask.sum() if mask is not None else input_ids.numel())

    def remove(self) -> tuple[int, int]:
        """Stop counting; returns (samples, tokens)."""
        self._handle.remove()
        return self.samples, int(self.tokens)


def trainer_predictions(predictions: np.ndarray | tuple, output_names: Sequence[str], wanted: Sequence[str]) -> dict[str, np.ndarray]:
    """``Trainer.predict(...).predictions`` (one array, or a tuple in model-output order) -> the
    task's ``predict_step`` keys, which name model outputs (``logits``, ``start_logits``...)."""
    arrays = (predictions,) if isinstance(predictions, np.ndarray) else tuple(predictions)
    if len(arrays) != len(output_names):
        raise BenchmarkError(f"Trainer returned {len(arrays)} prediction arrays for model outputs {list(output_names)}")
    by_name = dict(zip(output_names, arrays))
    missing = [key for key in wanted if key not in by_name]
    if missing:
        raise BenchmarkError(
            f"the task's predict_step returns {missing}, which are not model outputs {list(output_names)}: "
            "the Trainer reference can only score tasks whose predictions are the model's forward outputs"
        )
    return {key: by_name[key] for key in wanted}


def _model_output_names(task, model, features) -> tuple[list[str], list[str]]:
    """(forward output names in Trainer.predict's order, the keys the task's predict_step returns)."""
    batch = task.collator(train=False)([features[i] for i in range(min(2, len(features)))])
    model.eval()
    with torch.no_grad():
        outputs = model(**batch)
        wanted = list(task.predict_step(model, batch))
    ignored = set(getattr(model.config, "keys_to_ignore_at_inference", None) or [])
    return [key for key in outputs.keys() if key != "loss" and key not in ignored], wanted


def _run_bertpipe(config: RunConfig, task) -> dict[str, Any]:
    from pipelines.train import train

    summary = train(config, task)
    return {
        "train_samples": summary["train_samples"],
        "train_tokens": summary["train_tokens"],
        "train_runtime": summary["train_runtime"],
        "metrics": {key.removeprefix("eval_"): value for key, value in summary.items() if key.startswith("eval_")},
    }


def predict_in_dataset_order(trainer, features):
    """``trainer.predict`` with one prediction per feature, in the features' order.

    Under ``train_sampling_strategy="group_by_length"`` transformers 5's Trainer also length-groups
    the *evaluation* batches (``_get_eval_sampler``: a LengthGroupedSampler with shuffled megabatches),
    so predictions would come back in another order than the examples they are scored against.
    """
    strategy = trainer.args.train_sampling_strategy
    trainer.args.train_sampling_strategy = "random"
    try:
        return trainer.predict(features)
    finally:
        trainer.args.train_sampling_strategy = strategy


def _trainer_model_outputs(trainer, task, eval_features) -> dict[str, np.ndarray]:
    """What the task's ``predict_step`` returns, for every eval feature in order, from the Trainer's model.

    ``Trainer.predict`` (the docs recipe) when those are the model's forward outputs (classification
    logits, QA start/end logits). A task that reduces them inside ``predict_step`` (NER's per-token
    argmax and its probability, translation's ``generate``) is predicted through bertpipe's own
    evaluation code on the Trainer-trained model, so both sides are still scored by the same code.
    """
    output_names, wanted = _model_output_names(task, trainer.model, eval_features)
    if set(wanted) <= set(output_names):
        predicted = predict_in_dataset_order(trainer, eval_features)
        return trainer_predictions(predicted.predictions, output_names, wanted)
    from torch.utils.data import DataLoader

    from pipelines.evaluation import concat_padded

    # A plain loop, not run_predictions: the Trainer's Accelerator still holds its training loader's
    # end-of-data state, which gather_for_metrics would use to truncate these batches.
    loader = DataLoader(eval_features, batch_size=trainer.args.per_device_eval_batch_size, collate_fn=task.collator(train=False))
    collected: dict[str, list[np.ndarray]] = {}
    trainer.model.eval()
    with torch.no_grad():
        for batch in loader:
            batch = {key: value.to(trainer.model.device) for key, value in batch.items()}
            for key, tensor in task.predict_step(trainer.model, batch).items():
                collected.setdefault(key, []).append(tensor.float().cpu().numpy() if tensor.is_floating_point() else tensor.cpu().numpy())
    return {key: concat_padded(chunks, task.output_pad_values.get(key, -100)) for key, chunks in collected.items()}


def _run_trainer(config: RunConfig, task, setting: str) -> dict[str, Any]:
    """The docs recipe; every task-specific step is the task's own method, as in bertpipe."""
    from transformers import Trainer, TrainingArguments, set_seed

    data = config.data
    # Seeded before the model is built, as the docs' run_glue.py does and as bertpipe's train() does:
    # otherwise the new head's initialisation is unseeded and a run cannot be repeated.
    set_seed(config.seed)
    raw = task.load()
    tokenizer = task.build_tokenizer(raw)
    train_features = task.preprocess(raw[data.train_split], train=True)
    eval_features = task.preprocess(raw[data.eval_split], train=False)
    model = task.build_model(raw)
    collator = task.collator(train=True)
    arguments = trainer_arguments(
        config, setting, config.output_dir, warmup_steps=warmup_updates(config, len(train_features)),
        bf16=setting_precision(config, setting) == "bf16",
    )
    trainer = Trainer(
        model=model, args=TrainingArguments(**arguments), train_dataset=train_features,
        data_collator=collator, processing_class=tokenizer,
    )
    counter = TrainingCounter(trainer.model)
    result = trainer.train()
    samples, tokens = counter.remove()
    trainer.data_collator = task.collator(train=False)
    outputs = _trainer_model_outputs(trainer, task, eval_features)
    predictions = task.postprocess(outputs, eval_features, raw[data.eval_split])
    metrics = {name: float(value) for name, value in task.compute_metrics(predictions, raw[data.eval_split]).items()}
    trainer.save_model()
    return {"train_samples": samples, "train_tokens": tokens, "train_runtime": result.metrics["train_runtime"], "metrics": metrics}


def run_one(spec: RunSpec, get_task: TaskLookup) -> dict[str, Any]:
    """One setting and seed, start to finish (data, model, train, evaluate, save): a child process."""
    started = time.perf_counter()
    config = run_config(spec.tree, get_task, seed=spec.seed, output_dir=spec.output_dir)
    task = get_task(config.task)(config)
    if spec.setting == "bertpipe":
        record = _run_bertpipe(config, task)
    else:
        record = _run_trainer(config, task, spec.setting)
    return {
        "setting": spec.setting,
        "seed": spec.seed,
        "precision": setting_precision(config, spec.setting),
        "sampler": setting_sampler(config, spec.setting),
        "wall_time": time.perf_counter() - started,
        "peak_rss_mb": peak_rss_mb(),
        **record,
    }


def run_in_child(spec: RunSpec, get_task: TaskLookup) -> dict[str, Any]:
    # spawn, not fork: a fresh interpreter, so peak RSS and warm state belong to this run alone.
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_one, spec, get_task).result()


# ----- the table ------------------------------------------------------------------------------
def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def summarize(runs: Sequence[dict[str, Any]], *, metric: str, non_embedding_params: int, peak: MatmulPeak) -> dict[str, Any]:
    """Per-setting statistics over seeds, and bertpipe / Trainer ratios."""
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_setting.setdefault(run["setting"], []).append(run)
    rows = {}
    for setting, records in by_setting.items():
        for record in records:
            if metric not in record["metrics"]:
                raise BenchmarkError(f"metric {metric!r} is not among the task's metrics {sorted(record['metrics'])}; pass --metric")
        flops = [
            FLOPS_PER_TOKEN_PER_PARAMETER * non_embedding_params * r["train_tokens"] / r["train_runtime"] / peak.for_precision(r["precision"])
            for r in records
        ]
        rows[setting] = {
            "precision": "/".join(sorted({r["precision"] for r in records})),
            "sampler": records[0]["sampler"],
            "seeds": [r["seed"] for r in records],
            "samples_per_second": _spread([r["train_samples"] / r["train_runtime"] for r in records]),
            "tokens_per_second": _spread([r["train_tokens"] / r["train_runtime"] for r in records]),
            "train_time": _spread([r["train_runtime"] for r in records]),
            "wall_time": _spread([r["wall_time"] for r in records]),
            "peak_rss_mb": _spread([r["peak_rss_mb"] for r in records]),
            "metric": _spread([r["metrics"][metric] for r in records]),
            "share_of_peak": _spread(flops),
        }
    ratios = {}
    if "bertpipe" in rows:
        ours = rows["bertpipe"]
        for setting, row in rows.items():
            if setting == "bertpipe":
                continue
            ratios[setting] = {
                "samples_per_second": ours["samples_per_second"]["mean"] / row["samples_per_second"]["mean"],
                "tokens_per_second": ours["tokens_per_second"]["mean"] / row["tokens_per_second"]["mean"],
                "wall_time": ours["wall_time"]["mean"] / row["wall_time"]["mean"],
                "peak_rss_mb": ours["peak_rss_mb"]["mean"] / row["peak_rss_mb"]["mean"],
                "metric_difference": ours["metric"]["mean"] - row["metric"]["mean"],
            }
    return {"metric": metric, "rows": rows, "ratios": ratios}


COLUMNS = ["setting", "precision", "sampler", "samples/s", "tokens/s", "train s", "wall s", "peak RSS MB", "{metric}", "% of matmul peak"]


def _cell(spread: dict[str, float], digits: int, scale: float = 1.0) -> str:
    mean, low, high = (spread[k] * scale for k in ("mean", "min", "max"))
    if math.isclose(low, high, rel_tol=1e-12, abs_tol=10**-(digits + 2)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def _load(values: Sequence[float]) -> str:
    return "/".join(f"{value:.1f}" for value in values)


def format_table(summary: dict[str, Any], header: dict[str, Any]) -> str:
    metric = summary["metric"]
    lines = [
        f"# bertpipe benchmark: {header['config']}",
        "",
        f"{header['seeds']} seed(s) {header['seed_values']}; {header['train_examples']} train / {header['eval_examples']} eval examples; "
        f"{header['non_embedding_params']:,} non-embedding parameters; matmul peak {header['peak']['fp32'] / 1e9:.1f} GFLOP/s fp32, "
        f"{header['peak']['bf16'] / 1e9:.1f} GFLOP/s bf16 (native bf16: {header['native_bf16']}); load average (1/5/15 min) "
        f"{_load(header['load_average']['start'])} at start, {_load(header['load_average']['end'])} at end "
        f"(on {os.cpu_count()} CPUs). Cells: mean [min–max] over seeds.",
        "",
        "| " + " | ".join(column.format(metric=metric) for column in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for setting, row in summary["rows"].items():
        cells = [
            setting, row["precision"], row["sampler"], _cell(row["samples_per_second"], 1), _cell(row["tokens_per_second"], 0),
            _cell(row["train_time"], 1), _cell(row["wall_time"], 1), _cell(row["peak_rss_mb"], 0), _cell(row["metric"], 4),
            _cell(row["share_of_peak"], 1, scale=100),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if summary["ratios"]:
        lines += ["", "| bertpipe / | samples/s | tokens/s | wall time | peak RSS | " + f"Δ {metric} |", "|---|---|---|---|---|---|"]
        for setting, ratio in summary["ratios"].items():
            lines.append(
                f"| {setting} | {ratio['samples_per_second']:.2f}x | {ratio['tokens_per_second']:.2f}x | {ratio['wall_time']:.2f}x | "
                f"{ratio['peak_rss_mb']:.2f}x | {ratio['metric_difference']:+.4f} |"
            )
    return "\n".join(lines) + "\n"


# ----- the command ----------------------------------------------------------------------------
def parse_settings(text: str) -> list[str]:
    settings = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in settings if name not in SETTINGS]
    if unknown or not settings:
        raise BenchmarkError(f"unknown setting(s) {unknown or [text]}; choose from {', '.join(SETTINGS)}")
    return list(dict.fromkeys(settings))


def default_metric(config: RunConfig, metric_names: Sequence[str]) -> str:
    """``train.metric_for_best_model`` when set, else the first metric the task reports
    (accuracy for single-label classification)."""
    if config.train.metric_for_best_model:
        return config.train.metric_for_best_model.removeprefix("eval_")
    return metric_names[0]


def _prepare(config: RunConfig, get_task: TaskLookup) -> dict[str, Any]:
    """Fill the datasets cache (tokenised features) and count what the FLOP estimate needs."""
    task = get_task(config.task)(config)
    raw = task.load()
    task.build_tokenizer(raw)
    train_features = task.preprocess(raw[config.data.train_split], train=True)
    task.preprocess(raw[config.data.eval_split], train=False)
    model = task.build_model(raw)
    return {
        "train_examples": len(raw[config.data.train_split]),
        "eval_examples": len(raw[config.data.eval_split]),
        "train_features": len(train_features),
        "non_embedding_params": non_embedding_parameters(model),
    }


def run_benchmark(
    config: RunConfig,
    get_task: TaskLookup,
    *,
    config_label: str,
    seeds: int = 3,
    settings: Sequence[str] = SETTINGS,
    output_dir: str | None = None,
    metric: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every setting for ``seeds`` seeds, one run at a time; write and return the results."""
    if seeds < 1:
        raise BenchmarkError("--seeds must be at least 1")
    out = Path(output_dir or f"{config.output_dir}-benchmark")
    out.mkdir(parents=True, exist_ok=True)
    load_at_start = os.getloadavg()
    tree = benchmark_config_tree(config)
    facts = _prepare(config, get_task)
    log("measuring the matmul peak")
    peak = measure_matmul_peak()
    seed_values = [config.seed + index for index in range(seeds)]
    runs = []
    for index, seed in enumerate(seed_values):
        rotation = index % len(settings)
        for setting in [*settings[rotation:], *settings[:rotation]]:
            log(f"run {len(runs) + 1}/{seeds * len(settings)}: {setting}, seed {seed}")
            spec = RunSpec(setting=setting, seed=seed, tree=tree, output_dir=str(out / "runs" / f"{setting}-seed{seed}"))
            runs.append(run_in_child(spec, get_task))
    metric = metric or default_metric(config, list(runs[0]["metrics"]))
    summary = summarize(runs, metric=metric, non_embedding_params=facts["non_embedding_params"], peak=peak)
    header = {
        "config": config_label, "seeds": seeds, "seed_values": seed_values, **facts,
        "peak": {"fp32": peak.fp32, "bf16": peak.bf16}, "native_bf16": native_bf16(),
        "load_average": {"start": load_at_start, "end": os.getloadavg()},
    }
    table = format_table(summary, header)
    (out / RESULTS_MARKDOWN).write_text(table)
    (out / RESULTS_JSON).write_text(json.dumps({**header, **summary, "runs": runs}, indent=2) + "\n")
    return {"table": table, "summary": summary, "runs": runs, "output_dir": str(out)}


# ----- prediction: `bertpipe predict` against transformers.pipeline() -----------------------------
PREDICT_SETTINGS = ("bertpipe_predict", "pipeline")
PREDICT_JSON = "predict_benchmark.json"
PREDICT_MARKDOWN = "predict_benchmark.md"


@dataclass(frozen=True)
class PredictSpec:
    setting: str
    run_dir: str
    input_path: str
    output_path: str
    overrides: tuple[str, ...] = ()


def _finished_run(spec: PredictSpec, get_task: TaskLookup):
    from pipelines.outputs import load_saved_config

    config = load_config(None, list(spec.overrides), lambda name: get_task(name).Options, base=load_saved_config(spec.run_dir))
    return config, get_task(config.task)(config)


def predict_one(spec: PredictSpec, get_task: TaskLookup) -> dict[str, Any]:
    """Predict every input with a finished run, start to finish (load, tokenise, forward, write).

    ``bertpipe_predict`` is ``bertpipe predict``'s code path (length-sorted batches);
    ``pipeline`` is ``transformers.pipeline("text-classification")`` with the same batch size and
    truncation, fed the inputs in file order as a user would.
    """
    started = time.perf_counter()
    config, task = _finished_run(spec, get_task)
    batch_size = config.train.eval_batch_size or config.train.batch_size * 2
    if spec.setting == "bertpipe_predict":
        from pipelines.evaluation import predict_file

        predict_file(config, task, spec.run_dir, spec.input_path, spec.output_path)
        rows = [json.loads(line) for line in Path(spec.output_path).read_text().splitlines()]
        labels, scores = [row["label"] for row in rows], [row["score"] for row in rows]
    else:
        from transformers import pipeline

        examples = task.load_inputs(spec.input_path)
        texts = list(examples[config.data.text_column or "text"])  # load_inputs maps a "text" column to it
        pair_column = config.data.text_pair_column
        inputs = [{"text": t, "text_pair": p} for t, p in zip(texts, list(examples[pair_column]))] if pair_column else texts
        classifier = pipeline("text-classification", model=spec.run_dir, batch_size=batch_size, device="cpu" if not has_accelerator_device() else None)
        outputs = classifier(inputs, truncation=True, max_length=config.data.max_seq_length)
        labels, scores = [row["label"] for row in outputs], [row["score"] for row in outputs]
        with open(spec.output_path, "w") as handle:
            for text, label, score in zip(texts, labels, scores):
                handle.write(json.dumps({"text": text, "label": label, "score": score}, ensure_ascii=False) + "\n")
    return {
        "setting": spec.setting, "inputs": len(labels), "batch_size": batch_size,
        "wall_time": time.perf_counter() - started, "peak_rss_mb": peak_rss_mb(), "labels": labels, "scores": scores,
    }


def compare_predictions(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Label agreement and the largest score difference (batching changes padding, hence float noise)."""
    if reference["inputs"] != other["inputs"]:
        raise BenchmarkError(f"{reference['setting']} predicted {reference['inputs']} inputs, {other['setting']} {other['inputs']}")
    differing = [i for i, (a, b) in enumerate(zip(reference["labels"], other["labels"])) if a != b]
    score_gap = max((abs(a - b) for a, b in zip(reference["scores"], other["scores"])), default=0.0)
    return {"identical_labels": not differing, "differing_rows": differing[:20], "max_score_difference": score_gap}


def run_predict_benchmark(
    run_dir: str, input_path: str, get_task: TaskLookup, *, output_dir: str | None = None, repeats: int = 1,
    overrides: Sequence[str] = (), log: Callable[[str], None] = print, in_child: bool = True,
) -> dict[str, Any]:
    """Time both prediction paths ``repeats`` times each (alternating), check they agree, write the table."""
    config, task = _finished_run(PredictSpec("bertpipe_predict", run_dir, input_path, "", tuple(overrides)), get_task)
    if task.pipeline_tag != "text-classification":
        raise BenchmarkError(f"--predict compares with pipeline('text-classification'); this run's task serves {task.pipeline_tag!r}")
    task.load_inputs(input_path)  # checks the file, and fills the datasets cache both settings read it through
    out = Path(output_dir or f"{run_dir.rstrip('/')}-predict-benchmark")
    out.mkdir(parents=True, exist_ok=True)
    load_at_start = os.getloadavg()
    runs = []
    for repeat in range(repeats):
        order = PREDICT_SETTINGS if repeat % 2 == 0 else PREDICT_SETTINGS[::-1]
        for setting in order:
            log(f"predict run {len(runs) + 1}/{repeats * len(PREDICT_SETTINGS)}: {setting}")
            spec = PredictSpec(setting, run_dir, input_path, str(out / f"{setting}.jsonl"), tuple(overrides))
            if in_child:
                with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
                    runs.append(pool.submit(predict_one, spec, get_task).result())
            else:
                runs.append(predict_one(spec, get_task))
    by_setting = {setting: [r for r in runs if r["setting"] == setting] for setting in PREDICT_SETTINGS}
    agreement = compare_predictions(by_setting["bertpipe_predict"][0], by_setting["pipeline"][0])
    rows = {
        setting: {
            "inputs": records[0]["inputs"], "batch_size": records[0]["batch_size"],
            "wall_time": _spread([r["wall_time"] for r in records]),
            "inputs_per_second": _spread([r["inputs"] / r["wall_time"] for r in records]),
            "peak_rss_mb": _spread([r["peak_rss_mb"] for r in records]),
        }
        for setting, records in by_setting.items()
    }
    speedup = rows["bertpipe_predict"]["inputs_per_second"]["mean"] / rows["pipeline"]["inputs_per_second"]["mean"]
    lines = [
        f"# bertpipe predict vs transformers.pipeline(): {run_dir} on {input_path}",
        "",
        f"{repeats} repeat(s); batch size {rows['pipeline']['batch_size']}; wall time covers loading the model, tokenising, "
        f"predicting and writing; load average {_load(load_at_start)} at start, {_load(os.getloadavg())} at end "
        f"(on {os.cpu_count()} CPUs). Cells: mean [min–max].",
        "",
        "| setting | inputs | wall s | inputs/s | peak RSS MB |",
        "|---|---|---|---|---|",
        *(
            f"| {setting} | {row['inputs']} | {_cell(row['wall_time'], 2)} | {_cell(row['inputs_per_second'], 1)} | {_cell(row['peak_rss_mb'], 0)} |"
            for setting, row in rows.items()
        ),
        "",
        f"bertpipe predict / pipeline(): {speedup:.2f}x inputs/s. Labels identical: {agreement['identical_labels']}"
        f" (differing rows: {agreement['differing_rows']}); largest score difference {agreement['max_score_difference']:.2e}.",
    ]
    table = "\n".join(lines) + "\n"
    (out / PREDICT_MARKDOWN).write_text(table)
    stored_runs = [{k: v for k, v in r.items() if k not in ("labels", "scores")} for r in runs]
    (out / PREDICT_JSON).write_text(json.dumps({"rows": rows, "agreement": agreement, "speedup": speedup, "runs": stored_runs}, indent=2) + "\n")
    return {"table": table, "rows": rows, "agreement": agreement, "speedup": speedup, "output_dir": str(out)}

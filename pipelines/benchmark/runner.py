"""The runner: every setting and seed, each in a fresh spawned process, then the table written to disk.

In:  a ``RunConfig``, the task registry lookup, the number of seeds, the settings, an output folder (and
     whether an earlier benchmark there may be replaced) and optionally the metric to compare.
Out: ``benchmark.md``, ``benchmark.json`` and the runs' folders in the output folder, and the table, summary and
     per-run records returned. ``run_one`` is the child process's entry point (spawn pickles it by this module's name).
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from pipelines.benchmark.job import (
    SETTINGS,
    BenchmarkError,
    TaskLookup,
    benchmark_config_tree,
    check_comparable,
    run_config,
    setting_precision,
    setting_sampler,
)
from pipelines.benchmark.measure import measure_matmul_peak, non_embedding_parameters
from pipelines.benchmark.output import benchmark_folder
from pipelines.benchmark.report import RESULTS_JSON, RESULTS_MARKDOWN, check_metric, format_table, summarize
from pipelines.benchmark.trainer import _run_trainer
from pipelines.config import RunConfig
from pipelines.data import prepare_data
from pipelines.outputs import run_inputs
from pipelines.process_memory import peak_rss_mb
from pipelines.runtime import native_bf16


@dataclass(frozen=True)
class RunSpec:
    setting: str
    seed: int
    tree: dict[str, Any]
    output_dir: str



def _run_bertpipe(config: RunConfig, task) -> dict[str, Any]:
    from pipelines.train import train

    summary = train(config, task)
    return {
        "train_samples": summary["train_samples"],
        "train_tokens": summary["train_tokens"],
        "train_runtime": summary["train_runtime"],
        "metrics": {key.removeprefix("eval_"): value for key, value in summary.items() if key.startswith("eval_")},
    }



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


def run_in_child(spec: Any, get_task: TaskLookup, entry: Callable[..., dict[str, Any]] = run_one, *arguments: Any) -> dict[str, Any]:
    """``entry(spec, get_task, *arguments)`` in a spawned child (``run_one`` unless told otherwise).

    When this process stops waiting (SIGTERM, Ctrl-C, an error), the child is killed before the stop goes on: it
    trained on as an orphan, writing into the output folder being discarded. A child killed from outside (out
    of memory) ends the benchmark with a :class:`BenchmarkError` naming the run, not the pool's traceback.
    """
    before = set(multiprocessing.active_children())
    # spawn, not fork: a fresh interpreter, so peak RSS and warm state belong to this run alone.
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        future = pool.submit(_in_child, entry, spec, get_task, *arguments)
        try:
            return future.result()
        except BrokenProcessPool as error:
            raise BenchmarkError(
                f"the {spec.setting} run ({_which(spec)}) ended without a result: its process was killed (out of memory, "
                "or a signal to it alone); nothing of this benchmark was kept"
            ) from error
        except BaseException:
            killed = set(multiprocessing.active_children()) - before
            for child in killed:
                child.kill()
                child.join()
            if killed:
                print(file=sys.stderr)  # ends the line of the killed run's progress bar, so the stop's message gets its own
            raise


def _in_child(entry: Callable[..., dict[str, Any]], spec: Any, get_task: TaskLookup, *arguments: Any) -> dict[str, Any]:
    import signal
    import threading

    from tqdm import tqdm

    from pipelines.preemption import ending_with_parent

    # A parent killed outright (kill -9) cannot kill this run: it would train on, writing into an abandoned folder.
    ending_with_parent(signal.SIGKILL)

    # tqdm's default lock is a multiprocessing one, a named semaphore: in a run that is killed, nothing releases it,
    # and spawn's resource tracker printed a "leaked semaphore" warning after the command's last line.
    # One bar at a time is drawn here: a thread lock serves.
    tqdm.set_lock(threading.RLock())
    return entry(spec, get_task, *arguments)


def _which(spec: Any) -> str:
    return f"seed {spec.seed}" if hasattr(spec, "seed") else spec.run_dir


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


def prepare_job(config: RunConfig, get_task: TaskLookup) -> dict[str, Any]:
    """Fill the datasets cache (tokenised features) so that no run pays for tokenisation the others get for
    free; count what the FLOP estimate needs; list the metrics the task reports on this eval split (a misspelt
    ``--metric`` is refused before the first run)."""
    task = get_task(config.task)(config)
    data = prepare_data(task, config)
    model = task.build_model(data.raw)
    absent = task.metrics_absent_from(data.eval_examples)
    return {
        "train_examples": len(data.train_examples),
        "eval_examples": len(data.eval_examples),
        "train_features": len(data.train_features),
        "non_embedding_params": non_embedding_parameters(model),
        "metric_names": [name for name in task.metric_names() if name not in absent],
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
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every setting for ``seeds`` seeds, one run at a time; write and return the results.

    Everything is written to a staging folder that becomes ``output_dir`` at the end (pipelines.benchmark.output):
    a refusal, a failed run or a stop leaves ``output_dir`` as it was.
    """
    if seeds < 1:
        raise BenchmarkError("--seeds must be at least 1")
    check_comparable(config)
    out = Path(output_dir or f"{config.output_dir}-benchmark")
    with benchmark_folder(out, overwrite=overwrite, inputs=run_inputs(config), config=config) as staging:
        load_at_start = os.getloadavg()
        tree = benchmark_config_tree(config)
        facts = prepare_job(config, get_task)
        metric_names = facts.pop("metric_names")
        metric = metric or default_metric(config, metric_names)
        check_metric(metric, metric_names)
        log("measuring the matmul peak")
        if config.train.torch_num_threads:  # the peak of the threads the runs train on
            torch.set_num_threads(config.train.torch_num_threads)
        peak = measure_matmul_peak()
        seed_values = [config.seed + index for index in range(seeds)]
        runs = []
        for index, seed in enumerate(seed_values):
            rotation = index % len(settings)
            for setting in [*settings[rotation:], *settings[:rotation]]:
                log(f"run {len(runs) + 1}/{seeds * len(settings)}: {setting}, seed {seed}")
                spec = RunSpec(setting=setting, seed=seed, tree=tree, output_dir=str(staging / "runs" / f"{setting}-seed{seed}"))
                runs.append(run_in_child(spec, get_task))
        summary = summarize(runs, metric=metric, non_embedding_params=facts["non_embedding_params"], peak=peak)
        header = {
            "config": config_label, "seeds": seeds, "seed_values": seed_values, **facts,
            "peak": {"fp32": peak.fp32, "bf16": peak.bf16}, "native_bf16": native_bf16(),
            "load_average": {"start": load_at_start, "end": os.getloadavg()},
        }
        table = format_table(summary, header)
        (staging / RESULTS_MARKDOWN).write_text(table, encoding="utf-8")
        (staging / RESULTS_JSON).write_text(json.dumps({**header, **summary, "runs": runs}, indent=2) + "\n", encoding="utf-8")
    return {"table": table, "summary": summary, "runs": runs, "output_dir": str(out)}

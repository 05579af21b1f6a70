"""Time to accuracy: how long bertpipe's config, as shipped, takes to match the Trainer default recipe.

In:  a ``RunConfig`` as the user gives it (its evaluation schedule included), the task registry lookup,
     the number of seeds, an output folder (and whether an earlier benchmark there may be replaced) and the
     metric to compare.
Out: ``to_accuracy.md`` and ``to_accuracy.json`` in the output folder, and the table, summary and per-run
     records returned. Per seed, the Trainer default recipe (fp32, random batches: the docs recipe) runs
     start to finish: its wall time (data, model load, training, evaluation) and its final metric. The
     target is the mean of those final metrics. bertpipe runs the same config with its own evaluation
     schedule (``train.eval_steps``); its time to accuracy is the wall time from process start to the
     end of the first evaluation that reaches the target, or "not reached" with its final metric.

bertpipe runs to the end rather than stopping at the target: everything up to the evaluation that
reaches it is the same either way, so the time is exact, the order of the runs does not matter (the
target is known only after the last Trainer run) and the whole learning curve lands in the JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from pipelines.benchmark.job import BenchmarkError, TaskLookup, benchmark_config_tree, check_comparable, run_config, setting_precision
from pipelines.benchmark.output import benchmark_folder
from pipelines.benchmark.report import TO_ACCURACY_JSON, TO_ACCURACY_MARKDOWN, check_metric
from pipelines.benchmark.runner import RunSpec, default_metric, prepare_job, run_in_child
from pipelines.config import RunConfig
from pipelines.outputs import run_inputs

REFERENCE = "trainer_default"


def shipped_config_tree(config: RunConfig) -> dict[str, Any]:
    """The config as the user runs it: its evaluation, checkpoint and early-stopping schedule kept
    (they are part of the time a user waits); trackers off and no resuming, so each seed starts afresh."""
    tree = config.to_yaml_dict()
    tree["train"].update(report_to=[], resume_from_checkpoint=None)
    tree["overwrite"] = True
    return tree


def run_bertpipe_curve(spec: RunSpec, get_task: TaskLookup, metric: str) -> dict[str, Any]:
    """One bertpipe run (a spawned child's entry point): every evaluation's wall time since the
    process started, its step and the metric, then the final evaluation's."""
    # Started before the import, as the reference's clock starts before it imports the Trainer.
    started = time.perf_counter()
    from pipelines.train import train

    config = run_config(spec.tree, get_task, seed=spec.seed, output_dir=spec.output_dir)
    key = f"eval_{metric}"
    curve: list[dict[str, float]] = []
    final_seconds: list[float] = []

    def on_evaluate(step: int, metrics: dict[str, float]) -> bool:
        if key not in metrics:
            raise BenchmarkError(f"metric {metric!r} is not among the evaluation metrics {sorted(metrics)}; pass --metric")
        curve.append({"seconds": time.perf_counter() - started, "step": step, "metric": float(metrics[key])})
        return False

    # The final point is timed when its evaluation ends, as the scheduled ones are: timed after train() returned, it
    # also counted saving the model, the card and the plot (45% of a small run's last point).
    summary = train(config, get_task(config.task)(config), on_evaluate=on_evaluate,
                    on_final_metrics=lambda metrics: final_seconds.append(time.perf_counter() - started))
    if key not in summary:
        raise BenchmarkError(f"metric {metric!r} is not among the evaluation metrics {sorted(summary)}; pass --metric")
    seconds = final_seconds[0] if final_seconds else time.perf_counter() - started  # a resume of a finished run: none
    curve.append({"seconds": seconds, "step": int(summary["global_step"]), "metric": float(summary[key])})
    return {"setting": "bertpipe", "seed": spec.seed, "precision": setting_precision(config, "bertpipe"), "curve": curve}


def first_reaching(curve: Sequence[dict[str, float]], target: float, greater_is_better: bool = True) -> dict[str, float] | None:
    """The first evaluation at or beyond ``target`` (in the metric's better direction), else None."""
    for point in curve:
        if (point["metric"] >= target) if greater_is_better else (point["metric"] <= target):
            return point
    return None


def mean_curve(curves: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """The seeds' curves averaged evaluation by evaluation (seconds and metric), over the evaluations every
    seed ran at the same step; empty when the seeds evaluated at different steps."""
    steps = [[point["step"] for point in run["curve"]] for run in curves]
    if not curves or any(run_steps != steps[0] for run_steps in steps):
        return []
    return [
        {"step": step, "seconds": statistics.fmean(run["curve"][index]["seconds"] for run in curves),
         "metric": statistics.fmean(run["curve"][index]["metric"] for run in curves)}
        for index, step in enumerate(steps[0])
    ]


def summarize_to_accuracy(references: Sequence[dict[str, Any]], curves: Sequence[dict[str, Any]], *, metric: str, greater_is_better: bool = True) -> dict[str, Any]:
    """The target (mean final metric of the reference runs) and, per bertpipe seed, when it was reached."""
    target = statistics.fmean(run["metrics"][metric] for run in references)
    reached = []
    for run in curves:
        point = first_reaching(run["curve"], target, greater_is_better)
        final = run["curve"][-1]
        reached.append({
            "seed": run["seed"], "seconds": point["seconds"] if point else None, "step": point["step"] if point else None,
            "metric_at": point["metric"] if point else None, "final_metric": final["metric"], "final_seconds": final["seconds"],
        })
    reference_seconds = statistics.fmean(run["wall_time"] for run in references)
    times = [row["seconds"] for row in reached if row["seconds"] is not None]
    ours = statistics.fmean(times) if len(times) == len(reached) and times else None
    averaged = mean_curve(curves)
    mean_point = first_reaching(averaged, target, greater_is_better)
    return {
        "metric": metric, "target": target, "reference": REFERENCE,
        "reference_seconds": reference_seconds, "bertpipe_seconds": ours,
        "speedup": reference_seconds / ours if ours else None,
        # The seed-mean view: one seed's luck decides the per-seed rows; the mean curve compares means.
        "mean_curve_point": mean_point,
        # Empty when the seeds evaluated at different steps (early stopping): then there is no mean curve to read.
        "mean_curve_evaluations": len(averaged),
        "mean_curve_speedup": reference_seconds / mean_point["seconds"] if mean_point else None,
        "references": [{"seed": run["seed"], "seconds": run["wall_time"], "final_metric": run["metrics"][metric]} for run in references],
        "bertpipe": reached,
    }


def format_to_accuracy(summary: dict[str, Any], header: dict[str, Any]) -> str:
    metric, target = summary["metric"], summary["target"]
    lines = [
        f"# bertpipe time to accuracy: {header['config']}",
        "",
        f"Target: the {REFERENCE} recipe's final dev {metric}, mean over seeds = **{target:.4f}**. Wall time counts "
        f"data, model load, training and evaluation, from process start. bertpipe precision: {header['precision']}; "
        f"load average (1/5/15 min) {'/'.join(f'{v:.1f}' for v in header['load_average']['start'])} at start, "
        f"{'/'.join(f'{v:.1f}' for v in header['load_average']['end'])} at end (on {os.cpu_count()} CPUs).",
        "",
        f"| seed | {REFERENCE} s | {REFERENCE} {metric} | bertpipe s to target | at step | bertpipe {metric} there | bertpipe final {metric} (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for reference, ours in zip(summary["references"], summary["bertpipe"]):
        reached = f"{ours['seconds']:.1f}" if ours["seconds"] is not None else "not reached"
        step = str(ours["step"]) if ours["step"] is not None else "–"
        at = f"{ours['metric_at']:.4f}" if ours["metric_at"] is not None else "–"
        lines.append(
            f"| {ours['seed']} | {reference['seconds']:.1f} | {reference['final_metric']:.4f} | {reached} | {step} | {at} | "
            f"{ours['final_metric']:.4f} ({ours['final_seconds']:.1f}) |"
        )
    point = summary["mean_curve_point"]
    if point is not None:
        lines += ["", f"Mean over seeds, evaluation by evaluation: bertpipe's mean {metric} is {point['metric']:.4f} at step "
                  f"{point['step']}, {point['seconds']:.1f} s from start, against {summary['reference_seconds']:.1f} s for "
                  f"{REFERENCE}: **{summary['mean_curve_speedup']:.2f}x** sooner."]
    elif summary.get("mean_curve_evaluations") == 0:
        lines += ["", "Mean over seeds, evaluation by evaluation: not computed, the seeds evaluated at different steps "
                  "(early stopping); see the per-seed rows."]
    else:
        lines += ["", f"Mean over seeds, evaluation by evaluation: bertpipe's mean {metric} never reaches {target:.4f}."]
    if summary["bertpipe_seconds"] is not None:
        lines += ["", f"Every seed: {REFERENCE} {summary['reference_seconds']:.1f} s, bertpipe {summary['bertpipe_seconds']:.1f} s "
                  f"to the same {metric}: **{summary['speedup']:.2f}x** sooner."]
    else:
        lines += ["", f"Every seed: bertpipe did not reach {target:.4f} in every seed, so no per-seed mean time to accuracy."]
    return "\n".join(lines) + "\n"


def run_to_accuracy(
    config: RunConfig,
    get_task: TaskLookup,
    *,
    config_label: str,
    seeds: int = 3,
    output_dir: str | None = None,
    metric: str | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trainer default and bertpipe for ``seeds`` seeds, alternating; write and return the table (staged, as
    ``run_benchmark`` writes: a refusal, a failed run or a stop leaves ``output_dir`` as it was)."""
    if seeds < 1:
        raise BenchmarkError("--seeds must be at least 1")
    check_comparable(config)
    out = Path(output_dir or f"{config.output_dir}-to-accuracy")
    with benchmark_folder(out, overwrite=overwrite, inputs=run_inputs(config), config=config) as staging:
        load_at_start = os.getloadavg()
        # The first reference run paid for tokenising what every later run, bertpipe's included, read from the cache.
        metric_names = prepare_job(config, get_task)["metric_names"]
        metric = metric or default_metric(config, metric_names)
        check_metric(metric, metric_names)
        reference_tree, bertpipe_tree = benchmark_config_tree(config), shipped_config_tree(config)
        references, curves = [], []
        for index in range(seeds):
            seed = config.seed + index
            reference = RunSpec(setting=REFERENCE, seed=seed, tree=reference_tree, output_dir=str(staging / "runs" / f"{REFERENCE}-seed{seed}"))
            log(f"seed {seed}: {REFERENCE}")
            references.append(run_in_child(reference, get_task))
            log(f"seed {seed}: bertpipe")
            ours = RunSpec(setting="bertpipe", seed=seed, tree=bertpipe_tree, output_dir=str(staging / "runs" / f"bertpipe-seed{seed}"))
            curves.append(run_in_child(ours, get_task, run_bertpipe_curve, metric))
        greater_is_better = config.train.metric_greater_is_better(metric, get_task(config.task).higher_is_better)
        summary = summarize_to_accuracy(references, curves, metric=metric, greater_is_better=greater_is_better)
        header = {
            "config": config_label, "seeds": seeds, "precision": curves[0]["precision"],
            "load_average": {"start": load_at_start, "end": os.getloadavg()},
        }
        table = format_to_accuracy(summary, header)
        (staging / TO_ACCURACY_MARKDOWN).write_text(table, encoding="utf-8")
        (staging / TO_ACCURACY_JSON).write_text(
            json.dumps({**header, **summary, "reference_runs": references, "bertpipe_runs": curves}, indent=2) + "\n", encoding="utf-8"
        )
    return {"table": table, "summary": summary, "output_dir": str(out)}


__all__ = [
    "TO_ACCURACY_JSON", "TO_ACCURACY_MARKDOWN", "first_reaching", "format_to_accuracy", "mean_curve", "run_bertpipe_curve",
    "run_to_accuracy", "shipped_config_tree", "summarize_to_accuracy",
]

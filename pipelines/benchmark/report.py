"""The table: per-setting statistics over seeds, bertpipe / Trainer ratios, and their markdown.

In:  the runs' records (setting, seed, precision, sampler, times, tokens, peak RSS, metrics), the metric to
     compare, the non-embedding parameter count and the matmul peak; for the table, a header of run facts.
Out: ``summarize``'s rows (mean/min/max per column) and ratios, and ``format_table``'s markdown, written by
     the runner as ``RESULTS_MARKDOWN`` beside ``RESULTS_JSON``; the file names of every kind of benchmark.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Collection, Sequence

from pipelines.benchmark.job import BenchmarkError
from pipelines.benchmark.measure import FLOPS_PER_TOKEN_PER_PARAMETER, MatmulPeak

RESULTS_JSON = "benchmark.json"
RESULTS_MARKDOWN = "benchmark.md"
TO_ACCURACY_JSON = "to_accuracy.json"
TO_ACCURACY_MARKDOWN = "to_accuracy.md"
PREDICT_JSON = "predict_benchmark.json"
PREDICT_MARKDOWN = "predict_benchmark.md"
# What each kind of benchmark writes: a folder holding one of them is an earlier benchmark's (pipelines.benchmark.output).
RESULT_FILES = (RESULTS_JSON, TO_ACCURACY_JSON, PREDICT_JSON)


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def check_metric(metric: str, reported: Collection[str]) -> None:
    """Refuse a metric the task does not report (a misspelt --metric)."""
    if metric not in reported:
        raise BenchmarkError(f"metric {metric!r} is not among the task's metrics {sorted(reported)}; pass --metric")


def summarize(runs: Sequence[dict[str, Any]], *, metric: str, non_embedding_params: int, peak: MatmulPeak) -> dict[str, Any]:
    """Per-setting statistics over seeds, and bertpipe / Trainer ratios."""
    by_setting: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_setting.setdefault(run["setting"], []).append(run)
    rows = {}
    for setting, records in by_setting.items():
        for record in records:
            check_metric(metric, record["metrics"])
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

"""Prediction benchmark: ``bertpipe predict`` against ``transformers.pipeline(task.pipeline_tag)``.

In:  a finished run directory of a task whose ``pipeline_inputs`` are not None (classification), an input file (what ``bertpipe predict`` reads), overrides and repeats.
Out: per setting, wall time, inputs/s and peak RSS (each run in a fresh spawned process by default), the
     agreement of the two paths' labels and scores, written as ``predict_benchmark.md`` / ``.json``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pipelines.benchmark.job import BenchmarkError, TaskLookup
from pipelines.benchmark.output import benchmark_folder
from pipelines.benchmark.report import PREDICT_JSON, PREDICT_MARKDOWN, _cell, _load, _spread
from pipelines.benchmark.runner import run_in_child
from pipelines.config_loading import load_finished_run_config
from pipelines.files import json_lines
from pipelines.process_memory import peak_rss_mb
from pipelines.runtime import has_accelerator_device


PREDICT_SETTINGS = ("bertpipe_predict", "pipeline")


@dataclass(frozen=True)
class PredictSpec:
    setting: str
    run_dir: str
    input_path: str
    output_path: str
    overrides: tuple[str, ...] = ()


def _finished_run(spec: PredictSpec, get_task: TaskLookup):
    from pipelines.outputs import load_saved_config, saved_config_path

    config = load_finished_run_config(load_saved_config(spec.run_dir), list(spec.overrides), lambda name: get_task(name).Options,
                                      source=saved_config_path(spec.run_dir))
    return config, get_task(config.task)(config)


def predict_one(spec: PredictSpec, get_task: TaskLookup) -> dict[str, Any]:
    """Predict every input with a finished run, start to finish (load, tokenise, forward, write).

    ``bertpipe_predict`` is ``bertpipe predict``'s code path (length-sorted batches);
    ``pipeline`` is ``transformers.pipeline(task.pipeline_tag)`` with the same batch size and
    truncation, fed the task's ``pipeline_inputs`` in file order as a user would.
    """
    started = time.perf_counter()
    config, task = _finished_run(spec, get_task)
    batch_size = config.train.eval_batch_size_or_default
    if spec.setting == "bertpipe_predict":
        from pipelines.evaluation import predict_file

        predict_file(config, task, spec.run_dir, spec.input_path, spec.output_path)
        rows = [json.loads(line) for _, line in json_lines(Path(spec.output_path).read_text(encoding="utf-8"))]
        labels, scores = [row["label"] for row in rows], [row["score"] for row in rows]
    else:
        from transformers import pipeline

        inputs = task.pipeline_inputs(task.load_inputs(spec.input_path))
        predictor = pipeline(task.pipeline_tag, model=spec.run_dir, batch_size=batch_size, device="cpu" if not has_accelerator_device() else None)
        outputs = predictor(inputs, truncation=True, max_length=config.data.max_seq_length)
        labels, scores = [row["label"] for row in outputs], [row["score"] for row in outputs]
        with open(spec.output_path, "w", encoding="utf-8") as handle:
            for given, label, score in zip(inputs, labels, scores):
                row = given if isinstance(given, dict) else {"text": given}
                handle.write(json.dumps({**row, "label": label, "score": score}, ensure_ascii=False) + "\n")
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
    overrides: Sequence[str] = (), overwrite: bool = False, log: Callable[[str], None] = print, in_child: bool = True,
) -> dict[str, Any]:
    """Time both prediction paths ``repeats`` times each (alternating), check they agree, write the table."""
    if repeats < 1:  # with none, the comparison below had no run to read: an IndexError traceback
        raise BenchmarkError(f"--seeds {repeats}: with --predict, the repeats of each prediction path; at least 1")
    from pipelines.onnx_model import is_export_dir

    if is_export_dir(run_dir):
        # pipeline() loads torch weights, which an export has none of: it failed in the child with a traceback.
        raise BenchmarkError(
            f"{run_dir} is an ONNX export; --predict times pipeline(), which loads a torch model: benchmark the run it "
            "was exported from (export.json names it under source)"
        )
    config, task = _finished_run(PredictSpec("bertpipe_predict", run_dir, input_path, "", tuple(overrides)), get_task)
    # Checks the file, and fills the datasets cache both settings read it through.
    if task.pipeline_inputs(task.load_inputs(input_path)) is None:
        raise BenchmarkError(
            f"--predict compares labels and scores with pipeline({task.pipeline_tag!r}), which does not return one per input "
            f"for task {config.task!r}; it works for classification runs"
        )
    out = Path(output_dir or f"{run_dir.rstrip('/')}-predict-benchmark")
    with benchmark_folder(out, overwrite=overwrite, inputs={"RUN_DIR": run_dir, "--predict": input_path}) as staging:
        load_at_start = os.getloadavg()
        runs = []
        for repeat in range(repeats):
            order = PREDICT_SETTINGS if repeat % 2 == 0 else PREDICT_SETTINGS[::-1]
            for setting in order:
                log(f"predict run {len(runs) + 1}/{repeats * len(PREDICT_SETTINGS)}: {setting}")
                spec = PredictSpec(setting, run_dir, input_path, str(staging / f"{setting}.jsonl"), tuple(overrides))
                runs.append(run_in_child(spec, get_task, predict_one) if in_child else predict_one(spec, get_task))
        table, rows, agreement, speedup = _predict_table(runs, run_dir, input_path, repeats, load_at_start)
        (staging / PREDICT_MARKDOWN).write_text(table, encoding="utf-8")
        stored_runs = [{k: v for k, v in r.items() if k not in ("labels", "scores")} for r in runs]
        (staging / PREDICT_JSON).write_text(
            json.dumps({"rows": rows, "agreement": agreement, "speedup": speedup, "runs": stored_runs}, indent=2) + "\n", encoding="utf-8"
        )
    return {"table": table, "rows": rows, "agreement": agreement, "speedup": speedup, "output_dir": str(out)}


def _predict_table(runs: Sequence[dict[str, Any]], run_dir: str, input_path: str, repeats: int, load_at_start) -> tuple:
    """(markdown, rows by setting, agreement, speedup) of the timed runs."""
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
    return "\n".join(lines) + "\n", rows, agreement, speedup

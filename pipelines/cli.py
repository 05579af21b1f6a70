"""The ``bertpipe`` command line.

In:  ``bertpipe train CONFIG [KEY=VALUE ...]``, ``bertpipe evaluate RUN_DIR [--precision P] [KEY=VALUE ...]``,
     ``bertpipe predict RUN_DIR --input FILE --output FILE [--precision P] [KEY=VALUE ...]``,
     ``bertpipe merge RUN_DIR [--out DIR]`` (adapter -> full model),
     ``bertpipe publish RUN_DIR --repo-id OWNER/NAME [--private|--public] [--revision BRANCH]
     [--commit-message MSG] [--merged] [--dry-run --out DIR]``,
     ``bertpipe benchmark CONFIG [KEY=VALUE ...] [--seeds N] [--settings ...] [--output-dir DIR [--overwrite]]
     [--to-accuracy | --predict INPUT]``,
     ``bertpipe sweep CONFIG --trials N [--space SPACE.yaml] [--study NAME] [--storage URL] [--workers K]
     [--timeout S] [--pruner none|median|hyperband] [KEY=VALUE ...]``,
     ``bertpipe export RUN_DIR --out DIR [--quantize int8] [--opset N]`` (ONNX; ``predict``/``evaluate``
     take the export directory too), ``bertpipe distill TEACHER_RUN CONFIG [KEY=VALUE ...]`` and the tool commands.
Out: the run directory / metrics / predictions; exit status 0, or 2 with a one-paragraph error
     (no traceback) for bad input: config, data, model, checkpoint, output dir, an unreachable Hub
     id, or the machine refusing a write (a full disk). ``--debug`` (anywhere on the line) or
     ``BERTPIPE_DEBUG=1`` prints the traceback, with the library error it wraps, before the message.
     Ctrl-C: one line and exit status 130; a checkpoint being written is discarded, complete ones kept.
     SIGTERM/SIGUSR1 during training: a checkpoint at the end of the current step (during the final
     evaluation of a one-process run: of the last step), one line, exit status
     128 + the signal's number (pipelines/preemption.py); during evaluate, predict, export and the tool
     commands (and benchmark, its running child killed): stopped where they are, what they were writing
     discarded, one line, the same status.

The task registry is handed in by the caller (``tasks.cli``), because ``pipelines/`` never
imports ``tasks/``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

# Only light modules here (no torch, transformers or datasets): each command imports what it runs
# after its arguments are parsed, so help, --version and argument errors answer at once.
from pipelines.atomic_writes import check_replaceable_folder, replacing_folder
from pipelines.config import ConfigError, RunConfig
from pipelines.config_loading import load_config, load_finished_run_config, refuse_repeated_overrides
from pipelines.errors import ModelError, OutputDirError, RunStopped, UserError, failures_named
from pipelines.outputs import load_saved_config, saved_config_path
from pipelines.preemption import StopNow, stopping_at_once

if TYPE_CHECKING:
    from pipelines.task import Task

# Bad-input errors that are not UserErrors, by the module that defines them: a command can only raise
# one of these after importing its module, so they are looked up in ``sys.modules`` instead of imported.
_OTHER_USER_ERRORS = {
    "pipelines.benchmark": "BenchmarkError", "pipelines.export": "ExportError", "pipelines.publish": "PublishError",
}
DEBUG_VARIABLE = "BERTPIPE_DEBUG"
INTERRUPTED_STATUS = 130
# How long a launched process other than its machine's first waits before reporting its own error (see _wait_for_first_process).
OTHER_PROCESS_REPORT_DELAY_S = 5.0

TaskLookup = Callable[[str], "type[Task]"]

# What to do after a training stopped by a signal (pipelines.preemption), by command.
_RUN_AGAIN = "; the command has nothing to resume: run it again"
_WAY_ON_AFTER_A_STOP = {
    "train": ": continue with train.resume_from_checkpoint=latest",
    "distill": ": continue with train.resume_from_checkpoint=latest",
    "sweep": "; its trial is marked failed: the same command continues the study with a new trial",
}


# Commands with no step to stop at and nothing to resume: SIGTERM/SIGUSR1 end them where they are, through their
# cleanup. Killed by the signal instead, predict left its half-written output (OUTPUT.tmp) beside the file.
# benchmark: its runs are children it kills on the way out (pipelines.benchmark.runner.run_in_child), its folder staged.
_STOPPED_WHERE_THEY_ARE = {"evaluate", "predict", "export", "merge", "attention", "convert-bert", "publish", "benchmark"}


def user_errors() -> tuple[type[Exception], ...]:
    """The exception types the CLI reports as bad input (exit status 2, no traceback)."""
    errors: list[type[Exception]] = [UserError, FileNotFoundError]
    for module, name in _OTHER_USER_ERRORS.items():
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def package_version() -> str:
    try:
        return version("bertpipe")
    except PackageNotFoundError:  # a source checkout that was never pip-installed
        return "unknown (not installed)"


def load_run_config(get_task: TaskLookup, config_path: str | None, overrides: Sequence[str], *, run_dir: str | None = None) -> RunConfig:
    options_for = lambda name: get_task(name).Options  # noqa: E731
    if run_dir is not None:
        return load_finished_run_config(load_saved_config(run_dir), list(overrides), options_for, source=saved_config_path(run_dir))
    return load_config(config_path, list(overrides), options_for)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertpipe", description="Fine-tune and pretrain BERT-style models.")
    parser.add_argument(
        "--debug", action="store_true",
        help=f"on an error, also print the traceback and its cause (or set {DEBUG_VARIABLE}=1); accepted anywhere on the line",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train, evaluate on the eval split, write the run directory")
    train.add_argument("config", help="YAML task config")
    train.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="dotted overrides, e.g. train.max_steps=100")

    evaluate = commands.add_parser("evaluate", help="evaluate a finished run (e.g. data.eval_split=test)")
    evaluate.add_argument("run_dir", help="a finished run directory (an adapter run too: its base model and adapter are loaded) or an ONNX export")
    evaluate.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="e.g. data.eval_split=test, data.files.test=FILE")
    _add_precision_option(evaluate)

    predict = commands.add_parser("predict", help="predict a jsonl/csv/txt file with a finished run")
    predict.add_argument("run_dir", help="a finished run directory (an adapter run too: its base model and adapter are loaded) or an ONNX export")
    predict.add_argument(
        "--input", required=True,
        help="jsonl, json, csv, tsv or parquet rows with the run's text column(s), or txt with one text per line "
             "(NER: also CoNLL files and word lists; QA: SQuAD JSON, or rows with question and context)",
    )
    predict.add_argument(
        "--output", required=True,
        help="JSON lines, one object per input row, in order, followed by the row's other columns (an id, a gold label)",
    )
    predict.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="e.g. data.encoding=latin-1")
    _add_precision_option(predict)

    convert = commands.add_parser("convert-bert", help="transformers BERT checkpoint -> bertpipe's own BERT (or back)")
    convert.add_argument("source")
    convert.add_argument("destination")
    convert.add_argument("--reverse", action="store_true", help="convert a bertpipe_bert checkpoint back to transformers BERT")

    benchmark = commands.add_parser(
        "benchmark", help="time the same job through bertpipe and the transformers Trainer (default and best settings)"
    )
    benchmark.add_argument("config", help="YAML task config (with --predict: a finished run directory)")
    benchmark.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="dotted overrides, e.g. data.max_train_samples=8000")
    benchmark.add_argument("--seeds", type=int, default=3, help="runs per setting, seeds config.seed, config.seed+1, ... (default 3; with --predict: repeats)")
    benchmark.add_argument("--settings", help="comma-separated subset of the settings (default: bertpipe,trainer_default,trainer_best)")
    benchmark.add_argument(
        "--output-dir",
        help="a new or empty folder for benchmark.md/.json and the runs (default: OUTPUT_DIR-benchmark; --to-accuracy: "
             "OUTPUT_DIR-to-accuracy; --predict: RUN_DIR-predict-benchmark)",
    )
    benchmark.add_argument("--overwrite", action="store_true", help="replace an earlier benchmark in --output-dir once this one has finished")
    benchmark.add_argument("--metric", help="metric column (default: train.metric_for_best_model, else the task's first metric)")
    benchmark.add_argument(
        "--to-accuracy", action="store_true",
        help="instead: wall time for the config as shipped (its eval_steps) to reach the Trainer default recipe's final metric",
    )
    benchmark.add_argument(
        "--predict", metavar="INPUT", help="instead: time `bertpipe predict` against pipeline('text-classification') on INPUT"
    )

    attention = commands.add_parser("attention", help="PNG heatmaps of attention weights per layer and head")
    attention.add_argument("run_dir")
    attention.add_argument("sentence")
    attention.add_argument("--out", required=True)

    merge = commands.add_parser("merge", help="fold a peft adapter run into a full model (Auto classes, pipeline())")
    merge.add_argument("run_dir")
    merge.add_argument("--out", help="where to write the merged model (default RUN_DIR/merged)")

    publish = commands.add_parser("publish", help="push a finished run (model or adapter + model card) to the Hub")
    publish.add_argument("run_dir")
    publish.add_argument("--repo-id", help="OWNER/NAME (default hub.repo_id of the run's config)")
    visibility = publish.add_mutually_exclusive_group()
    visibility.add_argument("--private", dest="private", action="store_const", const=True, default=None,
                            help="create the repo private (default: hub.private of the run's config)")
    visibility.add_argument("--public", dest="private", action="store_const", const=False, help="create the repo public")
    publish.add_argument("--revision", help="branch to push to (created when missing)")
    publish.add_argument("--commit-message")
    publish.add_argument("--merged", action="store_true", help="publish RUN_DIR/merged (a full model) instead of the adapter")
    publish.add_argument("--dry-run", action="store_true", help="write the folder that would be uploaded to --out and list it")
    publish.add_argument("--out", help="with --dry-run: the folder to write")
    sweep = commands.add_parser("sweep", help="hyperparameter search with Optuna: resumable, parallel, one machine or many")
    sweep.add_argument("config", help="YAML task config; its output_dir receives trials/, sweep.md, best.yaml and the plots")
    sweep.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="dotted overrides fixed for every trial")
    sweep.add_argument("--trials", type=int, required=True, help="finished (complete or pruned) trials the study should hold")
    sweep.add_argument("--space", help="search-space YAML: dotted key -> {uniform|log_uniform|int|log_int|choice: ...} (default: the task's)")
    sweep.add_argument("--study", help="study name (default: the name of output_dir)")
    sweep.add_argument("--storage", help="Optuna storage URL shared by workers on many machines, e.g. postgresql://... "
                                         "(default: a journal file in output_dir)")
    sweep.add_argument("--workers", type=int, default=1, help="worker processes here, each with its share of the cores")
    sweep.add_argument("--timeout", type=float, help="start no new trial after this many seconds")
    sweep.add_argument("--pruner", choices=["none", "median", "hyperband"],
                       help="stop hopeless trials at an evaluation (needs train.eval_steps; default: median with it, none without)")
    _add_edge_commands(commands)
    return parser


def _add_precision_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--precision", choices=["fp32", "bf16", "fp16", "auto"], default="fp32",
        help="inference precision (default fp32, as in training's evaluations and pipeline(); auto: train.mixed_precision's rule)",
    )


# ----- edge: export to ONNX (int8), distil (issue 19) -----------------------------------------
def _add_edge_commands(commands) -> None:
    export = commands.add_parser("export", help="a finished run as ONNX (dynamic batch/sequence axes), optionally int8")
    export.add_argument("run_dir")
    export.add_argument("--out", required=True, help="the export directory (model.onnx, tokenizer, export.json)")
    export.add_argument("--format", default="onnx", choices=["onnx"])
    export.add_argument("--quantize", choices=["int8"], help="dynamic int8 quantisation with onnxruntime")
    export.add_argument("--opset", type=int, default=18, help="ONNX opset (18 or newer, up to what the installed onnx and onnxruntime run; default 18)")
    export.add_argument("--parity-samples", type=int, default=64, help="eval examples the parity check runs on (default 64)")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")

    distill = commands.add_parser("distill", help="distil a finished run (the teacher) into a smaller student run")
    distill.add_argument("teacher_run")
    distill.add_argument("config", help="YAML task config of the student (its distill: section optional)")
    distill.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE", help="e.g. distill.num_layers=3 distill.alpha=0.7")


def _run_edge_command(args: argparse.Namespace, get_task: TaskLookup) -> bool:
    """Runs ``export``/``distill``; False for any other command."""
    if args.command == "export":
        config = load_run_config(get_task, None, [], run_dir=args.run_dir)
        check_replaceable_folder(args.out, "--out")  # before the export and its parity check, not after
        from pipelines.export import export_run

        # The task reads only the eval split's file; export_run saves the run's own config beside the export.
        summary = export_run(
            config, get_task(config.task)(_eval_split_only(config)), args.run_dir, args.out, quantize=args.quantize, opset=args.opset,
            parity_samples=args.parity_samples, overwrite=args.overwrite,
        )
        print(json.dumps({key: summary[key] for key in ("precision", "opset", "size_bytes", "parity")}, indent=2))
        print(f"wrote {args.out}")
        return True
    if args.command == "distill":
        from pipelines.distill import distill_config
        from pipelines.train import train

        config = distill_config(args.teacher_run, args.config, args.overrides, lambda name: get_task(name).Options)
        _print_metrics(train(config, get_task(config.task)(config)))
        return True
    return False


def _eval_split_only(config: RunConfig) -> RunConfig:
    """A finished run's config whose task loads only the eval split's file(s) (pipelines.data.eval_split_files_only)."""
    from pipelines.data import eval_split_files_only

    return config.model_copy(update={"data": eval_split_files_only(config.data)})


def _check_new_folder(label: str, folder: str, what: str) -> None:
    """Refuse a destination that holds files: ``save_pretrained`` writes over whatever model is there."""
    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"{label} {folder} is a file, not a folder; {what} goes into a new or empty folder")
    if path.is_dir() and any(path.iterdir()):
        raise OutputDirError(f"{label} {folder} is not empty; {what} goes into a new or empty folder")


def _run_files_beside_the_model(folder: str, get_task: TaskLookup) -> tuple[Path, ...]:
    """A bertpipe run's own files beside its model and tokenizer: config, metrics, log, evaluation reports (the task's
    own too: QA's n-best answers, NER's eval_predictions.conll), model card, checkpoints, best and merged models,
    trackers. ``convert-bert`` of a run copied them all: the converted folder then passed for a finished run
    (``train`` refused it as one, ``evaluate`` read the run's config), its card described the run's model, and it
    carried every checkpoint, optimizer states included."""
    from pipelines.outputs import is_run_dir, load_saved_config

    if not is_run_dir(folder):
        return ()
    try:
        task_files = get_task(load_saved_config(folder)["task"]).run_files
    except (UserError, KeyError, TypeError):  # a config that names no known task: the general files only
        task_files = ()
    from pipelines.adapters import MERGED_DIR
    from pipelines.checkpoint import CHECKPOINTS_DIR, SOURCES_FILE
    from pipelines.outputs import CONFIG_FILE, LOG_FILE, METRICS_FILE, PLOT_FILE
    from pipelines.train import BEST_MODEL_DIR

    from pipelines.onnx_model import EXPORT_FILE

    run = Path(folder)
    names = (CONFIG_FILE, METRICS_FILE, LOG_FILE, PLOT_FILE, SOURCES_FILE, "README.md", "predictions.json", "tracking",
             CHECKPOINTS_DIR, BEST_MODEL_DIR, MERGED_DIR, *task_files)
    # Folders bertpipe wrote a model into inside the run, under names of the user's (`export --out RUN/onnx`,
    # `publish --dry-run --out RUN/upload`): each holds the run's own weights, which the converted folder carried.
    written_inside = [path for path in run.iterdir() if path.is_dir() and ((path / CONFIG_FILE).is_file() or (path / EXPORT_FILE).is_file())]
    return (*(run / name for name in names), *run.glob("eval_*.json"), *run.glob(".*.partial"), *written_inside)


def _check_merge_out(run_dir: str, out: str | None) -> None:
    """``merge --out``: a new or empty folder, or the run's own ``merged/``, which each merge replaces.

    Anything else may hold another model (another run's, or the adapter run itself), which the merged
    weights would overwrite while that run's metrics went on describing its own.
    """
    from pipelines.adapters import MERGED_DIR
    from pipelines.outputs import is_run_dir

    if out is not None:
        check_replaceable_folder(out, "--out")
    if out is None or Path(out).expanduser().resolve() == (Path(run_dir).expanduser() / MERGED_DIR).resolve():
        return
    _check_new_folder("--out", out, "the merged model")
    # Inside a run (another's merged/, which its export and publish --merged then read as its own, or its checkpoints/):
    # a folder that did not exist yet passed as new.
    target = Path(out).expanduser().resolve()
    for folder in (target, *target.parents):
        if is_run_dir(folder):
            raise OutputDirError(
                f"--out {out} is inside the run {folder}, whose merged/, checkpoints and files are its own: merge into "
                f"{Path(run_dir) / MERGED_DIR} (the default) or a folder outside every run"
            )


def _check_export_precision(args: argparse.Namespace) -> None:
    """An ONNX export runs in the precision it was exported in: ``--precision bf16`` changed nothing but
    the ``inference_precision`` that ``evaluate`` wrote beside the metrics."""
    if args.precision == "fp32":
        return
    from pipelines.onnx_model import EXPORT_FILE, is_export_dir

    if is_export_dir(args.run_dir):
        raise ModelError(
            f"--precision {args.precision}: {args.run_dir} is an ONNX export, which runs in the precision it was exported in "
            f"({EXPORT_FILE} says which); drop --precision, or evaluate the run it came from"
        )


_BENCHMARK_MODES = {
    "--predict": "times bertpipe predict against pipeline() on a finished run",
    "--to-accuracy": "times the trainer_default recipe and bertpipe as shipped to the same metric",
}


def _check_benchmark_options(args: argparse.Namespace) -> None:
    """``--predict`` and ``--to-accuracy`` are benchmarks of their own: an option that only the side-by-side table
    reads (or the other mode) was accepted and silently ignored, so the result answered another question than asked."""
    mode = "--predict" if args.predict else "--to-accuracy"
    ignored = [option for option, given in (
        ("--to-accuracy", args.predict and args.to_accuracy),
        ("--settings", args.settings is not None),
        ("--metric", args.predict and args.metric is not None),
    ) if given]
    if ignored:
        raise ConfigError(
            f"{', '.join(ignored)} cannot be combined with {mode}, which {_BENCHMARK_MODES[mode]} and would ignore "
            f"{'it' if len(ignored) == 1 else 'them'}; run one benchmark at a time"
        )


def run(args: argparse.Namespace, get_task: TaskLookup) -> int:
    refuse_repeated_overrides(getattr(args, "overrides", None) or ())
    # Each command reads its config before importing the module that runs it (torch and friends).
    if _run_edge_command(args, get_task):
        return 0
    if args.command in ("evaluate", "predict"):
        _check_export_precision(args)
    if args.command == "train":
        config = load_run_config(get_task, args.config, args.overrides)
        from pipelines.train import train

        metrics = train(config, get_task(config.task)(config))
        _print_metrics(metrics)
    elif args.command == "evaluate":
        config = load_run_config(get_task, None, args.overrides, run_dir=args.run_dir)
        from pipelines.evaluation import evaluate_run

        _print_metrics(evaluate_run(config, get_task(config.task)(_eval_split_only(config)), args.run_dir, precision=args.precision))
    elif args.command == "predict":
        config = load_run_config(get_task, None, args.overrides, run_dir=args.run_dir)
        from pipelines.evaluation import predict_file

        count = predict_file(config, get_task(config.task)(config), args.run_dir, args.input, args.output, precision=args.precision)
        _print_on_main_process(f"wrote {count} predictions to {args.output}")
    elif args.command == "benchmark" and args.predict:
        _check_benchmark_options(args)
        from pipelines.benchmark import run_predict_benchmark

        result = run_predict_benchmark(
            args.config, args.predict, get_task, output_dir=args.output_dir, repeats=args.seeds, overrides=args.overrides,
            overwrite=args.overwrite,
        )
        print(result["table"])
        print(f"wrote {result['output_dir']}/predict_benchmark.md and predict_benchmark.json")
    elif args.command == "benchmark" and args.to_accuracy:
        _check_benchmark_options(args)
        config = load_run_config(get_task, args.config, args.overrides)
        from pipelines.benchmark.to_accuracy import TO_ACCURACY_JSON, TO_ACCURACY_MARKDOWN, run_to_accuracy

        result = run_to_accuracy(
            config, get_task, config_label=" ".join([args.config, *args.overrides]), seeds=args.seeds,
            output_dir=args.output_dir, metric=args.metric, overwrite=args.overwrite,
        )
        print(result["table"])
        print(f"wrote {result['output_dir']}/{TO_ACCURACY_MARKDOWN} and {TO_ACCURACY_JSON}")
    elif args.command == "benchmark":
        config = load_run_config(get_task, args.config, args.overrides)
        from pipelines.benchmark import SETTINGS, parse_settings, run_benchmark

        result = run_benchmark(
            config, get_task, config_label=" ".join([args.config, *args.overrides]), seeds=args.seeds,
            settings=parse_settings(args.settings) if args.settings else SETTINGS, output_dir=args.output_dir,
            metric=args.metric, overwrite=args.overwrite,
        )
        print(result["table"])
        print(f"wrote {result['output_dir']}/benchmark.md and benchmark.json")
    elif args.command == "sweep":
        from pipelines.sweep import run_sweep

        result = run_sweep(
            args.config, args.overrides, get_task, trials=args.trials, space_path=args.space, study_name=args.study,
            storage=args.storage, workers=args.workers, timeout=args.timeout, pruner=args.pruner,
        )
        print(result["table"])
        print(f"wrote {result['report']}" + (f" and {result['best_config']}" if result["best_config"] else ""))
        if result["dead_workers"]:
            print("; ".join(result["dead_workers"]) + ": rerun the same command to continue the study", file=sys.stderr)
            return 1
    elif args.command == "convert-bert":
        _check_new_folder("destination", args.destination, "the converted model")
        from models.convert import convert_bert

        # A checkpoint of another kind is bad input, which models/ reports as a plain ValueError. Staged beside the
        # destination and renamed into place: a failure or a kill mid-write left a half-filled folder the rerun refused.
        with failures_named(ModelError, f"convert-bert {args.source}"), \
                replacing_folder(Path(args.destination), label="destination") as staging:
            convert_bert(args.source, str(staging), reverse=args.reverse, leave_out=(args.destination, *_run_files_beside_the_model(args.source, get_task)))
        print(f"wrote {args.destination}")
    elif args.command == "attention":
        _check_new_folder("--out", args.out, "the heatmaps")
        from models.visualize import attention_heatmaps

        with failures_named(ModelError, f"attention {args.run_dir}"):
            paths = attention_heatmaps(args.run_dir, args.sentence, args.out)
        for path in paths:
            print(path)
    elif args.command == "merge":
        config = load_run_config(get_task, None, [], run_dir=args.run_dir)
        _check_merge_out(args.run_dir, args.out)
        from pipelines.evaluation import merge_run

        print(f"wrote the merged model to {merge_run(config, get_task(config.task)(config), args.run_dir, args.out)}")
    elif args.command == "publish":
        config = load_run_config(get_task, None, [], run_dir=args.run_dir)
        from pipelines.publish import publish_run

        result = publish_run(
            args.run_dir, config, get_task(config.task)(config),
            repo_id=args.repo_id or config.hub.repo_id,
            private=config.hub.private if args.private is None else args.private,
            revision=args.revision or config.hub.revision, commit_message=args.commit_message,
            dry_run=args.dry_run, out=args.out, merged=args.merged,
        )
        where = f"would upload to {result['repo_id']} (written to {result['folder']})" if result["dry_run"] else f"uploaded to {result['url']}"
        print(f"{where}:\n" + "\n".join(f"  {name}" for name in result["files"]))
    return 0


def _print_metrics(metrics: dict) -> None:
    _print_on_main_process(json.dumps(metrics, indent=2))


def _print_on_main_process(text: str) -> None:
    """Under ``accelerate launch`` every process runs the command; one report, not one per process."""
    from accelerate.state import PartialState

    if PartialState().is_main_process:
        print(text)


def configure_logging() -> None:
    """Warnings on stderr, from each machine's first process only: under ``accelerate launch`` every
    process reads the same data and would repeat each warning about it once per process."""
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.ERROR if int(os.environ.get("LOCAL_RANK") or 0) > 0 else logging.WARNING)


def main(argv: Sequence[str] | None = None, *, get_task: TaskLookup) -> int:
    configure_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(DEBUG_VARIABLE, "").lower() in {"1", "true", "yes"}
    argv = [item for item in argv if item != "--debug"]
    parser = build_parser()
    # Overrides may also follow options (``predict RUN --input F --output F key=value``), which a
    # positional ``nargs="*"`` alone would reject.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in item or item.startswith("-") for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        with stopping_at_once() if args.command in _STOPPED_WHERE_THEY_ARE else contextlib.nullcontext():
            return run(args, get_task)
    except StopNow as stop:
        if _is_a_machines_other_process():
            return 128 + int(stop.signal)
        print(f"bertpipe {args.command}: stopped by {stop.signal.name}; nothing half-written is left, and files that were "
              f"there are unchanged{_RUN_AGAIN}", file=sys.stderr)
        return 128 + int(stop.signal)
    except KeyboardInterrupt:
        # Ctrl-C is the user's choice, not a fault to debug: one line instead of the traceback of wherever
        # the loop happened to be, and the status a shell gives an interrupted command (128 + SIGINT).
        if debug:
            traceback.print_exc()
    except RunStopped as stopped:
        # The scheduler's notice (SIGTERM, SIGUSR1) was honoured: a checkpoint, one line, and the status a
        # shell gives a command ended by that signal, so a job script can tell it from a failure and requeue.
        if _is_a_machines_other_process():
            return stopped.exit_status
        print(f"bertpipe {args.command}: {stopped}{_WAY_ON_AFTER_A_STOP.get(args.command, _RUN_AGAIN)}", file=sys.stderr)
        return stopped.exit_status
    except Exception as error:
        if _another_process_ended(error):
            # This process waited in a collective for one that stopped on its own error and reported it; a
            # traceback here would be a second, misleading error. The launcher usually ends this one first.
            time.sleep(OTHER_PROCESS_REPORT_DELAY_S)
            if debug:
                traceback.print_exc()
            # A process killed from outside (out of memory, kill -9) prints nothing: the launcher's report names its signal.
            way_on = _RESUME if args.command in ("train", "distill") else ""
            print(f"bertpipe {args.command}: stopped: another process of this run ended first (its own message says why; "
                  f"one killed from outside prints none, and the launcher's report gives its exit code){way_on}", file=sys.stderr)
            return 1
        if isinstance(error, user_errors()):
            message = str(error)
            # A boundary that wrapped the full disk named the file but not what to do; one that said it keeps its words.
            hint = "" if "free space" in message.lower() else _disk_full_hint(args.command, error)
            return _report(args.command, message + hint, debug)
        if not isinstance(error, OSError):
            raise
        # The last resort for the machine saying no where no boundary did (a full disk while saving, a
        # permission, a vanished file): its own words and the file, not a traceback.
        where = f" ({error.filename})" if error.filename else ""
        return _report(args.command, f"{error.strerror or error}{where}{_disk_full_hint(args.command, error)}", debug)
    # Printed once the interrupted frames are gone, so their progress bars have drawn their last line above it.
    if _is_a_machines_other_process():
        return INTERRUPTED_STATUS
    way_on = {"train": _RESUME, "distill": _RESUME, "sweep": _WAY_ON_AFTER_A_STOP["sweep"]}.get(args.command, "")
    print(f"bertpipe {args.command}: interrupted{way_on}", file=sys.stderr)
    return INTERRUPTED_STATUS


_RESUME = "; continue from the last complete checkpoint (one per train.save_steps) with train.resume_from_checkpoint=latest"


def _disk_full_hint(command: str, error: BaseException) -> str:
    """What to do after a full disk anywhere in ``error``'s chain: complete checkpoints are never touched
    by a failed write, so training resumes once space is freed; the other commands (predict, evaluate,
    export, ...) have nothing to resume and simply run again."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            if command in ("train", "distill"):
                return "; free space, then resume with train.resume_from_checkpoint=latest"
            return "; free space, then run the command again"
        error = error.__cause__ if error.__cause__ is not error else None
    return ""


# What gloo (and NCCL) raise in a process whose collective lost its peer, in torch 2.x.
_PEER_ENDED = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe")


def _another_process_ended(error: BaseException | None) -> bool:
    """In a launched run of several processes: ``error`` is, or was caused by, a collective failing because another
    process ended (a checkpoint's save wraps the one it waited in: it named this process's checkpoint as the fault)."""
    if int(os.environ.get("WORLD_SIZE") or 1) < 2:
        return False
    import torch.distributed

    while error is not None:
        if isinstance(error, RuntimeError) and (isinstance(error, torch.distributed.DistError) or any(sign in str(error) for sign in _PEER_ENDED)):
            return True
        error = error.__cause__ if error.__cause__ is not error else None
    return False


def _is_a_machines_other_process() -> bool:
    """A launched process other than its machine's first. A stop by a signal (agreed at one step, or Ctrl-C to the
    process group) ends every process alike, and the first one says so: the others stay silent. Waiting for the
    launcher to end them, as for errors, was not enough: on a signal of its own the launcher waits out its grace
    period, and every process printed the same line."""
    return int(os.environ.get("LOCAL_RANK") or 0) > 0


def _wait_for_first_process() -> None:
    """Under ``accelerate launch`` every process of a machine runs the same command on the same files, so
    a bad input (or Ctrl-C) stops all of them at once, and each would print the same message. The
    machine's first process reports at once; the others wait, and the launcher, which stops every process
    as soon as one has failed, ends them before they speak. One whose error is its own alone still
    reports, a few seconds late."""
    if _is_a_machines_other_process():
        time.sleep(OTHER_PROCESS_REPORT_DELAY_S)


def _report(command: str, message: str, debug: bool) -> int:
    """One paragraph on stderr and exit status 2; with debug, the traceback (causes included) first."""
    _wait_for_first_process()
    if debug:
        traceback.print_exc()
    elif sys.exc_info()[1] is not None and sys.exc_info()[1].__cause__ is not None:
        message += f"\n(run with --debug or {DEBUG_VARIABLE}=1 for the traceback)"
    print(f"bertpipe {command}: error: {message}", file=sys.stderr)
    return 2

"""The report of a sweep, from its study: written to OUTPUT_DIR after every run of the command.

In:  the study (any storage; trials from earlier runs of the command count too) and its
     :class:`~pipelines.sweep.plan.SweepPlan`.
Out: ``sweep.md`` (trials sorted by objective); ``best.yaml`` (the best trial's complete config:
     ``bertpipe train best.yaml`` reproduces it); PNG plots (optimisation history, parameter
     importances, one slice plot per parameter); a summary dict of what was written and found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

try:
    import optuna
except ImportError:  # the [sweep] extra; run_sweep says how to install it
    optuna = None

from pipelines.atomic_writes import write_text_atomically
from pipelines.config_loading import dump_yaml, load_config
from pipelines.outputs import CONFIG_FILE, save_figure
from pipelines.sweep.plan import BEST_CONFIG_FILE, BEST_RUN_DIR, REPORT_FILE, SweepPlan
from pipelines.sweep.space import OptionsLookup

def write_report(study, plan: SweepPlan, wall_seconds: float | None = None, options_for: OptionsLookup | None = None) -> dict[str, Any]:
    """``sweep.md``, ``best.yaml`` and the plots in OUTPUT_DIR; returns what was written and found."""
    output_dir = Path(plan.output_dir)
    trials = [trial for trial in study.get_trials(deepcopy=False) if not trial.user_attrs.get("surplus")]
    State = optuna.trial.TrialState
    complete = [t for t in trials if t.state == State.COMPLETE]
    pruned = [t for t in trials if t.state == State.PRUNED]
    maximize = plan.direction == "maximize"

    def order(trial) -> tuple:
        value = _shown_value(trial)
        rank = {State.COMPLETE: 0, State.PRUNED: 1}.get(trial.state, 2)
        return (rank, 0 if value is None else (-value if maximize else value), trial.number)

    keys = [param.key for param in plan.params]
    for trial in trials:  # params searched by an earlier run of the study with another space
        keys += [key for key in trial.params if key not in keys]
    header = ["rank", "trial", "state", plan.metric, *keys, "steps", "seconds", "run directory"]
    rows = []
    for rank, trial in enumerate(sorted(trials, key=order), start=1):
        value = _shown_value(trial)
        shown = "" if value is None else f"{value:.4f}"
        pruned_at_step = trial.user_attrs.get("pruned_at_step", "") if trial.state == State.PRUNED else ""
        if pruned_at_step != "":
            shown += f" (at step {pruned_at_step})"
        seconds = (trial.datetime_complete - trial.datetime_start).total_seconds() if trial.datetime_complete and trial.datetime_start else None
        steps = _global_step(trial) if trial.state == State.COMPLETE else pruned_at_step
        rows.append([
            str(rank), str(trial.number), trial.state.name, shown, *(_format_param(trial.params.get(key)) for key in keys),
            str(steps), "" if seconds is None else f"{seconds:.1f}", trial.user_attrs.get("run_dir", ""),
        ])
    table = "\n".join("| " + " | ".join(row) + " |" for row in [header, ["---"] * len(header), *rows])

    best_path, best = None, None
    if complete:
        best = study.best_trial
        best_path = write_best_config(best, plan, output_dir / BEST_CONFIG_FILE, options_for)
    plots, plot_notes = write_plots(study, plan, keys, output_dir)
    failed = sum(t.state == State.FAIL for t in trials)
    running = sum(t.state == State.RUNNING for t in trials)
    span = _study_span(trials)
    lines = [
        f"# Sweep `{plan.study_name}`", "",
        f"- objective: `{plan.metric}` ({plan.direction}); pruner: {plan.pruner}; storage: `{plan.storage}`",
        f"- trials: {len(complete) + len(pruned)} finished of {plan.trials} asked ({len(complete)} complete, "
        f"{len(pruned)} pruned), {failed} failed" + (f", {running} running" if running else ""),
        "- search space: " + ", ".join(f"`{param.key}` {param.describe()}" for param in plan.params),
        "- fixed for every trial: " + (", ".join(f"`{override}`" for override in plan.overrides) or "nothing"),
    ]
    if wall_seconds is not None:
        lines.append(f"- this run of the command: {wall_seconds:.1f} s wall" + (f"; the study so far: {span:.1f} s from first start to last finish" if span else ""))
    if best_path is not None:
        lines.append(f"- best: trial {best.number}, `{plan.metric}` = {best.value:.4f}, config `{BEST_CONFIG_FILE}` "
                     f"(`bertpipe train {output_dir / BEST_CONFIG_FILE}` reproduces it)")
    lines += ["", table, ""]
    lines += [f"![{name}]({name})" for name in plots]
    lines += [f"- {note}" for note in plot_notes]
    if failed:
        lines += ["", "Failed trials (a worker killed mid-trial, or an error) keep their run directories as they were; "
                      "they do not count towards the trials asked for."]
    report_path = output_dir / REPORT_FILE
    write_text_atomically(report_path, "\n".join(lines) + "\n")
    return {
        "report": str(report_path), "table": table, "best_config": str(best_path) if best_path else None,
        "best_trial": best.number if best else None, "best_value": best.value if best else None,
        "complete": len(complete), "pruned": len(pruned), "failed": failed, "plots": [str(output_dir / name) for name in plots],
    }


def _shown_value(trial) -> float | None:
    if trial.state == optuna.trial.TrialState.COMPLETE:
        return trial.value
    if trial.intermediate_values:
        return trial.intermediate_values[max(trial.intermediate_values)]
    return None


def _global_step(trial) -> int | str:
    import json

    try:
        return json.loads((Path(trial.user_attrs["run_dir"]) / "metrics.json").read_text(encoding="utf-8"))["global_step"]
    except (KeyError, OSError, ValueError):
        return ""


def _format_param(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def _study_span(trials) -> float | None:
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    return (max(ends) - min(starts)).total_seconds() if starts and ends else None


def write_best_config(best, plan: SweepPlan, path: Path, options_for: OptionsLookup | None = None) -> Path | None:
    """The best trial's resolved config, writing to OUTPUT_DIR/best instead of its own directory."""
    run_dir = Path(best.user_attrs.get("run_dir", ""))
    if (run_dir / CONFIG_FILE).is_file():
        tree = yaml.safe_load((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    elif "overrides" in best.user_attrs:  # it ran on another machine sharing the storage: rebuild its config
        tree = load_config(plan.config_path, best.user_attrs["overrides"], options_for).to_yaml_dict()
    else:
        return None
    tree["output_dir"] = str(Path(plan.output_dir) / BEST_RUN_DIR)
    tree["overwrite"] = False
    header = (
        f"# Run:  bertpipe train {path}\n"
        f"# Trial {best.number} of sweep {plan.study_name!r}: {plan.metric} = {best.value!r} (run directory {run_dir}).\n"
        "# The complete config of that trial; the same seed, precision and thread count reproduce its metric.\n"
    )
    # Written beside and renamed over: a full disk or Ctrl-C mid-write left the last run's best.yaml cut short.
    write_text_atomically(path, header + dump_yaml(tree, sort_keys=False))
    return path


def write_plots(study, plan: SweepPlan, keys: list[str], folder: Path) -> tuple[list[str], list[str]]:
    """Optimisation history, parameter importances and a slice plot per parameter, as PNG files."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    wanted = [
        ("optimization_history.png", lambda: plots.plot_optimization_history(study, target_name=plan.metric)),
        ("param_importances.png", lambda: plots.plot_param_importances(study, target_name=plan.metric)),
        *((f"slice_{key}.png", lambda key=key: plots.plot_slice(study, params=[key], target_name=plan.metric)) for key in keys),
    ]
    written, notes = [], []
    for name, draw in wanted:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib backend experimental
                axes = draw()
            figure = np.atleast_1d(axes).flat[0].figure
            try:
                save_figure(figure, folder / name, bbox_inches="tight")
            finally:
                plt.close(figure)
            written.append(name)
        except (ValueError, RuntimeError, ZeroDivisionError) as error:
            # Too few complete trials, or a parameter that never varied: say so rather than fail the sweep.
            notes.append(f"{name} not drawn: {error}")
    return written, notes

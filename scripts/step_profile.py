"""Where a training step's time goes, op by op: torch.profiler over a window of one benchmark setting's steps.

In:  a task config and its overrides, as ``bertpipe benchmark`` takes them; the setting to run (``bertpipe``,
     ``trainer_default``, ``trainer_best``); how many optimizer steps to skip first and how many to record.

    python scripts/step_profile.py configs/classification/sst2.yaml data.max_train_samples=8000 \\
        train.num_epochs=1 data.max_seq_length=128 --setting trainer_best --skip 45 --steps 20

Out: a markdown table of the ops with the most self CPU time, per optimizer step (ms, calls, share of the
     step), the time outside every op (``ProfilerStep*``: Python and dispatch) among them, and the total.

The run is the benchmark's own (``pipelines.benchmark.runner.run_one``: the data, model, optimizer and loop of
the table it explains), one seed, in this process, into a temporary folder. A global optimizer-step hook steps
the profiler, so bertpipe's loop and the Trainer are cut at the same optimizer steps without a hook of either's
own; the run is stopped once the window is recorded. Each loop draws its own batches (the Trainer groups by
length its own way), so compare settings per sample with the benchmark, and per op with this.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines.benchmark.job import SETTINGS, benchmark_config_tree  # noqa: E402
from pipelines.benchmark.runner import RunSpec, run_one  # noqa: E402
from pipelines.cli import load_run_config  # noqa: E402
from tasks import get_task  # noqa: E402


class _WindowRecorded(Exception):
    """Raised from the optimizer hook to end the run once the profiler has its window."""


def profile_steps(config_path: str, overrides: list[str], *, setting: str, skip: int, steps: int, seed: int = 42):
    """The profiler's per-op averages over optimizer steps ``skip + 1 .. skip + steps`` of one benchmark run."""
    if skip < 1 or steps < 1:
        raise SystemExit("--skip and --steps must be at least 1")
    tree = benchmark_config_tree(load_run_config(get_task, config_path, overrides))
    # wait + warmup = skip: the profiler warms up on the last skipped step, so the window starts clean.
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=skip - 1, warmup=1, active=steps, repeat=1),
    )
    done = 0

    def after_optimizer_step(optimizer, args, kwargs) -> None:
        nonlocal done
        done += 1
        profiler.step()
        if done == skip + steps:
            raise _WindowRecorded

    handle = register_optimizer_step_post_hook(after_optimizer_step)
    profiler.start()
    try:
        with tempfile.TemporaryDirectory() as folder:
            run_one(RunSpec(setting=setting, seed=seed, tree=tree, output_dir=str(Path(folder) / "run")), get_task)
    except _WindowRecorded:
        pass
    finally:
        handle.remove()
        profiler.stop()
    if done < skip + steps:
        raise SystemExit(f"the run ended after {done} optimizer steps: ask for fewer than --skip {skip} + --steps {steps}")
    return profiler.key_averages()


def table(averages, *, steps: int, top: int = 25) -> str:
    total = sum(event.self_cpu_time_total for event in averages)
    lines = ["| op | ms / step | calls / step | share |", "|---|---|---|---|"]
    for event in sorted(averages, key=lambda event: -event.self_cpu_time_total)[:top]:
        lines.append(f"| `{event.key}` | {event.self_cpu_time_total / steps / 1e3:.2f} | {event.count / steps:.1f} "
                     f"| {100 * event.self_cpu_time_total / total:.1f}% |")
    lines.append(f"| **total** | **{total / steps / 1e3:.1f}** | | 100% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides of the config")
    parser.add_argument("--setting", choices=SETTINGS, default="bertpipe")
    parser.add_argument("--skip", type=int, default=45, help="optimizer steps before the window (warm-up)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps recorded")
    parser.add_argument("--top", type=int, default=25, help="ops listed")
    args = parser.parse_args(argv)
    averages = profile_steps(args.config, args.overrides, setting=args.setting, skip=args.skip, steps=args.steps)
    print(f"{args.setting}: self CPU time over optimizer steps {args.skip + 1}-{args.skip + args.steps}\n")
    print(table(averages, steps=args.steps, top=args.top))


if __name__ == "__main__":
    from pipelines.errors import run_script

    run_script("step_profile.py", main)

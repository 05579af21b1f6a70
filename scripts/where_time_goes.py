"""Where a training run's time goes: py-spy samples bucketed into data, forward, backward, optimizer, eval.

In:  one or more py-spy "raw" profiles (collapsed stacks, ``frame;frame;... count`` per line), e.g.

    py-spy record --rate 50 --format raw --subprocesses -o bertpipe.txt -- \\
        bertpipe benchmark CONFIG --settings bertpipe --seeds 1 --output-dir /tmp/prof-bertpipe
    py-spy record --rate 50 --format raw --subprocesses -o trainer.txt -- \\
        bertpipe benchmark CONFIG --settings trainer_default --seeds 1 --output-dir /tmp/prof-trainer
    python scripts/where_time_goes.py bertpipe.txt trainer.txt

Out: a markdown table, one column per profile: the share of the sampled wall time (and seconds at the
     sampling rate) in each phase. py-spy samples Python stacks, so time in torch's C++ kernels counts
     towards the Python call that launched them (``loss.backward()`` -> backward, and so on); idle
     threads are not sampled.

A sample's phase is decided by the first rule, in the order of PHASES, that any of its frames matches;
the rules name both bertpipe's loop and the transformers Trainer, so the two profiles are comparable.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

# (phase, substrings of a frame "function (file:line)"); earlier phases win.
PHASES: list[tuple[str, tuple[str, ...]]] = [
    # bertpipe benchmark's own work in its parent process (matmul peak probe, filling the datasets cache)
    ("harness", ("measure_matmul_peak (", "prepare_job (pipelines/benchmark/")),
    ("eval", ("pipelines/evaluation.py", "evaluation_loop (", "prediction_step (", "predict (transformers/trainer.py",
              "predict (trainer.py")),
    # bertpipe clips through its own row-wise clip_gradients (pipelines/optim.py), the Trainer through Accelerate's
    ("optimizer", ("torch/optim/", "clip_grad_norm", "clip_gradients (", "_clip_grads_with_norm_ (", "zero_grad (", "lr_scheduler.py")),
    ("backward", ("backward (",)),
    ("data", ("dataloader.py", "data_loader.py", "collate", "data_collator.py", "__next__ (", "batching.py")),
    ("forward", ("forward (", "_call_impl (", "compute_loss (")),
    ("imports", ("_find_and_load (",)),
    ("waiting", ("Condition.wait (", "Event.wait (", "TMonitor.run (")),
    ("setup", ("from_pretrained (", "arrow_dataset.py", "load_dataset (", "tokenization", "save_pretrained (",
               "save_model (", "_save (")),
]
OTHER = "other"


def phase_of(stack: str) -> str:
    frames = stack.split(";")
    for phase, needles in PHASES:
        if any(needle in frame for frame in frames for needle in needles):
            return phase
    return OTHER


def read_profile(path: Path) -> Counter:
    """Samples per phase in one py-spy raw profile."""
    counts: Counter = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[phase_of(stack)] += int(count)
    if not counts:
        raise SystemExit(f"{path}: no samples (is it py-spy's --format raw output?)")
    return counts


def table(profiles: dict[str, Counter], rate: float) -> str:
    phases = [phase for phase, _ in PHASES] + [OTHER]
    header = "| phase | " + " | ".join(profiles) + " |"
    lines = [header, "|---" * (len(profiles) + 1) + "|"]
    for phase in phases:
        cells = []
        for counts in profiles.values():
            total = sum(counts.values())
            cells.append(f"{100 * counts[phase] / total:.1f}% ({counts[phase] / rate:.1f} s)")
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    totals = [f"{sum(counts.values()) / rate:.1f} s" for counts in profiles.values()]
    lines.append("| total sampled | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profiles", nargs="+", type=Path, help="py-spy --format raw files")
    parser.add_argument("--rate", type=float, default=50.0, help="the py-spy --rate the profiles were recorded at")
    args = parser.parse_args(argv)
    print(table({path.stem: read_profile(path) for path in args.profiles}, args.rate))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipelines.errors import run_script

    run_script("where_time_goes.py", main)

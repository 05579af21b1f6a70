"""Training checkpoints: Accelerate's ``save_state``/``load_state`` made crash-safe.

In:  the accelerator, the run's ``output_dir`` and a :class:`TrainerState` to carry along.
Out: ``output_dir/checkpoints/step-00000123/`` folders. Each is written under a ``.partial`` name
     and renamed only after every process has finished writing and ``trainer_state.json`` is in
     place, so a crash mid-write never leaves a folder that looks complete. ``latest`` is the
     newest complete folder; a corrupt one is reported by path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accelerate import Accelerator

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step-(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or unreadable."""


@dataclass
class TrainerState:
    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    """Batches of ``epoch`` already trained on, so a resumed run skips exactly those."""
    best_metric: float | None = None
    best_step: int | None = None
    evaluations_without_improvement: int = 0
    train_loss_sum: float = 0.0
    train_loss_count: int = 0
    log_history: list[dict] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> "TrainerState":
        return cls(**json.loads((folder / STATE_FILE).read_text()))


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders, oldest first (partial ones never match the name pattern)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [path for path in root.iterdir() if _NAME.match(path.name) and (path / STATE_FILE).is_file()]
    return sorted(found, key=lambda path: int(_NAME.match(path.name).group(1)))


def find_checkpoint(resume_from: str, output_dir: str | Path) -> Path:
    """Resolve ``latest`` or a path to a complete checkpoint folder, or fail saying why."""
    if resume_from == "latest":
        found = complete_checkpoints(output_dir)
        if not found:
            raise CheckpointError(
                f"train.resume_from_checkpoint=latest but {checkpoint_root(output_dir)} holds no complete checkpoint"
            )
        return found[-1]
    folder = Path(resume_from)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} does not exist")
    if not (folder / STATE_FILE).is_file():
        raise CheckpointError(f"checkpoint {folder} is incomplete (no {STATE_FILE}); it was probably interrupted mid-write")
    return folder


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, state: TrainerState, save_total_limit: int | None) -> Path:
    """Write a complete checkpoint for ``state.global_step`` on every process; returns its path."""
    root = checkpoint_root(output_dir)
    final = root / f"step-{state.global_step:08d}"
    partial = root / f"{final.name}.partial"
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _write_json_atomically(partial / STATE_FILE, asdict(state))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        if save_total_limit is not None:
            for stale in complete_checkpoints(output_dir)[:-save_total_limit]:
                shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, folder: Path) -> TrainerState:
    """Restore model, optimizer, scheduler, RNG and sampler state; returns the loop's counters."""
    try:
        state = TrainerState.read(folder)
        accelerator.load_state(str(folder))
    except Exception as error:  # a truncated tensor file, a bad pickle, a wrong model shape...
        raise CheckpointError(f"checkpoint {folder} cannot be loaded: {type(error).__name__}: {error}") from error
    return state


def _write_json_atomically(path: Path, payload: dict) -> None:
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2))
    os.replace(temporary, path)

"""The run directory: what a finished run leaves behind besides the model.

In:  the resolved config, the step log records and the final metrics.
Out: ``config.yaml`` (resolved config), ``log.jsonl`` (one record per logging/eval step),
     ``metrics.json`` (flat final metrics), ``training_curves.png`` (loss and eval metrics over
     steps). ``metrics.json`` is written last, so its presence marks a finished run.

Which folders a run may use (:func:`check_output_dir`): a new or empty one, or its own run folder
(``config.yaml``) when resuming or, with ``overwrite=true``, replacing it (the old run waits beside it
until the new one has finished); never a foreign folder, one holding the run's inputs, or an unfinished
run without one of those two settings. The check creates nothing: a refused command leaves no folder.

Rewrites of a run's files are whole or not at all (:mod:`pipelines.atomic_writes`), so that an interruption
never leaves a finished run that does not load: ``config.yaml``, ``metrics.json``, ``log.jsonl`` on a resume,
the tokenizer files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from pipelines.atomic_writes import json_safe, open_beside, replacing_files, write_text_atomically
from pipelines.config import RunConfig, is_model_option
from pipelines.config_loading import dump_yaml, read_yaml
from pipelines.errors import OutputDirError

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
LOG_FILE = "log.jsonl"
PLOT_FILE = "training_curves.png"


# What a run writes beside its config.yaml (pipelines.train._open_run_dir saves the tokenizer right after the config),
# by names a user's own folder holding a config.yaml of theirs would not have: not a log.jsonl or a checkpoints/ alone.
def _holds_run_files(folder: Path) -> bool:
    return ((folder / "tokenizer_config.json").is_file() or (folder / METRICS_FILE).is_file()
            or any(folder.glob("checkpoints/step-*/trainer_state.json")))


def is_run_dir(folder: str | Path) -> bool:
    """A folder bertpipe wrote: its ``config.yaml`` is a resolved run config (task and output_dir), beside the
    files a run writes from its start. A config alone is not enough: a user's project folder that keeps its own
    config as ``config.yaml`` (``output_dir`` naming that folder) was taken for a run, and ``overwrite=true``
    deleted it, config, notes and code."""
    folder = Path(folder)
    path = folder / CONFIG_FILE
    if not path.is_file() or not _holds_run_files(folder):
        return False
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(saved, dict) and "task" in saved and "output_dir" in saved


def lies_inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def data_files_by_key(files: dict[str, str | list[str]] | None) -> dict[str, str]:
    """The files of ``data.files`` by the key that names each (``data.files.train``, ``data.files.train[1]``)."""
    named: dict[str, str] = {}
    for split, paths in (files or {}).items():
        for index, path in enumerate([paths] if isinstance(paths, str) else paths):
            named[f"data.files.{split}" + (f"[{index}]" if not isinstance(paths, str) else "")] = path
    return named


def run_inputs(config: RunConfig) -> dict[str, Path]:
    """Local paths the run reads, by the key that names them."""
    named: dict[str, str | None] = {
        "model.name_or_path": config.model.name_or_path,
        "model.tokenizer_name_or_path": config.model.tokenizer_name_or_path,
        "data.path": config.data.path,
        **data_files_by_key(config.data.files),
        # A distil run reads its teacher at every step; with distill.init=model no other key names it.
        "distill.teacher": config.distill.teacher if config.distill is not None else None,
        # A task's own checkpoints (translation's encoder_name_or_path, decoder_name_or_path): inside the folder that
        # overwrite=true deletes, the new run loaded them and then lost them with the old run.
        **{f"{config.task}.{key}": value for key, value in config.task_options.model_dump().items()
           if is_model_option(key) and isinstance(value, str)},
    }
    return {key: Path(value).expanduser().resolve() for key, value in named.items() if value and Path(value).expanduser().exists()}


def _check_creatable(run_dir: Path) -> None:
    """``output_dir`` is a folder or can become one. A folder that does not exist yet is created to
    find out and removed again (with the parents made for it): the run creates it when it starts
    writing, and a command refused before that (bad data, a student that cannot be built) leaves
    no empty folder behind. Several processes of one run may check at once: one's removal is not
    another's failure."""
    if run_dir.exists() and not run_dir.is_dir():
        raise OutputDirError(f"output_dir {run_dir} is a file, not a folder; choose another output_dir")
    blocking = next((parent for parent in run_dir.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise OutputDirError(f"output_dir {run_dir} lies under {blocking}, which is a file; choose another output_dir")
    made = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    for attempt in range(3):
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            break
        except OSError as error:
            # FileNotFoundError: maybe another process removed a parent it made between our two mkdirs.
            if attempt == 2 or not isinstance(error, FileNotFoundError):
                raise OutputDirError(f"output_dir {run_dir} cannot be created: {error.strerror or error}") from error
    writable = os.access(run_dir, os.W_OK | os.X_OK) or not run_dir.exists()
    for folder in made:  # deepest first; one another process has filled or removed stays as it is
        with contextlib.suppress(OSError):
            folder.rmdir()
    if not writable:
        raise OutputDirError(f"output_dir {run_dir} is not writable")


def check_outside_data_folder(config: RunConfig, folder: Path, key: str = "output_dir") -> None:
    """``folder`` (a run's, a sweep's) is not inside the local ``data.path`` folder, which is read whole, subfolders
    too: the run's checkpoints changed the data's digest, so it could never resume ("contents changed"), and the
    ``eval_validation.json`` that ``evaluate`` wrote became rows of the validation split, which no load could cast."""
    data_folder = None if config.data.files else run_inputs(config).get("data.path")  # data.files: data.path is not read
    if data_folder is not None and data_folder.is_dir() and lies_inside(folder.expanduser().resolve(), data_folder):
        raise OutputDirError(
            f"{key} {folder} lies inside data.path={config.data.path}, a folder read whole as the run's data: the run's "
            f"files would become part of it. Choose a {key} outside {config.data.path}"
        )


def check_output_dir(config: RunConfig) -> bool:
    """Refuse an ``output_dir`` whose contents a run would mix with or lose; nothing is deleted here.

    Accepted: a new or empty folder; a bertpipe run being resumed; a bertpipe run with
    ``overwrite=true`` that holds none of the run's inputs. Returns True in that last case: the
    caller replaces the old run only after the new one has loaded and validated its data and model
    (:func:`set_aside_run_dir`), so a typo in the new config never costs the old run.
    """
    run_dir = Path(config.output_dir)
    _check_creatable(run_dir)
    check_outside_data_folder(config, run_dir)
    if _is_absent_or_empty(run_dir):
        return False
    try:
        _check_run_dir_use(config, run_dir)
    except OutputDirError as error:
        raise OutputDirError(f"{error}{replaced_run_note(run_dir)}") from None
    return bool(config.overwrite and not config.train.resume_from_checkpoint)


def replaced_run_note(run_dir: Path) -> str:
    """Where the last finished run is, when an ``overwrite=true`` that replaced it was interrupted:
    without it the user of a refused command (``train``, ``evaluate``, ``predict``) took that run for lost."""
    aside = replaced_run_dir(Path(run_dir))
    if not (aside / METRICS_FILE).is_file():
        return ""
    return (f" The finished run that overwrite=true replaced there is still kept, whole, in {aside}; the next run to "
            f"finish in {run_dir} deletes it (move it elsewhere to keep it).")


def _check_run_dir_use(config: RunConfig, run_dir: Path) -> None:
    """The refusals of :func:`check_output_dir` for a folder that holds files."""
    if not is_run_dir(run_dir):
        raise OutputDirError(
            f"output_dir {run_dir} is not empty and is not a bertpipe run (no {CONFIG_FILE} written by bertpipe); "
            "bertpipe never writes into or deletes another folder's contents. Choose a new or empty output_dir."
        )
    if config.train.resume_from_checkpoint:
        resumed = config.train.resume_from_checkpoint
        # A resume continues its own run: into another run's folder it replaced that run's model, config and metrics
        # (without overwrite=true, and without keeping it aside), and mixed the two runs' checkpoints.
        if resumed != "latest" and not lies_inside(Path(resumed).resolve(), run_dir.resolve() / "checkpoints"):
            raise OutputDirError(
                f"output_dir {run_dir} holds another run: train.resume_from_checkpoint={resumed} is not one of its "
                "checkpoints, and two runs never share one folder. Resume into the folder of the run the checkpoint "
                "belongs to, or into a new or empty output_dir"
            )
        return
    if config.overwrite:
        resolved = run_dir.resolve()
        if lies_inside(Path.cwd().resolve(), resolved):
            raise OutputDirError(f"overwrite=true would delete output_dir {run_dir}, which holds the current directory")
        for key, path in run_inputs(config).items():
            if lies_inside(path, resolved):
                raise OutputDirError(
                    f"overwrite=true would delete output_dir {run_dir}, but {key}={path} lies inside it (an input of "
                    "this run). Choose another output_dir, or move the input out first."
                )
        return
    if (run_dir / METRICS_FILE).exists():
        raise OutputDirError(
            f"{config.output_dir} already holds a finished run ({METRICS_FILE} exists). Choose another output_dir, "
            "or set overwrite=true to replace it."
        )
    # Imported here: it loads torch and accelerate, which the CLI's start does without.
    from pipelines.checkpoint import complete_checkpoints

    if not complete_checkpoints(run_dir):
        # Not "continue it with train.resume_from_checkpoint=latest": that only fails in turn, naming no way on.
        raise OutputDirError(
            f"{config.output_dir} holds an unfinished run ({CONFIG_FILE}, no {METRICS_FILE}) that stopped before its first "
            "complete checkpoint (one per train.save_steps): there is nothing to resume. Replace it with overwrite=true, or "
            "choose another output_dir; two runs never share one folder."
        )
    checkpoints = run_dir / "checkpoints"
    held = f" and {len(list(checkpoints.iterdir()))} checkpoint folder(s)" if checkpoints.is_dir() else ""
    raise OutputDirError(
        f"{config.output_dir} holds an unfinished run ({CONFIG_FILE}{held}, no {METRICS_FILE}): it was interrupted "
        "or failed. Continue it with train.resume_from_checkpoint=latest, replace it with overwrite=true, or choose "
        "another output_dir; two runs never share one folder."
    )


def _is_absent_or_empty(folder: Path) -> bool:
    try:
        return not any(folder.iterdir())
    except FileNotFoundError:
        return True


def _the_folder(run_dir: str | Path) -> Path:
    """``run_dir``, or the folder it links to: an ``output_dir`` that is a symbolic link stays one, and the folder it
    points to is what a replacement sets aside (renamed, the link itself became the old run, which was never deleted)."""
    run_dir = Path(run_dir)
    return run_dir.resolve() if run_dir.is_symlink() else run_dir


def replaced_run_dir(run_dir: str | Path) -> Path:
    """Where ``overwrite=true`` keeps the run it replaces until the new run finishes: ``.<name>.replaced`` beside it
    (beside the folder a symbolic link ``run_dir`` points to)."""
    run_dir = _the_folder(run_dir)
    return run_dir.with_name(f".{run_dir.name}.replaced")


def set_aside_run_dir(run_dir: str | Path) -> Path:
    """Move the old run (``check_output_dir`` has established it is one we may replace) to
    :func:`replaced_run_dir` and give the new run an empty folder; returns where the old run is.

    Deleted at once, the old run was lost to a full disk, a crash or Ctrl-C in the new one; it is
    deleted when the new run has finished (:func:`drop_replaced_run`). A folder set aside by an earlier
    replacement that never finished is the last finished run and stays; the unfinished replacement
    in ``run_dir`` is what this command replaces.
    """
    run_dir = _the_folder(run_dir)
    aside = replaced_run_dir(run_dir)
    if aside.exists() and not (run_dir / METRICS_FILE).exists():
        _discard(run_dir)
    else:
        if aside.exists():  # the replacement finished but stopped before removing it
            shutil.rmtree(aside)
        os.replace(run_dir, aside)
    run_dir.mkdir(parents=True)
    return aside


def _discard(run_dir: Path) -> None:
    """Delete an unfinished run, renaming it out of the way first.

    Deleted in place, a folder of checkpoints takes a while, and a Ctrl-C or a kill within it left a
    folder that had lost its ``config.yaml`` but kept the rest: every later command, ``overwrite=true``
    too, refused it as "not a bertpipe run". Renamed first, ``run_dir`` is either whole or gone.
    """
    discarded = run_dir.with_name(f".{run_dir.name}.discarded")
    shutil.rmtree(discarded, ignore_errors=True)  # left by an earlier discard that was interrupted
    os.replace(run_dir, discarded)
    shutil.rmtree(discarded)


def drop_replaced_run(run_dir: str | Path) -> None:
    """Delete the run a finished run replaced (nothing when it replaced none), and what an interrupted
    :func:`_discard` left."""
    run_dir = _the_folder(run_dir)
    shutil.rmtree(replaced_run_dir(run_dir), ignore_errors=True)
    shutil.rmtree(run_dir.with_name(f".{run_dir.name}.discarded"), ignore_errors=True)


def save_tokenizer(tokenizer, run_dir: Path) -> None:
    """``tokenizer.save_pretrained(run_dir)``, each file whole or not replaced.

    A resume (and the final save) rewrites the tokenizer files of the run; written in place, a kill
    mid-write left a truncated ``tokenizer.json``, and a run that trained its own tokenizer (MLM from
    scratch), which reads it back from there on resume, could never be resumed again.
    """
    with replacing_files(run_dir, "tokenizer") as staging:
        tokenizer.save_pretrained(staging)


def save_config(config: RunConfig, run_dir: str | Path) -> None:
    write_text_atomically(Path(run_dir) / CONFIG_FILE, dump_yaml(config.to_yaml_dict(), sort_keys=False))


def saved_config_path(run_dir: str | Path) -> str:
    """The file a run's saved config is read from, for messages."""
    return str(Path(run_dir) / CONFIG_FILE)


def load_saved_config(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise OutputDirError(f"run directory {run_dir} {'is a file' if Path(run_dir).exists() else 'does not exist'}")
    if not path.is_file():
        raise OutputDirError(f"{run_dir} is not a bertpipe run directory (no {CONFIG_FILE})")
    return read_yaml(path, what="run config", written_here=True)


class StepLog:
    """One JSON record per line, flushed each time, so a crash keeps every record written so far.

    ``records`` (a resumed run's history, from its checkpoint) replace the file's contents whole before
    anything is appended; what the interrupted run logged after that checkpoint goes, as the resumed run
    logs those steps again. Truncated first and written back one by one, a kill in between left a
    resumed run's log empty or cut short.
    """

    def __init__(self, run_dir: str | Path, records: Iterable[dict[str, Any]] = ()) -> None:
        self.path = Path(run_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(self.path, "".join(map(self._line, records)))
        self._file = self.path.open("a", encoding="utf-8")

    @staticmethod
    def _line(record: dict[str, Any]) -> str:
        return json.dumps(json_safe(record), allow_nan=False) + "\n"

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(self._line(record))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def plot_training_curves(records: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Loss (left) and each eval metric (right) against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    eval_keys = sorted({k for r in records for k in r if k.startswith("eval_") and k not in {"eval_samples", "eval_runtime"}})
    if not train and not eval_keys:
        return None
    figure, (loss_axes, eval_axes) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        loss_axes.plot(*zip(*train), label="train loss")
    eval_loss = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
    if eval_loss:
        loss_axes.plot(*zip(*eval_loss), marker="o", label="eval loss")
    loss_axes.set(xlabel="optimizer step", ylabel="loss", title="loss")
    loss_axes.legend()
    for key in eval_keys:
        if key == "eval_loss":
            continue
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        if points:
            eval_axes.plot(*zip(*points), marker="o", label=key)
    eval_axes.set(xlabel="optimizer step", title="evaluation")
    if eval_axes.get_legend_handles_labels()[0]:
        eval_axes.legend(fontsize="small")
    figure.tight_layout()
    path = Path(path)
    try:
        save_figure(figure, path)
    finally:
        plt.close(figure)
    return path


def save_figure(figure, path: Path, **savefig_options) -> None:
    """``figure`` as an image file (its format from the suffix), written beside and renamed over: a resumed
    run or a sweep redraws its plots, and a kill mid-write left a truncated image that publish uploads."""
    temporary, handle = open_beside(path, "wb")
    handle.close()  # created for this figure alone: savefig writes over it by name
    try:
        figure.savefig(temporary, dpi=100, format=path.suffix.lstrip(".") or "png", **savefig_options)
        os.replace(temporary, path)
    except OSError as error:
        if not error.filename:  # a failed write names no file: the message would not say which
            error.filename = str(path)
        raise
    finally:
        temporary.unlink(missing_ok=True)

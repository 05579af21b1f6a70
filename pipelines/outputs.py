"""The run directory: what a finished run leaves behind besides the model.

In:  the resolved config, the step log records and the final metrics.
Out: ``config.yaml`` (resolved config), ``log.jsonl`` (one record per logging/eval step),
     ``metrics.json`` (flat final metrics), ``training_curves.png`` (loss and eval metrics over
     steps). ``metrics.json`` is written last, so its presence marks a finished run.

Which folders a run may use (:func:`check_output_dir`): a new or empty one, or its own run folder
(``config.yaml``) when resuming or, with ``overwrite=true``, replacing it (the old run waits beside it
until the new one has finished); never a foreign folder, one holding the run's inputs, or an unfinished
run without one of those two settings. The check creates nothing: a refused command leaves no folder.

Rewrites of a run's files are whole or not at all, so that an interruption never leaves a finished run
that does not load: :func:`write_text_atomically` (``config.yaml``, ``metrics.json``, ``log.jsonl`` on a resume,
the model card, a task's eval artifacts, a checkpoint's state),
:func:`replacing_files` (model and tokenizer files, staged inside the folder), :func:`replacing_folder`
(``merged/``, staged beside it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from pipelines.config import RunConfig, read_yaml
from pipelines.errors import UserError

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.json"
LOG_FILE = "log.jsonl"
PLOT_FILE = "training_curves.png"


class OutputDirError(UserError, RuntimeError):
    """An ``output_dir`` (or ``--output``) that cannot be written, or whose contents a write would lose."""


def is_run_dir(folder: str | Path) -> bool:
    """A folder bertpipe wrote: its ``config.yaml`` is a resolved run config (task and output_dir)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(saved, dict) and "task" in saved and "output_dir" in saved


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def data_files_by_key(files: dict[str, str | list[str]] | None) -> dict[str, str]:
    """The files of ``data.files`` by the key that names each (``data.files.train``, ``data.files.train[1]``)."""
    named: dict[str, str] = {}
    for split, paths in (files or {}).items():
        for index, path in enumerate([paths] if isinstance(paths, str) else paths):
            named[f"data.files.{split}" + (f"[{index}]" if not isinstance(paths, str) else "")] = path
    return named


def _run_inputs(config: RunConfig) -> dict[str, Path]:
    """Local paths the run reads, by the key that names them."""
    named: dict[str, str | None] = {
        "model.name_or_path": config.model.name_or_path,
        "model.tokenizer_name_or_path": config.model.tokenizer_name_or_path,
        "data.path": config.data.path,
        **data_files_by_key(config.data.files),
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


def check_output_dir(config: RunConfig) -> bool:
    """Refuse an ``output_dir`` whose contents a run would mix with or lose; nothing is deleted here.

    Accepted: a new or empty folder; a bertpipe run being resumed; a bertpipe run with
    ``overwrite=true`` that holds none of the run's inputs. Returns True in that last case: the
    caller replaces the old run only after the new one has loaded and validated its data and model
    (:func:`set_aside_run_dir`), so a typo in the new config never costs the old run.
    """
    run_dir = Path(config.output_dir)
    _check_creatable(run_dir)
    if _is_absent_or_empty(run_dir):
        return False
    try:
        _check_run_dir_use(config, run_dir)
    except OutputDirError as error:
        raise OutputDirError(f"{error}{_replaced_run_note(run_dir)}") from None
    return bool(config.overwrite and not config.train.resume_from_checkpoint)


def _replaced_run_note(run_dir: Path) -> str:
    """Where the last finished run is, when an ``overwrite=true`` that replaced it was interrupted:
    without it the user of a refused command took that run for lost."""
    aside = replaced_run_dir(run_dir)
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
        return
    if config.overwrite:
        resolved = run_dir.resolve()
        if _inside(Path.cwd().resolve(), resolved):
            raise OutputDirError(f"overwrite=true would delete output_dir {run_dir}, which holds the current directory")
        for key, path in _run_inputs(config).items():
            if _inside(path, resolved):
                raise OutputDirError(
                    f"overwrite=true would delete output_dir {run_dir}, but {key}={path} lies inside it (an input of "
                    "this run). Choose another output_dir, or move the input out first."
                )
        return
    if (run_dir / METRICS_FILE).exists():
        raise OutputDirError(
            f"{config.output_dir} already holds a finished run ({METRICS_FILE} exists). Choose another output_dir, "
            "set overwrite=true to replace it, or train.resume_from_checkpoint=latest to continue it."
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


def replaced_run_dir(run_dir: str | Path) -> Path:
    """Where ``overwrite=true`` keeps the run it replaces until the new run finishes: ``.<name>.replaced`` beside it."""
    run_dir = Path(run_dir)
    return run_dir.with_name(f".{run_dir.name}.replaced")


def set_aside_run_dir(run_dir: str | Path) -> Path:
    """Move the old run (``check_output_dir`` has established it is one we may replace) to
    :func:`replaced_run_dir` and give the new run an empty folder; returns where the old run is.

    Deleted at once, the old run was lost to a full disk, a crash or Ctrl-C in the new one; it is
    deleted when the new run has finished (:func:`drop_replaced_run`). A folder set aside by an earlier
    replacement that never finished is the last finished run and stays; the unfinished replacement
    in ``run_dir`` is what this command replaces.
    """
    run_dir = Path(run_dir)
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
    run_dir = Path(run_dir)
    shutil.rmtree(replaced_run_dir(run_dir), ignore_errors=True)
    shutil.rmtree(run_dir.with_name(f".{run_dir.name}.discarded"), ignore_errors=True)


# Weight files transformers and peft write and read: whole (model.safetensors), sharded (index + shards), legacy .bin.
_WEIGHT_FILE = re.compile(r"(model|pytorch_model|adapter_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?")
_SHARD_FILE = re.compile(r".*-\d{5}-of-\d{5}\.(safetensors|bin)")


@contextlib.contextmanager
def replacing_files(folder: Path, name: str) -> Iterator[Path]:
    """Yields an empty staging folder ``folder/.<name>.partial``; what the block writes there replaces
    the files of the same names in ``folder`` once the block has ended without an error, each by
    ``os.replace`` (whole or not). An error or a kill within the block leaves ``folder`` as it was.

    A resume of a finished run and each new best model rewrite a folder that already holds a model:
    written in place, a kill mid-write left a "finished" run whose model did not load. When the
    staging folder holds weight files, weight files of another layout in ``folder`` (a sharded save's
    index and shards, ``pytorch_model.bin``) are removed after the new ones are in, never before:
    transformers loads ``model.safetensors`` before an index, and an index before ``pytorch_model.bin``,
    so until then it loads the old model whole. Replacing the shards of an older sharded save one by
    one cannot be whole: its index is removed first, so a kill then leaves a model that fails to
    load, never one that mixes old and new shards. Only the main process calls this.
    """
    staging = folder / f".{name}.partial"
    shutil.rmtree(staging, ignore_errors=True)  # left by a save that was killed
    try:
        staging.mkdir(parents=True)
        yield staging
    except BaseException:  # a full disk, Ctrl-C: no half-written folder is left in the run
        shutil.rmtree(staging, ignore_errors=True)
        raise
    written = sorted(staging.iterdir(), key=lambda path: (not _SHARD_FILE.fullmatch(path.name), not _WEIGHT_FILE.fullmatch(path.name)))
    weights = {path.name for path in written if _WEIGHT_FILE.fullmatch(path.name)}
    if any(_SHARD_FILE.fullmatch(name) and (folder / name).exists() for name in weights):
        for index in folder.glob("*.index.json"):
            index.unlink()
    # Shards, then the file the loader reads first (index or whole weights), then config and the rest.
    for path in written:
        target = folder / path.name
        if path.is_dir() and target.is_dir():  # additional_chat_templates/: a folder is not renamed over a folder
            shutil.rmtree(target)
        os.replace(path, target)
    staging.rmdir()
    if weights:
        for stale in folder.iterdir():
            if _WEIGHT_FILE.fullmatch(stale.name) and stale.name not in weights and stale.is_file():
                stale.unlink()


def save_tokenizer(tokenizer, run_dir: Path) -> None:
    """``tokenizer.save_pretrained(run_dir)``, each file whole or not replaced.

    A resume (and the final save) rewrites the tokenizer files of the run; written in place, a kill
    mid-write left a truncated ``tokenizer.json``, and a run that trained its own tokenizer (MLM from
    scratch), which reads it back from there on resume, could never be resumed again.
    """
    with replacing_files(run_dir, "tokenizer") as staging:
        tokenizer.save_pretrained(staging)


@contextlib.contextmanager
def replacing_folder(folder: Path, *, label: str = "folder") -> Iterator[Path]:
    """Yields an empty staging folder ``.<name>.partial`` beside ``folder``; once the block has ended
    without an error it becomes ``folder``, and what was there before is deleted.

    ``bertpipe merge`` and ``model.peft.merge`` rewrite ``merged/``, ``bertpipe export --overwrite`` its
    ``--out``: written in place, a kill mid-write over an earlier one left a model that did not load. The old folder is renamed aside
    (``.<name>.old.partial``) before the new one is renamed in, and deleted after; a kill between the two
    renames leaves it there, and the next call puts it back before starting. Both names end in
    ``.partial``, which ``publish`` never uploads. A ``folder`` that cannot be renamed (a mount point,
    such as a docker volume) is refused as an :class:`OutputDirError` naming ``label`` (``--out``): before
    the block runs where :func:`check_replaceable_folder` can tell, else when the swap fails; either way
    ``folder`` is left as it was and no staging folder stays behind.

    A ``folder`` that is a symbolic link (``exports/latest -> v3``) stays one: the folder it points to is
    replaced, as writing into the link would; renamed itself, the link became a real folder and the
    user's link was left behind under the aside name.
    """
    folder = Path(os.path.realpath(folder))  # "--out ." has no name to stage beside
    check_replaceable_folder(folder, label)
    staging = folder.with_name(f".{folder.name}.partial")
    aside = folder.with_name(f".{folder.name}.old.partial")
    if aside.exists():
        if folder.exists():
            shutil.rmtree(aside)
        else:
            os.replace(aside, folder)
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        if folder.exists():
            os.replace(folder, aside)
        os.replace(staging, folder)
    except BaseException as error:  # Ctrl-C between the two renames, or a folder that cannot be renamed: the earlier one stays
        if aside.exists() and not folder.exists():
            os.replace(aside, folder)
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise OutputDirError(_not_replaceable(label, folder, error.strerror or str(error))) from error
        raise
    shutil.rmtree(aside, ignore_errors=True)


def check_replaceable_folder(folder: str | Path, label: str = "folder") -> None:
    """Refuse a ``folder`` that :func:`replacing_folder` could not swap, before any work is spent on it:
    a mount point (a docker volume, a network share) cannot be renamed, and the new folder, staged
    beside it on the parent's file system, could not be renamed onto it."""
    folder = Path(os.path.realpath(Path(folder).expanduser()))
    if folder.is_dir() and (os.path.ismount(folder) or str(folder) in _mount_points()):
        raise OutputDirError(_not_replaceable(label, folder, "it is a mount point"))


MOUNT_TABLE = Path("/proc/self/mountinfo")


def _mount_points() -> set[str]:
    """Every mount point the kernel lists (Linux; empty elsewhere). ``os.path.ismount`` compares a
    folder's device with its parent's and so misses a bind mount from the same file system, which
    docker's ``-v host_dir:/out`` often is."""
    try:
        lines = MOUNT_TABLE.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return set()
    # Field 5 is the mount point, with space, tab, newline and backslash written as octal escapes.
    points = (fields[4] for fields in (line.split(" ") for line in lines) if len(fields) > 4)
    return {re.sub(r"\\([0-7]{3})", lambda escape: chr(int(escape.group(1), 8)), point) for point in points}


def _not_replaceable(label: str, folder: Path, why: str) -> str:
    way_on = ""
    if label.startswith("--"):  # an option the user can point elsewhere
        way_on = f" Choose another {label}: a folder inside it ({label} {folder / 'model'}) or elsewhere."
    return (f"{label} {folder} cannot be replaced ({why}): bertpipe writes the new folder beside it and renames it "
            f"into place, so that an interruption never leaves half of one; {folder} was left as it was.{way_on}")


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` is either left as it was or holds all of ``text``: a full disk or an interruption
    mid-write never leaves it truncated (a resume rewrites ``config.yaml``, the file that marks
    the folder as a bertpipe run)."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        temporary.write_text(text, encoding="utf-8", newline="")
        # Renamed before its contents reach the disk, a power loss could leave an empty file under the name.
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        # A failed write() carries no file name: the message would not say which file.
        if isinstance(error, OSError) and not error.filename:
            error.filename = str(path)
        raise


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity as None: Python writes them as bare ``NaN``/``Infinity``,
    which is not JSON (jq, JavaScript and most readers refuse the whole file)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_json(path: Path, payload: Any) -> None:
    """``payload`` as strict JSON (a NaN metric, such as Pearson of constant predictions, is null), atomically."""
    write_text_atomically(path, json.dumps(json_safe(payload), indent=2, sort_keys=False, allow_nan=False) + "\n")


def save_config(config: RunConfig, run_dir: str | Path) -> None:
    write_text_atomically(Path(run_dir) / CONFIG_FILE, yaml.safe_dump(config.to_yaml_dict(), sort_keys=False))


def load_saved_config(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / CONFIG_FILE
    if not Path(run_dir).is_dir():
        raise OutputDirError(f"run directory {run_dir} {'is a file' if Path(run_dir).exists() else 'does not exist'}")
    if not path.is_file():
        raise OutputDirError(f"{run_dir} is not a bertpipe run directory (no {CONFIG_FILE})")
    return read_yaml(path, what="run config")


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
    # Beside and renamed over: a resumed finished run redraws it, and a kill mid-write left a truncated
    # image that publish uploads.
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    try:
        figure.savefig(temporary, dpi=100, format=path.suffix.lstrip(".") or "png")
        os.replace(temporary, path)
    finally:
        plt.close(figure)
        temporary.unlink(missing_ok=True)
    return path

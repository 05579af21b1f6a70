"""Writes that are whole or not at all: an interruption, a full disk or a kill never leaves half a file
or half a model folder where a whole one was.

In:  a file's text or JSON payload, or a block that writes it piece by piece; or a block that writes a model,
     tokenizer or export into a staging folder.
Out: :func:`write_text_atomically`, :func:`write_json` and :func:`writing_atomically` (UTF-8 text, fsynced, then
     renamed over the old file),
     :func:`replacing_files` (files staged inside their folder, each renamed over its old copy; weight files
     of another layout removed only once the new ones are in), :func:`replacing_folder` (a folder staged
     beside it and swapped in; one that cannot be renamed, a mount point, refused first by
     :func:`check_replaceable_folder`). A refusal is an :class:`~pipelines.errors.OutputDirError` naming
     the option or folder.

Used for a run's own files (:mod:`pipelines.outputs`), checkpoint state, the model card, a task's eval
artifacts, ``bertpipe predict``'s output, ``merged/`` and exports.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from pipelines.errors import OutputDirError


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
    with writing_atomically(path) as handle:
        handle.write(text)


@contextlib.contextmanager
def writing_atomically(path: Path) -> Iterator[TextIO]:
    """A text file (UTF-8, newlines as written) whose contents become ``path`` in one rename once the block
    has ended without an error; until then, and after an error, ``path`` is as it was and nothing is left
    beside it. For a file written piece by piece (``bertpipe predict``'s rows)."""
    path = _link_target(path)
    temporary = None
    try:
        temporary, handle = open_beside(path, "w", encoding="utf-8", newline="")
        with handle:
            yield handle
            handle.flush()
            # Renamed before its contents reach the disk, a power loss could leave an empty file under the name.
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
        # A failed write() carries no file name: the message would not say which file.
        if isinstance(error, OSError) and not error.filename:
            error.filename = str(path)
        raise


def open_beside(path: Path, mode: str, **options: Any) -> tuple[Path, IO]:
    """A new file beside ``path`` to be renamed over it: ``NAME.tmp``, or ``NAME.1.tmp``, ... where that
    exists. Created exclusively: a file of that name already there (the user's own, or a predict input
    named like the output's temporary) was overwritten and then deleted."""
    for attempt in range(1000):
        temporary = path.with_name(f"{path.name}.tmp" if attempt == 0 else f"{path.name}.{attempt}.tmp")
        try:
            return temporary, open(temporary, mode.replace("w", "x"), **options)
        except FileExistsError:
            continue
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)  # this call's, if any: "x" refuses a file already there
            raise
    raise FileExistsError(errno.EEXIST, "no free temporary name beside it", str(path))


def _link_target(path: Path) -> Path:
    """A symbolic link's target, which a rename over the link would leave as it was (the link replaced by a file)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


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

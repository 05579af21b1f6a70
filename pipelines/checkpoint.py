"""Training checkpoints: Accelerate's ``save_state``/``load_state`` made crash-safe.

In:  the accelerator, the run's ``output_dir`` and a :class:`TrainerState` to carry along.
Out: ``output_dir/checkpoints/step-00000123/`` folders. Each is written under a ``.partial`` name
     and renamed only after every process has finished writing and ``trainer_state.json`` is in
     place, so a crash mid-write never leaves a folder that looks complete. ``latest`` is the
     newest complete folder; a corrupt one is reported by path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import load as accelerate_load
from accelerate.utils.constants import RNG_STATE_NAME

from pipelines.atomic_writes import write_text_atomically
from pipelines.config import NO_DEFAULT, absolute_if_local, flatten_tree, is_model_option, schema_default
from pipelines.config_loading import dump_yaml
from pipelines.errors import UserError, describe
from pipelines.optim import StepPlan

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
STATE_FILE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
"""The resolved config the checkpoint was trained under, compared with the config of a resume."""
SOURCES_FILE = "sources.json"
"""Digests of the contents of the local files and folders that config names (``_PATH_KEYS``): a resume
whose paths differ only because the data or model moved (another mount point, a copy on another machine)
compares contents instead of paths."""

# Keys a resume may change: they decide what is logged, saved or reported and how fast, never what
# is computed (the thread count and compiling do change the order of float sums: rounding, which a resume on
# another thread count names). Every other key (model, data, seed, batch size, accumulation, learning rate,
# schedule, warmup, length, precision, grouping, best-model settings, task settings) must match the
# checkpoint's, or the resumed run would continue a trajectory other than the one it records.
RESUME_MAY_CHANGE = (
    "output_dir", "overwrite", "train.resume_from_checkpoint", "train.logging_steps", "train.eval_steps",
    "train.eval_on_start", "train.save_steps", "train.save_total_limit", "train.report_to", "train.eval_batch_size",
    "train.dataloader_num_workers", "train.torch_num_threads", "train.compile", "train.compile_backend",
    "data.preprocessing_num_workers", "hub.",
)
BEST_MODEL_CADENCE = ("train.eval_steps",)
"""Resume-changeable keys that become trajectory keys under ``train.metric_for_best_model``: the
evaluations then pick the model reloaded at the end and decide when early stopping ends the run."""
_NAME = re.compile(r"^step-(\d{8})$")


class CheckpointError(UserError, RuntimeError):
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
    train_samples: int = 0
    train_tokens: int = 0
    train_runtime: float = 0.0
    """Totals over every segment of the run (all processes) up to this checkpoint, so that a resumed
    run's ``metrics.json`` describes the whole run; runtime counts the training loop's seconds only."""
    interval_loss: float = 0.0
    interval_batches: int = 0
    """Summed loss (mean over processes) and count of the batches since the last logged step: a
    checkpoint between logging steps must carry them, or the next logged loss and ``train_loss``
    would leave those batches out."""
    num_processes: int | None = None
    """Processes that trained up to this checkpoint (None: a checkpoint from before it was recorded)."""
    mixed_precision: str | None = None
    """Accelerate's precision the run trained in up to here (``no``, ``bf16``, ``fp16``): ``auto`` resolves per
    machine, so the config's value alone cannot tell a resume on other hardware (None: from before it was recorded)."""
    train_data: str | None = None
    """Digest of the training features (pipelines.data.features_digest; None: from before it was recorded)."""
    torch_threads: int | None = None
    """Intra-op threads per process up to here: another count sums floats in another order (None: not recorded)."""
    stopped_early: bool = False
    """Early stopping (or the caller's ``on_evaluate``) ended training at this step; a resume from here
    goes straight to the final evaluation instead of training on."""
    log_history: list[dict] = field(default_factory=list)

    @classmethod
    def read(cls, folder: Path) -> "TrainerState":
        saved = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
        # Every checkpoint has written these: one missing was filled with its default (a step count of 0, an empty
        # log), and the run resumed from a position or with totals it never had, without a word.
        missing = [key for key in _ALWAYS_SAVED if key not in saved]
        if missing:
            raise ValueError(f"it lacks {', '.join(missing)}")
        return cls(**saved)


_ALWAYS_SAVED = ("global_step", "epoch", "batches_in_epoch", "train_loss_sum", "train_loss_count", "log_history")


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
                f"train.resume_from_checkpoint=latest but {checkpoint_root(output_dir)} holds no complete checkpoint "
                "(one is written every train.save_steps, and when a signal stops the run): there is nothing to resume. "
                "Start the run again without it (overwrite=true to replace an unfinished run in output_dir)"
            )
        return found[-1]
    folder = Path(resume_from)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder} {'is a file, not a checkpoint folder' if folder.exists() else 'does not exist'}")
    if not (folder / STATE_FILE).is_file():
        raise CheckpointError(f"checkpoint {folder} is incomplete (no {STATE_FILE}); it was probably interrupted mid-write")
    return folder


def save_checkpoint(
    accelerator: Accelerator, output_dir: str | Path, state: TrainerState, save_total_limit: int | None,
    *, config: dict | None = None, sources: dict[str, str] | None = None,
) -> Path:
    """Write a complete checkpoint for ``state.global_step`` on every process; returns its path.

    ``config`` (the resolved config as written to ``config.yaml``) is stored beside the state so a
    resume can be checked against the settings the checkpoint was trained with; ``sources``, the
    :func:`source_digests` of that config taken when the run read its files (computed here when not
    given), lets a resume from another path compare contents. A write that fails
    (a full disk) or is interrupted removes its own partial folder and leaves the complete checkpoints as they were.
    """
    root = checkpoint_root(output_dir)
    final = root / f"step-{state.global_step:08d}"
    partial = root / f"{final.name}.partial"
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    state.num_processes = accelerator.num_processes
    state.mixed_precision = accelerator.mixed_precision
    state.torch_threads = torch.get_num_threads()
    try:
        accelerator.save_state(str(partial), safe_serialization=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if config is not None:
                (partial / CONFIG_FILE).write_text(dump_yaml(config, sort_keys=False), encoding="utf-8")
                _write_json_atomically(partial / SOURCES_FILE, source_digests(config) if sources is None else sources)
            _write_json_atomically(partial / STATE_FILE, asdict(state))
    except BaseException as error:  # a full disk, and Ctrl-C too: neither leaves half a checkpoint behind
        free = _free_space(root)
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, UserError) or not isinstance(error, Exception):
            raise
        # A full disk reaches torch.save as a RuntimeError ("unexpected pos") and safetensors as a
        # SafetensorError, not as an OSError the CLI would report: name the checkpoint and the way on.
        raise CheckpointError(
            f"checkpoint {partial} could not be written ({describe(error)}; {free} free on its disk) and was "
            f"discarded. {_after_a_failed_save(output_dir)}"
        ) from error
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        if save_total_limit is not None:
            for stale in complete_checkpoints(output_dir)[:-save_total_limit]:
                shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _may_change(key: str) -> bool:
    return any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in RESUME_MAY_CHANGE)


# Keys whose values are local paths, which a config now holds absolute (pipelines.config): a checkpoint's
# config.yaml from before that holds them as written, relative to the directory the run was started in.
_PATH_KEYS = ("data.files.", "data.path", "model.name_or_path", "model.tokenizer_name_or_path", "distill.teacher")


def _is_path_key(key: str) -> bool:
    return any(key == path_key or (path_key.endswith(".") and key.startswith(path_key)) for path_key in _PATH_KEYS)


def _as_read_now(key: str, value: object) -> object:
    if not _is_path_key(key):
        return value
    if isinstance(value, list):
        return [absolute_if_local(item) if isinstance(item, str) else item for item in value]
    return absolute_if_local(value) if isinstance(value, str) else value


def _is_digested(key: str) -> bool:
    # A task's own model options (translation's encoder_name_or_path) are kept as written, relative or not,
    # so they are not path keys; their contents are still what the run trained from.
    return _is_path_key(key) or is_model_option(key)


# The digest of the weights and config alone of a local model.name_or_path folder, beside the whole folder's: an adapter
# run checks its base by it, where a file written into the folder later (a predictions file) changes nothing it loads.
MODEL_FILES_KEY = "model.name_or_path (weights and config)"
_MODEL_FILE = re.compile(r"config\.json|.*\.safetensors|.*\.bin|.*\.index\.json")


def source_digests(config: dict) -> dict[str, str]:
    """A digest of the contents of each local file or folder (or list of files) a path key of ``config``, or a
    task option naming a model (``*name_or_path``), names; and :data:`MODEL_FILES_KEY`'s for a local model folder."""
    digests = {}
    for key, value in flatten_tree(config).items():
        if _is_digested(key) and (digest := _content_digest(key, value)) is not None:
            digests[key] = digest
            if key == "model.name_or_path" and (weights := model_files_digest(value)) is not None:
                digests[MODEL_FILES_KEY] = weights
    return digests


def model_files_digest(folder: object) -> str | None:
    """sha256 over the weights and config files at the top of a model folder (None: not a readable folder)."""
    if not isinstance(folder, str) or not os.path.isdir(folder):
        return None
    digest = hashlib.sha256()
    try:
        for file in sorted(Path(folder).iterdir(), key=lambda path: path.name):
            if file.is_file() and _MODEL_FILE.fullmatch(file.name):
                digest.update(f"{file.name}\0{_file_digest(file)}\0".encode())
    except OSError:
        return None
    return digest.hexdigest()


def _content_digest(key: str, value: object) -> str | None:
    """None when ``value`` is not (a list of) existing local paths, e.g. a Hub id, or cannot be read."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, str) and os.path.exists(item) for item in items):
        return None
    digest = hashlib.sha256()
    try:
        for item in items:
            # A dataset folder is read with its subfolders (data/, one per split); a model folder is
            # read at its top alone, and a run directory's checkpoints/ beneath it may hold gigabytes.
            digest.update(_path_digest(Path(item), recursive=key == "data.path").encode() + b"\0")
    except OSError:
        return None
    return digest.hexdigest()


_EVALUATION_REPORT = re.compile(r"eval_[^/]*\.json")


def _path_digest(path: Path, *, recursive: bool) -> str:
    if path.is_file():
        return _file_digest(path)
    digest = hashlib.sha256()
    found = path.rglob("*") if recursive else path.iterdir()
    for file in sorted(found, key=lambda found_path: found_path.relative_to(path).as_posix()):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts):  # .git, .cache: not the content
            continue
        if not recursive and _EVALUATION_REPORT.fullmatch(relative.name):
            continue  # `bertpipe evaluate` of a teacher or base run writes it beside the model: not the model
        if file.is_file():
            digest.update(f"{relative.as_posix()}\0{_file_digest(file)}\0".encode())
    return digest.hexdigest()


_FILE_DIGESTS: dict[tuple, str] = {}


def _file_digest(path: Path) -> str:
    """sha256 of a file, read once per process while its size and modification time stay the same: every
    checkpoint of a run records the digests, and a multi-GB file must not be read again at each save."""
    status = path.stat()
    identity = (str(path.resolve()), status.st_size, status.st_mtime_ns)
    if identity not in _FILE_DIGESTS:
        with path.open("rb") as file:
            _FILE_DIGESTS[identity] = hashlib.file_digest(file, "sha256").hexdigest()
    return _FILE_DIGESTS[identity]


def resume_differences(saved: dict, current: dict, *, sources: dict[str, str] | None = None) -> list[str]:
    """``key: checkpoint value -> current value`` for each trajectory key that differs.

    ``sources`` (the checkpoint's :data:`SOURCES_FILE`) holds the digests of the contents its paths named: a
    path key whose value names other files with the same contents is not a difference.
    """
    sources = sources or {}
    old, new = {key: _as_read_now(key, value) for key, value in flatten_tree(saved).items()}, flatten_tree(current)
    tracks_best = bool(old.get("train.metric_for_best_model") or new.get("train.metric_for_best_model"))
    missing = object()
    lines = []
    for key in sorted(set(old) | set(new)):
        if _may_change(key) and not (tracks_best and key in BEST_MODEL_CADENCE):
            continue
        before, after = old.get(key, missing), new.get(key, missing)
        if before is missing and after is not missing and (default := schema_default(key)) is not NO_DEFAULT and after == default:
            continue  # a setting added since the checkpoint was written: that run trained as its default does
        contents = _content_digest(key, after) if key in sources and after is not missing else None
        if before == after:
            # The same path: a model folder or teacher run retrained in place, a data file rewritten.
            if contents is not None and contents != sources[key]:
                lines.append(f"{key}: {after!r}, the same path, but its contents changed since the checkpoint")
            continue
        if contents is not None and contents == sources[key]:
            continue  # the same contents, moved
        shown = lambda value: "(unset)" if value is missing else repr(value)  # noqa: E731
        other = ", with other contents" if contents is not None else ""
        lines.append(f"{key}: {shown(before)} in the checkpoint, {shown(after)} now{other}")
    return lines


def check_resume_config(folder: Path, current: dict, *, mixed_precision: str | None = None) -> None:
    """Refuse a resume whose trajectory settings differ from the checkpoint's, listing each one.

    Checkpoints written before the config was stored beside them are compared with their run's
    ``config.yaml`` (the run that wrote them, two levels up). ``mixed_precision`` is what this run's
    ``train.mixed_precision`` resolves to here; where the checkpoint records the precision it trained in,
    that is compared instead of the setting (``auto`` is bf16 on one machine and fp32 on the next).
    """
    for source in (folder / CONFIG_FILE, folder.parent.parent / CONFIG_FILE):
        if source.is_file():
            break
    else:
        return
    try:
        saved = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise CheckpointError(f"checkpoint {folder}: its config {source} cannot be read: {error}") from error
    sources = {}
    if source == folder / CONFIG_FILE and (folder / SOURCES_FILE).is_file():  # checkpoints from before it: paths compared
        try:
            sources = json.loads((folder / SOURCES_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CheckpointError(f"checkpoint {folder} cannot be loaded: {folder / SOURCES_FILE}: {describe(error)}") from error
    current_setting = current.get("train", {}).get("mixed_precision")
    trained_in = _recorded_precision(folder) if mixed_precision is not None else None
    if trained_in is not None:
        saved = {**(saved or {}), "train": {**(saved or {}).get("train", {}), "mixed_precision": None}}
        current = {**current, "train": {**current.get("train", {}), "mixed_precision": None}}
    differences = resume_differences(saved or {}, current, sources=sources if isinstance(sources, dict) else {})
    if trained_in is not None and trained_in != mixed_precision:
        differences.append(
            f"train.mixed_precision: trained in {_PRECISION_NAMES.get(trained_in, trained_in)} up to the checkpoint, and "
            f"{current_setting!r} is {_PRECISION_NAMES.get(mixed_precision, mixed_precision)} here ('auto' follows the "
            "hardware: BERTPIPE_NATIVE_BF16=1 or 0 decides it on a CPU)"
        )
    if differences:
        raise CheckpointError(
            f"train.resume_from_checkpoint={folder} was trained with other settings ({source}):\n  "
            + "\n  ".join(differences)
            + "\nResume with the checkpoint's values, or start a new run (another output_dir, or overwrite=true). "
            "Only logging/eval/save cadence (eval cadence not with train.metric_for_best_model), trackers, "
            "save_total_limit, hub settings and speed settings may change on a resume; data and model paths "
            "too, where they name the same contents as before."
        )


_PRECISION_NAMES = {"no": "fp32"}


def _recorded_precision(folder: Path) -> str | None:
    """The precision a checkpoint records having trained in; None where it records none (or its state is
    unreadable, which :func:`load_checkpoint` reports)."""
    try:
        recorded = json.loads((folder / STATE_FILE).read_text(encoding="utf-8")).get("mixed_precision")
    except (OSError, ValueError, AttributeError):
        return None
    return recorded if isinstance(recorded, str) else None


def load_checkpoint(accelerator: Accelerator, folder: Path, *, train_data: str | None = None, plan: StepPlan | None = None) -> TrainerState:
    """Restore model, optimizer, scheduler, RNG and sampler state; returns the loop's counters.

    ``train_data`` is the digest of the training features this run has; a checkpoint trained on others is refused.
    ``plan`` (this run's steps) must place the checkpoint's step where its epoch and batch say it is.
    """
    try:
        state = TrainerState.read(folder)
    except Exception as error:
        raise CheckpointError(f"checkpoint {folder} cannot be loaded: {folder / STATE_FILE}: {describe(error)}") from error
    _check_position(folder, state, plan)
    if state.train_data is not None and train_data is not None and state.train_data != train_data:
        # The config names the same files, so check_resume_config saw no change; their rows did change.
        raise CheckpointError(
            f"checkpoint {folder} was trained on other training data than this run has: the same data settings, but the "
            "rows differ (added, removed or edited since, or tokenised otherwise by another bertpipe), so the run would not "
            "end where the interrupted one would. Restore the data the run started with, or start a new run "
            "(another output_dir, or overwrite=true)."
        )
    state.train_data = train_data
    if state.torch_threads is not None and state.torch_threads != torch.get_num_threads():
        # A speed setting that may change on a resume (another machine), but not one that keeps every bit.
        logger.warning(
            "checkpoint %s trained on %d thread(s) per process, this run has %d (train.torch_num_threads, or the cores): "
            "floats are summed in another order, so the run ends where the uninterrupted one would up to rounding, not "
            "bit for bit", folder, state.torch_threads, torch.get_num_threads())
    _check_process_count(folder, state, accelerator.num_processes)
    _check_random_states(folder, accelerator.process_index)
    try:
        accelerator.load_state(str(folder))
    except Exception as error:  # a truncated tensor file, a bad pickle, a wrong model shape...
        damaged = [str(path) for path in sorted(folder.glob("*.bin")) if not zipfile.is_zipfile(path)]
        named = f" ({', '.join(damaged)} {'is' if len(damaged) == 1 else 'are'} truncated or not a torch file)" if damaged else ""
        raise CheckpointError(f"checkpoint {folder} cannot be loaded{named}: {type(error).__name__}: {error}") from error
    return state


def _check_position(folder: Path, state: TrainerState, plan: StepPlan | None) -> None:
    """The step the folder is named for, the state's step, and its epoch and batch under this run's plan agree: an
    edited or mismatched trainer_state.json resumed elsewhere than it said (a run 3 steps short of its plan, exit 0)."""
    named = _NAME.match(folder.name)
    problem = None
    if named is not None and int(named.group(1)) != state.global_step:
        problem = f"global_step {state.global_step} in a folder named for step {int(named.group(1))}"
    elif plan is not None:
        placed = state.epoch * plan.updates_per_epoch + math.ceil(state.batches_in_epoch / plan.accumulation_steps)
        if state.batches_in_epoch > plan.batches_per_epoch or placed != state.global_step:
            problem = (f"epoch {state.epoch}, batch {state.batches_in_epoch} is update {placed} of this run's plan "
                       f"({plan.batches_per_epoch} batches an epoch), not its global_step {state.global_step}")
    if problem is not None:
        raise CheckpointError(f"checkpoint {folder} cannot be resumed: {folder / STATE_FILE} holds {problem}; it was edited "
                              "or comes from another run. Resume an earlier checkpoint, or start a new run")


def _check_process_count(folder: Path, state: TrainerState, num_processes: int) -> None:
    """Refuse a checkpoint written by another number of processes than this run has.

    Every step counter in it (batches read in the epoch, the scheduler's steps) counts per-process
    batches: resumed by fewer processes, the run skipped only part of the data already trained on,
    re-planned its length and trained steps the interrupted run never had, silently (2 -> 1 process
    ended at step 18 of a 12-step run). More processes have no random states to restore.
    """
    written_by = state.num_processes
    if written_by is None:
        # Written before the count was recorded: random states for a process this run lacks tell it.
        # (Only those: on storage local to each machine, a folder holds its own processes' files alone.)
        indices = [int(found.group(1)) for path in folder.glob(f"{RNG_STATE_NAME}_*.pkl")
                   if (found := re.fullmatch(rf"{RNG_STATE_NAME}_(\d+)\.pkl", path.name))]
        written_by = max(indices) + 1 if indices and max(indices) >= num_processes else None
    if written_by is None or written_by == num_processes:
        return
    raise CheckpointError(
        f"checkpoint {folder} was written by a run of {written_by} process{'es' if written_by > 1 else ''}, and this run has "
        f"{num_processes}: the global batch (train.batch_size per process, times the processes), the data position, the "
        "learning-rate schedule and each process's random numbers would all change, and the run would end elsewhere than "
        f"the interrupted one. Resume with {written_by} process{'es' if written_by > 1 else ''} (accelerate launch "
        f"--num_processes {written_by}), or start a new run (another output_dir, or overwrite=true)."
    )


def _check_random_states(folder: Path, process_index: int) -> None:
    """Refuse a checkpoint whose random states this process cannot restore.

    Accelerate's ``load_state`` skips random states it cannot read with an info-level log line; the
    resumed run would then draw other dropout masks than the interrupted one and end elsewhere, silently.
    """
    path = folder / f"{RNG_STATE_NAME}_{process_index}.pkl"

    def refuse(problem: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {folder} cannot be resumed exactly: {path} {problem}. Without it the run would continue with "
            "other random numbers (dropout, masking) than the interrupted one. Resume from another checkpoint, or start "
            "again with overwrite=true."
        )

    if not path.is_file():
        raise refuse("is missing (a checkpoint written by fewer processes, or a file lost since)")
    try:
        states = accelerate_load(path)
    except Exception as error:
        raise refuse(f"cannot be read ({describe(error).rstrip('.')})") from error
    if not isinstance(states, dict) or not {"random_state", "numpy_random_seed", "torch_manual_seed"} <= states.keys():
        raise refuse("holds no random states")


def _free_space(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB"
    except OSError:
        return "unknown space"


def _after_a_failed_save(output_dir: str | Path) -> str:
    found = complete_checkpoints(output_dir)
    if found:
        return f"Free space, then continue with train.resume_from_checkpoint=latest ({found[-1]} is complete)."
    return "Free space, then start again with overwrite=true (no checkpoint of this run is complete)."


def _write_json_atomically(path: Path, payload: dict) -> None:
    # Plain json.dumps, not atomic_writes.write_json: a NaN (a diverged loss, a NaN best metric) must read back as
    # NaN on resume, where strict JSON's null would break the sums and comparisons the loop continues.
    write_text_atomically(path, json.dumps(payload, indent=2))

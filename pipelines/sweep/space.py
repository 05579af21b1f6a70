"""The search space of a sweep: which config keys to search, and over what values.

In:  a search-space YAML mapping dotted config keys to one distribution each, e.g.

         train.learning_rate: {log_uniform: [1.0e-5, 5.0e-4]}
         train.batch_size: {choice: [16, 32]}
         train.warmup_fraction: {uniform: [0.0, 0.2]}
         train.num_epochs: {int: [1, 4]}

     (``uniform``/``int`` also take ``step``; ``log_int`` is an integer range on a log scale), or
     none, for the task's default space; the task config and overrides it is checked against.
Out: a list of :class:`Param`, each of which an Optuna trial asks for its value; or a
     :class:`SweepError` (exit 2) naming the key and the file.

Every key of the space is checked against the task's config schema before the first trial: an
unknown key, a numeric distribution on a non-numeric key, an empty choice or a bound the schema
rejects is a :class:`SweepError`, and so is a key that the overrides fix, that another setting makes
inert (:data:`INERT_WHILE_SET`) or that the sweep sets for each trial (:data:`SET_BY_THE_SWEEP`).
:func:`yaml_scalar` writes a value as the override that reads back as the same value.
"""

from __future__ import annotations

import copy
import difflib
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import BaseModel

from pipelines.config import ConfigError, RunConfig, TaskOptions, flatten_tree, section_type
from pipelines.config_loading import Origin, apply_overrides, dump_yaml, load_config, read_yaml

OptionsLookup = Callable[[str], type[TaskOptions]]


class SweepError(ConfigError):
    """A sweep that cannot run as asked (bad search space, objective, storage or study)."""


FLOAT_DISTRIBUTIONS = ("uniform", "log_uniform")
INT_DISTRIBUTIONS = ("int", "log_int")
DISTRIBUTIONS = (*FLOAT_DISTRIBUTIONS, *INT_DISTRIBUTIONS, "choice")

# What most fine-tuning papers search (learning rate first, then batch size, warmup and length);
# ranges per task from their usual recipes. Keys not in the table fall back to ``_COMMON_SPACE``.
_COMMON_SPACE: dict[str, dict[str, Any]] = {
    "train.learning_rate": {"log_uniform": [1.0e-5, 3.0e-4]},
    "train.batch_size": {"choice": [16, 32]},
    "train.warmup_fraction": {"uniform": [0.0, 0.2]},
    "train.num_epochs": {"int": [1, 4]},
}
DEFAULT_SPACES: dict[str, dict[str, dict[str, Any]]] = {
    "classification": _COMMON_SPACE,
    "ner": _COMMON_SPACE,
    "qa": {**_COMMON_SPACE, "train.learning_rate": {"log_uniform": [1.0e-5, 1.0e-4]}, "train.num_epochs": {"int": [1, 3]}},
    "translation": {**_COMMON_SPACE, "train.learning_rate": {"log_uniform": [1.0e-5, 1.0e-3]}, "train.num_epochs": {"int": [1, 5]}},
    "mlm": {**_COMMON_SPACE, "train.learning_rate": {"log_uniform": [5.0e-5, 1.0e-3]}, "train.batch_size": {"choice": [32, 64]},
            "train.warmup_fraction": {"uniform": [0.0, 0.1]}},
}

# (inert key, key that overrides it while set): pipelines/optim.py takes the length from max_steps and the warmup
# from warmup_steps whenever they are set, pipelines/data.py reads data.files and then never data.path or
# data.name, and pipelines/modeling.py builds a model from model_type and architecture only without a checkpoint.
# Searching the first key (or one of its keys) while the second is set spends every trial on runs that train
# alike, so default_space leaves such a key out and load_space refuses it.
INERT_WHILE_SET: tuple[tuple[str, str], ...] = (
    ("train.num_epochs", "train.max_steps"),
    ("train.warmup_fraction", "train.warmup_steps"),
    ("data.path", "data.files"),
    ("data.name", "data.files"),
    ("model.architecture", "model.name_or_path"),
    ("model.model_type", "model.name_or_path"),
)
# Keys the sweep sets for each trial itself, with the reason a searched value would be wrong.
SET_BY_THE_SWEEP: dict[str, str] = {
    "output_dir": "each trial runs in its own folder, trials/NNNN of the sweep's output_dir",
    "overwrite": "each trial is a new run in a folder of its own, so there is nothing to overwrite",
    "train.resume_from_checkpoint": "each trial is a new run; to continue a stopped sweep, run the same command again",
}


@dataclass(frozen=True)
class Param:
    """One searched config key and its distribution."""

    key: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def suggest(self, trial) -> Any:
        """The value an Optuna trial proposes for this key."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind in INT_DISTRIBUTIONS:
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.kind == "log_int")
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.kind == "log_uniform")

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice {list(self.choices)}"
        step = f" step {self.step}" if self.step is not None else ""
        return f"{self.kind} [{self.low}, {self.high}]{step}"

    def candidate_values(self) -> list[Any]:
        """Values that must all pass the config schema: the bounds, or every choice."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]


def yaml_scalar(value: Any) -> str:
    """``value`` as an override's right-hand side that YAML reads back as the same value.

    ``str(1e-05)`` would not do: PyYAML reads ``1e-05`` (no dot) as a string.
    """
    return dump_yaml([value], default_flow_style=True, width=10**6).strip()[1:-1]


# ----- reading and checking a space ------------------------------------------------------------------
def default_space(config: RunConfig) -> dict[str, dict[str, Any]]:
    """The task's default space, less the keys the config makes inert (epochs under ``train.max_steps``, ...)."""
    space = dict(DEFAULT_SPACES.get(config.task, _COMMON_SPACE))
    for key, overrider in INERT_WHILE_SET:
        if _is_set(_setting(config, overrider)):
            space.pop(key, None)
    return space


def load_space(
    space_path: str | Path | None,
    config: RunConfig,
    *,
    config_path: str | Path,
    overrides: Sequence[str],
    options_for: OptionsLookup,
) -> list[Param]:
    """Read and check the search space (``space_path``, or the task's default space)."""
    if space_path is None:
        tree, source = default_space(config), f"the default search space of task {config.task!r}"
    else:
        try:
            tree = read_yaml(space_path, what="file")  # "search space: file X does not exist", not "config file"
        except ConfigError as error:
            raise SweepError(f"search space: {error}") from None
        source = str(space_path)
    if not tree:
        raise SweepError(f"{source}: the search space is empty; give at least one key with a distribution")
    fixed, origin = _fixed_by_overrides(config_path, overrides)
    params = [_parse_param(str(key), spec, source) for key, spec in tree.items()]
    searched = {param.key: param for param in params}
    for param in params:
        # A key inside a mapping the command line gives whole (data.files={...}) is fixed too: the trial's
        # value would be written into the user's mapping.
        if any(param.key == key or param.key.startswith(key + ".") for key in fixed):
            raise SweepError(f"{source}: {param.key} is searched here but also fixed on the command line; drop one of them")
        if param.key in SET_BY_THE_SWEEP:
            raise SweepError(f"{source}: {param.key} cannot be searched: {SET_BY_THE_SWEEP[param.key]}")
        _check_not_inert(param, source, config, searched, origin)
        _check_against_schema(param, source, config.task, options_for(config.task))
        _check_values(param, source, config_path, overrides, options_for)
    return params


def _fixed_by_overrides(config_path: str | Path, overrides: Sequence[str]) -> tuple[set[str], Origin]:
    """The dotted settings the overrides fix, read as each trial's load_config reads them (``train={batch_size: 4}``
    fixes ``train.batch_size``, ``data.files={train: a.jsonl}`` the whole of ``data.files``), and where each
    setting of the config comes from."""
    file_tree = read_yaml(config_path)
    fixed = apply_overrides(copy.deepcopy(file_tree), overrides)
    return {".".join(keys) for keys in fixed}, Origin(str(config_path), file_tree, fixed)


def _setting(config: RunConfig, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _is_set(value: Any) -> bool:
    # data.files={} is no files at all: pipelines/data.py then reads data.path.
    return value is not None and value != {}


def _check_not_inert(param: Param, source: str, config: RunConfig, searched: dict[str, Param], origin: Origin) -> None:
    """``param`` is not a key that another setting, fixed or searched, makes inert in every trial."""
    data = config.data
    if param.key == "data.validation_fraction" and data.files and data.eval_split in data.files:
        raise SweepError(f"{source}: data.validation_fraction is searched here, but data.files.{data.eval_split} gives the "
                         f"eval split, so no trial holds rows out of train; drop data.validation_fraction")
    key = param.key
    for inert, overrider in INERT_WHILE_SET:
        if key != inert and not key.startswith(inert + "."):
            continue
        also_searched = searched.get(overrider)
        if also_searched is not None:
            # Searched together, the key still counts in the trials whose value of the overrider is null.
            if all(_is_set(value) for value in also_searched.candidate_values()):
                raise SweepError(f"{source}: {key} is searched here, but {overrider}, searched here too, overrides it "
                                 f"in every trial ({also_searched.describe()}), so its values change nothing; drop {key}")
        elif _is_set(_setting(config, overrider)):
            where = origin.of(overrider.split("."))
            where = "on the command line" if where == "the command line" else f"in {where}"
            raise SweepError(f"{source}: {key} is searched here, but {overrider}, set {where}, overrides it, "
                             f"so its values change nothing; drop {key} or unset {overrider} ({overrider}=null)")


def _parse_param(key: str, spec: Any, source: str) -> Param:
    where = f"{source}: {key}"
    if not isinstance(spec, dict) or not any(name in spec for name in DISTRIBUTIONS):
        raise SweepError(f"{where}: expected one distribution, e.g. {{log_uniform: [1.0e-5, 5.0e-4]}}, "
                         f"{{choice: [16, 32]}}; the distributions are {', '.join(DISTRIBUTIONS)} (got {spec!r})")
    kinds = [name for name in spec if name in DISTRIBUTIONS]
    extra = [name for name in spec if name not in (*DISTRIBUTIONS, "step")]
    if len(kinds) > 1 or extra:
        raise SweepError(f"{where}: one distribution per key (and an optional step), got {sorted(map(str, spec))}")
    kind, value = kinds[0], spec[kinds[0]]
    if kind == "choice":
        if not isinstance(value, list) or not value:
            raise SweepError(f"{where}: choice needs a non-empty list of values (got {value!r})")
        if "step" in spec:
            raise SweepError(f"{where}: step goes with uniform or int, not choice")
        odd = [choice for choice in value if not isinstance(choice, (bool, int, float, str)) and choice is not None]
        if odd:
            raise SweepError(f"{where}: choices must be numbers, strings, booleans or null (got {odd[0]!r})")
        if len(set(map(repr, value))) != len(value):
            raise SweepError(f"{where}: choice lists a value twice ({value!r})")
        return Param(key, kind, choices=tuple(value))
    if not isinstance(value, list) or len(value) != 2:
        raise SweepError(f"{where}: {kind} needs [low, high] (got {value!r})")
    low, high = (_number(bound, where) for bound in value)
    step = _number(spec["step"], where) if spec.get("step") is not None else None
    if kind in INT_DISTRIBUTIONS:
        if any(not float(x).is_integer() for x in (low, high, step or 1)):
            raise SweepError(f"{where}: {kind} needs whole-number bounds (got {value!r}); use uniform for fractions")
        low, high, step = int(low), int(high), (int(step) if step is not None else None)
    if not low < high:
        raise SweepError(f"{where}: {kind} needs low < high (got {value!r})")
    if kind.startswith("log") and low <= 0:
        raise SweepError(f"{where}: {kind} needs a positive low bound (got {low!r})")
    if step is not None and (kind.startswith("log") or step <= 0):
        raise SweepError(f"{where}: step must be positive and goes with uniform or int, not {kind}")
    return Param(key, kind, low, high, step)


def _number(value: Any, where: str) -> float:
    # PyYAML reads ``1e-5`` (no dot) as a string; accept it as the number the user meant.
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SweepError(f"{where}: bounds must be finite numbers (got {value!r})")
    return value


def _is_free_mapping(annotation: Any) -> bool:
    """``dict[...]`` fields (``model.architecture``, ``data.files``) take keys the schema does not list."""
    return any(typing.get_origin(c) is dict or c is dict for c in (annotation, *typing.get_args(annotation)))


def _leaf_types(annotation: Any) -> set[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_leaf_types(arg) for arg in typing.get_args(annotation)))
    return {annotation}


def _check_against_schema(param: Param, source: str, task_name: str, options_cls: type[TaskOptions]) -> None:
    """The key names a setting of the task's schema, and a numeric distribution a numeric setting."""
    model: type[BaseModel] = RunConfig
    annotation: Any = None
    parts = param.key.split(".")
    for depth, part in enumerate(parts):
        at_top = model is RunConfig
        if at_top and part == task_name:
            model, annotation = options_cls, options_cls
        else:
            fields = {name: field for name, field in model.model_fields.items() if name != "task_options"}
            if part not in fields:
                valid = sorted([*fields, *([task_name] if at_top else [])])
                close = difflib.get_close_matches(part, valid, n=1, cutoff=0.5)
                hint = f"; did you mean {'.'.join([*parts[:depth], close[0]])!r}?" if close else ""
                raise SweepError(f"{source}: unknown key {param.key!r}{hint} (valid here: {', '.join(valid)})")
            annotation = fields[part].annotation
        if depth == len(parts) - 1:
            break
        if _is_free_mapping(annotation):
            annotation = Any  # its keys and values belong to the model's / the data's own config
            break
        section = section_type(annotation)
        if section is None:
            raise SweepError(f"{source}: {param.key!r}: {'.'.join(parts[:depth + 1])} is a setting, not a section")
        model = section
    if annotation is not Any and section_type(annotation) is not None and not _leaf_types(annotation) & {int, float}:
        raise SweepError(f"{source}: {param.key!r} is a config section; search one of its keys instead")
    if param.kind == "choice" or annotation is Any:
        return
    accepted = _leaf_types(annotation)
    wanted = {float} if param.kind in FLOAT_DISTRIBUTIONS else {int, float}
    if not accepted & wanted:
        advice = "use int for a whole-number key" if int in accepted else "use choice for a non-numeric key"
        raise SweepError(
            f"{source}: {param.key!r} takes {_describe_type(accepted)}, so {'an' if param.kind == 'int' else 'a'} {param.kind} distribution cannot search it; {advice}"
        )


def _describe_type(accepted: set[Any]) -> str:
    names = []
    for kind in accepted:
        if typing.get_origin(kind) is typing.Literal:
            names.append("one of " + ", ".join(map(repr, typing.get_args(kind))))
        elif kind is type(None):
            names.append("null")
        else:
            names.append(getattr(kind, "__name__", str(kind)))
    return " or ".join(sorted(names))


def _check_values(param: Param, source: str, config_path, overrides: Sequence[str], options_for: OptionsLookup) -> None:
    """Every bound / choice passes the schema's own checks (ranges, literals, cross-field rules), and no two choices
    are one setting (``[8, '8']``, ``[1, 1.0]``: the schema reads both alike, and the study would search it twice)."""
    settings: list[tuple[Any, Any]] = []
    for value in param.candidate_values():
        try:
            config = load_config(config_path, [*overrides, f"{param.key}={yaml_scalar(value)}"], options_for)
        except ConfigError as error:
            message = str(error).replace("the command line", source)
            raise SweepError(f"{source}: {param.key}={value!r} ({param.describe()}) is not a valid config: {message}") from None
        if param.kind != "choice":
            continue
        setting = flatten_tree(config.to_yaml_dict()).get(param.key)
        for earlier, earlier_setting in settings:
            if earlier_setting == setting and type(earlier_setting) is type(setting):
                raise SweepError(f"{source}: {param.key}: choices {earlier!r} and {value!r} are the same setting "
                                 f"({setting!r}); list it once")
        settings.append((value, setting))

"""A run configuration from a YAML file plus dotted ``key=value`` overrides.

In:  a YAML path (or a saved config as a mapping), a list of ``section.key=value`` strings, and a lookup from
     task name to the task's own settings class (so ``pipelines/`` never imports ``tasks/``).
Out: a frozen, validated :class:`~pipelines.config.RunConfig` (the schema lives in pipelines.config).

Every problem is a :class:`~pipelines.config.ConfigError` naming the key, the file (or the command line)
and, for unknown keys, the closest valid key. YAML is read as YAML 1.2 reads it (only true/false are
booleans, no octal or base-60 integers) and a key given twice in one mapping is an error.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml
from pydantic import BaseModel, ValidationError, create_model

from pipelines.config import ConfigError, RunConfig, Section, TaskOptions, flatten_tree, is_model_option


def parse_override(override: str) -> tuple[list[str], Any]:
    """``train.max_steps=10`` -> (["train", "max_steps"], 10); the value is read as YAML."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    dotted, raw_value = override.split("=", 1)
    keys = dotted.strip().split(".")
    if not all(keys):
        raise ConfigError(f"override {override!r} has an empty key")
    # No key has brackets: ``data.files.validation[0]=b`` made a split named "validation[0]" that nothing read.
    if any("[" in key or "]" in key for key in keys):
        raise ConfigError(
            f"override {override!r}: a list element cannot be set alone; give the whole list, "
            f"e.g. {'.'.join(key.split('[')[0] for key in keys)}=[a, b]"
        )
    try:
        # The config file's loader, so that a value (``data.files={train: a, train: b}``) gives no key twice either.
        value = yaml.load(raw_value, Loader=_UniqueKeyLoader) if raw_value.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"override {override!r}: value is not valid YAML ({error})") from error
    if "#" in raw_value:
        _refuse_a_comment(override, raw_value, value)
    return keys, value


# Stands for "#" while a value is read again: a private-use character, which YAML reads as text anywhere.
_HASH_STAND_IN = "\ue000"


def _refuse_a_comment(override: str, raw_value: str, value: Any) -> None:
    """A ``#`` after a space opens a YAML comment: ``output_dir=/tmp/run #2`` read ``/tmp/run`` and the run went
    there without a word. A ``#`` that YAML reads as text (``#2``, quoted) is fine: read again with the ``#``
    replaced, such a value is the same."""

    def restored(item: Any) -> Any:
        if isinstance(item, str):
            return item.replace(_HASH_STAND_IN, "#")
        if isinstance(item, list):
            return [restored(element) for element in item]
        if isinstance(item, dict):
            return {restored(key): restored(element) for key, element in item.items()}
        return item

    try:
        literal = restored(yaml.load(raw_value.replace("#", _HASH_STAND_IN), Loader=_UniqueKeyLoader))
    except yaml.YAMLError:
        literal = None
    if literal != value:
        key = override.split("=", 1)[0]
        raise ConfigError(
            f"override {override!r}: YAML reads a '#' at the start or after a space as a comment, so the value "
            f"would be {value!r}; drop the comment, or quote the value to keep the '#' as text: \"{key}='{raw_value}'\""
        )


def _set_dotted(tree: dict[str, Any], keys: list[str], value: Any, *, task_name: Any = None) -> list[tuple[str, ...]]:
    """Set ``keys`` to ``value``; returns the keys set. A mapping given for a section sets those keys of it and
    keeps the others (``train={max_steps: 5}`` replacing the file's whole train section put its learning rate
    and batch size back to the defaults, silently); a mapping-valued setting (``data.files``) is replaced."""
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    last = keys[-1]
    if isinstance(value, dict) and _names_a_section(keys, task_name):
        # Key by key also where the file has no such section (or a null one): the keys set are then the
        # settings given, which is what a caller asking "which settings did the command line fix" needs.
        created = not isinstance(node.get(last), dict)
        if created:
            node[last] = {}
        given = [set_ for key, item in value.items() for set_ in _set_dotted(tree, [*keys, key], item, task_name=task_name)]
        # An empty mapping that creates the section (`distill={}`) sets the section itself: a key it then lacks was
        # said to be missing from the config file.
        return given or ([tuple(keys)] if created else [])
    node[last] = value
    return [tuple(keys)]


def apply_overrides(tree: dict[str, Any], overrides: Iterable[str]) -> set[tuple[str, ...]]:
    """Apply ``KEY=VALUE`` overrides to a config tree in place, as :func:`load_config` does (unvalidated);
    returns the settings they set: each key inside a mapping given for a section, a mapping-valued setting
    (``data.files={...}``) whole. For a caller that must read a setting however the command line spelt it."""
    set_keys: set[tuple[str, ...]] = set()
    for override in overrides:
        keys, value = parse_override(override)
        set_keys.update(_set_dotted(tree, keys, value, task_name=tree.get("task")))
    return set_keys


def _names_a_section(keys: list[str], task_name: Any) -> bool:
    """Whether ``keys`` name a config section (``train``, ``model.peft``, the task's own), not a setting."""
    if keys == [task_name]:
        return True
    model: type[BaseModel] = RunConfig
    for key in keys:
        field = model.model_fields.get(key)
        annotation = field.annotation if field else None
        # An optional section (``peft: PeftConfig | None``) is a section too.
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        section = next((c for c in candidates if isinstance(c, type) and issubclass(c, Section)), None)
        if section is None:
            return False
        model = section
    return True


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error.

    Plain PyYAML keeps the last value silently, so ``learning_rate`` set twice trains with
    whichever came last and the user never learns the first was ignored.
    """


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            # ``<<: *defaults`` merges a mapping's keys; a key given here as well overrides the merged one, as
            # the merge key means (PyYAML's flatten_mapping, inside construct_mapping, orders them so).
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key; the base constructor reports it
            continue
        # By key, not by line: a flow mapping (``files: {train: a.csv, train: b.csv}``) repeats a key on one line.
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {first})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _read_tag_as(loader: type[yaml.SafeLoader], base: type[yaml.SafeLoader], tag: str, pattern: re.Pattern, first: str) -> None:
    """``loader`` resolves plain scalars as ``base`` does, except ``tag``, which only ``pattern`` gives (scalars starting
    with a character of ``first``)."""
    loader.yaml_implicit_resolvers = {
        start: [(other, regex) for other, regex in resolvers if other != tag] for start, resolvers in base.yaml_implicit_resolvers.items()
    }
    loader.add_implicit_resolver(tag, pattern, list(first))


# Booleans as YAML 1.2 reads them: only true/false. YAML 1.1 also reads yes/no/on/off, so the language
# code ``no`` (Norwegian), a config name ``on`` or a split ``off`` arrived as booleans that a text setting
# refused; a boolean setting still takes yes/no/on/off, which pydantic reads as booleans.
_BOOL_TAG = "tag:yaml.org,2002:bool"
_read_tag_as(_UniqueKeyLoader, yaml.SafeLoader, _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF")

# Integers as YAML 1.2 reads them: YAML 1.1 reads a leading zero as octal and colons as base 60, so
# ``eval_steps: 0500`` was 320 and ``1:30`` was 90. Decimal (underscores allowed, as before), 0x hex, 0o octal.
_INT_TAG = "tag:yaml.org,2002:int"
_YAML_1_2_INT = re.compile(r"^[-+]?(?:[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+)$")
_read_tag_as(_UniqueKeyLoader, _UniqueKeyLoader, _INT_TAG, _YAML_1_2_INT, "-+0123456789")

# Floats as YAML 1.2 reads them: YAML 1.1 needs a dot before an exponent (``1e-5`` was the string "1e-5", and
# ``train.max_steps=1e3`` was refused) and reads colons as base 60 (``1:30.0`` was 90.0). No underscores either.
_FLOAT_TAG = "tag:yaml.org,2002:float"
_NUMBER_STARTS = "-+0123456789."
_YAML_1_2_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_read_tag_as(_UniqueKeyLoader, _UniqueKeyLoader, _FLOAT_TAG, _YAML_1_2_FLOAT, _NUMBER_STARTS)


class _SavedConfigLoader(_UniqueKeyLoader):
    """The loader of files bertpipe wrote itself before floats were read as YAML 1.2 reads them (a run's config.yaml):
    PyYAML's writer left ``revision: 4501e23`` (a commit) unquoted, a string under YAML 1.1, and so it is read here."""


_YAML_1_1_FLOAT = next(regex for resolvers in yaml.SafeLoader.yaml_implicit_resolvers.values() for tag, regex in resolvers if tag == _FLOAT_TAG)
_read_tag_as(_SavedConfigLoader, _UniqueKeyLoader, _FLOAT_TAG, _YAML_1_1_FLOAT, _NUMBER_STARTS)


class _ConfigDumper(yaml.SafeDumper):
    """PyYAML's safe writer, quoting every string the loaders here would read as something else: a string such as
    ``4501e23`` or ``0o17`` is a number to YAML 1.2, not to the YAML 1.1 writer, which left it bare."""


_ConfigDumper.add_implicit_resolver(_FLOAT_TAG, _YAML_1_2_FLOAT, list(_NUMBER_STARTS))
_ConfigDumper.add_implicit_resolver(_INT_TAG, _YAML_1_2_INT, list("-+0123456789"))


def dump_yaml(tree: Any, **options: Any) -> str:
    """``yaml.safe_dump`` that the config loaders read back as written (see :class:`_ConfigDumper`)."""
    return yaml.dump(tree, Dumper=_ConfigDumper, **options)


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    return int(text, 0) if re.match(r"[-+]?0[xo]", text) else int(text, 10)


_UniqueKeyLoader.add_constructor(_INT_TAG, _construct_int)


def _describe_path(path: Path) -> str:
    """What a config path is, when it is not a readable regular file."""
    if not path.exists():
        return "does not exist"
    if path.is_dir():
        return "is a folder, not a YAML file"
    return "is not a regular file (a device, pipe or socket), not a YAML file"


def read_yaml(path: str | Path, *, what: str = "config file", written_here: bool = False) -> dict[str, Any]:
    """A YAML mapping from ``path``; every failure is a ConfigError naming the file (and line). ``written_here``: a file
    bertpipe wrote (a run's config.yaml), read as it was written (:class:`_SavedConfigLoader`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} {_describe_path(path)}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{what} {path}: not UTF-8 text (byte {error.start}); is it a YAML file?") from error
    except OSError as error:
        raise ConfigError(f"{what} {path} cannot be read: {error.strerror or error}") from error
    try:
        tree = yaml.load(text, Loader=_SavedConfigLoader if written_here else _UniqueKeyLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level")
    return tree


def load_config(
    path: str | Path | None,
    overrides: list[str] = (),
    task_options_for: Callable[[str], type[TaskOptions]] | None = None,
    *,
    base: dict[str, Any] | None = None,
    base_source: str = "the saved run config",
) -> RunConfig:
    """Read YAML (or start from ``base``, read from ``base_source``), apply overrides, validate against the task's
    schema."""
    source = str(path) if path is not None else base_source
    tree = read_yaml(path) if path is not None else copy.deepcopy(base or {})  # overrides set nested keys in place
    file_tree = copy.deepcopy(tree)
    where = Origin(source, file_tree, apply_overrides(tree, overrides))

    task_name = tree.get("task")
    # Everything but the task's own section first: that needs no task module (each imports torch),
    # so a typo there is reported at once instead of after seconds of imports. An unknown top-level
    # key may be the section of a misspelt task, so then the task name is checked first, as below.
    general_schema = _schema_for(TaskOptions)
    try:
        general_schema.model_validate({key: value for key, value in tree.items() if key != task_name})
    except ValidationError as error:
        if any(problem["type"] == "extra_forbidden" and len(problem["loc"]) == 1 for problem in error.errors()):
            _task_options(task_options_for, task_name, where.of(["task"]))
        raise ConfigError(_describe(error, general_schema, where, task_name)) from None
    options_cls = _task_options(task_options_for, task_name, where.of(["task"]))
    if isinstance(task_name, str) and task_name in tree:
        tree["task_options"] = tree.pop(task_name)
    schema = _schema_for(options_cls)
    try:
        return schema.model_validate(tree)
    except ValidationError as error:
        raise ConfigError(_describe(error, schema, where, task_name)) from None


# What evaluate and predict read of a finished run's train section: how to batch and thread the evaluation.
_TRAIN_KEYS_READ_AFTER_TRAINING = frozenset({"batch_size", "eval_batch_size", "dataloader_num_workers", "torch_num_threads"})
# What of the data section only training reads: a finished run's evaluation carves and samples its eval split alone.
_DATA_KEYS_OF_TRAINING_ONLY = frozenset({"max_train_samples"})
# Sections and keys that say how and where the run was trained: the finished run's weights hold their effect.
_FIXED_BY_TRAINING = frozenset({"task", "output_dir", "overwrite", "model", "distill", "hub"})


def load_finished_run_config(saved: dict[str, Any], overrides: list[str],
                             task_options_for: Callable[[str], type[TaskOptions]], *,
                             source: str = "the saved run config") -> RunConfig:
    """A finished run's saved config with the overrides of ``evaluate`` and ``predict`` (the data to read, the
    evaluation's batches, a task's decoding options); an override of a setting the run's training fixed (the
    model, the training recipe, the labels) is a ConfigError naming it: ignored, it gave the run's own numbers
    with exit status 0 (``classification.problem_type=regression`` evaluated the classifier as before). ``source``
    names the file ``saved`` was read from, for messages."""
    given_task = _overridden_task(saved, overrides)
    if given_task is not None and given_task != saved.get("task"):
        # Before validation, which would otherwise refuse the run's own task section as an unknown key.
        raise ConfigError(f"task={given_task!r} given to a finished run trained with {saved.get('task')!r} ({source}): "
                          "evaluate and predict use the run as trained; train a new run for another task")
    config = load_config(None, overrides, task_options_for, base=saved, base_source=source)
    if not overrides:
        return config
    fixed_options = type(config.task_options).fixed_by_training
    before = flatten_tree(load_config(None, [], task_options_for, base=saved, base_source=source).to_yaml_dict())
    after = flatten_tree(config.to_yaml_dict())
    for keys in sorted(apply_overrides(copy.deepcopy(saved), overrides)):  # the settings as the command line names them
        section, name, key = keys[0], keys[1] if len(keys) > 1 else "", ".".join(keys)
        if not (section in _FIXED_BY_TRAINING
                or (section == "train" and name not in _TRAIN_KEYS_READ_AFTER_TRAINING)
                or (section == "data" and name in _DATA_KEYS_OF_TRAINING_ONLY)
                or (section == config.task and (name in fixed_options or is_model_option(name)))):
            continue
        old, new = _setting(before, key), _setting(after, key)
        if old == new:
            continue
        hint = " (to evaluate in another precision: --precision)" if key == "train.mixed_precision" else ""
        raise ConfigError(
            f"{key}={new!r} given to a finished run trained with {old!r}: evaluate and predict use "
            f"the run as trained, so this setting would be ignored{hint}; train a new run to change it"
        )
    return config


class _Unset:
    def __repr__(self) -> str:
        return "(unset)"


_UNSET = _Unset()


def _overridden_task(saved: dict[str, Any], overrides: list[str]) -> Any:
    """The ``task`` the overrides set (the last one), or None when none sets it."""
    tree: dict[str, Any] = {"task": saved.get("task")}
    return tree["task"] if ("task",) in apply_overrides(tree, overrides) else None


def refuse_repeated_overrides(overrides: Iterable[str]) -> None:
    """A ConfigError naming a setting two command-line overrides both set: the last one won silently, as a
    key given twice in a YAML file would (which is refused too). A section given whole and then one of its keys
    (``model.peft=null model.peft.r=8``) sets different settings, so is not a repeat."""
    first_given: dict[tuple[str, ...], str] = {}
    for override in overrides:
        for keys in apply_overrides({}, [override]):
            if keys in first_given:
                raise ConfigError(f"{'.'.join(keys)} is set twice on the command line ({first_given[keys]!r}, then {override!r}); "
                                  "give it once")
            first_given[keys] = override


def _setting(flat: dict[str, Any], key: str) -> Any:
    """A dotted key's value in a flattened config; a mapping-valued one (``model.architecture``) as its flattened keys."""
    if key in flat:
        return flat[key]
    return {dotted: value for dotted, value in flat.items() if dotted.startswith(key + ".")} or _UNSET


def _task_options(task_options_for: Callable[[str], type[TaskOptions]] | None, task_name: Any, source: str) -> type[TaskOptions]:
    if task_options_for is None or not isinstance(task_name, str):
        return TaskOptions
    try:
        return task_options_for(task_name)
    except KeyError as error:
        raise ConfigError(f"{source}: task: {error.args[0]}") from error


@functools.lru_cache(maxsize=None)
def _schema_for(options_cls: type[TaskOptions]) -> type[RunConfig]:
    """RunConfig whose ``task_options`` is the task's own class (one class per task, reused)."""
    return create_model(f"RunConfig_{options_cls.__name__}", __base__=RunConfig, task_options=(options_cls, options_cls()))


class Origin:
    """Where a key's value came from, for messages: the file (``source``), the command line, or both.
    ``overrides``: the settings the command line set (:func:`apply_overrides`)."""

    def __init__(self, source: str, file_tree: dict[str, Any], overrides: set[tuple[str, ...]]) -> None:
        self.source, self.file_tree, self.overrides = source, file_tree, overrides

    def of(self, location: list[str]) -> str:
        location = tuple(location)
        # An override of the key or of a section above it replaced the file's value entirely.
        if any(location[: len(keys)] == keys for keys in self.overrides):
            return "the command line"
        # An override below the key (``trian.max_steps=3`` creates ``trian``) changed or created it.
        if any(keys[: len(location)] == location for keys in self.overrides):
            return f"{self.source} and the command line" if self._in_file(location) else "the command line"
        return self.source

    def _in_file(self, location: tuple[str, ...]) -> bool:
        node: Any = self.file_tree
        for key in location:
            if not isinstance(node, dict) or key not in node:
                return False
            node = node[key]
        return True


# pydantic names the member of a union that a value failed as one more part of its location
# ("data.files.validation.str", "data.files.validation.list[str]"): no key of the config.
_UNION_MEMBER = re.compile(r"(str|int|float|bool|none|(list|dict|tuple|set|literal|function-\w+)\[.*\])", re.IGNORECASE)


def _union_members_merged(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One problem per value that failed every member of a union, its messages joined, at the value's own key."""
    merged: dict[tuple, dict[str, Any]] = {}
    kept = []
    for problem in problems:
        location = tuple(str(part) for part in problem["loc"])
        if len(location) > 1 and _UNION_MEMBER.fullmatch(location[-1]) and problem["type"] not in ("extra_forbidden", "missing"):
            if location[:-1] in merged:
                merged[location[:-1]]["msg"] += f", or {problem['msg'][0].lower()}{problem['msg'][1:]}"
                continue
            problem = {**problem, "loc": location[:-1], "msg": problem["msg"]}
            merged[location[:-1]] = problem
        kept.append(problem)
    return kept


def _describe(error: ValidationError, schema: type[BaseModel], origin: Origin, task_name) -> str:
    lines = []
    for problem in _union_members_merged(error.errors()):
        location = [str(part) for part in problem["loc"]]
        shown = [task_name if part == "task_options" else part for part in location]
        dotted = ".".join(shown) or "(top level)"
        where = origin.of(shown)
        if problem["type"] == "extra_forbidden":
            valid = _valid_keys(schema, location[:-1], task_name)
            close = difflib.get_close_matches(location[-1], valid, n=1, cutoff=0.5)
            hint = f"; did you mean {'.'.join(shown[:-1] + close)!r}?" if close else ""
            lines.append(f"unknown key {dotted!r} in {where}{hint} (valid here: {', '.join(sorted(valid))})")
        elif problem["type"] == "missing":
            lines.append(f"missing required key {dotted!r} in {where}")
        else:
            got = problem.get("input")
            message = problem["msg"].removeprefix("Value error, ")
            if problem["type"] == "value_error" and isinstance(got, dict):
                # A rule across the keys of a section: its message names them, and a dump of the section says nothing.
                lines.append(f"{repr(dotted) + ' ' if shown else ''}in {where}: {message}")
            else:
                lines.append(f"bad value for {dotted!r} in {where}: {message} (got {got!r})")
    return "invalid config:\n  " + "\n  ".join(lines)


def _valid_keys(schema: type[BaseModel], location: list[str], task_name) -> list[str]:
    model = schema
    for part in location:
        field = model.model_fields.get(part)
        annotation = field.annotation if field else None
        # An optional section (``peft: PeftConfig | None``) lists the keys of its section type.
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        annotation = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if annotation is not None:
            model = annotation
        else:
            return []
    keys = [name for name in model.model_fields if name != "task_options"]
    if model is schema and task_name:
        keys.append(str(task_name))
    return keys

"""Typed run configuration: a YAML file plus dotted ``key=value`` overrides.

In:  a YAML path, a list of ``section.key=value`` strings, and a lookup from task name to the
     task's own settings class (so ``pipelines/`` never imports ``tasks/``).
Out: a frozen, validated :class:`RunConfig` whose ``task_options`` field holds the task's
     settings (written in YAML under a section named after the task, e.g. ``qa:``).

Every problem is a :class:`ConfigError` naming the key, the file (or the command line) and,
for unknown keys, the closest valid key. One schema library (pydantic) does the validation.

Paths (``output_dir``, ``data.files``, ``data.path``, ``model.name_or_path``, ...) are relative to the
current directory, with ``~`` the home folder, and are made absolute as the config is read: the run's
saved ``config.yaml`` then names the same files whichever directory ``evaluate`` or ``predict`` runs in.
"""

from __future__ import annotations

import codecs
import copy
import difflib
import functools
import os
import re
from pathlib import Path
from typing import Any, Callable, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

from pipelines.errors import UserError


class ConfigError(UserError, ValueError):
    """A config file or override that cannot be used; the message says where and why."""


def _absolute_path(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def absolute_if_local(name: str | None) -> str | None:
    """An existing local path made absolute; a Hub id, or a path that does not exist, as written (the
    loader then resolves the Hub id, or names the missing path in the user's own words)."""
    if name and os.path.exists(os.path.expanduser(name)):
        return _absolute_path(name)
    return name


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are immutable."""

    # use_attribute_docstrings: a field's docstring is its description, from which the README's
    # configuration table is generated (pipelines/config_docs.py), so the two cannot drift apart.
    # allow_inf_nan=False: ``inf`` passed ``gt=0`` (num_epochs=inf ended in a raw OverflowError) and no setting means it.
    model_config = ConfigDict(
        extra="forbid", frozen=True, protected_namespaces=(), use_attribute_docstrings=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic reads true as 1 for a number: train.batch_size=true trained with batches of one.
        field = cls.model_fields.get(info.field_name)
        if isinstance(value, bool) and field is not None and _numbers_only(field.annotation):
            raise ValueError(f"{str(value).lower()} is a boolean; this setting takes a number")
        return value


def _numbers_only(annotation: Any) -> bool:
    """Whether a field takes int or float and no bool (``int | None`` yes, ``bool | None`` and ``str`` no)."""
    kinds = set(get_args(annotation)) or {annotation}
    return bool(kinds & {int, float}) and bool not in kinds


class TaskOptions(Section):
    """Settings a task adds under its own section; tasks subclass this."""


class PeftConfig(Section):
    """Parameter-efficient fine-tuning: freeze the base model, train small adapters plus the task head.

    Works for every task: the peft task type is the task's ``peft_task_type`` and the
    defaults for ``target_modules`` / ``modules_to_save`` from the architecture
    (:func:`pipelines.adapters.apply_peft`).
    """

    method: Literal["lora", "ia3"] = "lora"
    """``lora`` (low-rank updates) or ``ia3`` (learned scaling vectors)."""
    r: int = Field(default=8, gt=0)
    """LoRA rank."""
    alpha: float = Field(default=16.0, gt=0)
    """LoRA scaling numerator: the update is ``(alpha / r) * B @ A``."""
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout on the LoRA input path."""
    target_modules: list[str] | str | None = None
    """Module-name suffixes (or one regex) that get adapters; None = the architecture's attention
    projections (BERT: query, value; T5: q, v; BART/Marian: q_proj, v_proj)."""
    modules_to_save: list[str] | None = None
    """Modules trained in full and saved with the adapter; None = the task head (classifier,
    qa_outputs, the MLM transform; the new cross-attention of a BERT2BERT encoder-decoder)."""
    merge: bool = False
    """Also write ``merged/``: the adapter folded into a full model (Auto classes, ``pipeline()``)."""


# A number with an exponent, written as YAML 1.2 and JSON allow (``1e-12``, ``2E5``, ``3.0e-4``).
_EXPONENT_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+")


class ModelConfig(Section):
    name_or_path: str | None = None
    """Hub id, mirror id or local folder (a finished bertpipe run works too, a LoRA/IA3 adapter run as well: its
    head, trained for the same labels in another order, is reordered to this run's labels; for other labels,
    another number of labels, or a head of another kind (a sentence classifier's for NER or QA), a new head
    starts, with a warning)."""
    tokenizer_name_or_path: str | None = None
    """A different tokenizer (default: the model's)."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of the model and tokenizer."""
    model_type: str = "bert"
    """From-scratch model family (when ``name_or_path`` is unset); ``bertpipe_bert`` selects bertpipe's own BERT."""
    architecture: dict[str, Any] = Field(default_factory=dict)
    """From-scratch architecture: keys of the family's config class, e.g. ``{num_hidden_layers: 4, hidden_size: 256}``."""
    dropout: float | None = Field(default=None, ge=0.0, lt=1.0)
    """Overrides the checkpoint's hidden and attention dropout when set."""
    peft: PeftConfig | None = None
    """Parameter-efficient fine-tuning (null = train every parameter)."""

    @field_validator("name_or_path", "tokenizer_name_or_path")
    @classmethod
    def _local_folder_absolute(cls, value: str | None) -> str | None:
        return absolute_if_local(value)

    @field_validator("architecture", mode="before")
    @classmethod
    def _exponent_floats(cls, value: Any) -> Any:
        # PyYAML reads YAML 1.1, where ``1e-12`` (no dot) is a string. Typed fields convert it, but these
        # values go untyped to the family's config class, which refuses ``layer_norm_eps: '1e-12'``.
        if not isinstance(value, dict):
            return value
        return {key: float(item) if isinstance(item, str) and _EXPONENT_FLOAT.fullmatch(item.strip()) else item
                for key, item in value.items()}


class DataConfig(Section):
    path: str | None = None
    """Hub dataset id or local folder; ignored when ``files`` is given."""
    name: str | None = None
    """Dataset configuration name (e.g. ``mrpc`` for ``nyu-mll/glue``)."""
    files: dict[str, str | list[str]] | None = None
    """Split name -> local file(s): csv, tsv, json, jsonl, parquet or txt. A tsv file is read with csv
    quoting only when its quoted fields parse as such (pandas/R output); plain tsv keeps its quotes as text."""
    encoding: str = "utf-8"
    """Text encoding of ``files`` and of ``bertpipe predict`` inputs (e.g. ``latin-1`` for older Gutenberg
    or CoNLL files; for predict alone: ``bertpipe predict RUN --input F --output O data.encoding=latin-1``);
    a byte that does not decode is an error naming file, line and byte."""
    train_split: str = "train"
    """Name of the training split."""
    eval_split: str = "validation"
    """Name of the evaluation split."""
    validation_fraction: float | None = Field(default=None, gt=0.0, lt=1.0)
    """Hold out this share of the train split when the data has no eval split."""
    max_train_samples: int | None = Field(default=None, gt=0)
    """Keep the first N training examples (default: all)."""
    max_eval_samples: int | None = Field(default=None, gt=0)
    """Keep the first N evaluation examples (default: all)."""
    max_seq_length: int = Field(default=128, gt=0)
    """Truncation length in tokens (batches are padded to their own longest example)."""
    text_column: str | None = None
    """Text column (default: the task's, e.g. ``text``)."""
    text_pair_column: str | None = None
    """Second text column of sentence-pair classification."""
    label_column: str | None = None
    """Label column (default: ``label``)."""
    preprocessing_num_workers: int | None = Field(default=None, gt=0)
    """Processes for a task's tokenising ``datasets.map`` (its ``num_proc``); unset: in this process."""

    @field_validator("path")
    @classmethod
    def _local_folder_absolute(cls, value: str | None) -> str | None:
        return absolute_if_local(value)

    @field_validator("files")
    @classmethod
    def _local_files_absolute(cls, value: dict[str, str | list[str]] | None) -> dict[str, str | list[str]] | None:
        if value is None:
            return None
        return {split: absolute_if_local(paths) if isinstance(paths, str) else [absolute_if_local(path) for path in paths]
                for split, paths in value.items()}

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        try:
            codecs.lookup(value)
        except LookupError:
            raise ValueError(f"unknown text encoding {value!r} (e.g. utf-8, latin-1, cp1252)") from None
        return value

    @model_validator(mode="after")
    def _needs_a_source(self) -> "DataConfig":
        if self.path is None and not self.files:
            raise ValueError("set data.path (a Hub id or folder) or data.files (split -> file)")
        return self


# transformers' get_length_grouped_indices sorts 50 batches' worth of examples at a time; matching it
# keeps bertpipe's padding comparable with the Trainer's.
TRAINER_LENGTH_GROUP_BATCHES = 50


class TrainConfig(Section):
    num_epochs: float = Field(default=3.0, gt=0)
    """Passes over the training data (fractions allowed)."""
    max_steps: int | None = Field(default=None, gt=0)
    """Optimizer updates; when set it overrides ``num_epochs``."""
    learning_rate: float = Field(default=5e-5, gt=0)
    """Peak AdamW learning rate."""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW weight decay (none on biases and norms)."""
    adam_beta1: float = Field(default=0.9, gt=0, lt=1)
    """AdamW's first-moment decay."""
    adam_beta2: float = Field(default=0.999, gt=0, lt=1)
    """AdamW's second-moment decay."""
    adam_epsilon: float = Field(default=1e-8, gt=0)
    """AdamW's denominator epsilon."""
    lr_scheduler: Literal["linear", "cosine", "constant"] = "linear"
    """Learning-rate schedule after warmup: ``linear``, ``cosine`` or ``constant``."""
    warmup_steps: int | None = Field(default=None, ge=0)
    """Warmup in optimizer updates; overrides ``warmup_fraction``."""
    warmup_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Share of the optimizer updates spent warming up (ignored when warmup_steps is set)."""
    batch_size: int = Field(default=32, gt=0)
    """Examples per process per forward pass."""
    eval_batch_size: int | None = Field(default=None, gt=0)
    """Examples per process per evaluation forward pass (default: twice ``batch_size``)."""
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    """Forward passes per optimizer update (through ``accelerator.accumulate``); the update is the one a batch of all of them makes (each loss weighted by the labelled tokens or examples it averages over)."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Gradient clipping norm (null = off)."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """``auto`` = bf16 where the hardware computes it natively (CUDA with bf16, CPUs with AVX-512
    BF16 or AMX), else fp16 on a GPU and fp32 on a CPU (bf16 emulated on other CPUs is many times
    slower); ``no``, ``bf16``, ``fp16`` (GPU only). See the README's Numeric precision."""
    group_by_length: bool = True
    """Batch examples of similar length together (batches still come in random order)."""
    length_group_batches: int = Field(default=TRAINER_LENGTH_GROUP_BATCHES, ge=1)
    """With ``group_by_length``: how many batches' worth of randomly drawn examples are sorted by
    length together. 50 (the Trainer's mega-batch) removes most padding; a few batches keep each
    batch a more varied draw (more padding), which matters when length tracks content (CoNLL NER)."""
    pack_sequences: bool = False
    """Token-level tasks (NER): put a random batch's examples side by side in shared rows, each
    attending only to itself, instead of padding each one. Random batches at about the padding of
    ``group_by_length`` (which it replaces); refused, before training, for tasks and model families
    whose packed forward would not equal the unpacked one (``docs/ner.md``)."""
    logging_steps: int = Field(default=10, gt=0)
    """Log the training loss every N optimizer updates."""
    eval_steps: int | None = Field(default=None, gt=0)
    """Evaluate every N optimizer updates (and always at the end)."""
    eval_on_start: bool = False
    """Also evaluate the untrained model before the first update (logged at step 0): where the
    curve starts, e.g. the perplexity of a fresh MLM head. Never counts as a best model."""
    save_steps: int | None = Field(default=None, gt=0)
    """Checkpoint every N optimizer updates; unset means no intermediate checkpoints."""
    save_total_limit: int | None = Field(default=2, gt=0)
    """Checkpoints kept (the oldest are deleted)."""
    resume_from_checkpoint: str | None = None
    """A checkpoint folder, or ``latest`` for the newest complete one in ``output_dir``; trajectory
    settings must match the checkpoint's."""
    early_stopping_patience: int | None = Field(default=None, gt=0)
    """Stop after N evaluations without improvement of ``metric_for_best_model``."""
    metric_for_best_model: str | None = None
    """e.g. ``eval_accuracy``; enables best-model selection (and early stopping with a patience)."""
    greater_is_better: bool | None = None
    """Direction of ``metric_for_best_model`` (default: from the metric, e.g. lower loss is better)."""
    load_best_model_at_end: bool = False
    """Reload the best evaluated model before the final evaluation and saving."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml"]] = Field(
        default_factory=list
    )
    """Accelerate trackers, e.g. ``[tensorboard]`` (logs under ``RUN_DIR/tracking``)."""
    dataloader_num_workers: int = Field(default=0, ge=0)
    """Data-loading worker processes."""
    torch_num_threads: int | None = Field(default=None, gt=0)
    """Intra-op threads; unset keeps torch's default (one per physical core; Accelerate divides
    them among the processes of a multi-process CPU run)."""
    compile: bool = False
    """``torch.compile`` the model's forward. Pays a compile at start and at each new shape family;
    worth it only for long runs (docs/benchmark.md measures it)."""
    compile_backend: str = "inductor"
    """The ``torch.compile`` backend: ``inductor`` generates fused kernels; ``aot_eager`` captures the
    forward and backward graphs without generating code (seconds, not minutes: shows that a model
    compiles and trains compiled); any name ``torch._dynamo.list_backends(exclude_tags=())`` lists."""

    @field_validator("resume_from_checkpoint")
    @classmethod
    def _checkpoint_folder_absolute(cls, value: str | None) -> str | None:
        return value if value == "latest" else absolute_if_local(value)

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _yaml_no_is_false(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare ``no`` (``train.mixed_precision=no``, ``mixed_precision: no``) as false.
        return "no" if value is False else value

    @property
    def eval_batch_size_or_default(self) -> int:
        """``eval_batch_size``, else twice ``batch_size`` (evaluation keeps no gradients, so twice fits)."""
        return self.eval_batch_size or self.batch_size * 2

    def metric_greater_is_better(self, metric: str | None, higher_is_better: dict[str, bool]) -> bool:
        """``greater_is_better`` when set, else the task's direction for ``metric`` (``eval_`` prefix or
        not; a task's ``higher_is_better`` names only the exceptions, so the default is higher)."""
        if self.greater_is_better is not None:
            return self.greater_is_better
        return higher_is_better.get((metric or "").removeprefix("eval_"), True)

    @model_validator(mode="after")
    def _best_model_needs_metric(self) -> "TrainConfig":
        if (self.load_best_model_at_end or self.early_stopping_patience) and not self.metric_for_best_model:
            raise ValueError("load_best_model_at_end and early_stopping_patience need train.metric_for_best_model")
        if self.early_stopping_patience and not self.eval_steps:
            raise ValueError("early_stopping_patience needs train.eval_steps (evaluations to be patient over)")
        return self


class HubConfig(Section):
    """Publishing to the Hugging Face Hub; the token comes from HF_TOKEN or ``hf auth login``, never from here."""

    push: bool = False
    """Push the run directory at the end of training (``bertpipe publish`` does it afterwards)."""
    repo_id: str | None = None
    """The Hub repository, ``OWNER/NAME``."""
    private: bool = True
    """Create the repository private."""
    revision: str | None = None
    """Branch to push to (created when missing); None = the default branch."""
    language: str | list[str] | None = None
    """ISO 639-1 code(s) for the model card, e.g. ``en`` or ``[en, de]``."""
    license: str | None = None
    """Hub license id for the model card, e.g. ``apache-2.0``."""
    tags: list[str] = Field(default_factory=list)
    """Extra model-card tags (``bertpipe`` and the task are always there)."""

    @model_validator(mode="after")
    def _push_needs_repo(self) -> "HubConfig":
        if self.push and not self.repo_id:
            raise ValueError("hub.push needs hub.repo_id (OWNER/NAME)")
        return self


class DistillConfig(Section):
    """Knowledge distillation from a finished run (the teacher) into this run's model (the student).

    loss = alpha * KL(teacher/T || student/T) * T² + (1 - alpha) * task loss (+ hidden_weight * hidden MSE);
    see :mod:`pipelines.distill`.
    """

    teacher: str
    """The teacher: a finished bertpipe run of the same task, with the same labels (in any order: the teacher's
    scores are matched to the student's labels by name) and the same tokenizer vocabulary."""
    alpha: float = Field(default=0.5, ge=0.0, le=1.0)
    """Weight of the soft-target loss; the task loss on the gold labels gets 1 - alpha."""
    temperature: float = Field(default=2.0, gt=0.0)
    """Softmax temperature of both models' outputs in the soft-target loss."""
    init: Literal["teacher", "model"] = "teacher"
    """``teacher``: the student is the teacher with ``layers`` of its layers (DistilBERT's recipe);
    ``model``: the student is ``model.name_or_path`` or a from-scratch ``model.architecture``."""
    num_layers: int | None = Field(default=None, gt=0)
    """With ``init: teacher``: student depth, teacher layers taken evenly spaced (default: half, i.e. every other layer)."""
    layers: list[int] | None = None
    """With ``init: teacher``: the teacher layers (0-based) to copy, in order; overrides ``num_layers``."""
    hidden_weight: float = Field(default=0.0, ge=0.0)
    """Weight of an MSE between student and teacher hidden states (student layer j <-> teacher layer
    j * L_teacher / L_student, embeddings included); 0 = off. Needs equal hidden sizes."""

    @field_validator("teacher")
    @classmethod
    def _teacher_absolute(cls, value: str) -> str:
        return absolute_if_local(value)

    @model_validator(mode="after")
    def _layers_need_teacher_init(self) -> "DistillConfig":
        if self.init != "teacher" and (self.layers is not None or self.num_layers is not None):
            raise ValueError("distill.layers and distill.num_layers choose teacher layers: they need distill.init=teacher")
        if self.layers is not None and (not self.layers or any(layer < 0 for layer in self.layers) or len(set(self.layers)) != len(self.layers)):
            raise ValueError(f"distill.layers must be distinct non-negative layer indices, got {self.layers}")
        return self


class RunConfig(Section):
    task: str
    """Which task runs: its name in the registry of ``tasks/__init__.py`` (``classification``, ``ner``, ...)."""
    output_dir: str
    """The run directory. This and every other path (``data.files``, ``data.path``, ``model.name_or_path``,
    ``distill.teacher``, ...) is relative to the current directory, ``~`` being the home folder; the run's
    ``config.yaml`` holds them absolute, so ``evaluate`` and ``predict`` read the same files from anywhere."""
    seed: int = 42
    """Seeds model initialisation, data order and dropout: a rerun gives identical results."""
    overwrite: bool = False
    """Replace the bertpipe run in ``output_dir`` (once the new run has validated)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    hub: HubConfig = Field(default_factory=HubConfig)
    distill: DistillConfig | None = None
    """Distil a teacher run into this run's model (``bertpipe distill TEACHER_RUN CONFIG`` fills it in)."""
    task_options: TaskOptions = Field(default_factory=TaskOptions, exclude=True)

    @field_validator("output_dir")
    @classmethod
    def _output_dir_absolute(cls, value: str) -> str:
        # Always: the folder usually does not exist yet (Path("~/runs/x") made a folder named "~").
        return _absolute_path(value) if value else value

    @model_validator(mode="after")
    def _distill_student(self) -> "RunConfig":
        if self.distill is None:
            return self
        teacher = Path(self.distill.teacher).expanduser().resolve()
        if teacher == Path(self.output_dir).expanduser().resolve():
            raise ValueError("distill.teacher is output_dir: the student must be written to another output_dir")
        if self.distill.init == "teacher":
            source = self.model.name_or_path
            if source is None or Path(source).expanduser().resolve() != teacher:
                raise ValueError(
                    f"distill.init=teacher builds the student from the teacher's layers: model.name_or_path must be "
                    f"the teacher run {self.distill.teacher} (bertpipe distill sets it), got {source!r}"
                )
        if self.model.peft is not None:
            raise ValueError("distill trains the whole student: model.peft cannot be combined with distill")
        return self

    def to_yaml_dict(self) -> dict[str, Any]:
        """The resolved config in the same shape as the YAML it came from."""
        resolved = self.model_dump(mode="json", exclude={"task_options"})
        if resolved.get("distill") is None:  # only distilled runs carry the section
            resolved.pop("distill", None)
        resolved[self.task] = self.task_options.model_dump(mode="json")
        return resolved


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
    return keys, value


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
    if isinstance(value, dict) and isinstance(node.get(last), dict) and _names_a_section(keys, task_name):
        return [set_ for key, item in value.items() for set_ in _set_dotted(tree, [*keys, key], item, task_name=task_name)]
    node[last] = value
    return [tuple(keys)]


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


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
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

# Booleans as YAML 1.2 reads them: only true/false. YAML 1.1 also reads yes/no/on/off, so the language
# code ``no`` (Norwegian), a config name ``on`` or a split ``off`` arrived as booleans that a text setting
# refused; a boolean setting still takes yes/no/on/off, which pydantic reads as booleans.
_BOOL_TAG = "tag:yaml.org,2002:bool"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))

# Integers as YAML 1.2 reads them: YAML 1.1 reads a leading zero as octal and colons as base 60, so
# ``eval_steps: 0500`` was 320 and ``1:30`` was 90. Decimal (underscores allowed, as before), 0x hex, 0o octal.
_INT_TAG = "tag:yaml.org,2002:int"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _INT_TAG]
    for first, resolvers in _UniqueKeyLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    _INT_TAG, re.compile(r"^[-+]?(?:[0-9][0-9_]*|0x[0-9a-fA-F_]+|0o[0-7_]+)$"), list("-+0123456789")
)


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


def read_yaml(path: str | Path, *, what: str = "config file") -> dict[str, Any]:
    """A YAML mapping from ``path``; every failure is a ConfigError naming the file (and line)."""
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
        tree = yaml.load(text, Loader=_UniqueKeyLoader)
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
) -> RunConfig:
    """Read YAML (or start from ``base``), apply overrides, validate against the task's schema."""
    source = str(path) if path is not None else "the saved run config"
    tree = read_yaml(path) if path is not None else dict(base or {})
    where = _Origin(source, copy.deepcopy(tree))
    for override in overrides:
        keys, value = parse_override(override)
        where.overrides.update(_set_dotted(tree, keys, value, task_name=tree.get("task")))

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


class _Origin:
    """Where a key's value came from, for messages: the file (``source``), the command line, or both."""

    def __init__(self, source: str, file_tree: dict[str, Any]) -> None:
        self.source, self.file_tree = source, file_tree
        self.overrides: set[tuple[str, ...]] = set()

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


def _describe(error: ValidationError, schema: type[BaseModel], origin: _Origin, task_name) -> str:
    lines = []
    for problem in error.errors():
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
            lines.append(f"bad value for {dotted!r} in {where}: {problem['msg']} (got {got!r})")
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

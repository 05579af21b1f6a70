"""Typed run configuration: the schema a run's settings are validated against.

In:  settings as plain data (pipelines.config_loading reads them from YAML and ``key=value`` overrides).
Out: frozen, validated sections (:class:`ModelConfig`, :class:`DataConfig`, :class:`TrainConfig`, ...) under
     one :class:`RunConfig`, whose ``task_options`` field holds the task's own settings (a subclass of
     :class:`TaskOptions` that the task defines, written in YAML under a section named after the task).

Each field's docstring is its documentation (the README's configuration table is generated from it).
Paths (``output_dir``, ``data.files``, ``data.path``, ``model.name_or_path``, ...) are relative to the
current directory, with ``~`` the home folder, and are made absolute as the config is validated: the run's
saved ``config.yaml`` then names the same files whichever directory ``evaluate`` or ``predict`` runs in.
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

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
        if isinstance(value, str) and "_" in value and field is not None and _numbers_only(field.annotation):
            # YAML reads 1_000 as a number itself; a string that reaches here (1_0.5, a typo) pydantic would read
            # with its underscores dropped, as 10.5.
            raise ValueError(f"{value!r} is not a number")
        if isinstance(value, list) and field is not None and _list_of_numbers(field.annotation):
            given = next((item for item in value if isinstance(item, bool)), None)
            if given is not None:  # distill.layers=[true, false] copied layers 1 and 0
                raise ValueError(f"{str(given).lower()} is a boolean; this setting takes a list of numbers")
        return value


def _numbers_only(annotation: Any) -> bool:
    """Whether a field takes int or float and no bool (``int | None`` yes, ``bool | None`` and ``str`` no)."""
    kinds = set(get_args(annotation)) or {annotation}
    return bool(kinds & {int, float}) and bool not in kinds


def distinct_label_names(value: list[str] | None) -> list[str] | None:
    """A task's ``label_names`` checked: a name given twice made a head with a dead class under a shared name (its
    scores dropped from predictions, which then summed to less than one), and an empty list read as unset."""
    if value is None:
        return None
    if not value:
        raise ValueError("the label set is empty: list the labels in id order, or leave the setting out to read them from the data")
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        raise ValueError(f"{repeated} listed more than once; each label needs one id")
    return value


def _list_of_numbers(annotation: Any) -> bool:
    """Whether a field takes a list of ints or floats (``list[int] | None`` yes)."""
    kinds = set(get_args(annotation)) or {annotation}
    return any(get_origin(kind) is list and _numbers_only(get_args(kind)[0]) for kind in kinds if get_args(kind))


class TaskOptions(Section):
    """Settings a task adds under its own section; tasks subclass this."""

    # Options that shape the trained model (its labels, heads, tokenizer), which evaluate and predict take from
    # the finished run as trained: an override of one would be ignored, so it is refused. A task option naming a
    # model (``is_model_option``) is one too.
    fixed_by_training: ClassVar[frozenset[str]] = frozenset()


def is_model_option(name: str) -> bool:
    """A task option (or its dotted key) naming a model the task loads, e.g. translation's
    ``encoder_name_or_path``: an input of the run, like ``model.name_or_path``."""
    return name.endswith("name_or_path")


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
    projections (BERT: query, value; T5: q, v; BART/Marian: q_proj, v_proj). A listed name matching no module is refused."""
    modules_to_save: list[str] | None = None
    """Modules trained in full and saved with the adapter; None = the task head (classifier,
    qa_outputs, the MLM transform; the cross-attention of a finished BERT2BERT run, as a warm start's is refused).
    Modules the checkpoint lacked (random on every load) are added to any list."""
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
    """Hub revision (branch, tag or commit) of the model and tokenizer. A mirror copy or a local folder holds one version: there the revision is not checked, and a warning says so."""
    model_type: str = "bert"
    """From-scratch model family (when ``name_or_path`` is unset); ``bertpipe_bert`` selects bertpipe's own BERT."""
    architecture: dict[str, Any] = Field(default_factory=dict)
    """From-scratch architecture: keys of the family's config class, e.g. ``{num_hidden_layers: 4, hidden_size: 256}``."""
    dropout: float | None = Field(default=None, ge=0.0, lt=1.0)
    """Overrides the checkpoint's hidden and attention dropout when set."""
    peft: PeftConfig | None = None
    """Parameter-efficient fine-tuning (null = train every parameter)."""
    freeze_input_embeddings: bool = False
    """Keep the input word embeddings as loaded (no gradient, no optimizer state, no update), and any weight
    tied to them: a masked-LM decoder's, a seq2seq model's shared embeddings and output projection. A
    vocabulary-sized matrix's gradient, clipping and AdamW pass then leave every step (MiniLM: 11.7M of its
    22.7M parameters; a packed NER step 0.93x the time on a 2-core CPU, 7% less peak memory). Not exact: SST-2
    -0.15 accuracy points, CoNLL-2003 NER -0.4 F1 points over 3 seeds (docs/benchmark.md); the shipped configs
    leave it off, and ``bertpipe benchmark`` freezes the Trainer reference's too. For a pretrained model only
    (from scratch the embeddings would stay random); not with ``peft``, which freezes them already."""

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
    """Hub dataset id or local folder; ignored when ``files`` is given. A folder of data files (``train.csv``,
    ``data/validation-0.tsv``: the split names ``datasets`` finds) is read as ``files`` are; a dataset repository
    whose README.md configures its data, by ``datasets``."""
    name: str | None = None
    """Dataset configuration name (e.g. ``mrpc`` for ``nyu-mll/glue``)."""
    files: dict[str, str | list[str]] | None = None
    """Split name -> local file(s): csv, tsv, json, jsonl, parquet or txt. A tsv file is read with csv
    quoting only when its quoted fields parse as such (pandas/R output) without joining lines that each hold a
    whole row; plain tsv keeps its quotes as text. A row with another number of fields than the header (a
    trailing delimiter) is an error naming its line. A file rewritten in place is read again, even with its old
    modification time."""
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
        empty = [split for split, paths in value.items() if not paths]
        if empty:
            raise ValueError(f"split(s) {empty} name no file: give each split a path or a list of paths, or leave the split out")
        # An empty path is the current directory once made absolute, refused later as "a folder, not a file".
        blank = [split for split, paths in value.items() if any(not str(path).strip() for path in ([paths] if isinstance(paths, str) else paths))]
        if blank:
            raise ValueError(f"split(s) {blank} list an empty path: give each file's path")
        return {split: absolute_if_local(paths) if isinstance(paths, str) else [absolute_if_local(path) for path in paths]
                for split, paths in value.items()}

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        try:
            codec = codecs.lookup(value)
        except LookupError:
            raise ValueError(f"unknown text encoding {value!r} (e.g. utf-8, latin-1, cp1252)") from None
        # base64, hex, zlib, rot13 are codecs too, of bytes to bytes or str to str: open() refuses them.
        if not codec._is_text_encoding:
            raise ValueError(f"{value!r} is a codec but not a text encoding (e.g. utf-8, latin-1, cp1252)")
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
    """Warmup in optimizer updates; overrides ``warmup_fraction``. One longer than the run is cut to the run's length (the rate peaks at the last update)."""
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
    """Save the best evaluated model (needs ``eval_steps``: the evaluations it picks from, the last model's final evaluation
    among them); an earlier best is reloaded and evaluated again for its own predictions and the final metrics."""
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
        """``greater_is_better`` for ``metric_for_best_model``, when set; else the task's direction for ``metric``
        (``eval_`` prefix or not; a task's ``higher_is_better`` names only the exceptions, so the default is
        higher). ``greater_is_better`` says how ``metric_for_best_model`` ranks: applied to another metric (the
        benchmark's ``--metric pearson`` beside ``eval_mse``), a run below its target was reported as reaching it."""
        name = (metric or "").removeprefix("eval_")
        if self.greater_is_better is not None and name == (self.metric_for_best_model or "").removeprefix("eval_"):
            return self.greater_is_better
        return higher_is_better.get(name, True)

    @model_validator(mode="after")
    def _best_model_needs_metric(self) -> "TrainConfig":
        if (self.load_best_model_at_end or self.early_stopping_patience) and not self.metric_for_best_model:
            raise ValueError("load_best_model_at_end and early_stopping_patience need train.metric_for_best_model")
        if self.early_stopping_patience and not self.eval_steps:
            raise ValueError("early_stopping_patience needs train.eval_steps (evaluations to be patient over)")
        if self.load_best_model_at_end and not self.eval_steps:
            # Without evaluations on the way there is no best model to reload: the run would end with its
            # last weights while the config said best.
            raise ValueError("load_best_model_at_end needs train.eval_steps (evaluations to pick the best model from)")
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
    """Softmax temperature of both models' outputs in the soft-target loss (a regression head matches the teacher's
    values by MSE, where none applies: another value is refused)."""
    init: Literal["teacher", "model"] = "teacher"
    """``teacher``: the student is the teacher with ``layers`` of its layers (DistilBERT's recipe);
    ``model``: the student is ``model.name_or_path`` or a from-scratch ``model.architecture``."""
    num_layers: int | None = Field(default=None, gt=0)
    """With ``init: teacher``: student depth, teacher layers taken evenly spaced (default: half, i.e. every other layer)."""
    layers: list[int] | None = None
    """With ``init: teacher``: the teacher layers (0-based) to copy, in order; with ``num_layers`` too, as many of them."""
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
        if self.layers is not None and self.num_layers is not None and self.num_layers != len(self.layers):
            # The layers won, and config.yaml kept a num_layers the student did not have.
            raise ValueError(f"distill.num_layers={self.num_layers} and distill.layers={self.layers} ({len(self.layers)} layers) "
                             "disagree: give one of them")
        return self


class RunConfig(Section):
    task: str
    """Which task runs: its name in the registry of ``tasks/__init__.py`` (``classification``, ``ner``, ...)."""
    output_dir: str
    """The run directory. This and every other path (``data.files``, ``data.path``, ``model.name_or_path``,
    ``distill.teacher``, ...) is relative to the current directory, ``~`` being the home folder; the run's
    ``config.yaml`` holds them absolute, so ``evaluate`` and ``predict`` read the same files from anywhere."""
    seed: int = Field(default=42, ge=0, lt=2**32)  # numpy's seed range
    """Seeds model initialisation, data order and dropout: a rerun gives identical results (except an MLM run that trains its WordPiece tokenizer: the trainer breaks ties in hash order; reuse a run's with model.tokenizer_name_or_path). On the CPU the dropout masks (hidden states' and attention's) are bertpipe's own draws of torch's generator (pipelines/dropout.py): the same seed gives other masks than a loop of torch's own; a sequence classifier whose head reads position 0 only (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT) draws its last layer's masks there only (pipelines/first_position.py)."""
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
        # An empty output_dir was the current folder, and "/" a folder with no name: a run trained into either, then
        # failed with a traceback (or, in an empty current folder, said a saved run could not be saved).
        if not value.strip():
            raise ValueError("is empty: name the run's folder (e.g. output_dir=runs/sst2)")
        # Always absolute: the folder usually does not exist yet (Path("~/runs/x") made a folder named "~").
        absolute = _absolute_path(value)
        if not os.path.basename(absolute):
            raise ValueError(f"{value!r} is the file system's root: name a folder for the run (e.g. output_dir=/runs/sst2)")
        return absolute

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

    @model_validator(mode="after")
    def _frozen_embeddings_without_adapter(self) -> "RunConfig":
        if self.model.freeze_input_embeddings and self.model.peft is not None:
            raise ValueError("model.freeze_input_embeddings: model.peft already keeps the base model's embeddings "
                             "frozen (list them in model.peft.modules_to_save to train them); set one of the two")
        return self

    def to_yaml_dict(self) -> dict[str, Any]:
        """The resolved config in the same shape as the YAML it came from."""
        resolved = self.model_dump(mode="json", exclude={"task_options"})
        if resolved.get("distill") is None:  # only distilled runs carry the section
            resolved.pop("distill", None)
        resolved[self.task] = self.task_options.model_dump(mode="json")
        return resolved


def flatten_tree(tree: dict, prefix: str = "") -> dict[str, object]:
    """A config tree as ``{"train.max_steps": 8, ...}`` (an empty section stays one key)."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten_tree(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


NO_DEFAULT = object()
"""What :func:`schema_default` returns for a key the schema does not know or that has no default."""


def section_type(annotation: Any) -> type[BaseModel] | None:
    """The section class of a field typed ``Section`` or ``Section | None``; None for a plain value."""
    candidates = (annotation, *get_args(annotation))
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def schema_default(key: str) -> Any:
    """The default of a dotted :class:`RunConfig` key, as its YAML would hold it (``train.pack_sequences`` ->
    False), or :data:`NO_DEFAULT`. A task's own section (``ner.label_all_tokens``) is not in the schema."""
    section: type[BaseModel] | None = RunConfig
    *path, leaf = key.split(".")
    for name in path:
        field = section.model_fields.get(name)
        section = section_type(field.annotation) if field is not None else None
        if section is None:
            return NO_DEFAULT
    field = section.model_fields.get(leaf)
    if field is None or field.is_required():
        return NO_DEFAULT
    default = field.get_default(call_default_factory=True)
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else default

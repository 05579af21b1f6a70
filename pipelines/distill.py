"""Task-specific knowledge distillation through the one training loop.

In:  a run config with a ``distill:`` section (:class:`~pipelines.config.DistillConfig`), the task,
     and the student model the task built; the teacher is a finished run of the same task.
Out: :class:`DistillationModel`, which the loop trains like any model: in training mode its forward
     returns the student's outputs with ``.loss`` replaced by

         alpha * KL(softmax(teacher / T) || softmax(student / T)) * T²  +  (1 - alpha) * task loss
         + hidden_weight * MSE(student hidden states, teacher hidden states)

     (Hinton et al.'s soft targets; T² keeps the soft-target gradients on the scale of the task
     loss's). In eval mode it is the student alone. The teacher is held outside the module tree,
     so it is neither trained, nor counted, nor saved: :func:`student_of` unwraps the student at
     save time and the run directory is a normal run (evaluate, predict, ``pipeline()``, export).

Which outputs are distilled is read from the output names, so the loop and this module stay task-agnostic:
``logits`` of shape (batch, labels) per example (regression: MSE; multi-label: per-label sigmoid
targets, a head of one label too), ``logits`` of shape (batch, sequence, labels) per labelled token (NER:
the pieces whose labels are not -100: every piece of each word with ``ner.label_all_tokens``, else its first
piece; a student labelling every piece needs a teacher trained so), ``start_logits``/``end_logits`` over the
real positions of each window (QA). Teacher and student must score the same labels (in any order) under the
same problem type; an encoder-decoder teacher, and hidden-state transfer between models whose hidden states are
not one vector per input token (Funnel), are refused before anything is written.

Student: ``distill.init: teacher`` keeps the teacher's embeddings, head and an evenly spaced subset of its
layers (every other one by default: DistilBERT's recipe; ALBERT, whose layers share their weights, runs its
shared layer that many times); ``init: model`` trains whatever
``model.name_or_path`` / ``model.architecture`` gives, which must share the teacher's tokenizer.
"""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from pipelines.adapters import is_peft_model, merge_adapter
from pipelines.autocast_safety import make_autocast_safe
from pipelines.config import ConfigError, RunConfig, TaskOptions
from pipelines.config_loading import apply_overrides, load_config, read_yaml
from pipelines.errors import ModelError, describe
from pipelines.heads import reorder_head_labels
from pipelines.outputs import METRICS_FILE, load_saved_config
from pipelines.task import Task

logger = logging.getLogger(__name__)

_LAYER_KEY = re.compile(r"^(.*\.layers?\.)(\d+)(\..*)$")  # BERT-likes: encoder.layer.<i>; ModernBERT: model.layers.<i>
_MASKED_LOGIT = -1e4


class DistillError(ModelError):
    """A teacher/student pair that cannot be distilled (unfinished teacher, other task, labels or vocabulary)."""


# ----- config -------------------------------------------------------------------------------------
def distill_config(
    teacher_run: str, config_path: str, overrides: Sequence[str], options_for: Callable[[str], type[TaskOptions]]
) -> RunConfig:
    """``bertpipe distill TEACHER CONFIG [KEY=VALUE ...]``: the config with ``distill.teacher`` set and,
    for ``init: teacher`` (the default), ``model.name_or_path`` pointed at the teacher."""
    check_teacher_run(teacher_run)
    # Read from the tree load_config will validate, not from the override strings: an override names a
    # setting in several spellings (``distill.init=model``, ``distill={init: model}``, ``model={name_or_path: X}``),
    # and one missed here put the teacher in as the student while config.yaml said ``init: model``.
    tree = read_yaml(config_path)
    given = apply_overrides(tree, overrides)
    section = tree.get("distill") if isinstance(tree.get("distill"), dict) else {}
    model = tree.get("model") if isinstance(tree.get("model"), dict) else {}
    init = section.get("init", "teacher")
    tokenizer_given = bool(model.get("tokenizer_name_or_path") or model.get("name_or_path"))
    extra = [f"distill.teacher={teacher_run}"]
    if init == "teacher":
        # The config file's model (the task's usual checkpoint) gives way to the teacher, but a student named on
        # the command line would be dropped without a word.
        if ("model", "name_or_path") in given and model.get("name_or_path") is not None:
            raise ConfigError(
                f"model.name_or_path={model['name_or_path']} (the command line): with distill.init=teacher the student is "
                "the teacher's own layers; to train that model as the student, add distill.init=model"
            )
        extra.append(f"model.name_or_path={teacher_run}")
    elif not tokenizer_given:  # a from-scratch student reads its inputs with the teacher's tokenizer
        extra.append(f"model.tokenizer_name_or_path={teacher_run}")
    config = load_config(config_path, [*overrides, *extra], options_for)
    # Before the student is built from the teacher's folder (init: teacher loads its weights into this task's head).
    check_teacher_task(load_saved_config(teacher_run), teacher_run, config.task)
    return config


# ----- the student --------------------------------------------------------------------------------
def teacher_layer_choice(teacher_layers: int, num_layers: int | None = None, layers: Sequence[int] | None = None) -> list[int]:
    """Teacher layers the student keeps: ``layers`` as given, else ``num_layers`` evenly spaced from
    layer 0 (12 -> 6 is DistilBERT's every other layer 0, 2, ..., 10; 12 -> 3 is 0, 4, 8)."""
    if layers is not None:
        bad = [layer for layer in layers if layer >= teacher_layers]
        if bad:
            raise DistillError(f"distill.layers {list(layers)}: the teacher has layers 0..{teacher_layers - 1}")
        return list(layers)
    count = num_layers if num_layers is not None else max(1, teacher_layers // 2)
    if count > teacher_layers:
        raise DistillError(f"distill.num_layers={count} exceeds the teacher's {teacher_layers} layers")
    return [index * teacher_layers // count for index in range(count)]


# Config entries that hold one value per layer: a student keeps its layers' values.
_PER_LAYER_CONFIG_KEYS = ("layer_types", "attention_window")


def shrink_to_layers(model: torch.nn.Module, keep: Sequence[int]) -> torch.nn.Module:
    """A copy of ``model`` with only the encoder layers ``keep`` (renumbered 0..n-1); every other weight as is.

    Layers are found by their state-dict names (``....layer.<i>.``: BERT, RoBERTa, ELECTRA, DistilBERT,
    DeBERTa; ``....layers.<i>.``: ModernBERT). ALBERT has no weights per layer: its layers run shared
    weight groups, which the student keeps whole.
    """
    teacher_layers = model.config.num_hidden_layers
    config = copy.deepcopy(model.config)
    try:
        # Inside: a family may refuse the setting itself (Funnel: "set block_sizes"), a traceback before.
        config.num_hidden_layers = len(keep)
        for key in _PER_LAYER_CONFIG_KEYS:
            per_layer = getattr(config, key, None)
            if isinstance(per_layer, (list, tuple)) and len(per_layer) == teacher_layers:
                # Each kept layer keeps its own setting (ModernBERT's attention kind, Longformer's window). Left as
                # it was, the list gave the student's layer j the teacher's layer j's, not the copied layer's (or,
                # longer than the student, was refused by the model).
                setattr(config, key, [per_layer[index] for index in keep])
        student = type(model)(config)
    except Exception as error:  # the family's own checks on its config (an assertion, a ValueError)
        raise DistillError(
            f"a {len(keep)}-layer {type(model).__name__} student of teacher layers {list(keep)} cannot be built: {describe(error)}; "
            "use distill.init=model with a student checkpoint (model.name_or_path) or model.architecture"
        ) from error
    renamed: dict[str, torch.Tensor] = {}
    found: set[int] = set()
    for key, value in model.state_dict().items():
        match = _LAYER_KEY.match(key)
        if match is None:
            renamed[key] = value
            continue
        found.add(int(match.group(2)))
        if int(match.group(2)) in keep:
            renamed[f"{match.group(1)}{list(keep).index(int(match.group(2)))}{match.group(3)}"] = value
    if not found:
        _check_shared_layer_groups(model, keep)
    missing, unexpected = student.load_state_dict(renamed, strict=False)
    if missing or unexpected:
        raise DistillError(
            f"teacher layers {list(keep)} do not fit a {len(keep)}-layer student (weights missing {missing[:5]} / left over "
            f"{unexpected[:5]}); choose other distill.layers (ModernBERT's first layer has no attention LayerNorm: keep layer 0)"
        )
    return student


def _check_shared_layer_groups(model: torch.nn.Module, keep: Sequence[int]) -> None:
    """Refuse a model without weights per layer unless its layers share weight groups (ALBERT) that the
    kept layers still run at their new depths; the student then keeps every weight as it is."""
    groups = getattr(model.config, "num_hidden_groups", None)
    if not groups:
        raise DistillError(
            f"{type(model).__name__} has no '.layer.<i>.' or '.layers.<i>.' weights to choose teacher layers from; "
            "use distill.init=model with model.architecture"
        )

    # ALBERT's layer i runs weight group int(i / (layers / groups)) (transformers' AlbertTransformer).
    def group_of(layer: int, layers: int) -> int:
        return int(layer / (layers / groups))

    teacher_layers = model.config.num_hidden_layers
    wanted = [group_of(layer, teacher_layers) for layer in keep]
    given = [group_of(layer, len(keep)) for layer in range(len(keep))]
    if wanted != given:
        raise DistillError(
            f"{type(model).__name__} shares {groups} weight groups over its {teacher_layers} layers: teacher layers "
            f"{list(keep)} run groups {wanted}, but a {len(keep)}-layer student would run {given}; choose "
            "distill.num_layers or distill.layers so that they match"
        )


def hidden_layer_map(student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student, teacher) indices into ``hidden_states`` (0 = embeddings): j <-> round(j * L_t / L_s)."""
    return [(j, round(j * teacher_layers / student_layers)) for j in range(student_layers + 1)]


# ----- the losses ---------------------------------------------------------------------------------
def soft_target_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over rows of KL(softmax(teacher/T) || softmax(student/T)) along the last axis, times T².

    ``rows`` (boolean, the shape of the logits without their last axis) selects the rows that count.
    """
    student_log = F.log_softmax(student.float() / temperature, dim=-1)
    teacher_log = F.log_softmax(teacher.float() / temperature, dim=-1)
    per_row = (teacher_log.exp() * (teacher_log - student_log)).sum(dim=-1)
    if rows is not None:
        per_row = per_row[rows]
    if per_row.numel() == 0:
        return student.sum() * 0.0
    return per_row.mean() * temperature**2


def distillation_loss(student_outputs, teacher_outputs, batch: dict[str, torch.Tensor], config, temperature: float) -> torch.Tensor:
    """The soft-target loss summed over the distilled outputs (see the module docstring)."""
    attention = batch.get("attention_mask")
    losses = []
    for name in ("logits", "start_logits", "end_logits"):
        student, teacher = getattr(student_outputs, name, None), getattr(teacher_outputs, name, None)
        if student is None or teacher is None:
            continue
        if name == "logits" and student.ndim == 2:
            problem_type = getattr(config, "problem_type", None)
            # One output is a value (regression, or a one-label head of no problem type), except a multi-label
            # head of one label: that is a sigmoid probability, as the module docstring says (it got MSE on raw
            # logits, and the temperature did nothing).
            if problem_type == "regression" or (student.shape[-1] == 1 and problem_type != "multi_label_classification"):
                losses.append(F.mse_loss(student.float(), teacher.float()))
            elif problem_type == "multi_label_classification":
                targets = torch.sigmoid(teacher.float() / temperature)
                losses.append(F.binary_cross_entropy_with_logits(student.float() / temperature, targets) * temperature**2)
            else:
                losses.append(soft_target_kl(student, teacher, temperature))
        elif name == "logits":  # per token: the labelled pieces, else every real token
            labels = batch.get("labels")
            rows = labels != -100 if labels is not None and labels.shape == student.shape[:2] else None
            if rows is None and attention is not None:
                rows = attention.bool()
            losses.append(soft_target_kl(student, teacher, temperature, rows))
        else:  # positions are the classes: padding must not take probability mass
            if attention is not None:
                padding = ~attention.bool()
                student, teacher = student.masked_fill(padding, _MASKED_LOGIT), teacher.masked_fill(padding, _MASKED_LOGIT)
            losses.append(soft_target_kl(student, teacher, temperature))
    if not losses:
        raise DistillError(f"the model returns none of logits/start_logits/end_logits ({sorted(student_outputs.keys())}); nothing to distil")
    return torch.stack(losses).sum() / len(losses) if len(losses) > 1 else losses[0]


@torch.no_grad()
def _check_hidden_states_align(student, teacher, tokenizer, layer_map, teacher_dir) -> None:
    """distill.hidden_weight compares hidden states position by position: refused, before anything is written, for
    models whose hidden states are not one vector per input token (Funnel pools them), where it failed mid-run."""
    probe = tokenizer("a probe of the hidden states , one vector per token", return_tensors="pt")
    length = probe["input_ids"].shape[1]
    states = []
    for model in (student, teacher):
        was_training = model.training
        model.eval()
        try:
            states.append(model(**probe.to(next(model.parameters()).device), output_hidden_states=True).hidden_states)
        finally:
            model.train(was_training)
    student_hidden, teacher_hidden = states
    for student_index, teacher_index in layer_map:
        shapes = (tuple(student_hidden[student_index].shape[1:]), tuple(teacher_hidden[teacher_index].shape[1:]))
        if shapes[0] != shapes[1] or shapes[0][0] != length:
            raise DistillError(
                f"distill.hidden_weight compares hidden states token by token, but for {length} input tokens the student's "
                f"layer {student_index} gives {shapes[0]} and the teacher's ({teacher_dir}) layer {teacher_index} {shapes[1]} "
                "(positions, width): set distill.hidden_weight=0"
            )


def hidden_state_loss(student_hidden, teacher_hidden, layer_map, attention: torch.Tensor | None) -> torch.Tensor:
    """Mean squared error between mapped hidden states over real tokens, averaged over the mapped layers."""
    total = 0.0
    for student_index, teacher_index in layer_map:
        difference = (student_hidden[student_index].float() - teacher_hidden[teacher_index].float()) ** 2
        if attention is not None:
            mask = attention.unsqueeze(-1).to(difference.dtype)
            total = total + (difference * mask).sum() / (mask.sum() * difference.shape[-1]).clamp(min=1)
        else:
            total = total + difference.mean()
    return total / len(layer_map)


# ----- segment ids the student's tokenizer does not give ------------------------------------------
# Texts that tell apart tokenizers of one vocabulary: case, accents, punctuation, digits, spacing, and a text pair.
_TOKENIZER_PROBES = (
    ("The FILM was Superb: naïve café, 42 dollars!", None),
    ("  Tabs\tand   spaces, «quotes» and dashes—here", None),
    ("Who wrote it?", "Élan Vital, 1907."),
)


def check_same_input_ids(teacher_tokenizer, student_tokenizer, teacher: str) -> None:
    """Refuse a student tokenizer that turns text into other input ids than the teacher's, its vocabulary the same
    (one lower-cases and the other not, or strips accents, or splits otherwise): the teacher then read ids it never
    saw in training (three of four words of a cased text as [UNK]), and its soft targets were noise."""
    for text, pair in _TOKENIZER_PROBES:
        ids = [tokenizer(text, pair)["input_ids"] for tokenizer in (teacher_tokenizer, student_tokenizer)]
        if ids[0] != ids[1]:
            shown = repr(text) if pair is None else f"{text!r} with {pair!r}"
            raise DistillError(
                f"the student's tokenizer reads text otherwise than the teacher's ({teacher}), though their vocabularies are "
                f"the same: {shown} is {ids[1]} to the student and {ids[0]} to the teacher (case, accents or splitting). "
                f"Both must turn text into the same input ids: give the student the teacher's tokenizer "
                f"(model.tokenizer_name_or_path={teacher})"
            )


def segment_separator(teacher_tokenizer, student_tokenizer) -> int | None:
    """The separator id after which the teacher numbers tokens segment 1, when the teacher reads
    ``token_type_ids`` that the student's batches lack; None when the teacher loses nothing without them.

    The common case is a BERT teacher and a DistilBERT student: the same vocabulary, but DistilBERT's
    tokenizer makes no segment ids, so on text pairs (and every QA question/context) the teacher would
    read the second segment as the first and give soft targets it never gives on its own inputs.
    """
    if "token_type_ids" not in teacher_tokenizer.model_input_names or "token_type_ids" in student_tokenizer.model_input_names:
        return None
    probe = teacher_tokenizer(["a", "a b c"], ["b c d", "d"], padding=True, return_tensors="pt")
    types = probe.get("token_type_ids")
    if types is None or not bool(types.any()):
        return None  # the teacher's template gives every token segment 0: zeros are what it reads
    separator = teacher_tokenizer.sep_token_id
    if separator is None or not torch.equal(second_segment(probe["input_ids"], probe["attention_mask"], separator), types):
        raise DistillError(
            "the teacher reads token_type_ids, which the student's tokenizer does not give, and numbers its segments in a "
            "way bertpipe cannot rebuild from the input ids; give the student the teacher's tokenizer "
            "(model.tokenizer_name_or_path=TEACHER_RUN)"
        )
    return separator


def second_segment(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, separator: int) -> torch.Tensor:
    """Segment ids as BERT's template numbers them: 0 up to and including the first separator, 1 after it, 0 on padding."""
    is_separator = (input_ids == separator).long()
    types = ((is_separator.cumsum(-1) - is_separator) > 0).long()
    return types * attention_mask.long() if attention_mask is not None else types


# ----- the wrapper the loop trains ----------------------------------------------------------------
class DistillationModel(torch.nn.Module):
    """The student, whose training-mode forward returns the distillation loss as ``.loss``."""

    def __init__(self, student: torch.nn.Module, teacher: torch.nn.Module, *, alpha: float, temperature: float,
                 hidden_weight: float = 0.0, layer_map: list[tuple[int, int]] | None = None,
                 segment_separator: int | None = None) -> None:
        super().__init__()
        self.student = student
        # Not a submodule: the optimizer, state_dict, checkpoints and parameter counts see the student only.
        object.__setattr__(self, "teacher", teacher.eval().requires_grad_(False))
        self.alpha, self.temperature, self.hidden_weight, self.layer_map = alpha, temperature, hidden_weight, layer_map or []
        self.config = student.config
        self.segment_separator = segment_separator

    def forward(self, **batch: Any):
        if not self.training:
            return self.student(**batch)
        with_hidden = self.hidden_weight > 0
        outputs = self.student(**batch, output_hidden_states=with_hidden) if with_hidden else self.student(**batch)
        if self.alpha < 1.0 and outputs.loss is None:
            raise DistillError("the student returned no task loss: the collator supplied no labels")
        if self.alpha == 0 and not with_hidden:
            # The task loss alone (a sweep's alpha=0 baseline): the teacher's forward would only be multiplied by 0.
            return outputs
        teacher = self.teacher
        device = batch["input_ids"].device
        if next(teacher.parameters()).device != device:
            teacher.to(device)
        inputs = {key: value for key, value in batch.items() if key not in ("labels", "start_positions", "end_positions")}
        if self.segment_separator is not None and "token_type_ids" not in inputs:
            inputs["token_type_ids"] = second_segment(inputs["input_ids"], inputs.get("attention_mask"), self.segment_separator)
        with torch.no_grad():
            teacher_outputs = teacher(**inputs, output_hidden_states=with_hidden) if with_hidden else teacher(**inputs)
        loss = self.alpha * distillation_loss(outputs, teacher_outputs, batch, self.student.config, self.temperature)
        if self.alpha < 1.0:
            loss = loss + (1.0 - self.alpha) * outputs.loss
        if with_hidden:
            loss = loss + self.hidden_weight * hidden_state_loss(outputs.hidden_states, teacher_outputs.hidden_states, self.layer_map, batch.get("attention_mask"))
        outputs.loss = loss
        return outputs


def student_of(model: torch.nn.Module) -> torch.nn.Module:
    """The student inside a :class:`DistillationModel`; any other model unchanged."""
    return model.student if isinstance(model, DistillationModel) else model


def student_state_dict(model: torch.nn.Module, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A (possibly gathered) state dict of ``model`` with the distillation wrapper's prefix removed."""
    if not isinstance(model, DistillationModel):
        return state_dict
    return {key.removeprefix("student."): value for key, value in state_dict.items()}


def check_teacher_run(teacher_run: str | Path) -> Path:
    teacher_dir = Path(teacher_run)
    if not (teacher_dir / METRICS_FILE).is_file():
        raise DistillError(f"distill.teacher {teacher_dir} is not a finished run (no {METRICS_FILE})")
    return teacher_dir


def check_teacher_task(saved: dict[str, Any], teacher_dir: str | Path, task: str) -> None:
    if saved.get("task") != task:
        raise DistillError(f"distill.teacher {teacher_dir} is a {saved.get('task')!r} run; this run's task is {task!r}")


def load_teacher(config: RunConfig, task: Task) -> tuple[torch.nn.Module, Any]:
    """The teacher run's model (adapter runs merged) and tokenizer, checked against the student's task."""
    teacher_dir = check_teacher_run(config.distill.teacher)
    task_class = type(task)
    saved = load_saved_config(teacher_dir)
    # Checked first: another task's config.yaml fails to load with this task's options, naming its keys instead.
    check_teacher_task(saved, teacher_dir, config.task)
    try:
        teacher_config = load_config(None, [], lambda name: task_class.Options, base=saved)
    except ConfigError as error:
        raise DistillError(f"distill.teacher {teacher_dir}: its config.yaml does not load: {error}") from None
    teacher_task = task_class(teacher_config)
    task.check_distillation_teacher(teacher_config.task_options, str(teacher_dir))
    tokenizer = teacher_task.build_tokenizer(None, model_path=str(teacher_dir))
    teacher = teacher_task.build_model(None, model_path=str(teacher_dir))
    if getattr(teacher.config, "is_encoder_decoder", False):
        # Its depth, layers and outputs are an encoder's and a decoder's: the teacher's depth was read as one
        # encoder's, an AttributeError traceback.
        raise DistillError(f"distill.teacher {teacher_dir} is an encoder-decoder ({teacher.config.model_type}): distillation "
                           "takes encoder models (classification, ner, qa, mlm)")
    if is_peft_model(teacher):
        teacher = merge_adapter(teacher)  # peft's own unload fails for IA3 heads of several layers
    # It runs under the student's autocast, outside the modules the training loop mends (not a submodule).
    make_autocast_safe(teacher)
    return teacher, tokenizer


def build_distillation_model(student: torch.nn.Module, config: RunConfig, task: Task) -> DistillationModel:
    """Load the teacher, check it against ``student`` (labels, vocabulary), shape the student, wrap both."""
    distill = config.distill
    teacher, teacher_tokenizer = load_teacher(config, task)
    student_tokenizer = getattr(task, "tokenizer", None)
    if student_tokenizer is not None and student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise DistillError(f"the student's tokenizer differs from the teacher's ({distill.teacher}): both must read the same input ids")
    if student_tokenizer is not None:
        check_same_input_ids(teacher_tokenizer, student_tokenizer, distill.teacher)
    separator = segment_separator(teacher_tokenizer, student_tokenizer) if student_tokenizer is not None else None
    teacher_labels = getattr(teacher.config, "id2label", None)
    student_labels = getattr(student.config, "id2label", None)
    # Only tasks that declare label names (classification, NER) have heads scoring labels. QA's head scores
    # start and end, MLM's and translation's the vocabulary: their id2label is whatever the checkpoint
    # carried, and "reordering" it would swap the teacher's start and end logits.
    labelled = "label_names" in type(config.task_options).model_fields
    if labelled and teacher_labels != student_labels:
        teacher_names, student_names = ([labels[i] for i in range(len(labels))] for labels in (teacher_labels or {}, student_labels or {}))
        # The same labels in another order (a Hub ClassLabel order against a local file's): the teacher's
        # output rows are permuted into the student's order, so each soft target lands on its own label.
        if not reorder_head_labels(teacher, teacher_names, student_names):
            raise DistillError(
                f"the teacher {distill.teacher} predicts labels {teacher_names}, the student {student_names}; they must "
                f"be the same labels: set {config.task}.label_names to the teacher's"
            )
        teacher.config.id2label, teacher.config.label2id = dict(student_labels), {name: index for index, name in student_labels.items()}
    teacher_problem, student_problem = (getattr(model.config, "problem_type", None) for model in (teacher, student))
    if labelled and teacher_problem != student_problem:
        # A multi-label teacher's sigmoid outputs read as one softmax (neither label and both gave one target), or
        # softmax logits read through sigmoids, with exit status 0.
        raise DistillError(
            f"the teacher {distill.teacher} is a {teacher_problem} model, the student {student_problem}: its outputs mean "
            f"something else; set {config.task}.problem_type to the teacher's"
        )
    default_temperature = type(distill).model_fields["temperature"].default
    if getattr(student.config, "problem_type", None) == "regression" and distill.temperature != default_temperature:
        # A regression head's targets are the teacher's values, matched by MSE: the temperature was accepted, written to
        # config.yaml, and changed nothing (the same weights at T=1 and T=10).
        raise DistillError(
            f"distill.temperature={distill.temperature}: a regression head learns the teacher's values by mean squared "
            f"error, where no temperature applies; drop distill.temperature"
        )
    teacher_depth = teacher.config.num_hidden_layers
    if distill.init == "teacher":
        keep = teacher_layer_choice(teacher_depth, distill.num_layers, distill.layers)
        logger.info("student: teacher layers %s of %d", keep, teacher_depth)
        student = shrink_to_layers(student, keep)
    layer_map = []
    if distill.hidden_weight > 0:
        if student.config.hidden_size != teacher.config.hidden_size:
            raise DistillError(
                f"distill.hidden_weight needs equal hidden sizes (student {student.config.hidden_size}, teacher "
                f"{teacher.config.hidden_size}); set it to 0"
            )
        layer_map = hidden_layer_map(student.config.num_hidden_layers, teacher_depth)
        _check_hidden_states_align(student, teacher, teacher_tokenizer, layer_map, distill.teacher)
    return DistillationModel(
        student, teacher, alpha=distill.alpha, temperature=distill.temperature, hidden_weight=distill.hidden_weight, layer_map=layer_map,
        segment_separator=separator,
    )


@torch.no_grad()
def mean_teacher_kl(student: torch.nn.Module, teacher: torch.nn.Module, batches, config, temperature: float = 1.0) -> float:
    """The soft-target loss of ``student`` against ``teacher`` averaged over ``batches`` (both in eval mode)."""
    student.eval(), teacher.eval()
    values = []
    for batch in batches:
        inputs = {key: value for key, value in batch.items() if key not in ("start_positions", "end_positions")}
        model_inputs = {key: value for key, value in inputs.items() if key != "labels"}
        values.append(float(distillation_loss(student(**model_inputs), teacher(**model_inputs), inputs, config, temperature)))
    return sum(values) / len(values)

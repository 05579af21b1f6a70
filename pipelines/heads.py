"""How a checkpoint's task head carries over to the head and labels a task asks for.

In:  a checkpoint's config (its ``architectures`` name the head kinds it holds, ``id2label`` what each
     output row scores), the Auto class the task builds its head with, and the task's label maps.
Out: the plan :func:`pipelines.modeling.load_model` follows (:func:`plan_head`: the labels to set, a head
     of another kind to replace, a label count that differs), and what is done to the loaded model after:
     rows permuted to the task's label order (:func:`match_head_to_labels`), or a new head when the
     checkpoint's rows score other labels or another kind of thing (:func:`reinitialize_head`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from pipelines.errors import ModelError

logger = logging.getLogger(__name__)


def plan_head(kinds: list[str], checkpoint_labels: list[str], auto_class,
              label_maps: dict[str, Any]) -> tuple[dict[str, Any], str | None, bool]:
    """How a checkpoint's head (of ``kinds``, scoring ``checkpoint_labels``) carries over to the task's.

    Returns the label maps to set, the checkpoint's head kind when ``auto_class`` builds a head of
    another kind (None otherwise), and whether a head of the same kind scores another number of labels.
    """
    other_head = _other_head_kind(kinds, auto_class)
    if other_head is not None and "id2label" not in label_maps:
        # The old head's labels say nothing about a head of another kind: a task that names none (QA) gets
        # a fresh config's two outputs, not e.g. an MNLI head's three, which its start/end split cannot take.
        fresh = PretrainedConfig()
        label_maps = {**label_maps, "id2label": fresh.id2label, "label2id": fresh.label2id}
    mismatched = other_head is None and head_labels_differ(kinds, checkpoint_labels, label_maps)
    return label_maps, other_head, mismatched


_TASK_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice")
_LABEL_HEADS = ("ForSequenceClassification", "ForTokenClassification")
"""Task heads with one output row per label (whose label maps say what each row scores)."""


def head_kind(class_name: str) -> str | None:
    """``ForTokenClassification`` of ``BertForTokenClassification`` or ``AutoModelForTokenClassification``.

    Families put the kind into their class names (``DebertaV2For...``, ``ModernBertFor...``, bertpipe's
    ``BertpipeFor...``), though not always last: XLNet's QA class is ``XLNetForQuestionAnsweringSimple``.
    Pretraining classes (``ElectraForPreTraining``, ``BertForMaskedLM``) have no task head: None.
    """
    return next((kind for kind in _TASK_HEADS if kind in class_name), None)


def head_kinds(config: PretrainedConfig) -> list[str]:
    """The task head kinds a full checkpoint holds, by the classes its config's ``architectures`` names."""
    return [kind for name in getattr(config, "architectures", None) or [] if (kind := head_kind(name)) is not None]


def scores_labels(kinds: list[str]) -> bool:
    return any(kind in _LABEL_HEADS for kind in kinds)


def _other_head_kind(kinds: list[str], auto_class: Any) -> str | None:
    """The checkpoint's task head kind (of ``kinds``) when ``auto_class`` builds a head of another kind, else None.

    Heads of different kinds often share module names and shapes (BERT, ALBERT, DistilBERT, DeBERTa:
    ``classifier``; ModernBERT: ``head`` + ``classifier``, QA's too): a sentence classifier's weights
    loaded silently into a token classifier with as many labels, scoring tokens with rows trained on
    pooled sentences.
    """
    wanted = head_kind(getattr(auto_class, "__name__", ""))
    return kinds[0] if wanted is not None and kinds and wanted not in kinds else None


def reinitialize_head(model: PreTrainedModel) -> list[str]:
    """Re-initialise every module outside the base model (weights it shares with the base excepted);
    returns their parameter names."""
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    shared = {id(parameter) for parameter in base.parameters()} if isinstance(base, torch.nn.Module) and base is not model else set()
    keys: list[str] = []
    for name, child in model.named_children():
        parameters = list(child.named_parameters())
        if child is base or not parameters or any(id(parameter) in shared for _, parameter in parameters):
            continue
        for module in child.modules():
            # transformers' initialisers skip parameters marked as loaded from the checkpoint.
            for parameter in module.parameters(recurse=False):
                parameter._is_hf_initialized = False
            model._init_weights(module)
        keys += [f"{name}.{key}" for key, _ in parameters]
    return keys


def head_labels_differ(kinds: list[str], checkpoint_labels: list[str], label_maps: dict[str, Any]) -> bool:
    """True when the checkpoint (heads of ``kinds``) has a head scoring labels whose count differs from ours
    (its weights cannot load)."""
    wanted = label_maps.get("id2label")
    return wanted is not None and scores_labels(kinds) and len(checkpoint_labels) != len(wanted)


def label_list(id2label: dict[int, str]) -> list[str]:
    return [id2label[index] for index in range(len(id2label))]


def _unnamed(labels: list[str]) -> bool:
    """transformers' placeholder names: the checkpoint does not say what its rows mean."""
    return all(name == f"LABEL_{index}" for index, name in enumerate(labels))


def _output_layer(model: torch.nn.Module) -> tuple[str, torch.nn.Linear] | None:
    """The head's last linear layer with one output per label: its rows score the labels.

    BERT/ALBERT/DistilBERT ``classifier``, RoBERTa/XLM-R/ELECTRA ``classifier.out_proj`` (after a
    dense layer), ModernBERT/DeBERTa ``classifier``; layers inside the base model are not the head's.
    """
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    inside = {id(module) for module in base.modules()} if isinstance(base, torch.nn.Module) and base is not model else set()
    found = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and id(module) not in inside and module.out_features == model.config.num_labels:
            found = (name, module)
    return found


def reorder_head_labels(model: torch.nn.Module, from_labels: list[str], to_labels: list[str]) -> bool:
    """Permute the rows of ``model``'s output layer, which score ``from_labels`` in that order, so that
    they score ``to_labels`` (the same names in another order): each label keeps its own weights and
    the model predicts exactly what it did. False when the model has no such layer."""
    found = _output_layer(model)
    if found is None or sorted(from_labels) != sorted(to_labels) or len(set(to_labels)) != len(to_labels):
        return False
    layer = found[1]
    order = torch.tensor([from_labels.index(name) for name in to_labels], device=layer.weight.device)
    with torch.no_grad():
        layer.weight.copy_(layer.weight[order])
        if layer.bias is not None:
            layer.bias.copy_(layer.bias[order])
    return True


def match_head_to_labels(model: PreTrainedModel, checkpoint_labels: list[str], source: str) -> list[str]:
    """Make a loaded head whose rows follow ``checkpoint_labels`` score ``model.config.id2label`` instead.

    Loading by shape alone kept a checkpoint's rows under new names when only the count matched: a run
    started from another run whose labels came in another order (a Hub ClassLabel order against a local
    file's) predicted one label's row under another's name, with no error. The same names in another
    order are permuted; other names get a new head (as a head of another size would). Placeholder names
    (``LABEL_0``, ...) say nothing about the rows, which are kept in order. Returns the re-initialised keys.
    """
    wanted = label_list(model.config.id2label)
    if wanted == checkpoint_labels or _unnamed(checkpoint_labels):
        return []
    if reorder_head_labels(model, checkpoint_labels, wanted):
        logger.info("%s: head rows reordered from labels %s to %s", source, checkpoint_labels, wanted)
        return []
    found = _output_layer(model)
    if found is None:
        raise ModelError(
            f"{source} has a head trained for labels {checkpoint_labels}, and bertpipe cannot find its output layer to "
            f"give it labels {wanted}; start from its base model"
        )
    name, layer = found
    logger.warning("%s has a head trained for labels %s; a new head is initialised for labels %s", source, checkpoint_labels, wanted)
    # transformers' initialisers skip parameters marked as loaded from the checkpoint.
    for parameter in layer.parameters():
        parameter._is_hf_initialized = False
    model._init_weights(layer)
    return [f"{name}.{key}" for key, _ in layer.named_parameters()]

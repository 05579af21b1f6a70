"""A masked-LM's prediction head computed at the labelled positions only.

In:  a model about to train, or a finished run's model about to evaluate.
Out: when it is one of the masked-LM classes in ``_HEAD_INPUT`` (or ModernBERT's), the same model, whose
     forward — when given ``labels`` — feeds its prediction head the last hidden states at the labelled
     positions only (label not -100) and returns those positions' logits, ``[labelled positions, vocab]``
     in row-major order, with the family's loss; without ``labels`` the family's forward, every position's
     logits. Any other model is untouched. Returns whether it changed the model.

Why: masked-LM scores ~15% of the positions, but each family's forward runs the head — a hidden × hidden
transform and the hidden × vocabulary decoder, the largest matmul of a small model — at every position,
and the loss then ignores the other 85%. For the shipped from-scratch config (4 layers of 256, a vocabulary
of 8,000) the decoder is ~40% of a token's matmul work; a training step takes 0.70× the time without it
(docs/benchmark.md). BERT's own pretraining code gathers the masked positions before its head for the
same reason; ModernBERT has it built in (``sparse_prediction``), which is what this switches on there.

Exact: the loss is the family's cross-entropy over the same positions (their mean), the heads have no
dropout, so a seed draws the same masks; the head's matmuls over fewer rows may round their last bit
differently. What changes is the shape of ``logits`` when labels are given: the loop reads ``loss`` only,
evaluation (tasks/mlm) reads the logits of the labelled positions, and distillation, which compares every
position's logits with the teacher's, wraps the model in a class that is not listed. The class is swapped on
the module object for a subclass that carries the family's name, so ``save_pretrained`` still writes the
family's architecture; the state dict, parameters and hooks are untouched.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from torch import nn
from transformers import (
    AlbertForMaskedLM,
    BertForMaskedLM,
    BertForPreTraining,
    BigBirdForMaskedLM,
    DebertaForMaskedLM,
    DebertaV2ForMaskedLM,
    DistilBertForMaskedLM,
    ElectraForMaskedLM,
    FunnelForMaskedLM,
    LongformerForMaskedLM,
    MobileBertForMaskedLM,
    ModernBertForMaskedLM,
    MPNetForMaskedLM,
    RobertaForMaskedLM,
    XLMRobertaForMaskedLM,
)

IGNORE_INDEX = -100  # transformers' masked-LM losses skip this label


def _deberta_head(model: nn.Module) -> nn.Module:
    return model.cls if model.legacy else model.lm_predictions


# The module each family's forward hands the last hidden states to first (the rest of the head follows it,
# row by row); every listed forward is base model -> this head -> cross-entropy over every position.
_HEAD_INPUT: dict[type[nn.Module], Callable[[nn.Module], nn.Module]] = {
    BertForMaskedLM: lambda model: model.cls,
    BertForPreTraining: lambda model: model.cls,  # its heads take (sequence, pooled): the first is narrowed
    RobertaForMaskedLM: lambda model: model.lm_head,
    XLMRobertaForMaskedLM: lambda model: model.lm_head,
    DistilBertForMaskedLM: lambda model: model.vocab_transform,
    ElectraForMaskedLM: lambda model: model.generator_predictions,
    AlbertForMaskedLM: lambda model: model.predictions,
    MPNetForMaskedLM: lambda model: model.lm_head,
    MobileBertForMaskedLM: lambda model: model.cls,
    BigBirdForMaskedLM: lambda model: model.cls,
    FunnelForMaskedLM: lambda model: model.lm_head,
    LongformerForMaskedLM: lambda model: model.lm_head,
    DebertaForMaskedLM: _deberta_head,
    DebertaV2ForMaskedLM: _deberta_head,
}


class _HeadAtLabelledPositions:
    """Mixed in before a listed masked-LM class: with labels, its head sees the labelled positions only."""

    _family: type[nn.Module]

    def forward(self, input_ids=None, *args, labels=None, **kwargs):
        if labels is None or args or kwargs.get("return_dict") is False:
            return super().forward(input_ids, *args, labels=labels, **kwargs)
        labelled = labels != IGNORE_INDEX
        head = _HEAD_INPUT[self._family](self)
        narrowing = head.register_forward_pre_hook(lambda module, inputs: (inputs[0][labelled], *inputs[1:]))
        try:
            outputs = super().forward(input_ids, **kwargs)  # without labels: no loss over every position
        finally:
            narrowing.remove()
        pretraining = "prediction_logits" in outputs
        logits = outputs.prediction_logits if pretraining else outputs.logits
        loss = nn.CrossEntropyLoss()(logits, labels[labelled].to(logits.device))
        if pretraining:  # as BertForPreTraining: a loss only with both labels, the two summed
            next_sentence = kwargs.get("next_sentence_label")
            relationship = outputs.seq_relationship_logits
            loss = None if next_sentence is None else loss + nn.CrossEntropyLoss()(relationship.view(-1, 2), next_sentence.view(-1))
        return dataclasses.replace(outputs, loss=loss)


@functools.cache
def _labelled_positions_class(family: type[nn.Module]) -> type[nn.Module]:
    # The family's own name: save_pretrained writes the class name into config.architectures.
    return type(family.__name__, (_HeadAtLabelledPositions, family),
                {"_family": family, "__module__": family.__module__, "__qualname__": family.__qualname__})


def head_at_labelled_positions(model: nn.Module) -> bool:
    """Makes ``model``'s forward with labels compute its masked-LM head at the labelled positions only, when
    its class is listed; returns whether it did. A peft-wrapped model is looked through to the model it wraps
    (the head, kept trainable by peft's ``modules_to_save``, is narrowed through its wrapper)."""
    masked_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = type(masked_lm)
    if family is ModernBertForMaskedLM:
        # On the object, not its config: the saved model keeps the checkpoint's setting.
        masked_lm.sparse_prediction, masked_lm.sparse_pred_ignore_index = True, IGNORE_INDEX
        return True
    if family not in _HEAD_INPUT:
        return False
    masked_lm.__class__ = _labelled_positions_class(family)
    return True

"""A model's vocabulary head computed at the labelled positions only: masked-LM and sequence-to-sequence.

In:  a model about to train, or a finished run's model about to evaluate.
Out: when it is one of the classes in ``_HEAD_INPUT`` (or ModernBERT's masked-LM), the same model, whose
     forward — when given ``labels`` — feeds its prediction head the last hidden states at the labelled
     positions only (label not -100) and returns those positions' logits, ``[labelled positions, vocab]``
     in row-major order, with the family's loss; without ``labels`` (generation, ``pipeline("fill-mask")``) the
     family's forward, every position's logits (bertpipe's fill-mask prediction passes its mask positions as
     labels). Any other model is untouched. Returns whether it changed the model.

Why: the head ends in the hidden × vocabulary matmul, the largest of a small model, and each family's
forward runs it at every position before a loss that ignores most of them. Masked-LM scores ~15% of the
positions: for the shipped from-scratch config (4 layers of 256, a vocabulary of 8,000) the decoder is
~40% of a token's matmul work, for MiniLM 52%. A translation batch's targets are padded to its longest
(Multi30k, batches of 32: 24% of target positions are padding), and the decoder's projection onto
30,522 (bert2bert MiniLM) to 256,206 (NLLB-200) words ran there too. docs/benchmark.md measures both. BERT's own
pretraining code gathers the masked positions before its head for the same reason; ModernBERT has it
built in (``sparse_prediction``), which is what this switches on there.

Exact: the loss is the family's cross-entropy over the same positions (their mean), the heads have no
dropout, so a seed draws the same masks; the head's matmuls over fewer rows may round their last bit
differently. What changes is the shape of ``logits`` when labels are given: the loop reads ``loss`` only,
masked-LM evaluation (tasks/mlm) reads the labelled positions' logits, and distillation, which compares
every position's logits with the teacher's, wraps the model in a class that is not listed. An
encoder-decoder called without decoder inputs (DataCollatorForSeq2Seq gives them, but not to M2M100 and
NLLB, which have no method to build them) gets them built here from the labels as its forward builds them.
The class is swapped on the module object for a subclass that carries the family's name and forward
signature, so ``save_pretrained`` still writes the family's architecture and ``generate`` sees the
family's inputs; the state dict, parameters and hooks are untouched.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch
from torch import nn
from transformers import (
    AlbertForMaskedLM,
    BartForConditionalGeneration,
    BertForMaskedLM,
    BertForPreTraining,
    BertLMHeadModel,
    BigBirdForMaskedLM,
    DebertaForMaskedLM,
    DebertaV2ForMaskedLM,
    DistilBertForMaskedLM,
    ElectraForMaskedLM,
    EncoderDecoderModel,
    FunnelForMaskedLM,
    LongformerForMaskedLM,
    M2M100ForConditionalGeneration,
    MarianMTModel,
    MBartForConditionalGeneration,
    MobileBertForMaskedLM,
    ModernBertForMaskedLM,
    MPNetForMaskedLM,
    PegasusForConditionalGeneration,
    RobertaForMaskedLM,
    T5ForConditionalGeneration,
    XLMRobertaForMaskedLM,
)
from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right as shift_m2m100_labels_right

IGNORE_INDEX = -100  # the label transformers' losses skip


def _deberta_head(model: nn.Module) -> nn.Module:
    return model.cls if model.legacy else model.lm_predictions


# The module each family's forward hands the last hidden states to first (the rest of the head follows it,
# row by row); every listed forward ends: last hidden states -> this head -> cross-entropy over every position.
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
    # Sequence-to-sequence: the decoder's vocabulary projection, at the target positions that are not padding.
    T5ForConditionalGeneration: lambda model: model.lm_head,  # after T5's rescaling of the decoder output
    BartForConditionalGeneration: lambda model: model.lm_head,  # final_logits_bias is added per row after it
    MBartForConditionalGeneration: lambda model: model.lm_head,
    MarianMTModel: lambda model: model.lm_head,
    PegasusForConditionalGeneration: lambda model: model.lm_head,
    M2M100ForConditionalGeneration: lambda model: model.lm_head,  # NLLB's class too
    EncoderDecoderModel: lambda model: _DECODER_HEAD[type(model.decoder)](model.decoder),
}
# The decoders an EncoderDecoderModel (bert2bert) may hold whose head is listed here.
_DECODER_HEAD: dict[type[nn.Module], Callable[[nn.Module], nn.Module]] = {BertLMHeadModel: lambda decoder: decoder.cls}


def _decoder_inputs_from_labels(model: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """The labels shifted right behind the decoder start, as ``model``'s forward shifts them."""
    if isinstance(model, M2M100ForConditionalGeneration):  # (and NLLB) no method for it: its forward's own shift
        return shift_m2m100_labels_right(labels, model.config.pad_token_id, model.config.decoder_start_token_id)
    return model.prepare_decoder_input_ids_from_labels(labels=labels)


def _forward_with_head_at_labelled_positions(family: type[nn.Module]) -> Callable:
    """``family``'s forward, with labels handing its head the labelled positions only."""

    # wraps: generate() and peft read the family's parameters from the forward's signature.
    @functools.wraps(family.forward)
    def forward(self, input_ids=None, *args, labels=None, **kwargs):
        if labels is None or args or kwargs.get("return_dict") is False:
            return family.forward(self, input_ids, *args, labels=labels, **kwargs)
        if self.config.is_encoder_decoder and kwargs.get("decoder_input_ids") is None and kwargs.get("decoder_inputs_embeds") is None:
            # What the family's forward builds from the labels, which it is not given below.
            kwargs["decoder_input_ids"] = _decoder_inputs_from_labels(self, labels)
        labelled = labels != IGNORE_INDEX
        head = _HEAD_INPUT[family](self)
        narrowing = head.register_forward_pre_hook(lambda module, inputs: (inputs[0][labelled], *inputs[1:]))
        try:
            outputs = family.forward(self, input_ids, **kwargs)  # without labels: no loss over every position
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

    return forward


@functools.cache
def _labelled_positions_class(family: type[nn.Module]) -> type[nn.Module]:
    # The family's own name: save_pretrained writes the class name into config.architectures.
    return type(family.__name__, (family,), {"forward": _forward_with_head_at_labelled_positions(family),
                                            "__module__": family.__module__, "__qualname__": family.__qualname__})


def head_at_labelled_positions(model: nn.Module) -> bool:
    """Makes ``model``'s forward with labels compute its vocabulary head at the labelled positions only, when
    its class is listed; returns whether it did. A peft-wrapped model is looked through to the model it wraps
    (the head, kept trainable by peft's ``modules_to_save``, is narrowed through its wrapper)."""
    wrapped = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = type(wrapped)
    if family is ModernBertForMaskedLM:
        # On the object, not its config: the saved model keeps the checkpoint's setting.
        wrapped.sparse_prediction, wrapped.sparse_pred_ignore_index = True, IGNORE_INDEX
        return True
    if family not in _HEAD_INPUT or (family is EncoderDecoderModel and type(wrapped.decoder) not in _DECODER_HEAD):
        return False
    wrapped.__class__ = _labelled_positions_class(family)
    return True

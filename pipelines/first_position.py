"""The last encoder layer of a BERT-style sequence classifier, computed at the one position its head reads.

In:  a model about to train, or a finished run's model about to predict or evaluate.
Out: when it is one of the sequence classifiers in ``_FIRST_POSITION_LAYERS``' families (its head reads the
     last layer's hidden state at position 0 and nothing else), the same model, its last encoder layer now
     returning that position only (``[batch, 1, hidden]``); any other model untouched. Returns whether it
     changed the model.

Why: BERT's pooler, RoBERTa's, XLM-R's and ELECTRA's classification heads and DistilBERT's ``pre_classifier``
read ``hidden_states[:, 0]`` of the last layer and nothing else. That layer needs keys and values at every
position (position 0 attends to all of them), but its query, attention output, residual and LayerNorm, and
feed-forward only at position 0: at the others they are computed, back-propagated through and thrown away.
That is 5/6 of the last layer's matmul work (all but the key and value projections) and its elementwise work
at every position but one — for a 6-layer MiniLM, about 14% of a training step's matmuls (docs/benchmark.md
measures the step).

Exact: the logits are the whole forward's — the same operations on the rows that are kept (a matmul over
fewer rows may round its last bit differently), and the same gradients reach every parameter. What
changes is what the last layer's dropout draws: masks for position 0 only, so which masks a seed gives
changes (as ``pipelines.dropout``'s do). The layer's class is swapped on the module object (no state,
parameter or hook changes; the model saves and loads as the family's own); its hidden states at
positions 1.. no longer exist, so nothing may ask this model for them (the loop never does: distillation,
whose student is asked for every layer's hidden states, wraps the model in a class that is not listed).

A call this rule cannot take — a key/value cache, cross-attention, an attention implementation other than
``sdpa`` (or its cheap-dropout-mask form, pipelines/dropout.py) or ``eager`` (flash kernels want their own
mask layout, flex attention a block mask) — runs the family's own forward.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertForSequenceClassification, BertLayer, eager_attention_forward
from transformers.models.distilbert.modeling_distilbert import DistilBertForSequenceClassification, TransformerBlock
from transformers.models.electra.modeling_electra import ElectraForSequenceClassification, ElectraLayer
from transformers.models.roberta.modeling_roberta import RobertaForSequenceClassification, RobertaLayer
from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaForSequenceClassification, XLMRobertaLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from pipelines.dropout import SDPA_WITH_CHEAP_MASKS

_ATTENTION_FOR_ONE_QUERY = ("sdpa", "eager", SDPA_WITH_CHEAP_MASKS)


def _takes_one_query(attention: nn.Module, attention_mask) -> bool:
    """Whether position 0's attention can be computed alone here (the module docstring's list of exceptions)."""
    masked_per_query = attention_mask is not None and not (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4)
    return attention.config._attn_implementation in _ATTENTION_FOR_ONE_QUERY and not masked_per_query


def _first_position_context(attention: nn.Module, query: nn.Linear, key: nn.Linear, value: nn.Linear,
                            hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, kwargs) -> torch.Tensor:
    """Position 0's attention over every position, heads concatenated: ``[batch, 1, hidden]``, before the output projection."""
    batch, length = hidden_states.shape[:2]
    head_shape = (-1, attention.attention_head_size)
    queries = query(hidden_states[:, :1]).view(batch, 1, *head_shape).transpose(1, 2)
    keys = key(hidden_states).view(batch, length, *head_shape).transpose(1, 2)
    values = value(hidden_states).view(batch, length, *head_shape).transpose(1, 2)
    if attention_mask is not None and attention_mask.shape[-2] != 1:
        attention_mask = attention_mask[:, :, :1]  # [batch, heads or 1, queries, keys]: position 0's row
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(attention.config._attn_implementation, eager_attention_forward)
    context, _ = attend(attention, queries, keys, values, attention_mask,
                        dropout=attention.dropout.p if attention.training else 0.0, scaling=attention.scaling, **kwargs)
    return context.reshape(batch, 1, -1)


class _FirstPositionOnly:
    """Mixed in before a BERT-style layer class (BERT, RoBERTa, XLM-R, ELECTRA): its forward computes position 0 only."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                encoder_hidden_states: torch.Tensor | None = None, encoder_attention_mask: torch.Tensor | None = None,
                cache=None, **kwargs) -> torch.Tensor:
        attention = self.attention.self
        if cache is not None or encoder_hidden_states is not None or not _takes_one_query(attention, attention_mask):
            return super().forward(hidden_states, attention_mask, encoder_hidden_states,
                                   encoder_attention_mask=encoder_attention_mask, cache=cache, **kwargs)
        context = _first_position_context(attention, attention.query, attention.key, attention.value, hidden_states, attention_mask, kwargs)
        attention_output = self.attention.output(context, hidden_states[:, :1])
        return self.feed_forward_chunk(attention_output)


class FirstPositionBertLayer(_FirstPositionOnly, BertLayer):
    pass


class FirstPositionRobertaLayer(_FirstPositionOnly, RobertaLayer):
    pass


class FirstPositionXLMRobertaLayer(_FirstPositionOnly, XLMRobertaLayer):
    pass


class FirstPositionElectraLayer(_FirstPositionOnly, ElectraLayer):
    pass


class FirstPositionDistilBertLayer(TransformerBlock):
    """DistilBERT's block (post-LayerNorm, projections named ``q_lin``..``out_lin``) computing position 0 only."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        attention = self.attention
        if not _takes_one_query(attention, attention_mask):
            return super().forward(hidden_states, attention_mask, **kwargs)
        context = _first_position_context(attention, attention.q_lin, attention.k_lin, attention.v_lin, hidden_states, attention_mask, kwargs)
        attention_output = self.sa_layer_norm(attention.out_lin(context) + hidden_states[:, :1])
        return self.output_layer_norm(self.ffn(attention_output) + attention_output)


# Each classifier here reads hidden_states[:, 0] of its base model's last layer and nothing else (BertPooler;
# RobertaClassificationHead, shared by XLM-R; ElectraClassificationHead; DistilBERT's pre_classifier): the class,
# exactly, not subclasses, whose heads may read more. Values: the layer class, its position-0 class, and where
# the base model keeps its layers.
_FIRST_POSITION_LAYERS: dict[type[nn.Module], tuple[type[nn.Module], type[nn.Module], str]] = {
    BertForSequenceClassification: (BertLayer, FirstPositionBertLayer, "encoder"),
    RobertaForSequenceClassification: (RobertaLayer, FirstPositionRobertaLayer, "encoder"),
    XLMRobertaForSequenceClassification: (XLMRobertaLayer, FirstPositionXLMRobertaLayer, "encoder"),
    ElectraForSequenceClassification: (ElectraLayer, FirstPositionElectraLayer, "encoder"),
    DistilBertForSequenceClassification: (TransformerBlock, FirstPositionDistilBertLayer, "transformer"),
}


def last_layer_at_first_position(model: nn.Module) -> bool:
    """Makes ``model``'s last encoder layer compute position 0 only when its head reads nothing else; returns whether it did.

    A peft-wrapped model is looked through to the model it wraps (LoRA's layers stay in place inside the
    swapped layer's projections).
    """
    classifier = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = _FIRST_POSITION_LAYERS.get(type(classifier))
    if layers is None or getattr(classifier.config, "is_decoder", False) or getattr(classifier.config, "add_cross_attention", False):
        return False
    family_layer, first_position_layer, stack = layers
    last = getattr(classifier.base_model, stack).layer[-1]
    if type(last) is not family_layer:
        return False
    last.__class__ = first_position_layer
    return True

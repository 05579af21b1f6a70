"""BERT: the encoder stack and its task heads, as transformers ``PreTrainedModel`` classes.

In: ``input_ids``, ``attention_mask`` (1 = token, 0 = padding), ``token_type_ids`` (segments) and, for
training, ``labels`` (or ``start_positions``/``end_positions`` for QA); label value -100 is ignored.
Out: transformers ``ModelOutput`` objects (``.loss`` when labels are given, ``.logits`` or
``.start_logits``/``.end_logits``, and ``.hidden_states``/``.attentions`` on request).

    BertpipeModel                         embeddings -> N x EncoderLayer (-> pooler: tanh(W h_[CLS] + b))
    BertpipeForMaskedLM                   + transform (dense, act, LayerNorm) + decoder tied to token embeddings
    BertpipeForSequenceClassification     + dropout + linear on the pooled [CLS]; loss by ``config.problem_type``
    BertpipeForTokenClassification        + dropout + linear on every position
    BertpipeForQuestionAnswering          + linear to (start, end) logits per position

Head semantics (problem types, loss of QA with out-of-range positions) follow transformers' Bert* classes,
so this model can be swapped in wherever a BertFor* model is used.
"""

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .attention import AdditiveScore, BilinearScore, make_padding_mask
from .configuration import BertpipeBertConfig
from .embeddings import Embeddings
from .layers import EncoderLayer, MaskedBatchNorm, make_norm


class BertpipePreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading conventions shared by the encoder and the encoder-decoder."""

    config_class = BertpipeBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True

    def _init_weights(self, module):
        # transformers' default covers Linear/Embedding (normal, std=initializer_range; zero padding row)
        # and any class called LayerNorm; the modules below are ours. `init.*` skips weights that were loaded.
        super()._init_weights(module)
        if isinstance(module, MaskedBatchNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            init.zeros_(module.running_mean)
            init.ones_(module.running_var)
            init.zeros_(module.num_batches_tracked)
        elif isinstance(module, BilinearScore):
            # Identity W makes the bilinear score start out as the dot score.
            num_heads, d_k, _ = module.weight.shape
            init.copy_(module.weight, torch.eye(d_k, device=module.weight.device).repeat(num_heads, 1, 1))
        elif isinstance(module, AdditiveScore):
            d_k = module.v.shape[-1]
            for weight in (module.w_query, module.w_key, module.v):
                init.normal_(weight, mean=0.0, std=d_k**-0.5)


def _flag(value, default):
    return default if value is None else value


class Encoder(nn.Module):
    """A stack of encoder layers; pre-norm stacks end with one more norm, as their residual stream is raw."""

    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.final_norm = (
            make_norm(config.norm, config.hidden_size, config.layer_norm_eps)
            if config.norm_placement == "pre"
            else None
        )

    def forward(
        self, hidden_states, attention_mask=None, padding_mask=None, output_attentions=False, output_hidden_states=False
    ):
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, weights = layer(hidden_states, attention_mask, padding_mask, output_attentions)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (weights,)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states, padding_mask)
            if output_hidden_states:
                all_hidden_states = all_hidden_states[:-1] + (hidden_states,)
        return hidden_states, all_hidden_states, all_attentions


class Pooler(nn.Module):
    """tanh(W h_[CLS] + b): the sentence vector the sequence classifier reads."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))


class BertpipeModel(BertpipePreTrainedModel):
    """The bare encoder: last hidden states (batch, seq, hidden) and the pooled [CLS] vector."""

    def __init__(self, config: BertpipeBertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = Embeddings(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            max_position_embeddings=config.max_position_embeddings,
            type_vocab_size=config.type_vocab_size,
            position_embedding=config.position_embedding,
            scale=config.scale_embedding,
            layer_norm_eps=config.layer_norm_eps,
            dropout=config.hidden_dropout_prob,
            pad_token_id=config.pad_token_id,
        )
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.token_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.token_embeddings = value

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds")
        output_attentions = _flag(output_attentions, self.config.output_attentions)
        output_hidden_states = _flag(output_hidden_states, self.config.output_hidden_states)
        return_dict = _flag(return_dict, self.config.return_dict)

        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        padding_mask = attention_mask.bool() if attention_mask is not None else None
        additive_mask = make_padding_mask(attention_mask, hidden_states.dtype) if attention_mask is not None else None
        hidden_states, all_hidden_states, all_attentions = self.encoder(
            hidden_states, additive_mask, padding_mask, output_attentions, output_hidden_states
        )
        pooled = self.pooler(hidden_states) if self.pooler is not None else None

        output = BaseModelOutputWithPooling(
            last_hidden_state=hidden_states,
            pooler_output=pooled,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )
        return output if return_dict else output.to_tuple()


def _encode(
    head,
    input_ids,
    attention_mask,
    token_type_ids,
    position_ids,
    inputs_embeds,
    output_attentions,
    output_hidden_states,
):
    return head.bert(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
        output_attentions=output_attentions,
        output_hidden_states=output_hidden_states,
        return_dict=True,
    )


class MaskedLMHead(nn.Module):
    """dense -> act -> LayerNorm -> decoder whose weight is the token embedding matrix (tied) plus a bias."""

    def __init__(self, config):
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states):
        return self.decoder(self.norm(self.activation(self.transform(hidden_states))))


class BertpipeForMaskedLM(BertpipePreTrainedModel):
    _tied_weights_keys = {"mlm_head.decoder.weight": "bert.embeddings.token_embeddings.weight"}

    def __init__(self, config: BertpipeBertConfig):
        super().__init__(config)
        self.bert = BertpipeModel(config, add_pooling_layer=False)
        self.mlm_head = MaskedLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.mlm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.mlm_head.decoder = new_embeddings

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        outputs = _encode(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
        )
        logits = self.mlm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.config.vocab_size), labels.view(-1))  # ignores -100
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if _flag(return_dict, self.config.return_dict) else output.to_tuple()


def _classifier_dropout(config):
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class BertpipeForSequenceClassification(BertpipePreTrainedModel):
    def __init__(self, config: BertpipeBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertpipeModel(config)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        outputs = _encode(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels)
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if _flag(return_dict, self.config.return_dict) else output.to_tuple()

    def _loss(self, logits, labels):
        # Same inference of the problem type as transformers' BertForSequenceClassification.
        if self.config.problem_type is None:
            if self.num_labels == 1:
                self.config.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                self.config.problem_type = "single_label_classification"
            else:
                self.config.problem_type = "multi_label_classification"
        if self.config.problem_type == "regression":
            if self.num_labels == 1:
                return MSELoss()(logits.squeeze(), labels.squeeze().to(logits.dtype))
            return MSELoss()(logits, labels.to(logits.dtype))
        if self.config.problem_type == "single_label_classification":
            return CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        return BCEWithLogitsLoss()(logits, labels.to(logits.dtype))


class BertpipeForTokenClassification(BertpipePreTrainedModel):
    def __init__(self, config: BertpipeBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertpipeModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(_classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        outputs = _encode(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(
                logits.view(-1, self.num_labels), labels.view(-1)
            )  # ignores -100 (sub-words, pads)
        output = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if _flag(return_dict, self.config.return_dict) else output.to_tuple()


class BertpipeForQuestionAnswering(BertpipePreTrainedModel):
    """Extractive QA: a start and an end logit per token."""

    def __init__(self, config: BertpipeBertConfig):
        super().__init__(config)
        self.bert = BertpipeModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
    ):
        outputs = _encode(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits = start_logits.squeeze(-1).contiguous()
        end_logits = end_logits.squeeze(-1).contiguous()

        loss = None
        if start_positions is not None and end_positions is not None:
            if start_positions.dim() > 1:
                start_positions = start_positions.squeeze(-1)
            if end_positions.dim() > 1:
                end_positions = end_positions.squeeze(-1)
            # As BertForQuestionAnswering, positions outside the window (the answer was truncated away) are
            # clamped to one past the end and that index is ignored. -100 is sent there too: transformers would
            # clamp it to 0 and train "answer at [CLS]", contradicting the -100 = ignore convention.
            ignored_index = start_logits.size(1)
            start_positions = start_positions.masked_fill(start_positions == -100, ignored_index).clamp(
                0, ignored_index
            )
            end_positions = end_positions.masked_fill(end_positions == -100, ignored_index).clamp(0, ignored_index)
            loss_fct = CrossEntropyLoss(ignore_index=ignored_index)
            loss = (loss_fct(start_logits, start_positions) + loss_fct(end_logits, end_positions)) / 2

        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if _flag(return_dict, self.config.return_dict) else output.to_tuple()

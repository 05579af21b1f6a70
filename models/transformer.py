"""The encoder-decoder Transformer of "Attention Is All You Need", for translation-style seq2seq.

In: source ``input_ids``/``attention_mask`` and either ``labels`` (target ids, -100 = ignore; the decoder
input is then ``labels`` shifted right behind ``decoder_start_token_id``) or ``decoder_input_ids``.
Out: ``Seq2SeqLMOutput`` with ``.loss`` (token cross-entropy) and ``.logits`` (batch, tgt_len, vocab).

    encoder:  x = Embed(src)·√d + PE;  N x [self-attention, FFN]                   (each with Add & Norm)
    decoder:  y = Embed(tgt)·√d + PE;  N x [masked self-attention, cross-attention over x, FFN]
    output:   softmax(y Eᵀ)  with E the (shared) token embedding matrix

It plugs into transformers' ``generate()`` (greedy, sampling, beam search): ``get_encoder()`` gives the
encoder, and the decoder keeps an ``EncoderDecoderCache`` of projected keys/values so each step only
processes the newest token. ``use_cache=False`` recomputes the whole prefix instead; both give the same
tokens. ``prepare_decoder_input_ids_from_labels`` lets ``DataCollatorForSeq2Seq`` build decoder inputs.
"""

import torch
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers import DynamicCache, EncoderDecoderCache, GenerationMixin
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput

from .attention import make_causal_mask, make_padding_mask, merge_masks
from .bert import BertpipePreTrainedModel, Encoder, _flag
from .configuration import BertpipeTransformerConfig
from .embeddings import Embeddings
from .layers import DecoderLayer, make_norm


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing input: [start, y_1, ..., y_{n-1}]; ignored (-100) labels become padding."""
    if decoder_start_token_id is None:
        raise ValueError("config.decoder_start_token_id must be set to build decoder inputs from labels")
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def _embeddings(config) -> Embeddings:
    # No segments and, as in the paper, no LayerNorm on the embeddings; tokens scaled by √d_model.
    return Embeddings(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=0,
        position_embedding=config.position_embedding,
        layer_norm_eps=config.layer_norm_eps,
        dropout=config.hidden_dropout_prob,
        pad_token_id=config.pad_token_id,
        scale=config.scale_embedding,
        use_norm=False,
    )


class BertpipeTransformerPreTrainedModel(BertpipePreTrainedModel):
    config_class = BertpipeTransformerConfig
    base_model_prefix = "model"


class TransformerEncoder(Encoder):
    """Embeddings + encoder stack; callable on its own, as ``generate()`` does through ``get_encoder()``."""

    def __init__(self, config):
        super().__init__(config)
        self.config = config
        self.embeddings = _embeddings(config)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        output_attentions=False,
        output_hidden_states=False,
        return_dict=True,
    ):
        hidden_states = self.embeddings(input_ids, inputs_embeds=inputs_embeds)
        padding_mask = attention_mask.bool() if attention_mask is not None else None
        additive_mask = make_padding_mask(attention_mask, hidden_states.dtype) if attention_mask is not None else None
        hidden_states, all_hidden_states, all_attentions = super().forward(
            hidden_states, additive_mask, padding_mask, bool(output_attentions), bool(output_hidden_states)
        )
        output = BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, attentions=all_attentions
        )
        return output if return_dict else output.to_tuple()


class TransformerDecoder(nn.Module):
    """Embeddings + decoder stack; returns the last hidden states and (optionally) per-layer extras."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = _embeddings(config)
        self.layers = nn.ModuleList([DecoderLayer(config, layer_idx=i) for i in range(config.num_decoder_layers)])
        self.final_norm = (
            make_norm(config.norm, config.hidden_size, config.layer_norm_eps)
            if config.norm_placement == "pre"
            else None
        )

    def forward(
        self,
        input_ids,
        encoder_hidden_states,
        encoder_attention_mask=None,
        attention_mask=None,
        inputs_embeds=None,
        cache=None,
        output_attentions=False,
        output_hidden_states=False,
    ):
        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embeddings(input_ids, inputs_embeds=inputs_embeds, past_length=past_length)
        dtype, device = hidden_states.dtype, hidden_states.device
        q_len = hidden_states.shape[1]
        kv_len = past_length + q_len

        # attention_mask, when given, covers the whole target so far (cached steps included).
        self_mask = merge_masks(
            make_causal_mask(q_len, kv_len, dtype, device),
            make_padding_mask(attention_mask, dtype) if attention_mask is not None else None,
        )
        cross_mask = make_padding_mask(encoder_attention_mask, dtype) if encoder_attention_mask is not None else None
        # Which current positions are real tokens, for BatchNorm's statistics. Without an explicit mask,
        # padding is recognised by pad_token_id except at position 0, where the start token may equal pad.
        if attention_mask is not None:
            padding_mask = attention_mask[:, -q_len:].bool()
        elif input_ids is not None and self.config.pad_token_id is not None and past_length == 0:
            padding_mask = input_ids != self.config.pad_token_id
            padding_mask[:, 0] = True
        else:
            padding_mask = None

        all_hidden_states = (hidden_states,) if output_hidden_states else None
        self_attentions = () if output_attentions else None
        cross_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, self_weights, cross_weights = layer(
                hidden_states,
                encoder_hidden_states,
                self_mask,
                cross_mask,
                padding_mask,
                output_attentions,
                cache=cache,  # by keyword, so that gradient checkpointing can drop it
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                self_attentions += (self_weights,)
                cross_attentions += (cross_weights,)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states, padding_mask)
            if output_hidden_states:
                all_hidden_states = all_hidden_states[:-1] + (hidden_states,)
        return hidden_states, all_hidden_states, self_attentions, cross_attentions


class BertpipeTransformerModel(BertpipeTransformerPreTrainedModel):
    """Encoder + decoder without the output projection; returns ``Seq2SeqModelOutput``."""

    # One token embedding matrix for source and target (a joint vocabulary, as in the paper).
    _tied_weights_keys = {"decoder.embeddings.token_embeddings.weight": "encoder.embeddings.token_embeddings.weight"}

    def __init__(self, config: BertpipeTransformerConfig):
        super().__init__(config)
        self.encoder = TransformerEncoder(config)
        self.decoder = TransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.encoder.embeddings.token_embeddings

    def set_input_embeddings(self, value):
        self.encoder.embeddings.token_embeddings = value
        self.decoder.embeddings.token_embeddings = value

    def get_encoder(self, modality=None):
        return self.encoder

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        token_type_ids=None,
    ):
        # token_type_ids is accepted and ignored (there are no segments) so that the output of BERT-style
        # tokenizers can be passed to the model and to generate() unchanged.
        output_attentions = _flag(output_attentions, self.config.output_attentions)
        output_hidden_states = _flag(output_hidden_states, self.config.output_hidden_states)
        return_dict = _flag(return_dict, self.config.return_dict)
        use_cache = _flag(use_cache, self.config.use_cache) and not self.training

        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids, attention_mask, inputs_embeds, output_attentions, output_hidden_states, return_dict=True
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)

        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        elif not use_cache:
            cache = None

        hidden_states, all_hidden_states, self_attentions, cross_attentions = self.decoder(
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            attention_mask=decoder_attention_mask,
            inputs_embeds=decoder_inputs_embeds,
            cache=cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        output = Seq2SeqModelOutput(
            last_hidden_state=hidden_states,
            cache=cache,
            decoder_hidden_states=all_hidden_states,
            decoder_attentions=self_attentions,
            cross_attentions=cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class BertpipeTransformerForConditionalGeneration(BertpipeTransformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder with the output projection tied to the shared embeddings; works with ``generate()``."""

    _tied_weights_keys = {"lm_head.weight": "model.encoder.embeddings.token_embeddings.weight"}

    def __init__(self, config: BertpipeTransformerConfig):
        super().__init__(config)
        self.model = BertpipeTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_encoder(self, modality=None):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        token_type_ids=None,
    ):
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.config.vocab_size), labels.view(-1))  # ignores -100

        output = Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )
        return output if _flag(return_dict, self.config.return_dict) else output.to_tuple()

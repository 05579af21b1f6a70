"""Configurations of the project's own BERT encoder and encoder-decoder Transformer.

In: architecture keyword arguments (BertConfig names where BertConfig has them, plus the five switches
below), typically via ``AutoConfig.for_model("bertpipe_bert", hidden_size=..., num_labels=...)``.
Out: ``PreTrainedConfig`` objects that serialise to ``config.json`` and back unchanged.

Switches that are ours, not BertConfig's:

- ``position_embedding``: ``"learned"`` (a trained table, BERT) or ``"sinusoidal"`` (the fixed
  sin/cos code of "Attention Is All You Need").
- ``scale_embedding`` (BERT; always on in the encoder-decoder): token embeddings times √hidden_size, as
  the paper does so that the fixed sinusoids do not drown them.
- ``attention_score``: ``"dot"`` (q·k/√d_k), ``"bilinear"`` (qᵀWk/√d_k) or ``"additive"`` (vᵀtanh(W₁q + W₂k)).
- ``norm``: ``"layer"`` (LayerNorm) or ``"batch"`` (BatchNorm over the non-padding positions only).
- ``norm_placement``: ``"post"`` (norm(x + sublayer(x)), as in BERT) or ``"pre"`` (x + sublayer(norm(x))).
"""

import copy
from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

PositionEmbedding = Literal["learned", "sinusoidal"]
AttentionScore = Literal["dot", "bilinear", "additive"]
NormKind = Literal["layer", "batch"]
NormPlacement = Literal["post", "pre"]


def _check_heads(hidden_size: int, num_attention_heads: int) -> None:
    if hidden_size % num_attention_heads != 0:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_attention_heads}) "
            "so that every head gets d_k = hidden_size / num_attention_heads dimensions"
        )


@strict
class BertpipeBertConfig(PreTrainedConfig):
    """Encoder-only (BERT) configuration; defaults are bert-base-uncased."""

    model_type = "bertpipe_bert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    tie_word_embeddings: bool = True
    position_embedding: PositionEmbedding = "learned"
    # BERT leaves token embeddings at their init scale (std 0.02); next to fixed sinusoids in [-1, 1]
    # they start as a few percent of the sum, so sinusoidal runs want the paper's sqrt(d_model) scale.
    scale_embedding: bool = False
    attention_score: AttentionScore = "dot"
    norm: NormKind = "layer"
    norm_placement: NormPlacement = "post"

    def validate_architecture(self):
        """Called by ``@strict`` after construction."""
        _check_heads(self.hidden_size, self.num_attention_heads)


@strict
class BertpipeTransformerConfig(PreTrainedConfig):
    """Encoder-decoder configuration; defaults are the base model of Vaswani et al. (2017).

    ``num_hidden_layers`` is the encoder depth and ``num_decoder_layers`` the decoder depth; source and
    target share one vocabulary, one embedding matrix and the output projection (``tie_word_embeddings``).
    """

    model_type = "bertpipe_transformer"
    attribute_map = {
        "d_model": "hidden_size",
        "encoder_layers": "num_hidden_layers",
        "decoder_layers": "num_decoder_layers",
    }

    vocab_size: int = 32000
    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_decoder_layers: int = 6
    num_attention_heads: int = 8
    intermediate_size: int = 2048
    hidden_act: str = "relu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.0
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    # The paper multiplies embeddings by √d_model so they are not drowned by the positional code.
    scale_embedding: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    is_encoder_decoder: bool = True
    use_cache: bool = True
    tie_word_embeddings: bool = True
    position_embedding: PositionEmbedding = "sinusoidal"
    attention_score: AttentionScore = "dot"
    norm: NormKind = "layer"
    norm_placement: NormPlacement = "post"

    def validate_architecture(self):
        """Called by ``@strict`` after construction."""
        _check_heads(self.hidden_size, self.num_attention_heads)

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """The decoder's view when asked for it: transformers sizes generation caches from
        ``get_text_config(decoder=True).num_hidden_layers``, which here must be the decoder depth."""
        if decoder and not encoder and self.num_decoder_layers != self.num_hidden_layers:
            decoder_view = copy.deepcopy(self)
            decoder_view.num_hidden_layers = self.num_decoder_layers
            return decoder_view
        return super().get_text_config(decoder=decoder, encoder=encoder)

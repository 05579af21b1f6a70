"""Position-wise feed-forward network, residual Add & Norm, and the encoder/decoder layers built from them.

In: hidden states (batch, seq, hidden), an additive attention mask (see ``attention.py``) and a boolean
``padding_mask`` (batch, seq), True at real tokens, which BatchNorm needs to leave padding out of its
statistics.
Out: hidden states of the same shape (plus attention weights when asked for).

    FFN(x)            = W₂ · act(W₁ x + b₁) + b₂
    post-norm (BERT)  : x ← Norm(x + Dropout(Sublayer(x)))
    pre-norm          : x ← x + Dropout(Sublayer(Norm(x)))      (plus one final Norm after the stack)
"""

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import MultiHeadAttention


class FeedForward(nn.Module):
    """W₂ · act(W₁ x + b₁) + b₂ applied to every position independently."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        self.w_1 = nn.Linear(hidden_size, intermediate_size)
        self.w_2 = nn.Linear(intermediate_size, hidden_size)
        # transformers' "gelu" is the exact erf GELU that BERT checkpoints were trained with.
        self.activation = ACT2FN[hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.activation(self.w_1(x)))


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm that accepts (and ignores) the padding mask, so both norms share one call signature."""

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x)


class MaskedBatchNorm(nn.Module):
    """BatchNorm over the hidden features whose statistics come from real tokens only.

    Plain BatchNorm1d would average padding vectors into the mean and variance, so a sentence's
    representation would depend on how much padding its batch had. Here, in training, mean and variance
    are taken over the positions where ``padding_mask`` is True; running statistics (momentum 0.1,
    unbiased variance, as nn.BatchNorm1d) are used in eval mode. Padding positions are still normalised
    (with the real tokens' statistics) so the output keeps its shape; attention masks them downstream.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.training:
            real = x.reshape(-1, x.shape[-1]) if padding_mask is None else x[padding_mask.bool()]
            mean = real.mean(dim=0)
            var = real.var(dim=0, unbiased=False)
            with torch.no_grad():
                count = real.shape[0]
                unbiased_var = var * count / max(count - 1, 1)
                self.running_mean.lerp_(mean.detach(), self.momentum)
                self.running_var.lerp_(unbiased_var.detach(), self.momentum)
                self.num_batches_tracked += 1
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


def make_norm(kind: str, hidden_size: int, eps: float) -> nn.Module:
    if kind == "layer":
        return LayerNorm(hidden_size, eps=eps)
    if kind == "batch":
        # BatchNorm's customary eps; BERT's 1e-12 is tuned for LayerNorm on unit-scale features.
        return MaskedBatchNorm(hidden_size, eps=max(eps, 1e-5))
    raise ValueError(f"norm must be 'layer' or 'batch', got {kind!r}")


class ResidualNorm(nn.Module):
    """Add & Norm around one sublayer, for either placement.

    Used in two steps so the sublayer can return extra outputs (attention weights):
    ``h = rn.sublayer_input(x, mask)``, ``y = sublayer(h)``, ``x = rn.residual(x, y, mask)``.
    """

    def __init__(self, hidden_size: int, norm: str, placement: str, eps: float, dropout: float):
        super().__init__()
        if placement not in ("post", "pre"):
            raise ValueError(f"norm_placement must be 'post' or 'pre', got {placement!r}")
        self.pre_norm = placement == "pre"
        self.norm = make_norm(norm, hidden_size, eps)
        self.dropout = nn.Dropout(dropout)

    def sublayer_input(self, x: torch.Tensor, padding_mask: torch.Tensor | None) -> torch.Tensor:
        return self.norm(x, padding_mask) if self.pre_norm else x

    def residual(
        self, x: torch.Tensor, sublayer_output: torch.Tensor, padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        summed = x + self.dropout(sublayer_output)
        return summed if self.pre_norm else self.norm(summed, padding_mask)


class EncoderLayer(GradientCheckpointingLayer):
    """Self-attention then FFN, each wrapped in Add & Norm.

    The base class recomputes the layer in the backward pass when ``model.gradient_checkpointing_enable()``
    was called (a BatchNorm layer then updates its running statistics twice per step).
    """

    def __init__(self, config):
        super().__init__()
        args = (
            config.hidden_size,
            config.norm,
            config.norm_placement,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
        )
        self.self_attention = MultiHeadAttention(
            config.hidden_size, config.num_attention_heads, config.attention_probs_dropout_prob, config.attention_score
        )
        self.attention_norm = ResidualNorm(*args)
        self.ffn = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.ffn_norm = ResidualNorm(*args)

    def forward(self, x, attention_mask=None, padding_mask=None, output_attentions=False):
        h = self.attention_norm.sublayer_input(x, padding_mask)
        attended, weights = self.self_attention(h, attention_mask=attention_mask, output_attentions=output_attentions)
        x = self.attention_norm.residual(x, attended, padding_mask)
        x = self.ffn_norm.residual(x, self.ffn(self.ffn_norm.sublayer_input(x, padding_mask)), padding_mask)
        return x, weights


class DecoderLayer(GradientCheckpointingLayer):
    """Masked self-attention, cross-attention over the encoder output, then FFN; each with Add & Norm."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        args = (
            config.hidden_size,
            config.norm,
            config.norm_placement,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
        )
        heads, p_attn, score = config.num_attention_heads, config.attention_probs_dropout_prob, config.attention_score
        self.self_attention = MultiHeadAttention(config.hidden_size, heads, p_attn, score)
        self.self_attention_norm = ResidualNorm(*args)
        self.cross_attention = MultiHeadAttention(config.hidden_size, heads, p_attn, score, is_cross_attention=True)
        self.cross_attention_norm = ResidualNorm(*args)
        self.ffn = FeedForward(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.ffn_norm = ResidualNorm(*args)

    def forward(
        self,
        x,
        encoder_hidden_states,
        self_attention_mask=None,
        cross_attention_mask=None,
        padding_mask=None,
        output_attentions=False,
        cache=None,
    ):
        h = self.self_attention_norm.sublayer_input(x, padding_mask)
        attended, self_weights = self.self_attention(
            h,
            attention_mask=self_attention_mask,
            output_attentions=output_attentions,
            cache=cache,
            layer_idx=self.layer_idx,
        )
        x = self.self_attention_norm.residual(x, attended, padding_mask)

        h = self.cross_attention_norm.sublayer_input(x, padding_mask)
        attended, cross_weights = self.cross_attention(
            h,
            key_value_states=encoder_hidden_states,
            attention_mask=cross_attention_mask,
            output_attentions=output_attentions,
            cache=cache,
            layer_idx=self.layer_idx,
        )
        x = self.cross_attention_norm.residual(x, attended, padding_mask)
        x = self.ffn_norm.residual(x, self.ffn(self.ffn_norm.sublayer_input(x, padding_mask)), padding_mask)
        return x, self_weights, cross_weights

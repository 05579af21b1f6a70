"""Attention: masks, score functions and multi-head attention.

In: query states (batch, q_len, hidden), key/value states (batch, kv_len, hidden) and an additive mask
broadcastable to (batch, heads, q_len, kv_len).
Out: (batch, q_len, hidden) context vectors and, on request, the attention weights
(batch, heads, q_len, kv_len).

    Attention(Q, K, V) = softmax(score(Q, K) + mask) V

with one of three score functions per head (q a query row, k a key row, d_k = hidden / heads):

    dot       q·k / √d_k                 (Vaswani et al., 2017; Luong "dot" with scaling)
    bilinear  qᵀ W k / √d_k              (Luong "general"; W starts as the identity, i.e. as dot)
    additive  vᵀ tanh(W₁ q + W₂ k)       (Bahdanau et al., 2015)

Masks are additive: 0 where attention is allowed and the dtype's most negative finite number where it is
not. A finite value (not −inf) keeps softmax defined on a row where everything is masked (it becomes
uniform instead of NaN); such rows only occur at padding queries, whose outputs are ignored anyway.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def make_padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(batch, kv_len) 1 = real token, 0 = padding  ->  additive (batch, 1, 1, kv_len) mask over keys."""
    keep = attention_mask[:, None, None, :].bool()
    return torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device).masked_fill(~keep, torch.finfo(dtype).min)


def make_causal_mask(q_len: int, kv_len: int, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    """Look-ahead mask (1, 1, q_len, kv_len): query i may see keys 0..past+i, where past = kv_len - q_len.

    ``past`` > 0 when cached keys of earlier steps precede the current queries during generation.
    """
    past = kv_len - q_len
    allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=past)
    mask = torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def merge_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Combine additive masks by broadcasting; the minimum keeps "masked" at dtype-min without overflowing."""
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    merged = present[0]
    for mask in present[1:]:
        merged = torch.minimum(merged, mask)
    return merged


class DotScore(nn.Module):
    """q·k / √d_k; no parameters."""

    def __init__(self, num_heads: int, d_k: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(d_k)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.matmul(q, k.transpose(-1, -2)) * self.scale


class BilinearScore(nn.Module):
    """qᵀ W k / √d_k with one (d_k, d_k) matrix W per head."""

    def __init__(self, num_heads: int, d_k: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(d_k)
        self.weight = nn.Parameter(torch.eye(d_k).repeat(num_heads, 1, 1))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        # (b,h,q,d) x (h,d,e) -> (b,h,q,e): transform the queries once, then an ordinary dot with the keys.
        q_w = torch.einsum("bhqd,hde->bhqe", q, self.weight)
        return torch.matmul(q_w, k.transpose(-1, -2)) * self.scale


class AdditiveScore(nn.Module):
    """vᵀ tanh(W₁ q + W₂ k) per head, with W₁, W₂ of shape (d_k, d_k) and v of size d_k.

    Memory is O(batch·heads·q_len·kv_len·d_k) because tanh does not factorise; fine for the sequence
    lengths this project fine-tunes on, but the reason the dot score is the default.
    """

    def __init__(self, num_heads: int, d_k: int):
        super().__init__()
        self.w_query = nn.Parameter(torch.empty(num_heads, d_k, d_k))
        self.w_key = nn.Parameter(torch.empty(num_heads, d_k, d_k))
        self.v = nn.Parameter(torch.empty(num_heads, d_k))
        for weight in (self.w_query, self.w_key):
            nn.init.normal_(weight, std=d_k**-0.5)
        nn.init.normal_(self.v, std=d_k**-0.5)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q_proj = torch.einsum("bhqd,hde->bhqe", q, self.w_query)
        k_proj = torch.einsum("bhkd,hde->bhke", k, self.w_key)
        hidden = torch.tanh(q_proj[:, :, :, None, :] + k_proj[:, :, None, :, :])  # (b,h,q,k,e)
        return torch.einsum("bhqke,he->bhqk", hidden, self.v)


SCORE_FUNCTIONS = {"dot": DotScore, "bilinear": BilinearScore, "additive": AdditiveScore}


def scaled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score: nn.Module,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit path: softmax(score(q, k) + mask) v, returning (context, weights) per head."""
    scores = score(q, k)
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    context = torch.matmul(F.dropout(weights, p=dropout) if dropout > 0 else weights, v)
    return context, weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention with per-head projections (packed as one Linear each) and an output projection.

    Self-attention when ``key_value_states`` is None, cross-attention otherwise. With ``cache`` (a
    transformers ``EncoderDecoderCache``) and ``layer_idx``, projected keys/values are stored so that
    generation only feeds the newest token; cross-attention keys/values are computed once per sequence.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        dropout: float,
        attention_score: str = "dot",
        is_cross_attention: bool = False,
    ):
        super().__init__()
        if hidden_size % num_heads != 0:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.d_k = hidden_size // num_heads
        self.dropout = dropout
        self.attention_score = attention_score
        self.is_cross_attention = is_cross_attention
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.output = nn.Linear(hidden_size, hidden_size)
        self.score = SCORE_FUNCTIONS[attention_score](num_heads, self.d_k)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_k).transpose(1, 2)

    def _keys_values(self, source: torch.Tensor, cache, layer_idx: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        if cache is not None and self.is_cross_attention and cache.is_updated.get(layer_idx):
            layer = cache.cross_attention_cache.layers[layer_idx]
            return layer.keys, layer.values
        k = self._split_heads(self.key(source))
        v = self._split_heads(self.value(source))
        if cache is not None:
            if self.is_cross_attention:
                k, v = cache.cross_attention_cache.update(k, v, layer_idx)
                cache.is_updated[layer_idx] = True
            else:
                k, v = cache.self_attention_cache.update(k, v, layer_idx)
        return k, v

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        cache=None,
        layer_idx: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, q_len, hidden = hidden_states.shape
        q = self._split_heads(self.query(hidden_states))
        source = hidden_states if key_value_states is None else key_value_states
        k, v = self._keys_values(source, cache, layer_idx)
        dropout = self.dropout if self.training else 0.0
        if attention_mask is not None and attention_mask.dtype != q.dtype:
            # Under autocast the projections can be half precision while the mask was built in float32;
            # clamp so that float32's minimum does not round to -inf (NaN on fully masked rows).
            attention_mask = attention_mask.to(q.dtype).clamp(min=torch.finfo(q.dtype).min)

        if self.attention_score == "dot" and not output_attentions:
            # Fused kernel; same maths as scaled_attention with DotScore, without materialising the weights.
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attention_mask, dropout_p=dropout, scale=self.score.scale
            )
            weights = None
        else:
            context, weights = scaled_attention(q, k, v, self.score, attention_mask, dropout)

        context = context.transpose(1, 2).reshape(batch, q_len, hidden)
        return self.output(context), weights

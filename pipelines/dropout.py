"""Dropout on the CPU at about half of torch's cost, with torch's distribution and scaling.

In:  a model about to train on the CPU.
Out: the same model, its ``nn.Dropout`` modules (exactly that class) now drawing each keep mask as one
     32-bit integer per element from torch's default generator (:func:`draw_cheap_dropout_masks`: returns
     how many), and its SDPA attention drawing its dropout masks the same way
     (:func:`draw_cheap_attention_dropout_masks`: returns how many configs it switched); every other
     module and every GPU tensor is untouched.

Why: on the CPU, ``nn.Dropout`` fills its mask with ``bernoulli_``, which takes a double (two 32-bit
draws of torch's one mt19937 generator) per element, serially: 5 ns per element, 9% of a fine-tuning
step on an AMX Xeon where the matmuls are cheap (docs/benchmark.md). One 32-bit draw per element,
compared with ``p`` scaled to 2³¹, draws the mask in a third of the time (a whole call, forward and
backward: ~1,000 → 550 µs for a 32 × 13 × 384 bf16 hidden state).

What stays as torch has it: an element is dropped with probability ``round(p · 2³¹) / 2³¹`` (``p`` to
within 2⁻³², where torch's double draw has 2⁻⁵³), and kept elements are scaled by ``1 / (1 - p)``
rounded to the input's dtype, as torch's CPU dropout does (``noise.div_(1 - p)`` in that dtype). The
draws come from torch's default CPU generator, so ``set_seed`` and a checkpoint's saved RNG state make
a run and its resume draw the same masks. What changes is which masks a seed gives: a run is not bit
for bit the run an earlier bertpipe (or the Trainer) trained with that seed. ``F.dropout`` called
directly keeps torch's own kernel.

Attention dropout too (:func:`attention_with_cheap_masks`): a model whose attention runs through
transformers' ``sdpa`` implementation is switched to one that is SDPA everywhere but in a CPU training
step with attention dropout. There, SDPA must leave its fused kernel for its math path (scores, softmax,
dropout, product), which draws the dropout mask with ``bernoulli_`` and guards every softmax row
against being fully masked (an ``all`` and a ``where`` over every head's scores), and autograd then
walks back through each of those steps. Written out here with a :func:`keep_mask` mask and its own
backward (:class:`_DroppedOutAttention`), a packed CoNLL-2003 batch's attention (7 rows × 12 heads ×
52², forward and backward) takes 0.60× the math path's time (5.4 → 3.4 ms); a packed NER training step
0.98× for writing it out and 0.98× again for its own backward (docs/benchmark.md). The steps are the
math path's (float32 for bf16 or fp16 inputs, as it computes; a query with no key left gets zeros);
causal attention without a mask, position biases, grouped key/value heads, a mask that takes a gradient
and returned attention weights go to SDPA as before.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

# The attention implementation's name: models switched to it build SDPA's masks and call attention_with_cheap_masks.
SDPA_WITH_CHEAP_MASKS = "bertpipe_sdpa_cheap_dropout_masks"


def keep_mask(shape: Sequence[int], p: float) -> torch.Tensor:
    """A boolean CPU tensor of ``shape``, each element False (dropped) with probability ``p``, independently."""
    # aten.random on int32 draws one 32-bit word per element and keeps 31 bits: uniform on [0, 2**31).
    # The out-of-place op, not Tensor.random_: torch.compile traces it into the graph where random_
    # breaks the graph in two, and a model split at every dropout sums its gradients in another order.
    bits = torch.ops.aten.random.default(torch.empty(shape, dtype=torch.int32))
    return bits >= round(p * (1 << 31))


class CheapMaskDropout(nn.Dropout):
    """``nn.Dropout`` whose CPU masks come from :func:`keep_mask`; elsewhere (GPU, eval, p of 0 or 1) it is ``nn.Dropout``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or not 0 < self.p < 1 or input.device.type != "cpu":
            return super().forward(input)
        noise = keep_mask(input.shape, self.p).to(input.dtype).div_(1 - self.p)
        return input.mul_(noise) if self.inplace else input * noise


def draw_cheap_dropout_masks(model: nn.Module) -> int:
    """Makes ``model``'s ``nn.Dropout`` modules :class:`CheapMaskDropout`, in place; returns how many.

    The class is swapped on the module objects (no state, parameters or hooks change, and the model
    saves as before); subclasses of ``nn.Dropout`` keep their own forward.
    """
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = CheapMaskDropout
            swapped += 1
    return swapped


def _written_out_here(module: nn.Module, query: torch.Tensor, attention_mask, dropout: float, is_causal: bool | None,
                      kwargs) -> bool:
    """Whether this call is one :func:`attention_with_cheap_masks` writes out (the module docstring's cases)."""
    if not 0 < dropout < 1 or query.device.type != "cpu" or not torch.is_grad_enabled():
        return False
    if getattr(module, "num_key_value_groups", 1) > 1 or kwargs.get("output_attentions"):
        return False
    if any(kwargs.get(key) is not None for key in ("position_bias", "softcap", "sliding_window")):
        return False
    if attention_mask is None:
        # transformers' rule: no mask and a causal module means SDPA's is_causal (its own kernel's mask).
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        return not (query.shape[2] > 1 and causal)
    # A mask that takes a gradient (a learned bias) is SDPA's: the written-out backward gives masks none.
    return (attention_mask.dtype == torch.bool or attention_mask.is_floating_point()) and not attention_mask.requires_grad


def attention_with_cheap_masks(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                               is_causal: bool | None = None, **kwargs):
    """transformers' ``sdpa`` attention, its dropout masks drawn by :func:`keep_mask` on the CPU (module docstring).

    In: ``query``, ``key``, ``value`` as ``[batch, heads, length, head size]``; the mask SDPA would get.
    Out: ``([batch, query length, heads, head size], None)``, as transformers' attention functions return.
    """
    if not _written_out_here(module, query, attention_mask, dropout, is_causal, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    with torch.autocast(device_type="cpu", enabled=False):  # the math path computes reduced precisions in float32
        query_, key_, value_ = (tensor.float() for tensor in (query, key, value))
        bias = rows_kept = None
        if attention_mask is not None:
            # Masked keys at the dtype's lowest value, not -inf: exp() makes them exactly 0 either way, but a
            # query with no key left then gets a finite softmax row (not NaN), which rows_kept zeroes, as the
            # math path's softmax gives such a query zeros; the guard costs mask-sized work only.
            lowest = torch.finfo(torch.float32).min
            if attention_mask.dtype == torch.bool:
                bias = torch.zeros(attention_mask.shape).masked_fill_(attention_mask.logical_not(), lowest)
                has_key = attention_mask.any(dim=-1, keepdim=True)
            else:
                bias = attention_mask.float().clamp_min(lowest)
                has_key = (attention_mask > float("-inf")).any(dim=-1, keepdim=True)
            rows_kept = has_key.float()
        keep = keep_mask(query.shape[:-1] + key.shape[-2:-1], dropout)
        output = _DroppedOutAttention.apply(query_, key_, value_, bias, keep, rows_kept, scale, 1 / (1 - dropout))
    return output.to(query.dtype).transpose(1, 2).contiguous(), None


class _DroppedOutAttention(torch.autograd.Function):
    """``softmax(query · keyᵀ · scale + bias) ⊙ keep / (1 - p) · value``, each query's row times ``rows_kept``.

    Written with its own backward because autograd, given the same steps, does more passes on the CPU:
    it copies the scores for the mask, multiplies them by the scale, converts and rescales the mask and
    pushes the gradient back through each of those, all over ``[batch, heads, length, length]``. Here
    the scale goes into the query, ``1 / (1 - p)`` and the no-key guard into the ``[.., length, head
    size]`` output, and masked keys need no backward step (their probabilities are exactly 0, so
    softmax's backward gives them 0). A packed CoNLL-2003 batch's attention, forward and backward:
    4.9 ms with autograd, 3.4 ms with this (docs/benchmark.md). Inputs float32 ``[batch, heads,
    length, size]``; ``keep`` boolean ``[batch, heads, queries, keys]``; ``bias`` and ``rows_kept``
    broadcast to the scores and to ``[batch, heads, queries, 1]``, or None.
    """

    @staticmethod
    def forward(ctx, query, key, value, bias, keep, rows_kept, scale: float, keep_scale: float):
        # Contiguous operands: the projections hand over [batch, length, heads, size] transposed, and a
        # batched matmul on that layout copies each head's matrix on its own.
        query = query.mul(scale).contiguous()
        key, value = key.contiguous(), value.contiguous()
        scores = torch.matmul(query, key.transpose(-1, -2))
        if bias is not None:
            scores.add_(bias)
        probabilities = scores.softmax(dim=-1)
        kept = probabilities * keep
        output_scale = keep_scale if rows_kept is None else rows_kept * keep_scale
        ctx.save_for_backward(query, key, value, probabilities, kept, keep, rows_kept)
        ctx.scale, ctx.keep_scale = scale, keep_scale
        return torch.matmul(kept, value).mul_(output_scale)

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, probabilities, kept, keep, rows_kept = ctx.saved_tensors
        output_scale = ctx.keep_scale if rows_kept is None else rows_kept * ctx.keep_scale
        grad_output = grad_output.mul(output_scale).contiguous()
        grad_value = torch.matmul(kept.transpose(-1, -2), grad_output)
        grad_kept = torch.matmul(grad_output, value.transpose(-1, -2)).mul_(keep)
        grad_scores = torch._softmax_backward_data(grad_kept, probabilities, -1, probabilities.dtype)
        grad_query = torch.matmul(grad_scores, key).mul_(ctx.scale)
        grad_key = torch.matmul(grad_scores.transpose(-1, -2), query)
        return grad_query, grad_key, grad_value, None, None, None, None, None


def draw_cheap_attention_dropout_masks(model: nn.Module) -> int:
    """Switches every config in ``model`` whose attention is ``sdpa`` to :func:`attention_with_cheap_masks`; returns how many.

    The config's ``_attn_implementation`` is not saved with it (transformers drops the key), so a saved
    model loads as SDPA again.
    """
    AttentionInterface.register(SDPA_WITH_CHEAP_MASKS, attention_with_cheap_masks)
    AttentionMaskInterface.register(SDPA_WITH_CHEAP_MASKS, sdpa_mask)
    configs = {id(module.config): module.config for module in model.modules()
               if isinstance(getattr(module, "config", None), PretrainedConfig)}
    switched = 0
    for config in configs.values():
        if config._attn_implementation == "sdpa":
            config._attn_implementation = SDPA_WITH_CHEAP_MASKS
            switched += 1
    return switched

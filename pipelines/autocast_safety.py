"""Model families whose transformers code fails under a bf16 or fp16 autocast, made to run there.

In:  a loaded model (a task's, a distillation's student or teacher, a peft wrapper: every submodule is looked at;
     an ONNX export's session runs no autocast and is left alone).
Out: the same object, each module that would fail given a subclass that does not (``module.__class__`` swapped:
     the weights, state-dict keys and saved class are the family's own); how many were swapped.

DeBERTa (v1): ``DisentangledSelfAttention`` adds its fp32 ``q_bias``/``v_bias`` parameters to the bf16 output of
its projection, which makes the query fp32, and then fills the masked scores (bf16, from an autocast matmul) with
``torch.finfo(query.dtype).min``: float32's lowest value, which bf16 and fp16 cannot hold, so every forward under
``train.mixed_precision=bf16`` (``auto`` on a CPU with native bf16, or a GPU) and ``--precision bf16`` stopped with
"value cannot be converted to type c10::BFloat16 without overflow". The subclass casts the biases to the autocast
dtype first, as autocast does with a ``Linear`` layer's bias; outside an autocast it computes what the family's
class does, bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

try:
    from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention
except ImportError:  # a transformers without DeBERTa v1: nothing to mend
    DisentangledSelfAttention = None


def _autocast_dtype(tensor: torch.Tensor) -> torch.dtype | None:
    device = tensor.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


if DisentangledSelfAttention is not None:

    class AutocastSafeDisentangledSelfAttention(DisentangledSelfAttention):
        """DeBERTa's attention with its query and value biases in the autocast dtype (module docstring)."""

        def transpose_for_scores(self, x: torch.Tensor) -> torch.Tensor:
            # The forward passes its fp32 bias parameters through here before adding them to the projection.
            dtype = _autocast_dtype(x)
            if dtype is not None and x.dtype == torch.float32:
                x = x.to(dtype)
            return super().transpose_for_scores(x)


def make_autocast_safe(model: nn.Module) -> int:
    """Swaps the class of each module of ``model`` that fails under autocast (module docstring); returns how many."""
    if DisentangledSelfAttention is None or not isinstance(model, nn.Module):  # an ONNX export runs no autocast
        return 0
    swapped = 0
    for module in model.modules():
        if type(module) is DisentangledSelfAttention:
            module.__class__ = AutocastSafeDisentangledSelfAttention
            swapped += 1
    return swapped

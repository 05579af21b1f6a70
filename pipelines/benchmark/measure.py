"""What is measured: this machine's matmul peak, FLOP-bearing parameters, peak RSS, trained samples and tokens.

In:  a dtype and time budget (the matmul probe), a model (its parameters; the forward pre-hook that counts).
Out: FLOP/s of the fastest square matmul per dtype (``MatmulPeak``), the non-embedding parameter count the
     6·N·T FLOP estimate uses, this process's peak RSS in MB, and (samples, non-padding tokens) trained on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from pipelines.packing import count_samples_and_tokens

FLOPS_PER_TOKEN_PER_PARAMETER = 6
"""Forward (2) + backward (4) multiply-adds per non-embedding parameter per token (Kaplan et al.)."""


@dataclass(frozen=True)
class MatmulPeak:
    fp32: float
    bf16: float
    """FLOP/s of the best timed square matmul in each dtype."""

    def for_precision(self, precision: str) -> float:
        return self.bf16 if precision == "bf16" else self.fp32


def matmul_flops(dtype: torch.dtype, *, budget_seconds: float = 1.0, start_size: int = 256, max_size: int = 4096) -> float:
    """FLOP/s of the fastest square matmul (2·n³ FLOPs) in ``dtype``, within about ``budget_seconds``.

    The size doubles until one product takes an eighth of the budget (large enough to reach the
    kernel's peak) or ``max_size``; then the best of three timings counts. The budget keeps this
    bounded where a dtype is emulated (bf16 on AVX2 CPUs runs at a few percent of fp32).
    """
    size = start_size
    while True:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        torch.mm(a, b)  # first call at a size: kernel selection, page faults
        started = time.perf_counter()
        torch.mm(a, b)
        best = time.perf_counter() - started
        if best > budget_seconds / 8 or size >= max_size:
            break
        size *= 2
    for _ in range(2):
        if best > budget_seconds / 2:
            break
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def measure_matmul_peak(budget_seconds: float = 1.0) -> MatmulPeak:
    """This machine's matmul peak in fp32 and bf16 (intra-op threads as torch sets them)."""
    return MatmulPeak(
        fp32=matmul_flops(torch.float32, budget_seconds=budget_seconds),
        bf16=matmul_flops(torch.bfloat16, budget_seconds=budget_seconds),
    )


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters outside embedding tables: those that cost FLOPs per token (the 6·N·T estimate)."""
    embedding = {id(p) for module in model.modules() if isinstance(module, torch.nn.Embedding) for p in module.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


class TrainingCounter:
    """Counts the samples and non-padding tokens the model trains on, as bertpipe's loop does.

    A forward pre-hook, not a collator wrapper: dataloaders build batches ahead of use (Accelerate
    looks one batch ahead to detect the end), so a count at collation overstates what was trained
    on when training stops mid-epoch; and it works whether or not DataLoader workers collate.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        # Ints that become tensors on the batch's device on first use: no .item() per step, no device sync.
        self.samples: int | torch.Tensor = 0
        self.tokens: int | torch.Tensor = 0
        self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        samples, tokens = count_samples_and_tokens({"input_ids": input_ids, "attention_mask": kwargs.get("attention_mask")})
        self.samples = self.samples + samples
        self.tokens = self.tokens + tokens

    def remove(self) -> tuple[int, int]:
        """Stop counting; returns (samples, tokens)."""
        self._handle.remove()
        return int(self.samples), int(self.tokens)

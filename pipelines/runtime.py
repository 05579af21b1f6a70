"""Process setup shared by training, evaluation and prediction.

In:  the run config.
Out: an ``Accelerator`` that does the right thing on CPU-only machines: ``accelerate launch
     --multi_gpu --num_processes N`` there starts N processes that each believe they are alone
     unless the Accelerator runs in CPU mode, in which case they join one gloo process group.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

from pipelines.config import RunConfig

logger = logging.getLogger(__name__)


def has_accelerator_device() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def native_bf16() -> bool:
    """Whether bf16 matmuls run natively here (not emulated, which is ~20x slower than fp32)."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_mixed_precision(requested: str) -> str:
    if requested == "auto":
        return "bf16" if native_bf16() else "no"
    if requested == "bf16" and not native_bf16():
        logger.warning("train.mixed_precision=bf16 on hardware without native bf16: expect it to be much slower than fp32")
    return requested


def build_accelerator(config: RunConfig, *, with_trackers: bool = True) -> Accelerator:
    train = config.train
    if train.torch_num_threads:
        torch.set_num_threads(train.torch_num_threads)
    trackers = list(train.report_to) if with_trackers and train.report_to else None
    return Accelerator(
        cpu=not has_accelerator_device(),
        mixed_precision=resolve_mixed_precision(train.mixed_precision),
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        log_with=trackers,
        project_config=ProjectConfiguration(
            project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / "tracking")
        ),
    )

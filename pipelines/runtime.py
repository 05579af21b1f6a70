"""Process setup and numeric precision shared by training, evaluation and prediction.

In:  the run config (``train.mixed_precision``), an inference precision (``bertpipe evaluate|predict
     --precision``), and the environment variable ``BERTPIPE_NATIVE_BF16``.
Out: an ``Accelerator`` that does the right thing on CPU-only machines (``accelerate launch
     --multi_gpu --num_processes N`` there starts N processes that each believe they are alone
     unless the Accelerator runs in CPU mode, in which case they join one gloo process group), the
     Accelerate precision that ``auto`` means on this hardware, and :func:`without_autocast`, which
     runs a prepared model's forward in fp32 even when training runs in bf16/fp16.

The inference-precision rule (README, "Numeric precision"): every evaluation and prediction, during
training included, runs in fp32 unless ``--precision`` asks otherwise, so ``metrics.json``,
``bertpipe evaluate``, ``bertpipe predict`` and ``pipeline()`` (which loads the fp32 weights) agree on
every machine, whatever ``train.mixed_precision`` resolved to there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import platform
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from accelerate import Accelerator
from accelerate import __version__ as accelerate_version
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DistributedType, ProjectConfiguration

from pipelines.config import ConfigError, RunConfig
from pipelines.errors import DataError

logger = logging.getLogger(__name__)

# "1" makes this machine count as having native bf16, "0" as lacking it, so that either branch of
# `train.mixed_precision: auto` (and on a GPU: bf16 or fp16) can be exercised on any machine.
NATIVE_BF16_ENV = "BERTPIPE_NATIVE_BF16"
INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16", "auto")


def has_accelerator_device() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def _env_native_bf16() -> bool | None:
    value = os.environ.get(NATIVE_BF16_ENV, "").strip().lower()
    if not value:
        return None
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ConfigError(f"{NATIVE_BF16_ENV}={os.environ[NATIVE_BF16_ENV]!r} is neither 1 nor 0 (or unset: ask the hardware)")


def native_bf16() -> bool:
    """Whether bf16 matmuls run natively here (not emulated, which is ~20x slower than fp32 on a CPU).

    ``BERTPIPE_NATIVE_BF16=1|0`` overrides the hardware query, in both directions.
    """
    forced = _env_native_bf16()
    if forced is not None:
        return forced
    if torch.cuda.is_available():
        # Without including_emulation=False, torch answers True on pre-Ampere GPUs that only emulate bf16.
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_mixed_precision(requested: str) -> str:
    """``train.mixed_precision`` -> the value Accelerate takes (``no``, ``bf16`` or ``fp16``).

    ``auto``: on a GPU bf16 where it is native, else fp16 (Accelerate adds the dynamic loss scaling
    fp16 needs); on a CPU bf16 where it is native, else fp32.
    """
    gpu = torch.cuda.is_available()
    if requested == "auto":
        if native_bf16():
            return "bf16"
        return "fp16" if gpu else "no"
    if requested == "fp16" and not has_accelerator_device():
        # Accelerate would stop with a ValueError and a traceback: fp16 autocast needs a GPU.
        raise ConfigError("train.mixed_precision=fp16 needs a GPU; on a CPU use bf16, no or auto")
    if requested == "bf16" and not native_bf16():
        logger.warning("train.mixed_precision=bf16 on hardware without native bf16: expect it to be much slower than fp32")
    return requested


def resolve_inference_precision(requested: str = "fp32") -> str:
    """``--precision`` of ``bertpipe evaluate|predict`` (fp32, bf16, fp16, auto) -> Accelerate's value."""
    if requested not in INFERENCE_PRECISIONS:
        raise ConfigError(f"--precision {requested!r} is not one of {', '.join(INFERENCE_PRECISIONS)}")
    if requested == "fp16" and not has_accelerator_device():
        # resolve_mixed_precision's refusal names train.mixed_precision, and offers `no`, which --precision lacks.
        raise ConfigError("--precision fp16 needs a GPU; on a CPU use fp32, bf16 or auto")
    return "no" if requested == "fp32" else resolve_mixed_precision(requested)


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Above the largest tensor a training step frees and allocates again (a 250k-row vocabulary's fp32
# embedding gradient is ~400 MB at hidden size 384), below what glibc accepts on 64-bit systems.
_KEEP_BLOCKS_UP_TO = 1 << 30
_NEVER_TRIM = (1 << 31) - 1  # the largest int mallopt takes


def keep_freed_memory_for_reuse() -> bool:
    """Let glibc keep large freed blocks for the next step instead of returning them to the OS.

    PyTorch has no caching allocator on the CPU: every step frees the gradients (``zero_grad(
    set_to_none=True)``) and allocates them again. glibc serves blocks over its mmap threshold with
    a fresh ``mmap`` and unmaps them on free, so each step page-faults and zero-fills the word
    embedding's dense gradient (47 MB for BERT's 30k vocabulary) and every other large buffer anew.
    Raising the mmap and trim thresholds makes those blocks come from the heap, already mapped:
    on a 2-core AMD EPYC a 47 MB zeros-and-free cycle went from 30 ms to 16 ms. Numerics are untouched;
    the cost is that the process keeps its peak heap mapped until it exits (its peak RSS is unchanged).
    Returns whether the setting took (glibc only; a no-op elsewhere, e.g. macOS or musl).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP_BLOCKS_UP_TO)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))


def build_accelerator(config: RunConfig, *, with_trackers: bool = True, mixed_precision: str | None = None) -> Accelerator:
    """The run's Accelerator; ``mixed_precision`` (Accelerate's value) replaces the training precision."""
    train = config.train
    if train.torch_num_threads:
        torch.set_num_threads(train.torch_num_threads)
    if not has_accelerator_device():
        keep_freed_memory_for_reuse()
    trackers = list(train.report_to) if with_trackers and train.report_to else None
    # Accelerate keeps one AcceleratorState per process and refuses another precision for a second
    # Accelerator: a command run in a process that already ran one (train, then evaluate in fp32, from
    # Python) must not fail on, or inherit, the last one's precision and accumulation steps. Each
    # command builds one Accelerator, after the previous one is done. PartialState, this process's
    # rank and process group in a launched run, is kept.
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    accelerator = Accelerator(
        cpu=not has_accelerator_device(),
        mixed_precision=mixed_precision or resolve_mixed_precision(train.mixed_precision),
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        log_with=trackers,
        project_config=ProjectConfiguration(
            project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / "tracking")
        ),
    )
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and accelerator.distributed_type != DistributedType.FSDP:
        # accelerate 1.15 turns FSDP on only for GPU-class process groups: on a CPU the processes form a
        # gloo MULTI_CPU group and the FSDP config would be dropped silently, training plain DDP.
        raise ConfigError(
            f"the Accelerate config asks for FSDP, but accelerate {accelerate_version} runs FSDP only on GPUs "
            f"(here: {accelerator.distributed_type.value} on {accelerator.device}); use configs/accelerate/cpu.yaml on a CPU"
        )
    return accelerator


def end_run(accelerator: Accelerator) -> None:
    """Finish the run's trackers and end its process group, once the caller holds no prepared model.

    The order is the point. DDP's C++ ``Reducer`` holds the process group too, and Python frees it
    holding the GIL. Ended first (``end_training``) and then dropped with the model, the Reducer held the
    group's last reference, so the group's destructor joined gloo's worker threads with the GIL held while
    one of them, freeing the tensors of the run's last collective, waited for the GIL: a two-process run
    hung after writing everything, about one run in thirty. Freed here first, the group's last reference
    is a Python ``ProcessGroup``, which torch destroys with the GIL released.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        accelerator.end_training()
        return
    accelerator.free_memory()  # its references to the prepared model, optimizer, scheduler and loaders
    # free_memory's own collection runs before it drops those lists: a wrapped model left in a reference cycle
    # would be freed later, by whichever line ran then.
    gc.collect()
    group = torch.distributed.group.WORLD
    accelerator.end_training()
    del group  # the group's last reference: destroyed here, with the GIL released


def check_trackers(report_to: list[str]) -> None:
    """Refuse a ``train.report_to`` tracker whose package is not installed, before anything is loaded or written:
    Accelerate leaves such a tracker out with a log line, and the run trained and exited 0 with nothing tracked."""
    import accelerate.utils

    missing = [name for name in report_to if not getattr(accelerate.utils, f"is_{name}_available")()]
    if missing:
        raise ConfigError(
            f"train.report_to: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed here "
            f"(pip install {' '.join(missing)}), and the run would track nothing there; install it or leave it out"
        )


def check_compile_backend(name: str) -> None:
    """Refuse a ``train.compile_backend`` that this torch does not know, before anything is loaded or written."""
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if name not in known:
        raise ConfigError(
            f"train.compile_backend={name!r} is not a torch.compile backend of torch {torch.__version__}; "
            f"known: {', '.join(sorted(known))}"
        )


@contextmanager
def without_autocast(accelerator: Accelerator, model) -> Iterator[None]:
    """Run ``model`` (as prepared by ``accelerator``) in fp32 inside the block.

    With bf16/fp16, ``Accelerator.prepare`` replaces the model's ``forward`` by an autocast wrapper
    and keeps the plain one as ``_original_forward``; the plain one is swapped back in for the block
    (``generate()`` calls ``forward`` too). Weights are fp32 under autocast, so this is exact fp32.
    FSDP's and DeepSpeed's own bf16 (weights or compute held in bf16) are not autocast and stay as they are.
    """
    if not isinstance(model, torch.nn.Module):  # an onnxruntime session (an export directory) has no autocast
        yield
        return
    inner = accelerator.unwrap_model(model)
    plain = getattr(inner, "_original_forward", None)
    if plain is None or "forward" not in vars(inner):
        yield
        return
    patched = inner.forward
    inner.forward = plain
    try:
        yield
    finally:
        inner.forward = patched


def layer_classes_to_wrap(model: torch.nn.Module) -> list[str]:
    """Class names of the model's repeated blocks, each of which FSDP shards as one unit.

    ``_no_split_modules`` when the model declares it (transformers 5 collects it per instance from the
    submodules, e.g. ``BertEmbeddings`` and ``BertLayer``; a peft wrapper passes it through); otherwise, as
    for bertpipe's own models, the class of the blocks in each ``nn.ModuleList`` of identical modules.
    """
    # transformers leaves _no_split_modules empty for some families (DistilBERT, ELECTRA, ALBERT,
    # DeBERTa-v2, Marian): their blocks are the elements of a ModuleList of one class whose elements hold
    # parameters in submodules (TransformerBlock, DebertaV2Layer, MarianEncoderLayer, ...).
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    declared = getattr(model, "_no_split_modules", None) or getattr(inner, "_no_split_modules", None)
    if declared:
        return sorted(declared)
    names: list[str] = []
    for module in inner.modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
            continue
        block = module[0]
        if len({type(child) for child in module}) == 1 and any(True for _ in block.children()) \
                and any(True for _ in block.parameters()) and type(block).__name__ not in names:
            names.append(type(block).__name__)
    return names


def refuse_processes_that_differ(accelerator: Accelerator, digests: dict[str, tuple[str, str]]) -> None:
    """In a launched run of several processes, end it (every process alike) when one process's ``digests`` differ from
    the others': ``{"what": (digest, "the settings that named it here")}``, e.g. the training data, the model.

    A machine holding another copy of the data met DDP's shape check as a raw traceback (another label, another head
    size), or, where the shapes agreed, trained each process on its own data without a word. (Alone, a process meets
    only itself; the caller skips the digests then.)"""
    from accelerate.utils import gather_object

    everyone = gather_object([{what: digest for what, (digest, _) in digests.items()}])
    differing = [what for what in digests if len({process.get(what) for process in everyone}) > 1]
    if differing:
        others = [str(index) for index, process in enumerate(everyone) if any(process.get(what) != everyone[0][what] for what in differing)]
        named = " nor the same ".join(f"{what} ({digests[what][1]})" for what in differing)
        raise DataError(
            f"the {len(everyone)} processes of this run did not read the same {named}: process {', '.join(others)} read "
            f"other contents than process 0. Every machine must hold the same files (and the same model), or each process "
            f"trains on its own"
        )


def wrap_model_layers_for_fsdp(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Under FSDP with transformer-based wrapping and no class named in the Accelerate config, name the
    model's own block classes (before ``prepare``), so one config serves every architecture."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None or plugin.transformer_cls_names_to_wrap:
        return
    plugin.transformer_cls_names_to_wrap = layer_classes_to_wrap(model)
    logger.info("FSDP wraps each %s", " / ".join(plugin.transformer_cls_names_to_wrap))

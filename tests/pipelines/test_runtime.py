"""pipelines.runtime: what `auto` means on each kind of hardware (device queries faked), the
BERTPIPE_NATIVE_BF16 override, and fp32 inference on a model Accelerate prepared for bf16."""

from __future__ import annotations

import pytest
import torch

from pipelines import runtime
from pipelines.config import ConfigError


@pytest.fixture
def cpu_with_flags(monkeypatch, tmp_path):
    """A CPU-only machine whose /proc/cpuinfo lists ``flags``."""

    def make(flags: str) -> None:
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(runtime, "Path", lambda _: cpuinfo)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.delenv(runtime.NATIVE_BF16_ENV, raising=False)

    return make


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate's state is a process-wide singleton that refuses a second precision: start and end clean
    (another in-process test may have created one in this worker)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA machine whose GPU has native bf16 or not; records the query torch was asked."""
    asked = {}

    def make(bf16: bool) -> dict:
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            asked["including_emulation"] = including_emulation
            return bf16 or including_emulation  # what torch answers on a pre-Ampere GPU

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
        monkeypatch.delenv(runtime.NATIVE_BF16_ENV, raising=False)
        return asked

    return make


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse avx avx2 fma", "no"),                      # AVX2 only: emulated bf16 would be ~20x slower
    ("fpu avx2 avx512f avx512_bf16", "bf16"),            # AMD Zen 4 / Cooper Lake
    ("fpu avx2 avx512f amx_bf16 amx_tile", "bf16"),      # Sapphire Rapids
])
def test_runtime_auto_on_a_cpu_follows_native_bf16(cpu_with_flags, flags, expected):
    cpu_with_flags(flags)
    assert runtime.resolve_mixed_precision("auto") == expected
    assert runtime.resolve_mixed_precision("no") == "no"


def test_runtime_env_forces_either_branch_of_auto(cpu_with_flags, monkeypatch):
    cpu_with_flags("fpu avx2")
    monkeypatch.setenv(runtime.NATIVE_BF16_ENV, "1")
    assert runtime.native_bf16() and runtime.resolve_mixed_precision("auto") == "bf16"
    cpu_with_flags("fpu avx2 amx_bf16")
    monkeypatch.setenv(runtime.NATIVE_BF16_ENV, "0")
    assert not runtime.native_bf16() and runtime.resolve_mixed_precision("auto") == "no"
    monkeypatch.setenv(runtime.NATIVE_BF16_ENV, "maybe")
    with pytest.raises(ConfigError, match="BERTPIPE_NATIVE_BF16='maybe'"):
        runtime.native_bf16()


def test_runtime_auto_on_a_gpu_is_bf16_where_native_else_fp16(gpu, monkeypatch):
    asked = gpu(bf16=True)
    assert runtime.resolve_mixed_precision("auto") == "bf16"
    asked = gpu(bf16=False)
    # A pre-Ampere GPU: torch's default query counts emulated bf16 as supported; bertpipe must not.
    assert runtime.resolve_mixed_precision("auto") == "fp16" and asked["including_emulation"] is False
    assert runtime.resolve_mixed_precision("fp16") == "fp16"
    gpu(bf16=True)
    monkeypatch.setenv(runtime.NATIVE_BF16_ENV, "0")  # the fp16 branch on a bf16 GPU
    assert runtime.resolve_mixed_precision("auto") == "fp16"


def test_runtime_fp16_on_a_cpu_is_a_config_error(cpu_with_flags):
    cpu_with_flags("fpu avx2 amx_bf16")
    with pytest.raises(ConfigError, match="train.mixed_precision=fp16 needs a GPU"):
        runtime.resolve_mixed_precision("fp16")


def test_runtime_a_tracker_that_is_not_installed_is_refused_naming_it(monkeypatch):
    """Accelerate leaves out a tracker it cannot import, with a log line: train.report_to=[wandb] without wandb trained
    and exited 0 with nothing tracked."""
    import accelerate.utils

    monkeypatch.setattr(accelerate.utils, "is_wandb_available", lambda: False)
    monkeypatch.setattr(accelerate.utils, "is_tensorboard_available", lambda: True)
    runtime.check_trackers(["tensorboard"])
    runtime.check_trackers([])
    with pytest.raises(ConfigError, match=r"^train.report_to: wandb is not installed here \(pip install wandb\)"):
        runtime.check_trackers(["tensorboard", "wandb"])


def test_runtime_inference_precision_is_fp32_unless_asked(cpu_with_flags):
    cpu_with_flags("fpu avx2 avx512_bf16")
    assert runtime.resolve_inference_precision() == "no"
    assert runtime.resolve_inference_precision("bf16") == "bf16"
    assert runtime.resolve_inference_precision("auto") == "bf16"
    with pytest.raises(ConfigError, match="--precision 'int8'"):
        runtime.resolve_inference_precision("int8")
    # Not the training setting's refusal ("train.mixed_precision=fp16 ... use bf16, no or auto"): --precision has no `no`.
    with pytest.raises(ConfigError, match=r"^--precision fp16 needs a GPU; on a CPU use fp32, bf16 or auto$"):
        runtime.resolve_inference_precision("fp16")


def test_runtime_without_autocast_runs_a_bf16_prepared_model_in_fp32(fresh_accelerate_state):
    from accelerate import Accelerator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    inputs = torch.randn(16, 64)
    with torch.no_grad():
        reference = model(inputs)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    prepared = accelerator.prepare(model)
    with torch.no_grad():
        autocast = prepared(inputs)
        with runtime.without_autocast(accelerator, prepared):
            plain = prepared(inputs)
        again = prepared(inputs)
    assert torch.equal(plain, reference)
    assert not torch.allclose(autocast, reference, atol=1e-4)  # bf16 keeps ~3 significant digits
    assert torch.equal(again, autocast)  # the autocast wrapper is back for training


def test_runtime_fsdp_wraps_the_models_own_layer_classes(tiny_bert):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, BertConfig, BertLMHeadModel, BertModel, EncoderDecoderModel

    import models  # noqa: F401  (registers bertpipe_bert)
    from models.configuration import BertpipeBertConfig
    from models.bert import BertpipeForSequenceClassification

    bert = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    assert runtime.layer_classes_to_wrap(bert) == ["BertEmbeddings", "BertLayer"]  # its _no_split_modules
    lora = get_peft_model(bert, LoraConfig(r=2, target_modules=["query"]))
    assert runtime.layer_classes_to_wrap(lora) == ["BertEmbeddings", "BertLayer"]
    own = BertpipeForSequenceClassification(BertpipeBertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                               num_attention_heads=2, intermediate_size=32))
    assert runtime.layer_classes_to_wrap(own) == ["EncoderLayer"]  # declares none: its repeated block
    small = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    decoder = BertConfig(**{**small.to_dict(), "is_decoder": True, "add_cross_attention": True})
    seq2seq = EncoderDecoderModel(encoder=BertModel(small), decoder=BertLMHeadModel(decoder))
    assert "BertLayer" in runtime.layer_classes_to_wrap(seq2seq)

    class Declared(torch.nn.Module):
        _no_split_modules = ["Block"]

    assert runtime.layer_classes_to_wrap(Declared()) == ["Block"]


def test_runtime_fsdp_plugin_gets_the_layer_classes_only_when_the_config_names_none(tiny_bert):
    from types import SimpleNamespace

    from transformers import AutoModelForSequenceClassification

    bert = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    unnamed = SimpleNamespace(transformer_cls_names_to_wrap=None)
    runtime.wrap_model_layers_for_fsdp(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=unnamed)), bert)
    assert unnamed.transformer_cls_names_to_wrap == ["BertEmbeddings", "BertLayer"]
    named = SimpleNamespace(transformer_cls_names_to_wrap=["BertAttention"])
    runtime.wrap_model_layers_for_fsdp(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=named)), bert)
    assert named.transformer_cls_names_to_wrap == ["BertAttention"]
    runtime.wrap_model_layers_for_fsdp(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=None)), bert)  # DDP: nothing to do


def test_runtime_fsdp_config_on_a_cpu_is_refused_not_dropped(monkeypatch, tmp_path, tiny_bert, sentiment_files, fresh_accelerate_state):
    from pipelines.cli import load_run_config
    from tasks import get_task
    from tests.conftest import classification_config

    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files)), [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch --config_file configs/accelerate/fsdp.yaml` sets
    with pytest.raises(ConfigError, match="runs FSDP only on GPUs"):
        runtime.build_accelerator(config, with_trackers=False)


def test_runtime_a_second_command_in_one_process_gets_its_own_precision(monkeypatch, tmp_path, tiny_bert, sentiment_files, fresh_accelerate_state):
    """Train in bf16, then evaluate in fp32, from one Python process: Accelerate refuses a second
    precision per process unless the first command's state is forgotten."""
    from pipelines.cli import load_run_config
    from tasks import get_task
    from tests.conftest import classification_config

    config_path = str(classification_config(tmp_path, tiny_bert, sentiment_files))
    config = load_run_config(get_task, config_path, ["train.gradient_accumulation_steps=2"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    training = runtime.build_accelerator(config, with_trackers=False, mixed_precision="bf16")
    assert (training.mixed_precision, training.gradient_accumulation_steps) == ("bf16", 2)
    single_step = config.model_copy(update={"train": config.train.model_copy(update={"gradient_accumulation_steps": 1})})
    evaluating = runtime.build_accelerator(single_step, with_trackers=False, mixed_precision="no")
    assert (evaluating.mixed_precision, evaluating.gradient_accumulation_steps) == ("no", 1)
    assert evaluating.num_processes == 1


_MALLOC_PROBE = r"""
import ctypes, json, torch
from pipelines.runtime import keep_freed_memory_for_reuse

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mmapped_while_holding_a_gradient_sized_tensor():
    tensor = torch.zeros(30522, 384)  # BERT's word-embedding gradient, 47 MB
    return libc.mallinfo2().hblkhd

before = mmapped_while_holding_a_gradient_sized_tensor()
took = keep_freed_memory_for_reuse()
after = mmapped_while_holding_a_gradient_sized_tensor()
print(json.dumps({"took": took, "before": before, "after": after, "baseline": libc.mallinfo2().hblkhd}))
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_runtime_keeps_large_freed_blocks_on_the_heap_instead_of_unmapping_them():
    """Without the setting, glibc serves the 47 MB gradient with a fresh mmap each step (page faults and
    zero-fill every time); with it, from the heap, where the freed block is reused."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    result = subprocess.run([sys.executable, "-c", _MALLOC_PROBE], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[2])
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["took"] is True
    assert probe["before"] - probe["baseline"] >= 30522 * 384 * 4, probe  # mmapped by default
    assert probe["after"] - probe["baseline"] < 1 << 20, probe  # from the heap once kept

"""scripts/gpu_check.sh: the bundle (size cap, bf16 MiniLM, data, source, only the wheels the target lacks)
and the run's step bookkeeping; the whole dry run end to end is marked slow (~2 minutes on 2 CPU cores).

No test reaches the package registry: ``--have`` is this interpreter's own ``pip freeze``, so nothing is
missing, and PIP_NO_INDEX makes any download attempt fail at once instead of going online.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, shared_path

spec = importlib.util.spec_from_file_location("gpu_check", REPO_ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up there
spec.loader.exec_module(gpu_check)


def script(*args: str, env_extra: dict[str, str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    import os

    env = {key: value for key, value in os.environ.items() if not key.startswith(("ACCELERATE_", "BERTPIPE_"))}
    env.update(PIP_NO_INDEX="1", PYTHON=sys.executable, BUNDLE_PYTHON=sys.executable, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    shared_path("mirror", "models", gpu_check.MODEL_ID)
    folder = tmp_path_factory.mktemp("gpu-bundle")
    freeze = folder / "freeze.txt"
    freeze.write_text(subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout)
    result = script("bundle", str(folder / "bundle"), "--have", str(freeze))
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / "bundle"


def test_gpu_check_bundle_holds_model_data_source_under_the_cap(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["total_mb"] <= 60 and manifest["target_python"] == "3.12"
    assert manifest["wheels"] == [] and manifest["left_out"] == {}  # this interpreter has every dependency
    assert {"transformers", "accelerate", "datasets", "peft", "seqeval"} <= set(manifest["dependencies_present_on_target"])
    assert not any(name == "torch" or name.startswith("nvidia-") for name in manifest["dependencies_present_on_target"])
    model = bundle / "mirror" / "models" / gpu_check.MODEL_ID
    assert json.loads((model / "config.json").read_text()).get("dtype") == "bfloat16"
    assert 40e6 < (model / "model.safetensors").stat().st_size < 50e6  # 22.7M parameters x 2 bytes
    files = manifest["files"]
    assert any(name.startswith(f"mirror/datasets/{gpu_check.SST2_ID}/") and name.endswith(".parquet") for name in files)
    assert "text/wikitext2.tokens" in files and sum(name.startswith("text/gutenberg-") for name in files) == 13
    for name in ("src/tasks/cli.py", "src/pipelines/train.py", "src/scripts/gpu_check.py", "src/tests/gpu/test_gpu.py"):
        assert name in files, name
    (bundle / "text" / "gutenberg-shakespeare-caesar.txt").read_text(encoding="utf-8")  # Latin-1 in ../shared, UTF-8 here


def test_gpu_check_bundles_only_what_the_target_lacks(tmp_path):
    closure = gpu_check.dependency_closure("3.12")
    assert {"transformers", "seqeval", "pyarrow"} <= set(closure) and "torch" not in closure and "setuptools" not in closure
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("".join(f"{name}=={version}\n" for name, version in closure.items() if name not in ("seqeval", "sacrebleu"))
                      + "torch==2.5.1+cu124\n-e git+https://example.invalid/x#egg=x\n")
    have = gpu_check.read_freeze(freeze)
    assert have["torch"] == "2.5.1+cu124"
    assert sorted(name for name in closure if name not in have) == ["sacrebleu", "seqeval"]


def test_gpu_check_a_failed_step_fails_the_run_after_the_others_ran(tmp_path):
    (tmp_path / "bundle" / "src").mkdir(parents=True)
    runner = gpu_check.Runner(tmp_path / "bundle", tmp_path / "out", dry_run=True, python=sys.executable)
    ran = []

    def broken(step):
        ran.append("broken")
        raise gpu_check.StepFailed("exit 1: the thing it checks is wrong")

    runner.plan = lambda: [("first", lambda step: ran.append("first") or "fine", False), ("broken", broken, False),
                           ("last", lambda step: ran.append("last") or "fine too", True)]
    assert runner.run() == 1 and ran == ["first", "broken", "last"]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["failed"] == ["broken"] and [s["status"] for s in report["steps"]] == ["passed", "failed", "passed"]
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "FAILED: broken" in table and "| broken | failed |" in table and "the thing it checks is wrong" in table


def test_gpu_check_dry_run_checks_environment_install_and_the_fsdp_config(bundle, tmp_path):
    result = script("run", str(bundle), str(tmp_path / "out"), "--dry-run", "--steps", "fsdp")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = {s["name"]: s for s in json.loads((tmp_path / "out" / "gpu_check.json").read_text())["steps"]}
    assert steps["environment"]["status"] == "passed" and "torch" in steps["environment"]["summary"]
    assert steps["install"]["status"] == "passed" and "transformers" in steps["install"]["summary"]
    assert steps["fsdp"]["summary"].startswith("skipped: FSDP needs a GPU")
    assert steps["benchmark"]["summary"] == "not selected (--steps)"


def test_gpu_check_run_refuses_a_folder_that_is_not_a_bundle(tmp_path):
    result = script("run", str(tmp_path), str(tmp_path / "out"))
    assert result.returncode == 2 and "is not a bundle" in result.stderr


@pytest.mark.slow
def test_gpu_check_dry_run_end_to_end(bundle, tmp_path):
    result = script("run", str(bundle), str(tmp_path / "out"), "--dry-run", timeout=1800)
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert result.returncode == 0 and report["failed"] == [], (tmp_path / "out" / "gpu_check.md").read_text()
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["gpu-tests"]["status"] == "passed"  # on a CPU: collected, each skipped for want of CUDA
    assert [run["setting"] for run in steps["benchmark"]["details"]["runs"]] == ["bertpipe", "trainer_default", "trainer_best"]
    assert steps["ddp"]["details"]["num_processes"] == 2
    pretraining = steps["pretraining"]["details"]
    assert len(pretraining["sst2_accuracy"]["pretrained"]) == len(pretraining["sst2_accuracy"]["random init"]) == 1
    assert len(pretraining["linear_probe"]) == 3
    assert sum(path.stat().st_size for path in (tmp_path / "out").rglob("*") if path.is_file() and "runs" not in path.parts) < 5e6

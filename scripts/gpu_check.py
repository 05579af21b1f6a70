"""One prepared check of bertpipe on a CUDA machine that this project's CI cannot reach.

    python scripts/gpu_check.py bundle DIR [--python 3.12] [--have FREEZE.txt] [--no-wheels] [--max-mb 60]
    python scripts/gpu_check.py run DIR OUT [--dry-run]

(``scripts/gpu_check.sh`` wraps both.)

``bundle`` (on a machine with the package registry and ../shared) writes into DIR everything an air-gapped
GPU machine may lack, in at most ``--max-mb`` MB: ``mirror/`` (MiniLM saved in bf16 to halve it, which bertpipe loads in
fp32 as it loads any bf16 checkpoint, and the SST-2 parquet
files, laid out as a BERTPIPE_MIRROR), ``text/`` (WikiText-2 and the Gutenberg books), ``src/`` (bertpipe's
source), ``wheels/`` (manylinux x86_64 wheels for the target Python of bertpipe's dependencies, never torch,
only those missing from ``--have``, a ``pip freeze`` of the target; otherwise as many as fit) and
``manifest.json`` (every file with its size, the wheels left out and why).

``run`` (on the GPU machine, no network) uses that machine's ``python3`` and its torch as they are, installs
the bundle's wheels that are missing or incompatible there into a temporary ``--target`` with ``--no-index``,
checks the assumptions (CUDA visible, bf16, memory) and names the one that failed, then runs each step (the
tests marked ``gpu``, ``bertpipe benchmark`` on SST-2, 2-process DDP when there are 2 GPUs, the FSDP config,
and the pretraining experiment: masked-LM from scratch on the bundled text, then SST-2 fine-tuning from it
against a random initialisation of the same shape, plus ``scripts/linear_probe.py``). It writes
``OUT/gpu_check.md`` (one table), ``OUT/gpu_check.json`` and short per-step logs under ``OUT/logs/``, and exits
1 if any step failed, after running the others. ``--dry-run`` runs the same steps at toy size on the CPU.

Standard library only (plus pip's vendored ``packaging``): it starts under whatever Python the GPU machine has.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"
MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
SST2_ID = "stanfordnlp/sst2"
# Wheels a GPU image brings with torch (or that are torch): never bundled.
TORCH_FAMILY = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|pytorch-triton.*)$")
# Packaging tools: every Python with pip has them, and `pip freeze` does not list them.
PIP_TOOLING = {"pip", "setuptools", "wheel"}
SOURCE_PARTS = ["pipelines", "tasks", "models", "configs", "scripts", "tests", "pyproject.toml", "README.md"]
MIN_GPU_MEMORY_GIB = 16
LOG_TAIL_CHARS = 20_000


def _packaging():
    try:
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
        from packaging.version import Version
    except ImportError:  # pip vendors it; a bare GPU image has pip but maybe not packaging
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.utils import canonicalize_name
        from pip._vendor.packaging.version import Version
    return Requirement, canonicalize_name, Version


# ----- bundle ----------------------------------------------------------------------------------
def read_freeze(path: Path | None) -> dict[str, str]:
    """``pip freeze`` lines -> {canonical name: version}; ``name @ URL`` lines count with version ''."""
    if path is None:
        return {}
    _, canonicalize_name, _ = _packaging()
    have = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-")):
            continue
        name = re.split(r"\s*(===|==| @ )", line)[0]
        version = line.split("==", 1)[1].lstrip("=").strip() if "==" in line else ""
        have[canonicalize_name(name.split("[")[0])] = version
    return have


def dependency_closure(python_version: str) -> dict[str, str]:
    """bertpipe's runtime dependencies and theirs, {canonical name: version installed here}, for a Linux
    target Python ``python_version``, leaving out torch and whatever only torch needs."""
    import importlib.metadata as metadata

    Requirement, canonicalize_name, _ = _packaging()
    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
    project = [*_project_dependencies(), "pytest"]  # the run's `pytest -m gpu` step
    versions: dict[str, str] = {}
    pending = [Requirement(text) for text in project]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in versions or name in PIP_TOOLING or TORCH_FAMILY.match(name):
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            versions[name] = ""  # not installed here: pip resolves its latest
            continue
        versions[name] = distribution.version
        for text in distribution.requires or []:
            pending.append(Requirement(text))
    return versions


def _project_dependencies() -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return []
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]


def download_wheels(names: dict[str, str], folder: Path, python_version: str, log: list[str]) -> dict[str, str]:
    """One wheel per package for the target (pinned to the version that works here); a pure-Python sdist
    (seqeval) is built into a wheel. Returns {name: why} for the packages that could not be fetched."""
    folder.mkdir(parents=True, exist_ok=True)
    failed = {}
    platforms = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64"]
    for name, version in sorted(names.items()):
        spec = f"{name}=={version}" if version else name
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
                   python_version, "--implementation", "cp", *[arg for p in platforms for arg in ("--platform", p)], "-d", str(folder), spec]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            before = set(folder.iterdir())
            built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder), spec],
                                   capture_output=True, text=True)
            new = set(folder.iterdir()) - before
            # A wheel built here is for this Python; only a pure-Python one also installs on the target.
            if built.returncode != 0 or not new or not all(path.name.endswith("-none-any.whl") for path in new):
                for path in new:
                    path.unlink()
                failed[name] = (result.stderr.strip().splitlines() or ["pip download failed"])[-1]
                continue
            log.append(f"{spec}: no binary wheel on the index, built a pure-Python one locally")
    return failed


def save_bf16_model(source: Path, destination: Path) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(source, dtype=torch.bfloat16)
    model.save_pretrained(destination)
    AutoTokenizer.from_pretrained(source).save_pretrained(destination)


def bundle(directory: Path, *, python_version: str, have_file: Path | None, wheels: bool, max_mb: float,
           shared: Path = SHARED) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    mirror = shared / "mirror"
    save_bf16_model(mirror / "models" / MODEL_ID, directory / "mirror" / "models" / MODEL_ID)
    shutil.copytree(mirror / "datasets" / SST2_ID, directory / "mirror" / "datasets" / SST2_ID, dirs_exist_ok=True)
    text = directory / "text"
    text.mkdir(exist_ok=True)
    copy_as_utf8(shared / "data" / "wikitext2" / "wiki.valid.tokens", text / "wikitext2.tokens")
    for book in sorted((shared / "data" / "gutenberg").glob("*.txt")):
        copy_as_utf8(book, text / f"gutenberg-{book.name}")
    source = directory / "src"
    for part in SOURCE_PARTS:
        path = REPO_ROOT / part
        if path.is_dir():
            shutil.copytree(path, source / part, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / part)

    have = read_freeze(have_file)
    wanted = {name: version for name, version in dependency_closure(python_version).items() if name not in have}
    notes: list[str] = []
    left_out: dict[str, str] = {}
    if wheels and wanted:
        with tempfile.TemporaryDirectory() as scratch:
            left_out.update(download_wheels(wanted, Path(scratch), python_version, notes))
            budget = max_mb * 1e6 - folder_size(directory)
            # Smallest first: "as many as fit" means as many packages as fit.
            for wheel in sorted(Path(scratch).glob("*.whl"), key=lambda p: p.stat().st_size):
                if wheel.stat().st_size > budget:
                    left_out[wheel.name] = f"{wheel.stat().st_size / 1e6:.1f} MB does not fit the {max_mb:g} MB bundle"
                    continue
                budget -= wheel.stat().st_size
                (directory / "wheels").mkdir(exist_ok=True)
                shutil.move(str(wheel), directory / "wheels" / wheel.name)
    elif not wheels:
        left_out.update({name: "--no-wheels" for name in wanted})
    files = {str(path.relative_to(directory)): path.stat().st_size for path in sorted(directory.rglob("*"))
             if path.is_file() and path.name != "manifest.json"}
    manifest = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"), "target_python": python_version, "have": str(have_file) if have_file else None,
        "total_mb": round(sum(files.values()) / 1e6, 2), "max_mb": max_mb,
        "wheels": sorted(name for name in files if name.startswith("wheels/")),
        "dependencies_present_on_target": sorted(name for name in dependency_closure(python_version) if name in have),
        "left_out": left_out, "notes": notes, "files": files,
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    if manifest["total_mb"] > max_mb:
        raise SystemExit(f"the bundle is {manifest['total_mb']} MB, over the {max_mb:g} MB limit")
    return manifest


def copy_as_utf8(source: Path, destination: Path) -> None:
    """Some of the Gutenberg books are Latin-1; one corpus in one encoding is what ``data.files`` reads."""
    raw = source.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    destination.write_text(text, encoding="utf-8")


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# ----- run -------------------------------------------------------------------------------------
@dataclass
class Step:
    name: str
    status: str = "pending"  # passed | failed | skipped
    seconds: float = 0.0
    summary: str = ""
    details: dict = field(default_factory=dict)


@dataclass
class Sizes:
    """What differs between the real check (one H100/H200-class GPU, ~8 minutes) and the dry run."""
    dry_run: bool
    benchmark: list[str]
    benchmark_seeds: int
    pretrain: list[str]
    finetune: list[str]
    seeds: int
    probe: list[str]
    ddp: list[str]

    @classmethod
    def for_mode(cls, dry_run: bool) -> "Sizes":
        if dry_run:
            small = ["data.max_train_samples=32", "data.max_eval_samples=32", "data.max_seq_length=32", "train.max_steps=2",
                     "train.batch_size=8", "train.eval_steps=null", "train.logging_steps=1", "train.torch_num_threads=1"]
            return cls(True, small, 1,
                       ["train.max_steps=3", "train.batch_size=8", "data.max_seq_length=32", "mlm.tokenizer_vocab_size=300",
                        "train.eval_steps=null", "train.logging_steps=1", "train.torch_num_threads=1", "data.validation_fraction=0.01",
                        "model.architecture.num_hidden_layers=1", "model.architecture.hidden_size=32",
                        "model.architecture.num_attention_heads=2", "model.architecture.intermediate_size=64",
                        "model.architecture.vocab_size=300", "train.eval_on_start=false"],
                       small, 1, ["--train-samples", "32", "--eval-samples", "32", "--max-length", "32", "--threads", "1"], small)
        return cls(False, ["data.max_train_samples=null", "train.num_epochs=1", "train.eval_steps=null", "train.batch_size=64"], 1,
                   # ~4 minutes on an H100 for 4 x 256 at blocks of 128, batch 256 (about 12 updates/s in bf16).
                   ["train.max_steps=3000", "train.batch_size=256", "train.learning_rate=1.0e-3", "train.eval_steps=1000",
                    "data.validation_fraction=0.02", "train.logging_steps=100", "train.eval_on_start=true"],
                   ["data.max_train_samples=10000", "train.num_epochs=1", "train.eval_steps=null", "train.batch_size=64",
                    "train.learning_rate=1.0e-4"],
                   3, ["--train-samples", "4000"], ["train.max_steps=300", "train.eval_steps=null"])


class Runner:
    def __init__(self, bundle_dir: Path, out: Path, *, dry_run: bool, python: str, only: set[str] | None = None) -> None:
        self.only = only
        self.bundle = bundle_dir.resolve()
        self.out = out.resolve()
        self.dry_run = dry_run
        self.python = python
        self.sizes = Sizes.for_mode(dry_run)
        self.steps: list[Step] = []
        self.facts: dict = {}
        self.source = self.bundle / "src"
        self.site = Path(tempfile.mkdtemp(prefix="bertpipe-gpu-check-site-"))
        self.cuda_ok = False
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        # Run directories (models, checkpoints) stay out of OUT, which must stay a few MB; removed at the end.
        self.work = Path(tempfile.mkdtemp(prefix="bertpipe-gpu-check-runs-"))

    # -- plumbing
    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("ACCELERATE_")}
        env.update(PYTHONPATH=os.pathsep.join([str(self.site), str(self.source)]), BERTPIPE_MIRROR=str(self.bundle / "mirror"),
                   HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   HF_DATASETS_CACHE=str(self.work / "datasets-cache"))
        return env

    def call(self, step: Step, args: list[str], *, timeout: int = 900, log: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(args, cwd=self.source, env=self.env(), capture_output=True, text=True, timeout=timeout)
        text = f"$ {' '.join(args)}\n--- exit {result.returncode}\n--- stdout\n{result.stdout[-LOG_TAIL_CHARS:]}\n--- stderr\n{result.stderr[-LOG_TAIL_CHARS:]}\n"
        with open(self.out / "logs" / f"{log or step.name}.log", "a", encoding="utf-8") as handle:
            handle.write(text)
        if result.returncode != 0:
            raise StepFailed(f"exit {result.returncode}: {_last_line(result.stderr) or _last_line(result.stdout)}")
        return result

    def bertpipe(self, step: Step, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
        return self.call(step, [self.python, "-m", "tasks.cli", *args], timeout=timeout)

    def run_step(self, name: str, body: Callable[[Step], str], *, needs_cuda: bool = True) -> Step:
        step = Step(name)
        self.steps.append(step)
        if self.only is not None and name not in self.only:
            step.status, step.summary = "skipped", "not selected (--steps)"
            return step
        if needs_cuda and not self.dry_run and not self.cuda_ok:
            step.status, step.summary = "skipped", "no usable CUDA device (see the environment step)"
            return step
        started = time.perf_counter()
        try:
            step.summary = body(step)
            step.status = "skipped" if step.summary.startswith("skipped") else "passed"
        except StepFailed as error:
            step.status, step.summary = "failed", str(error)
        except Exception as error:  # a bug in one step must not stop the others
            step.status, step.summary = "failed", f"{type(error).__name__}: {error}"
        step.seconds = round(time.perf_counter() - started, 1)
        print(f"[gpu_check] {name}: {step.status} ({step.seconds} s) {step.summary}", flush=True)
        self.write_report()
        return step

    # -- steps
    def environment(self, step: Step) -> str:
        probe = (
            "import json, sys, torch; c = torch.cuda.is_available(); n = torch.cuda.device_count() if c else 0\n"
            "p = torch.cuda.get_device_properties(0) if c else None\n"
            "print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, 'cuda_build': torch.version.cuda,"
            " 'cuda_available': c, 'gpus': n, 'gpu_name': p.name if p else None,"
            " 'gpu_memory_gib': round(p.total_memory / 2**30, 1) if p else 0,"
            " 'bf16': bool(c and torch.cuda.is_bf16_supported(including_emulation=False)),"
            " 'capability': list(torch.cuda.get_device_capability(0)) if c else None}))"
        )
        facts = json.loads(self.call(step, [self.python, "-c", probe]).stdout.strip().splitlines()[-1])
        self.facts.update(facts)
        step.details = facts
        problems = []
        if not facts["cuda_available"]:
            problems.append(f"CUDA not visible to torch {facts['torch']} (CUDA build {facts['cuda_build']})")
        elif not facts["bf16"]:
            problems.append(f"{facts['gpu_name']} has no native bf16 (capability {facts['capability']}): auto will train in fp16")
        if facts["cuda_available"] and facts["gpu_memory_gib"] < MIN_GPU_MEMORY_GIB:
            problems.append(f"{facts['gpu_memory_gib']} GiB of GPU memory, under the {MIN_GPU_MEMORY_GIB} GiB these sizes assume")
        self.cuda_ok = bool(facts["cuda_available"]) and facts["gpu_memory_gib"] >= MIN_GPU_MEMORY_GIB
        found = f"python {facts['python']}, torch {facts['torch']} (CUDA {facts['cuda_build']}), {facts['gpus']} GPU(s) {facts['gpu_name'] or ''}"
        if problems and not self.dry_run:
            raise StepFailed(f"{found}; failed assumption: {'; '.join(problems)}")
        return found + (f" (dry run: {'; '.join(problems)})" if problems else "")

    def install(self, step: Step) -> str:
        wheels = sorted((self.bundle / "wheels").glob("*.whl")) if (self.bundle / "wheels").is_dir() else []
        check = (
            "import json, sys, importlib.metadata as m\nout = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = None\n"
            "print(json.dumps(out))"
        )
        names = [_wheel_name(wheel) for wheel in wheels]
        present = json.loads(self.call(step, [self.python, "-c", check, *[n for n, _ in names]]).stdout) if names else {}
        install, kept = [], []
        for wheel, (name, version) in zip(wheels, names):
            if present.get(name) and _compatible(name, present[name], version):
                kept.append(f"{name} {present[name]}")
            else:
                install.append(wheel)
        step.details = {"installed": [w.name for w in install], "kept_from_machine": kept}
        if install:
            self.call(step, [self.python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(self.site),
                             *map(str, install)])
        versions = self.call(step, [self.python, "-c", "import torch, transformers, accelerate, datasets, peft; import pipelines.train, tasks;"
                                    "print(f'transformers {transformers.__version__}, accelerate {accelerate.__version__}, "
                                    "datasets {datasets.__version__}, peft {peft.__version__}')"]).stdout.strip()
        return f"{len(install)} wheel(s) installed, {len(kept)} kept from the machine; {versions}"

    def gpu_tests(self, step: Step) -> str:
        args = [self.python, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--junitxml",
                str(self.out / "logs" / "gpu_tests.xml")]
        result = self.call(step, args, timeout=600)
        return _last_line(result.stdout)

    def benchmark(self, step: Step) -> str:
        folder = self.work / "benchmark"
        self.bertpipe(step, "benchmark", "configs/classification/sst2.yaml", *self.sizes.benchmark, "--seeds", str(self.sizes.benchmark_seeds),
                      "--output-dir", str(folder), timeout=1200)
        result = json.loads((folder / "benchmark.json").read_text(encoding="utf-8"))
        step.details = {key: result[key] for key in ("config", "train_examples", "eval_examples", "metric", "rows", "ratios", "runs")}
        shutil.copy2(folder / "benchmark.md", self.out / "benchmark.md")
        metric = result["metric"]
        return "; ".join(
            f"{run['setting']} ({run['precision']}) {run['train_samples'] / run['train_runtime']:.0f} samples/s, "
            f"{metric} {run['metrics'][metric]:.4f}" for run in result["runs"]
        ) + " (benchmark.md)"

    def ddp(self, step: Step) -> str:
        gpus = self.facts.get("gpus", 0)
        if gpus < 2 and not self.dry_run:
            return f"skipped: {gpus} GPU(s)"
        run = self.work / "ddp"
        self.call(step, [self.python, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                         "--dynamo_backend", "no", "--main_process_port", "29631", "scripts/train.py", "configs/classification/sst2.yaml",
                         f"output_dir={run}", "overwrite=true", *self.sizes.ddp], timeout=900)
        metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
        step.details = metrics
        if metrics["num_processes"] != 2:
            raise StepFailed(f"ran with {metrics['num_processes']} process(es), not 2")
        return f"2 processes, eval_accuracy {metrics['eval_accuracy']:.4f}, {metrics['train_samples_per_second']} samples/s"

    def fsdp(self, step: Step) -> str:
        if self.dry_run:
            # accelerate 1.15 enables FSDP only for GPU distributed types: on a CPU, a process group is gloo
            # MULTI_CPU and bertpipe refuses the FSDP config (README); the dry run checks it parses.
            self.call(step, [self.python, "-c", "from accelerate.commands.config.config_args import ClusterConfig; import sys;"
                                               "c = ClusterConfig.from_yaml_file(sys.argv[1]); assert c.fsdp_config['fsdp_version'] == 2",
                             "configs/accelerate/fsdp.yaml"])
            return "skipped: FSDP needs a GPU (config parsed)"
        gpus = self.facts.get("gpus", 0)
        run, resumed = self.work / "fsdp", self.work / "fsdp-resumed"

        def launch(output_dir: Path, *extra: str) -> list[str]:
            return [self.python, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/fsdp.yaml",
                    "--num_processes", str(min(2, gpus)), "--main_process_port", "29633", "scripts/train.py",
                    "configs/classification/sst2.yaml", f"output_dir={output_dir}", "overwrite=true", "train.max_steps=60",
                    "train.save_steps=30", "train.eval_steps=null", *extra]

        self.call(step, launch(run), timeout=900)
        self.call(step, launch(resumed, f"train.resume_from_checkpoint={run / 'checkpoints' / 'step-00000030'}"), timeout=900,
                  log="fsdp_resume")
        served = self.call(step, [self.python, "-c", "import sys; from transformers import pipeline;"
                                  "print(pipeline('text-classification', model=sys.argv[1])('a gorgeous, moving film'))", str(run)]).stdout
        metrics, again = (json.loads((folder / "metrics.json").read_text(encoding="utf-8")) for folder in (run, resumed))
        step.details = {"run": metrics, "resumed": again}
        if abs(metrics["eval_accuracy"] - again["eval_accuracy"]) > 0.01:
            raise StepFailed(f"resumed at step 30: eval_accuracy {again['eval_accuracy']:.4f}, uninterrupted {metrics['eval_accuracy']:.4f}")
        return (f"{min(2, gpus)} process(es), eval_accuracy {metrics['eval_accuracy']:.4f} (resumed from step 30: "
                f"{again['eval_accuracy']:.4f}); pipeline() on the saved model: {served.strip()[:80]}")

    def pretraining(self, step: Step) -> str:
        texts = sorted(str(path) for path in (self.bundle / "text").glob("*"))
        pretrained = self.work / "pretrain"
        self.bertpipe(step, "train", "configs/pretrain/wikitext2_mlm.yaml", f"output_dir={pretrained}", "overwrite=true",
                      f"data.files.train={json.dumps(texts)}", *self.sizes.pretrain, timeout=1200)
        mlm = json.loads((pretrained / "metrics.json").read_text(encoding="utf-8"))
        architecture = json.loads((pretrained / "config.json").read_text(encoding="utf-8"))
        shape = {key: architecture[key] for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                                                    "max_position_embeddings", "vocab_size")}
        results: dict[str, list[float]] = {"pretrained": [], "random init": []}
        for seed in range(self.sizes.seeds):
            for label, model in (("pretrained", [f"model.name_or_path={pretrained}"]),
                                 ("random init", ["model.name_or_path=null", f"model.tokenizer_name_or_path={pretrained}",
                                                  f"model.architecture={json.dumps(shape)}"])):
                run = self.work / f"sst2-{label.replace(' ', '-')}-{seed}"
                self.bertpipe(step, "train", "configs/classification/sst2.yaml", f"output_dir={run}", "overwrite=true", f"seed={42 + seed}",
                              *model, *self.sizes.finetune, timeout=900)
                results[label].append(json.loads((run / "metrics.json").read_text(encoding="utf-8"))["eval_accuracy"])
        probe = self.call(step, [self.python, "scripts/linear_probe.py", f"random:{pretrained}", str(pretrained), MODEL_ID,
                                 "--json", str(self.out / "linear_probe.json"), *self.sizes.probe], timeout=900, log="linear_probe")
        step.details = {"mlm": {k: mlm.get(k) for k in ("eval_perplexity", "eval_accuracy", "global_step", "train_runtime",
                                                         "train_tokens_per_second", "mixed_precision")},
                        "sst2_accuracy": results, "linear_probe": json.loads((self.out / "linear_probe.json").read_text(encoding="utf-8")),
                        "linear_probe_table": probe.stdout.strip()}
        mean = {label: sum(values) / len(values) for label, values in results.items()}
        return (f"MLM {mlm['global_step']} updates in {mlm['train_runtime']:.0f} s, perplexity {mlm['eval_perplexity']:.1f}; "
                f"SST-2 accuracy over {self.sizes.seeds} seed(s): pretrained {mean['pretrained']:.4f} vs random init {mean['random init']:.4f}")

    # -- report
    def write_report(self) -> None:
        failed = [step.name for step in self.steps if step.status == "failed"]
        document = {"dry_run": self.dry_run, "bundle": str(self.bundle), "facts": self.facts, "failed": failed,
                    "steps": [asdict(step) for step in self.steps]}
        (self.out / "gpu_check.json").write_text(json.dumps(document, indent=1, default=str), encoding="utf-8")
        lines = [f"# bertpipe GPU check{' (dry run, CPU, toy sizes)' if self.dry_run else ''}", "",
                 f"{self.facts.get('gpu_name') or 'no GPU'}; python {self.facts.get('python', '?')}, torch {self.facts.get('torch', '?')}; "
                 f"{'all steps passed' if not failed else 'FAILED: ' + ', '.join(failed)}", "",
                 "| step | status | seconds | result |", "| --- | --- | ---: | --- |"]
        lines += [f"| {s.name} | {s.status} | {s.seconds} | {s.summary.replace('|', '/')} |" for s in self.steps]
        (self.out / "gpu_check.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def plan(self) -> list[tuple[str, Callable[[Step], str], bool]]:
        """(name, step, needs CUDA) in order; environment and install always run: the others need them."""
        return [("environment", self.environment, False), ("install", self.install, False), ("gpu-tests", self.gpu_tests, True),
                ("benchmark", self.benchmark, True), ("ddp", self.ddp, True), ("fsdp", self.fsdp, True),
                ("pretraining", self.pretraining, True)]

    def run(self) -> int:
        if self.only is not None:
            self.only |= {"environment", "install"}
        for name, body, needs_cuda in self.plan():
            self.run_step(name, body, needs_cuda=needs_cuda)
        shutil.rmtree(self.site, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.write_report()
        return 1 if any(step.status == "failed" for step in self.steps) else 0


class StepFailed(Exception):
    pass


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _wheel_name(wheel: Path) -> tuple[str, str]:
    _, canonicalize_name, _ = _packaging()
    name, version = wheel.name.split("-")[:2]
    return canonicalize_name(name), version


def _compatible(name: str, present: str, bundled: str) -> bool:
    """The machine's copy will do when it satisfies bertpipe's own requirement on it (or, for a package
    bertpipe needs only indirectly, shares the bundled wheel's major version)."""
    Requirement, canonicalize_name, Version = _packaging()
    for text in _project_dependencies():
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == name:
            return requirement.specifier.contains(present, prereleases=True)
    try:
        return Version(present).major == Version(bundled).major
    except Exception:
        return present == bundled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("bundle", help="write what an air-gapped GPU machine may lack into DIR")
    make.add_argument("dir", type=Path)
    make.add_argument("--python", default="3.12", help="the target's Python version (default 3.12)")
    make.add_argument("--have", type=Path, help="`pip freeze` of the target: bundle only what it lacks")
    make.add_argument("--no-wheels", action="store_true", help="bundle no wheels (no registry needed)")
    make.add_argument("--max-mb", type=float, default=60.0)
    make.add_argument("--shared", type=Path, default=SHARED, help="the ../shared folder (mirror/ and data/)")
    check = commands.add_parser("run", help="run the check on the GPU machine")
    check.add_argument("dir", type=Path)
    check.add_argument("out", type=Path)
    check.add_argument("--dry-run", action="store_true", help="the same steps at toy size, on the CPU")
    check.add_argument("--python", default=os.environ.get("PYTHON", "python3"), help="the machine's Python (default python3)")
    check.add_argument("--steps", help="comma-separated subset: gpu-tests, benchmark, ddp, fsdp, pretraining (default all)")
    args = parser.parse_args(argv)
    if args.command == "bundle":
        manifest = bundle(args.dir, python_version=args.python, have_file=args.have, wheels=not args.no_wheels, max_mb=args.max_mb,
                          shared=args.shared)
        print(f"wrote {args.dir}: {manifest['total_mb']} MB, {len(manifest['wheels'])} wheel(s), "
              f"{len(manifest['left_out'])} package(s) left out (manifest.json says why)")
        return 0
    if not (args.dir / "src" / "tasks").is_dir():
        parser.error(f"{args.dir} is not a bundle (no src/tasks); make one with: gpu_check.sh bundle DIR")
    only = None if args.steps is None else {name.strip() for name in args.steps.split(",") if name.strip()}
    return Runner(args.dir, args.out, dry_run=args.dry_run, python=args.python, only=only).run()


if __name__ == "__main__":
    sys.exit(main())

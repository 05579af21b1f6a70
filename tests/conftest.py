"""Shared fixtures: a tiny BERT and WordPiece tokenizer built here, small data files, a CLI runner.

Nothing here touches the network; tests that need ``../shared`` use :func:`shared_path`, which
skips when it is absent.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests import cli_server

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"

POSITIVE_WORDS = ["good", "great", "fine", "lovely", "superb", "happy", "bright", "warm"]
NEGATIVE_WORDS = ["bad", "awful", "poor", "dull", "grim", "sad", "dark", "cold"]
FILLER_WORDS = ["the", "film", "was", "a", "story", "with", "very", "and", "plot", "actors", "it", "is", "of", "scenes"]


# Most of the suite's time is CLI subprocesses importing torch/transformers: single-threaded work that
# xdist spreads over the cores (pyproject: -n auto --dist loadfile, so a module's fixtures stay in one
# worker). Past 4 workers, the session fixtures rebuilt per worker and torch threads oversubscribing
# the cores cost more than they save.
MAX_TEST_WORKERS = 4


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(MAX_TEST_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (the ../shared folder with real data is not on this machine)")
    return path


def corpus_sentences(count: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = POSITIVE_WORDS + NEGATIVE_WORDS + FILLER_WORDS
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) for _ in range(count)]


def written_wordpiece(lines: list[str], special: list[str], *, split: set[str] = frozenset()):
    """A BERT-style WordPiece tokenizer (``tokenizers.Tokenizer``: lowercasing ``BertNormalizer``,
    ``BertPreTokenizer``) over ``lines``: the special tokens, every letter alone and as a ``##`` continuation,
    then every word whole, except the words in ``split`` (lowercase), which are cut into letters.

    Written out rather than trained: ``WordPieceTrainer`` breaks ties between equally frequent merges in hash
    order, which changes from process to process, and with it the vocabulary, the model built on it and what a
    barely trained model of it predicts (a flaky test of one worker that the next run could not reproduce).
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = {word for line in lines for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line))}
    letters = sorted({letter for word in words for letter in word})
    pieces = [*special, *letters, *(f"##{letter}" for letter in letters), *sorted(words - set(split) - set(letters))]
    tokenizer = Tokenizer(models.WordPiece({piece: index for index, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    return tokenizer


def build_tiny_bert(directory: Path, *, vocab_words: list[str] | None = None) -> Path:
    """A 2-layer BERT (hidden 32) with a WordPiece tokenizer holding every word of a generated corpus whole."""
    from tokenizers import processors
    from transformers import BertConfig, BertModel, BertTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = written_wordpiece(corpus_sentences() + (vocab_words or []), special)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    fast = BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=64)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
    )
    import torch

    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def resaved_checkpoint(model, checkpoint: Path, folder: Path) -> Path:
    """``model`` (loaded from ``checkpoint``, then changed: another head class, another dtype) saved into ``folder``
    beside ``checkpoint``'s tokenizer: a checkpoint as the Hub ships its variants."""
    from transformers import AutoTokenizer

    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def sentiment_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        positive = rng.random() < 0.5
        cue = rng.choice(POSITIVE_WORDS if positive else NEGATIVE_WORDS)
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(2, 12))]
        words.insert(rng.randint(0, len(words)), cue)
        rows.append({"sentence": " ".join(words), "label": "positive" if positive else "negative"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="session")
def sentiment_files(tmp_path_factory) -> dict[str, Path]:
    """train: 96 rows; validation: 37 rows (odd, so a duplicated last batch would show)."""
    folder = tmp_path_factory.mktemp("sentiment")
    return {
        "train": write_jsonl(folder / "train.jsonl", sentiment_rows(96, seed=1)),
        "validation": write_jsonl(folder / "validation.jsonl", sentiment_rows(37, seed=2)),
    }


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def classification_config(tmp_path: Path, tiny_bert: Path, files: dict[str, Path], *, run_name: str = "run", **train_keys) -> Path:
    """A classification config on the tiny BERT and the sentiment files; ``train_keys`` override ``train:``."""
    train = {"num_epochs": 10, "batch_size": 8, "learning_rate": 3e-3, "lr_scheduler": "constant", "logging_steps": 4,
             "eval_steps": 24, **train_keys}
    train_yaml = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in train.items())
    return write_config(tmp_path / f"{run_name}.yaml", f"""# test config
task: classification
output_dir: {tmp_path / run_name}
seed: 7
model:
  name_or_path: {tiny_bert}
data:
  files:
    train: {files['train']}
    validation: {files['validation']}
  text_column: sentence
  label_column: label
  max_seq_length: 32
train:
{train_yaml}
""")


# Set in this process by torch the first time something here looks for inductor's cache, not by the user.
_SET_BY_TORCH_HERE = set() if "TORCHINDUCTOR_CACHE_DIR" in os.environ else {"TORCHINDUCTOR_CACHE_DIR"}


def cli_env(**extra: str) -> dict[str, str]:
    # BERTPIPE_NATIVE_BF16 passes through, so `BERTPIPE_NATIVE_BF16=1 pytest` runs every CLI test as on a bf16 CPU.
    # PYTEST_CURRENT_TEST does not: it names each test, and the warm server runs only commands in its own environment
    # (nor, for that reason, what torch set here after the server started).
    env = {key: value for key, value in os.environ.items()
           if not (key.startswith(("ACCELERATE_", "BERTPIPE_", "PYTEST_CURRENT_TEST")) or key in _SET_BY_TORCH_HERE)
           or key == "BERTPIPE_NATIVE_BF16"}
    # Kept after the repo: scripts/gpu_check.sh puts the wheels it installed there.
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(PYTHONPATH=python_path, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def signal_after_logged_losses(process: subprocess.Popen, log: Path, count: int, signal_number: int, *, timeout: float = 120,
                               children: list | None = None) -> str:
    """Send ``signal_number`` to a running CLI ``process`` once its ``log.jsonl`` holds ``count`` loss records,
    and return its stderr once it has ended; fail with that stderr if it ends (or ``timeout`` passes) first.
    ``children``, when given, receives the process's child processes (psutil) as they were when signalled."""
    deadline = time.monotonic() + timeout
    while not (log.is_file() and sum("loss" in line for line in log.read_text().splitlines()) >= count):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.01)
    if children is not None:
        import psutil

        children.extend(psutil.Process(process.pid).children())
    process.send_signal(signal_number)
    return process.communicate(timeout=timeout)[1]


def run_cli(*args: str, env: dict[str, str] | None = None, check: bool = True, timeout: int = 600, script: str | None = None,
            new_session: bool = False) -> subprocess.CompletedProcess:
    """``bertpipe ARGS`` in a process of its own, as a user would run it: forked from this worker's warm
    server when ``env`` is the default one (tests/cli_server.py), else in a fresh interpreter.
    ``script`` runs ``python -c SCRIPT ARGS`` instead (a CLI with something patched); ``new_session`` as
    ``subprocess``'s ``start_new_session``."""
    env = env or cli_env()
    result = cli_server.run(list(args), env, REPO_ROOT, timeout, server_env=cli_env(), script=script, new_session=new_session)
    if result is None:
        result = subprocess.run(
            cli_server.command([str(arg) for arg in args], script), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
            timeout=timeout, start_new_session=new_session,
        )
    if check and result.returncode != 0:
        raise AssertionError(f"bertpipe {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def start_cli(*args: str, script: str | None = None, new_session: bool = False, sigint_default: bool = False):
    """``run_cli`` for a command the test signals while it runs: the started process (``subprocess.Popen``'s
    ``pid``, ``poll``, ``wait``, ``communicate``, ``send_signal``, ``kill``, ``returncode``). ``sigint_default``
    gives it SIGINT's default action, as a child of a terminal has: pytest run as a shell's background job
    (`pytest &`) ignores SIGINT, and its children inherit that, so a Ctrl-C would not reach the command."""
    started = cli_server.start(list(args), cli_env(), REPO_ROOT, server_env=cli_env(), script=script, new_session=new_session,
                               sigint_default=sigint_default)
    if started is None:
        restore_sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint_default else None
        started = subprocess.Popen(cli_server.command([str(arg) for arg in args], script), cwd=REPO_ROOT, env=cli_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=new_session,
                                   preexec_fn=restore_sigint)
    return started


def check_lora_run(config: Path, run_dir: Path, metric: str, *overrides: str, pipeline_input: Any = None) -> dict:
    """Train ``config`` with a LoRA adapter for a few steps, then re-evaluate the adapter run.

    Checks what issue 7 asks of every task: the run holds an adapter (not a full model copy), only a
    small share of the parameters trained, ``bertpipe evaluate`` loads it through peft and
    reproduces the training metrics, and ``pipeline(TASK, model=RUN_DIR)`` loads it through peft and
    answers ``pipeline_input``.
    """
    run_cli("train", str(config), f"output_dir={run_dir}", "overwrite=true", "model.peft.method=lora", "model.peft.r=4",
            "train.max_steps=4", "train.eval_steps=null", *overrides)
    assert (run_dir / "adapter_config.json").is_file() and (run_dir / "adapter_model.safetensors").is_file()
    assert not (run_dir / "model.safetensors").exists()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0 < metrics["trainable_params"] < 0.5 * metrics["total_params"]
    run_cli("evaluate", str(run_dir))
    evaluated = json.loads(next(run_dir.glob("eval_*.json")).read_text())
    assert evaluated[metric] == pytest.approx(metrics[metric], rel=1e-4, abs=1e-4)
    if pipeline_input is not None:
        from peft import PeftModel
        from transformers import pipeline

        from pipelines.outputs import load_saved_config
        from tasks import get_task

        saved = load_saved_config(run_dir)
        served = pipeline(get_task(saved["task"]).pipeline_tag, model=str(run_dir))
        assert isinstance(served.model, PeftModel)
        # What it answers after 4 updates depends on what they learnt (NER may tag nothing yet); that the
        # adapter serves through peft is checked here, and each task's own test compares the answer with predict's.
        assert isinstance(served(pipeline_input), (list, dict))
    return metrics

"""A command stopped at any moment (Ctrl-C, SIGTERM, a kill) leaves nothing broken: the next command
finishes or resumes the work, or refuses with exit status 2 and one message saying what to do."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import torch

from tests.conftest import REPO_ROOT, classification_config, cli_env, run_cli, signal_after_logged_losses, start_cli
from tests.test_cli_resume import SLOW_TRAINING

PINNED = {"mixed_precision": "no", "torch_num_threads": 1}


def test_cli_signals_ctrl_c_before_the_first_checkpoint_leaves_a_run_whose_rerun_says_what_works(tmp_path, tiny_bert, sentiment_files):
    # No checkpoint yet (train.save_steps unset): the refusal sent the user to
    # train.resume_from_checkpoint=latest, which only failed in turn ("holds no complete checkpoint").
    # More steps than the test waits for, so that the run ends by the Ctrl-C or not at all. The child gets SIGINT's
    # default disposition, as from a terminal: it inherits the parent's, and pytest run as a shell's background job
    # (`pytest &`) ignores SIGINT (Python then leaves it ignored, and the run trained to its end whatever the test sent).
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=100_000, logging_steps=1, eval_steps=None, **PINNED)
    process = start_cli("train", str(config), script=SLOW_TRAINING, sigint_default=True)
    try:
        stderr = signal_after_logged_losses(process, tmp_path / "run" / "log.jsonl", 1, signal.SIGINT)
    finally:
        process.kill()
    assert process.returncode == 130, stderr[-3000:]

    rerun = run_cli("train", str(config), check=False)
    assert rerun.returncode == 2 and "Traceback" not in rerun.stderr, rerun.stderr[-3000:]
    message = rerun.stderr.strip().splitlines()[-1]
    assert str(tmp_path / "run") in message and "overwrite=true" in message and "nothing to resume" in message, message
    assert "resume_from_checkpoint=latest" not in message, message


# Runs the CLI and loses the power while the final save rewrites the run's tokenizer.json (a kill mid-write:
# half the file is there), after the run's last checkpoint.
POWER_LOSS_IN_THE_FINAL_TOKENIZER_SAVE = """
import os, sys
from pathlib import Path
from transformers.tokenization_utils_tokenizers import TokenizersBackend
save, calls = TokenizersBackend.save_pretrained, []
def save_then_lose_power(self, directory, *args, **kwargs):
    files = save(self, directory, *args, **kwargs)
    calls.append(directory)
    if len(calls) == 2:  # the first save is the run's start, the second the final save
        path = Path(directory) / "tokenizer.json"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        os._exit(9)
    return files
TokenizersBackend.save_pretrained = save_then_lose_power
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_signals_a_kill_while_the_final_save_writes_the_tokenizer_leaves_a_resumable_pretraining_run(tmp_path):
    # A run that trained its own tokenizer reads it back from output_dir on resume: rewritten in place
    # and cut short, tokenizer.json made the run unresumable (its checkpoints' embeddings index that vocabulary).
    from tests.test_cli_mlm import corpus_file, pretrain_config

    config = pretrain_config(tmp_path, corpus_file(tmp_path))
    overrides = ["train.max_steps=2", "train.save_steps=2", "train.eval_steps=null", "data.max_train_samples=64"]
    killed = run_cli("train", str(config), *overrides, script=POWER_LOSS_IN_THE_FINAL_TOKENIZER_SAVE, timeout=300, check=False)
    assert killed.returncode == 9, killed.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.json").exists()

    resumed = run_cli("train", str(config), *overrides, "train.resume_from_checkpoint=latest", check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step-00000002" in resumed.stdout and (tmp_path / "run" / "metrics.json").is_file()


# Runs the CLI with a SIGTERM delivered to itself as the final evaluation starts (a scheduler taking the machine).
SIGTERM_IN_THE_FINAL_EVALUATION = """
import os, signal, sys
import pipelines.train as train
evaluate = train.evaluate
def evaluate_after_a_sigterm(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return evaluate(*args, **kwargs)
train.evaluate = evaluate_after_a_sigterm
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_signals_sigterm_in_the_final_evaluation_checkpoints_the_last_step_and_the_resume_finishes(tmp_path, tiny_bert, sentiment_files):
    # Outside the loop SIGTERM killed the process at once: without train.save_steps (the default) the
    # whole training was lost to a signal a second after its last step, which a second before it saved.
    from safetensors.torch import load_file

    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=6, eval_steps=None, **PINNED)
    stopped = run_cli("train", str(config), script=SIGTERM_IN_THE_FINAL_EVALUATION, timeout=300, check=False)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000006"
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"bertpipe train: stopped by SIGTERM at step 6 of 6; checkpoint {checkpoint} is complete: "
        "continue with train.resume_from_checkpoint=latest"
    )
    assert not (tmp_path / "run" / "metrics.json").exists()

    resumed = run_cli("train", str(config), "train.resume_from_checkpoint=latest")
    assert "step-00000006" in resumed.stdout
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and metrics["train_samples"] == 6 * 8
    # Nothing was trained again: the final model is the last step's.
    final, saved = load_file(tmp_path / "run" / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert final.keys() == saved.keys() and all(torch.equal(final[name], saved[name]) for name in final)


def test_cli_signals_a_sigterm_to_a_one_process_accelerate_launch_reaches_the_run_and_it_checkpoints(tmp_path, tiny_bert, sentiment_files):
    # A scheduler signals the command it started: here the launcher, which hands SIGTERM on to its one training
    # process and kills it 5 s later (as accelerate 1.16's launcher does; the README tells users what to rely on).
    script = tmp_path / "train_slowly.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\nsys.argv[1:1] = ['train']\n" + SLOW_TRAINING)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, eval_steps=None, **PINNED)
    process = subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--mixed_precision", "no",
         "--dynamo_backend", "no", str(script), str(config)],
        cwd=REPO_ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stderr = signal_after_logged_losses(process, tmp_path / "run" / "log.jsonl", 3, signal.SIGTERM)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    stopped = [line for line in stderr.splitlines() if line.startswith("bertpipe train: stopped by SIGTERM at step ")]
    assert len(stopped) == 1 and "is complete: continue with train.resume_from_checkpoint=latest" in stopped[0], stderr[-3000:]
    checkpoints = list((tmp_path / "run" / "checkpoints").iterdir())
    assert len(checkpoints) == 1 and checkpoints[0].name.startswith("step-") and str(checkpoints[0]) in stopped[0]

    run_cli("train", str(config), "train.resume_from_checkpoint=latest")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["global_step"] == 120  # 10 epochs of 12 batches


# bertpipe, with a SIGTERM sent to itself right after predict has written its first row to the file beside its output.
SIGTERM_MID_WRITE = f"""
import contextlib, os, signal, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import pipelines.evaluation as evaluation
writing_atomically = evaluation.writing_atomically

@contextlib.contextmanager
def signalled_after_the_first_row(path):
    with writing_atomically(path) as handle:
        class Handle:
            def write(self, text):
                handle.write(text)
                handle.flush()
                os.kill(os.getpid(), signal.SIGTERM)
        yield Handle()

evaluation.writing_atomically = signalled_after_the_first_row
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_signals_sigterm_while_predict_writes_leaves_the_output_as_it_was_and_nothing_beside_it(tmp_path, tiny_bert, sentiment_files):
    """Killed by the signal, predict left its half-written OUTPUT.tmp beside the output, and every later run wrote
    OUTPUT.1.tmp, ... instead, never removing it."""
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=2, eval_steps=None, **PINNED)
    run_cli("train", str(config))
    output = tmp_path / "out" / "predictions.jsonl"
    output.parent.mkdir()
    output.write_text("kept\n")
    stopped = run_cli("predict", str(tmp_path / "run"), "--input", str(sentiment_files["validation"]), "--output", str(output),
                      script=SIGTERM_MID_WRITE, check=False)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and stopped.stderr.strip().splitlines()[-1] == (
        "bertpipe predict: stopped by SIGTERM; nothing half-written is left, and files that were there are unchanged; "
        "the command has nothing to resume: run it again"), stopped.stderr[-3000:]
    assert output.read_text() == "kept\n" and sorted(path.name for path in output.parent.iterdir()) == ["predictions.jsonl"]
    run_cli("predict", str(tmp_path / "run"), "--input", str(sentiment_files["validation"]), "--output", str(output))
    assert len(output.read_text().splitlines()) == 37

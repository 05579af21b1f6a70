"""An interrupted run resumed from its last checkpoint ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.conftest import classification_config, cli_env, run_cli, signal_after_logged_losses, start_cli

TRAIN = dict(num_epochs=3, eval_steps=5, save_steps=4, logging_steps=1, lr_scheduler="linear", warmup_steps=2,
             gradient_accumulation_steps=2, batch_size=8)

# Runs the CLI, hard-killing the process (no cleanup, like a crash) once the second checkpoint is complete.
CRASH_AFTER_SECOND_CHECKPOINT = """
import os, sys
import pipelines.train as train
save = train.save_checkpoint
def save_then_crash(*args, **kwargs):
    folder = save(*args, **kwargs)
    if folder.name == "step-00000008":
        os._exit(9)
    return folder
train.save_checkpoint = save_then_crash
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


# Runs the CLI with each batch slowed down, so that a signal sent from outside lands mid-training.
SLOW_TRAINING = """
import sys, time
import pipelines.train as train
count = train.count_samples_and_tokens
def slowly(batch):
    time.sleep(0.05)
    return count(batch)
train.count_samples_and_tokens = slowly
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def final_state(run_dir):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    losses = [record for record in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "loss" in record]
    return metrics, losses


# Frozen input embeddings: the optimizer's state covers fewer parameters, which the checkpoint must restore as such.
@pytest.mark.parametrize("overrides", [(), ("model.freeze_input_embeddings=true",)], ids=["trained", "frozen-embeddings"])
def test_cli_resume_after_interruption_matches_uninterrupted(tmp_path, tiny_bert, sentiment_files, overrides):
    reference = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="reference", **TRAIN)
    run_cli("train", str(reference), *overrides)

    interrupted = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="interrupted", **TRAIN)
    crashed = run_cli("train", str(interrupted), *overrides, script=CRASH_AFTER_SECOND_CHECKPOINT, check=False)
    assert crashed.returncode == 9, crashed.stderr[-3000:]
    assert not (tmp_path / "interrupted" / "metrics.json").exists()

    result = run_cli("train", str(interrupted), *overrides, "train.resume_from_checkpoint=latest")
    assert "resumed from" in result.stdout and "step-00000008" in result.stdout

    expected_metrics, expected_losses = final_state(tmp_path / "reference")
    metrics, losses = final_state(tmp_path / "interrupted")
    assert expected_metrics["global_step"] == 18  # 12 batches/epoch, 2 per update, 3 epochs
    assert (metrics["trainable_params"] < metrics["total_params"]) == bool(overrides)
    for key in ("eval_accuracy", "eval_f1_macro", "global_step", "epoch", "train_loss"):
        assert metrics[key] == pytest.approx(expected_metrics[key], rel=1e-5, abs=1e-6), key
    # The whole run's counts, not only the part after the resume (the checkpoint carries them).
    assert expected_metrics["train_samples"] == 288  # 3 epochs of 96
    for key in ("train_samples", "train_tokens"):
        assert metrics[key] == expected_metrics[key], key
    # Every step logged once (not again for the steps the interrupted run logged after its checkpoint), with the
    # loss of the uninterrupted run: those before the checkpoint as recorded, those after as trained again.
    assert [record["step"] for record in losses] == list(range(1, 19))
    for record, expected in zip(losses, expected_losses, strict=True):
        assert record["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-6), record["step"]


def test_cli_sigterm_checkpoints_the_step_it_stops_at_and_the_resume_matches_uninterrupted(tmp_path, tiny_bert, sentiment_files):
    """What a scheduler does before it takes the machine away (Slurm, Kubernetes): SIGTERM, a grace period,
    then SIGKILL. The run stops at the end of the step, writes that step's checkpoint (none is due by
    save_steps), says so in one line and exits 143; the resume ends where the uninterrupted run ends."""
    keys = dict(TRAIN, num_epochs=6, save_steps=None)
    reference = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="reference", **keys)
    run_cli("train", str(reference))

    stopped = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="stopped", **keys)
    process = start_cli("train", str(stopped), script=SLOW_TRAINING)
    stderr = signal_after_logged_losses(process, tmp_path / "stopped" / "log.jsonl", 3, signal.SIGTERM, timeout=300)

    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr
    message = stderr.strip().splitlines()[-1]
    found = re.fullmatch(r"bertpipe train: stopped by SIGTERM at step (\d+) of 36; checkpoint (\S+) is complete: "
                         r"continue with train.resume_from_checkpoint=latest", message)
    assert found, message
    step = int(found.group(1))
    assert 3 <= step < 36
    assert [path.name for path in (tmp_path / "stopped" / "checkpoints").iterdir()] == [f"step-{step:08d}"]
    assert found.group(2) == str(tmp_path / "stopped" / "checkpoints" / f"step-{step:08d}")
    assert not (tmp_path / "stopped" / "metrics.json").exists()

    result = run_cli("train", str(stopped), "train.resume_from_checkpoint=latest")
    assert f"step-{step:08d}" in result.stdout
    expected_metrics, expected_losses = final_state(tmp_path / "reference")
    metrics, losses = final_state(tmp_path / "stopped")
    for key in ("eval_accuracy", "eval_f1_macro", "global_step", "epoch", "train_loss", "train_samples", "train_tokens"):
        assert metrics[key] == pytest.approx(expected_metrics[key], rel=1e-5, abs=1e-6), key
    assert [record["step"] for record in losses] == list(range(1, 37))
    for record, expected in zip(losses, expected_losses):
        assert record["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-6), record["step"]


def test_cli_resume_from_missing_or_corrupt_checkpoint_is_a_clear_error(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="broken", max_steps=4, save_steps=2)
    result = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "no complete checkpoint" in result.stderr and "overwrite=true" in result.stderr

    run_cli("train", str(config))
    (tmp_path / "broken" / "metrics.json").unlink()  # unfinished: a finished run has nothing to resume
    checkpoint = tmp_path / "broken" / "checkpoints" / "step-00000004"
    (checkpoint / "model.safetensors").write_bytes(b"truncated")
    result = run_cli("train", str(config), f"train.resume_from_checkpoint={checkpoint}", check=False)
    assert result.returncode == 2 and "cannot be loaded" in result.stderr and str(checkpoint) in result.stderr

    partial = tmp_path / "broken" / "checkpoints" / "step-00000006.partial"
    partial.mkdir()
    result = run_cli("train", str(config), f"train.resume_from_checkpoint={partial}", check=False)
    assert result.returncode == 2 and "incomplete" in result.stderr


class Interrupted(Exception):
    pass


def train_in_process(config_path, *overrides, crash_when=None, monkeypatch=None):
    """train() in this process; ``crash_when(folder, state)`` True interrupts it just after that checkpoint."""
    import pipelines.train as train_module
    from pipelines.cli import load_run_config
    from tasks import get_task

    if crash_when is not None:
        save = train_module.save_checkpoint

        def save_then_crash(accelerator, output_dir, state, *args, **kwargs):
            folder = save(accelerator, output_dir, state, *args, **kwargs)
            if crash_when(folder, state):
                raise Interrupted(folder)
            return folder

        monkeypatch.setattr(train_module, "save_checkpoint", save_then_crash)
    config = load_run_config(get_task, str(config_path), ["train.mixed_precision=no", "train.torch_num_threads=1", *overrides])
    try:
        return train_module.train(config, get_task(config.task)(config))
    finally:
        monkeypatch.undo()


def test_cli_resume_between_logging_steps_keeps_the_loss_of_batches_before_the_checkpoint(
    tmp_path, tiny_bert, sentiment_files, monkeypatch,
):
    # Checkpoints every 2 updates, losses logged every 3: the checkpoint at step 4 falls inside the
    # logging interval 4..6, whose loss must still average steps 4, 5 and 6 after the resume.
    keys = dict(num_epochs=1, save_steps=2, logging_steps=3, eval_steps=None)
    reference = train_in_process(classification_config(tmp_path, tiny_bert, sentiment_files, run_name="reference", **keys),
                                 monkeypatch=monkeypatch)
    interrupted = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="interrupted", **keys)
    with pytest.raises(Interrupted):
        train_in_process(interrupted, crash_when=lambda folder, state: state.global_step == 4, monkeypatch=monkeypatch)
    resumed = train_in_process(interrupted, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)

    assert resumed["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-6)
    _, expected_losses = final_state(tmp_path / "reference")
    _, losses = final_state(tmp_path / "interrupted")
    assert [record["step"] for record in losses] == [record["step"] for record in expected_losses] == [3, 6, 9, 12]
    for record, expected in zip(losses, expected_losses):
        assert record["loss"] == pytest.approx(expected["loss"], rel=1e-6), record["step"]


def test_cli_resume_from_the_checkpoint_where_early_stopping_fired_does_not_train_on(
    tmp_path, tiny_bert, sentiment_files, monkeypatch,
):
    keys = dict(num_epochs=4, save_steps=2, eval_steps=2, metric_for_best_model="eval_accuracy", early_stopping_patience=1)
    reference = train_in_process(classification_config(tmp_path, tiny_bert, sentiment_files, run_name="reference", **keys),
                                 monkeypatch=monkeypatch)
    assert reference["global_step"] < 48, "early stopping never fired: the test needs a run that stops early"
    interrupted = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="interrupted", **keys)
    # Killed after the checkpoint of the step at which patience ran out, e.g. during the final evaluation.
    with pytest.raises(Interrupted):
        train_in_process(interrupted, crash_when=lambda folder, state: state.evaluations_without_improvement >= 1,
                         monkeypatch=monkeypatch)
    resumed = train_in_process(interrupted, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)
    for key in ("global_step", "epoch", "best_step", "train_samples", "eval_accuracy", "eval_f1_macro", "train_loss"):
        assert resumed[key] == pytest.approx(reference[key], rel=1e-6), key


def test_cli_resume_of_a_finished_run_that_kept_no_checkpoint_changes_nothing_and_exits_0(tmp_path, tiny_bert, sentiment_files):
    """save_steps unset (the default) keeps no checkpoint: a requeued job's `resume_from_checkpoint=latest` of the
    finished run was refused with exit 2 ("holds no complete checkpoint ... nothing to resume"), calling it unfinished."""
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="plain", max_steps=2, eval_steps=None,
                                   mixed_precision="no")
    run_cli("train", str(config))
    run_dir = tmp_path / "plain"
    assert not (run_dir / "checkpoints").exists()
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    resumed = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "holds a finished run" in resumed.stderr and "nothing to resume" in resumed.stderr
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before


def test_cli_resume_of_a_finished_run_changes_nothing_and_returns_its_metrics(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """A resume of a finished run ends where it ended: it rewrote config.yaml and log.jsonl at its start and added a
    checkpoint, so a kill before it finished again left a "finished" run without its last log records. A requeued
    job resumes whatever it finds: no error, nothing written, nothing saved (a save would raise here)."""
    import transformers.modeling_utils

    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="finished", max_steps=6, save_steps=3,
                                   eval_steps=2, metric_for_best_model="eval_accuracy", load_best_model_at_end=True,
                                   mixed_precision="no")
    metrics = train_in_process(config, monkeypatch=monkeypatch)
    run_dir = tmp_path / "finished"
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", killed)
    # The finished run removed best_model/ once it had reloaded it: no refusal for that either.
    for resumed in ("latest", str(run_dir / "checkpoints" / "step-00000003")):
        assert train_in_process(config, f"train.resume_from_checkpoint={resumed}", monkeypatch=monkeypatch) == metrics
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before

    # Unfinished (its metrics.json gone), the same folder resumes its last checkpoint, whose best model was removed when
    # the run reloaded it: it would end with the last step's weights under the best step's name. Refused first.
    from pipelines.checkpoint import CheckpointError

    (run_dir / "metrics.json").unlink()
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    with pytest.raises(CheckpointError, match=r"best_model.*no longer exists"):
        train_in_process(config, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before


def test_cli_resume_of_masked_lm_pretraining_draws_the_masks_it_would_have(tmp_path, monkeypatch):
    """Masks are drawn per batch at training time; a resume skips the batches before its checkpoint without
    collating them, and must still mask every later batch as the uninterrupted run did."""
    from safetensors.torch import load_file

    from tests.test_cli_mlm import corpus_file, pretrain_config

    corpus = corpus_file(tmp_path)
    overrides = ["train.max_steps=8", "train.save_steps=3", "train.logging_steps=1", "train.eval_steps=null", "train.num_epochs=1"]
    (tmp_path / "reference").mkdir()
    reference = train_in_process(pretrain_config(tmp_path / "reference", corpus), *overrides, monkeypatch=monkeypatch)
    (tmp_path / "interrupted").mkdir()
    interrupted = pretrain_config(tmp_path / "interrupted", corpus)
    # The reference run's tokenizer: tokenizers' WordPiece trainer breaks frequency ties in hash order, so
    # two trainings on one corpus may differ; the masks, not the vocabulary, are what this test is about.
    overrides.append(f"model.tokenizer_name_or_path={tmp_path / 'reference' / 'run'}")
    with pytest.raises(Interrupted):
        train_in_process(interrupted, *overrides, crash_when=lambda folder, state: state.global_step == 3, monkeypatch=monkeypatch)
    resumed = train_in_process(interrupted, *overrides, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)

    assert resumed["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-6)
    _, expected_losses = final_state(tmp_path / "reference" / "run")
    _, losses = final_state(tmp_path / "interrupted" / "run")
    assert [record["loss"] for record in losses] == pytest.approx([record["loss"] for record in expected_losses], rel=1e-6)
    expected = load_file(tmp_path / "reference" / "run" / "model.safetensors")
    for name, tensor in load_file(tmp_path / "interrupted" / "run" / "model.safetensors").items():
        assert (tensor - expected[name]).abs().max().item() <= 1e-6, name


def test_cli_resume_on_training_data_edited_since_the_checkpoint_is_refused_before_anything_changes(tmp_path, tiny_bert, sentiment_files):
    """The config names the same file, so the settings check saw nothing: the run resumed on other rows, exit 0."""
    import shutil

    data = {split: Path(shutil.copy(path, tmp_path / path.name)) for split, path in sentiment_files.items()}
    config = classification_config(tmp_path, tiny_bert, data, run_name="run", max_steps=4, save_steps=2, eval_steps=None,
                                   mixed_precision="no")
    run_cli("train", str(config))
    rows = data["train"].read_text().splitlines()
    edited = json.loads(rows[3])
    edited["label"] = "negative" if edited["label"] == "positive" else "positive"
    data["train"].write_text("\n".join([*rows[:3], json.dumps(edited), *rows[4:]]) + "\n")
    run_dir = tmp_path / "run"
    (run_dir / "metrics.json").unlink()  # unfinished: a finished run has nothing to resume
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}

    result = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (f"data.files.train: {str(data['train'])!r}, the same path, but its contents changed since the checkpoint"
            in result.stderr)
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before

    # A checkpoint without sources.json (from before they were recorded): the digest of the tokenised rows still tells.
    (run_dir / "checkpoints" / "step-00000004" / "sources.json").unlink()
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    result = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"checkpoint {run_dir / 'checkpoints' / 'step-00000004'} was trained on other training data than this run has" in result.stderr
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before


def test_cli_resume_on_a_model_folder_changed_in_place_is_refused_and_an_evaluation_report_beside_it_is_not(
    tmp_path, tiny_bert, sentiment_files,
):
    """A base model folder (or a teacher run) retrained or edited at the same path was not compared: the resume
    went on with other dropout (or another teacher), exit 0, and ended elsewhere than the interrupted run."""
    import shutil

    model = shutil.copytree(tiny_bert, tmp_path / "model")
    config = classification_config(tmp_path, model, sentiment_files, max_steps=4, save_steps=2, eval_steps=None,
                                   mixed_precision="no")
    run_cli("train", str(config))
    run_dir = tmp_path / "run"
    (model / "eval_validation.json").write_text('{"eval_accuracy": 0.5}')  # `bertpipe evaluate` of the model's run
    run_cli("train", str(config), "train.resume_from_checkpoint=latest")

    model_config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**model_config, "hidden_dropout_prob": 0.4}))
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    result = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (f"model.name_or_path: {str(model)!r}, the same path, but its contents changed since the checkpoint"
            in result.stderr)
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before


def test_cli_resume_where_auto_precision_resolves_otherwise_is_refused_and_the_same_precision_named_goes_on(
    tmp_path, tiny_bert, sentiment_files,
):
    """`auto` is fp32 on an AVX2-only CPU and bf16 on the next machine: the literal settings matched, the resumed
    run trained its second half in another precision, exit 0, and metrics.json named the last precision alone."""
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=4, save_steps=2, eval_steps=None,
                                   mixed_precision="auto")
    run_cli("train", str(config), env=cli_env(BERTPIPE_NATIVE_BF16="0"))
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "metrics.json").read_text())["mixed_precision"] == "no"
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}

    result = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False,
                     env=cli_env(BERTPIPE_NATIVE_BF16="1"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "train.mixed_precision: trained in fp32 up to the checkpoint, and 'auto' is bf16 here" in result.stderr
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before

    run_cli("train", str(config), "train.resume_from_checkpoint=latest", "train.mixed_precision=no",
            env=cli_env(BERTPIPE_NATIVE_BF16="1"))
    assert json.loads((run_dir / "metrics.json").read_text())["mixed_precision"] == "no"


def test_cli_resume_of_a_run_moved_with_its_data_and_model_matches_uninterrupted_and_refuses_edited_copies(
    tmp_path, tiny_bert, sentiment_files, monkeypatch,
):
    """A job rescheduled where the shared filesystem mounts elsewhere (or a run directory copied to another machine
    with its data and model) was refused for "data.files.train: '/old/..' in the checkpoint, '/new/..' now"."""
    import shutil

    from safetensors.torch import load_file

    keys = dict(max_steps=8, save_steps=4, eval_steps=None, logging_steps=2, mixed_precision="no", torch_num_threads=1)

    def copy_of_sources(folder):
        folder.mkdir()
        data = {split: Path(shutil.copy(path, folder / path.name)) for split, path in sentiment_files.items()}
        return shutil.copytree(tiny_bert, folder / "model"), data

    reference = train_in_process(classification_config(tmp_path, tiny_bert, sentiment_files, run_name="reference", **keys),
                                 monkeypatch=monkeypatch)
    old_mount, new_mount = tmp_path / "old-mount", tmp_path / "new-mount"
    model, data = copy_of_sources(old_mount)
    with pytest.raises(Interrupted):
        train_in_process(classification_config(old_mount, model, data, run_name="run", **keys),
                         crash_when=lambda folder, state: state.global_step == 4, monkeypatch=monkeypatch)
    new_mount.mkdir()
    shutil.copytree(old_mount, new_mount, dirs_exist_ok=True)
    shutil.rmtree(old_mount)
    moved = classification_config(new_mount, new_mount / "model", {split: new_mount / path.name for split, path in data.items()},
                                  run_name="run", **keys)
    run_dir = new_mount / "run"

    # The same file names, but the eval file was edited: the features digest (training data only) cannot see it.
    validation = new_mount / "validation.jsonl"
    original = validation.read_text()
    validation.write_text(original.replace('"positive"', '"negative"', 1))
    before = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    result = run_cli("train", str(moved), "train.resume_from_checkpoint=latest", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (f"data.files.validation: {str(old_mount / 'validation.jsonl')!r} in the checkpoint, {str(validation)!r} now, "
            "with other contents") in result.stderr
    assert "data.files.train" not in result.stderr and "model.name_or_path" not in result.stderr
    assert {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()} == before

    validation.write_text(original)
    resumed = train_in_process(moved, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)
    for key in ("eval_accuracy", "eval_f1_macro", "global_step", "train_loss", "train_samples"):
        assert resumed[key] == pytest.approx(reference[key], rel=1e-6), key
    expected = load_file(tmp_path / "reference" / "model.safetensors")
    for name, tensor in load_file(run_dir / "model.safetensors").items():
        assert (tensor - expected[name]).abs().max().item() <= 1e-6, name


def test_cli_resume_checkpoint_records_the_contents_the_run_read_not_those_at_its_first_save(
    tmp_path, tiny_bert, sentiment_files, monkeypatch,
):
    """A file edited while the run trained (a data refresh job, a copy still in progress) was digested at the
    first checkpoint: the record named contents the run never read, and a resume from another path compared
    against those."""
    import shutil

    import pipelines.train as train_module
    from pipelines.checkpoint import SOURCES_FILE, source_digests
    from pipelines.cli import load_run_config
    from tasks import get_task

    files = {split: Path(shutil.copy(path, tmp_path / path.name)) for split, path in sentiment_files.items()}
    config = classification_config(tmp_path, tiny_bert, files, max_steps=2, save_steps=2, eval_steps=None,
                                   logging_steps=2, mixed_precision="no", torch_num_threads=1)
    read = source_digests(load_run_config(get_task, str(config), []).to_yaml_dict())
    prepare_data = train_module.prepare_data

    def prepare_then_edit(*args, **kwargs):
        data = prepare_data(*args, **kwargs)
        files["validation"].write_text(files["validation"].read_text().replace('"positive"', '"negative"'))
        return data

    monkeypatch.setattr(train_module, "prepare_data", prepare_then_edit)
    train_in_process(config, monkeypatch=monkeypatch)
    recorded = json.loads((tmp_path / "run" / "checkpoints" / "step-00000002" / SOURCES_FILE).read_text())
    assert recorded == read and recorded["data.files.validation"] != source_digests(
        load_run_config(get_task, str(config), []).to_yaml_dict())["data.files.validation"]


def test_cli_resume_from_another_runs_checkpoint_into_a_finished_run_is_refused(tmp_path, tiny_bert, sentiment_files):
    """output_dir may change on a resume (a run moved, or continued in a new folder), but into another run's folder
    the resumed run replaced that run's model, config and metrics, without overwrite=true, and mixed their checkpoints."""
    keys = dict(max_steps=4, save_steps=2, eval_steps=None, mixed_precision="no")
    first = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="a", **keys)
    run_cli("train", str(first))
    run_cli("train", str(classification_config(tmp_path, tiny_bert, sentiment_files, run_name="b", **keys)))
    checkpoint = tmp_path / "b" / "checkpoints" / "step-00000002"
    before = {path: path.read_bytes() for path in sorted((tmp_path / "a").rglob("*")) if path.is_file()}
    result = run_cli("train", str(first), f"train.resume_from_checkpoint={checkpoint}", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert (f"output_dir {tmp_path / 'a'} holds another run: train.resume_from_checkpoint={checkpoint} is not one of its "
            "checkpoints") in result.stderr
    assert {path: path.read_bytes() for path in sorted((tmp_path / "a").rglob("*")) if path.is_file()} == before
    # Its own checkpoint, named by path, still resumes it.
    run_cli("train", str(first), f"train.resume_from_checkpoint={tmp_path / 'a' / 'checkpoints' / 'step-00000002'}")


def test_cli_resume_refuses_a_trainer_state_edited_or_from_elsewhere(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """A trainer_state.json whose batch or step was edited, or whose totals were removed, resumed with exit 0: 3 updates
    short of the plan, a renumbered log, a train_loss of the last segment only. Each is refused naming the file."""
    from pipelines.checkpoint import CheckpointError

    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="edited", num_epochs=2, save_steps=4,
                                   eval_steps=None, mixed_precision="no")
    with pytest.raises(Interrupted):
        train_in_process(config, crash_when=lambda folder, state: state.global_step == 4, monkeypatch=monkeypatch)
    state_file = tmp_path / "edited" / "checkpoints" / "step-00000004" / "trainer_state.json"
    saved = json.loads(state_file.read_text())
    for edit, message in (
        ({"batches_in_epoch": saved["batches_in_epoch"] + 3}, r"epoch 0, batch \d+ is update 7 of this run's plan"),
        ({"global_step": 2}, r"global_step 2 in a folder named for step 4"),
        ({"log_history": None}, r"it lacks train_loss_sum, log_history"),
    ):
        edited = {**saved, **edit}
        if edit.get("log_history", 0) is None:
            edited = {key: value for key, value in saved.items() if key not in ("log_history", "train_loss_sum")}
        state_file.write_text(json.dumps(edited))
        with pytest.raises(CheckpointError, match=rf"{re.escape(str(state_file.parent))}.*{message}"):
            train_in_process(config, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)
    state_file.write_text(json.dumps(saved))
    train_in_process(config, "train.resume_from_checkpoint=latest", monkeypatch=monkeypatch)


def test_cli_resume_on_another_thread_count_says_it_is_not_bit_for_bit(tmp_path, tiny_bert, sentiment_files):
    # torch_num_threads may change on a resume (another machine), but it sums floats in another order: the weights
    # came out 2e-7 from the uninterrupted run's, where the README promised exactly, and nothing said so.
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="threads", max_steps=4, save_steps=2,
                                   eval_steps=None, mixed_precision="no", torch_num_threads=1)
    run_cli("train", str(config))
    (tmp_path / "threads" / "metrics.json").unlink()  # unfinished: a finished run has nothing to resume
    checkpoint = tmp_path / "threads" / "checkpoints" / "step-00000004"
    same = run_cli("train", str(config), "train.resume_from_checkpoint=latest")
    assert "thread(s) per process" not in same.stderr
    (tmp_path / "threads" / "metrics.json").unlink()
    other = run_cli("train", str(config), "train.resume_from_checkpoint=latest", "train.torch_num_threads=2")
    assert (f"checkpoint {checkpoint} trained on 1 thread(s) per process, this run has 2 (train.torch_num_threads, or the "
            "cores): floats are summed in another order") in other.stderr

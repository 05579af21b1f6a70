"""Which settings a resume may change: only cadence, trackers, retention, hub and speed settings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipelines.checkpoint import CheckpointError, check_resume_config, resume_differences

SAVED = {
    "task": "classification", "output_dir": "runs/a", "seed": 1, "overwrite": False,
    "model": {"name_or_path": "m", "architecture": {"hidden_size": 32}},
    "data": {"files": {"train": "t.jsonl"}, "max_seq_length": 64, "preprocessing_num_workers": None},
    "train": {"batch_size": 8, "learning_rate": 0.001, "logging_steps": 10, "save_steps": 5, "save_total_limit": 2,
              "eval_steps": 20, "report_to": [], "resume_from_checkpoint": None, "mixed_precision": "no"},
    "hub": {"push": False, "repo_id": None},
    "classification": {"problem_type": "auto"},
}


def changed(**sections):
    tree = {key: (dict(value) if isinstance(value, dict) else value) for key, value in SAVED.items()}
    for section, values in sections.items():
        if isinstance(tree.get(section), dict):
            tree[section] = {**tree[section], **values}
        else:
            tree[section] = values
    return tree


def test_checkpoint_resume_may_change_cadence_trackers_and_hub():
    current = changed(
        output_dir="runs/b", overwrite=True,
        train={"logging_steps": 1, "save_steps": 2, "save_total_limit": 9, "eval_steps": 3, "report_to": ["tensorboard"],
               "resume_from_checkpoint": "latest"},
        hub={"push": True, "repo_id": "me/model"}, data={"preprocessing_num_workers": 4},
    )
    assert resume_differences(SAVED, current) == []


def test_checkpoint_resume_lists_each_trajectory_key_with_both_values():
    current = changed(seed=2, train={"batch_size": 16, "mixed_precision": "bf16"}, classification={"problem_type": "regression"})
    current["model"] = {"name_or_path": "m", "architecture": {"hidden_size": 64}}
    assert resume_differences(SAVED, current) == [
        "classification.problem_type: 'auto' in the checkpoint, 'regression' now",
        "model.architecture.hidden_size: 32 in the checkpoint, 64 now",
        "seed: 1 in the checkpoint, 2 now",
        "train.batch_size: 8 in the checkpoint, 16 now",
        "train.mixed_precision: 'no' in the checkpoint, 'bf16' now",
    ]


def test_checkpoint_from_before_a_setting_existed_resumes_at_its_default_only():
    """A key added to the schema since the checkpoint was written: that run trained as its default does."""
    assert resume_differences(SAVED, changed(model={**SAVED["model"], "freeze_input_embeddings": False})) == []
    assert resume_differences(SAVED, changed(model={**SAVED["model"], "freeze_input_embeddings": True})) == [
        "model.freeze_input_embeddings: (unset) in the checkpoint, True now"
    ]
    # A task's own key and a key without a default are not the schema's to fill in.
    assert resume_differences(SAVED, changed(classification={"problem_type": "auto", "new_option": 1})) == [
        "classification.new_option: (unset) in the checkpoint, 1 now"
    ]


def test_checkpoint_written_with_relative_paths_resumes_where_they_still_name_the_same_files(tmp_path, monkeypatch):
    # Configs now hold local paths absolute; a checkpoint from before held them as written, and its resume was
    # refused for "data/train.jsonl in the checkpoint, /abs/data/train.jsonl now", with no way around it.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    saved = changed(data={**SAVED["data"], "files": {"train": "data/train.jsonl", "validation": ["data/train.jsonl"]}})
    now = changed(data={**SAVED["data"], "files": {"train": str(tmp_path / "data" / "train.jsonl"),
                                                   "validation": [str(tmp_path / "data" / "train.jsonl")]}})
    assert resume_differences(saved, now) == []
    elsewhere = changed(data={**SAVED["data"], "files": {**now["data"]["files"], "train": "/elsewhere/train.jsonl"}})
    assert resume_differences(saved, elsewhere) == [
        f"data.files.train: {str(tmp_path / 'data' / 'train.jsonl')!r} in the checkpoint, '/elsewhere/train.jsonl' now"
    ]


def test_checkpoint_resume_config_check_reads_the_checkpoint_then_its_run(tmp_path):
    import yaml

    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    checkpoint.mkdir(parents=True)
    check_resume_config(checkpoint, changed(seed=5))  # nothing stored: nothing to compare
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(SAVED))  # a checkpoint from before configs were stored
    with pytest.raises(CheckpointError, match=r"seed: 1 in the checkpoint, 5 now"):
        check_resume_config(checkpoint, changed(seed=5))
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(changed(seed=5)))
    check_resume_config(checkpoint, changed(seed=5))


def test_checkpoint_resume_from_another_mount_point_compares_contents_of_the_model_folder_and_files(tmp_path):
    # A run moved with its model and data (another mount point, another machine) was refused for the new paths.
    import shutil

    import yaml

    from pipelines.checkpoint import SOURCES_FILE, source_digests

    def sources_at(root):
        (root / "model").mkdir(parents=True)
        (root / "model" / "config.json").write_text('{"hidden_size": 32}')
        (root / "model" / "model.safetensors").write_bytes(b"weights")
        (root / "t.jsonl").write_text('{"text": "a"}\n')
        (root / "v.jsonl").write_text('{"text": "b"}\n')
        return changed(model={**SAVED["model"], "name_or_path": str(root / "model")},
                       data={**SAVED["data"], "files": {"train": str(root / "t.jsonl"), "validation": [str(root / "v.jsonl")]}})

    saved = sources_at(tmp_path / "old")
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(saved))
    (checkpoint / SOURCES_FILE).write_text(json.dumps(source_digests(saved)))
    shutil.rmtree(tmp_path / "old")
    moved = sources_at(tmp_path / "new")
    (tmp_path / "new" / "model" / ".git").mkdir()  # not the model's contents
    check_resume_config(checkpoint, moved)

    (tmp_path / "new" / "model" / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(CheckpointError) as refused:
        check_resume_config(checkpoint, moved)
    assert re.findall(r"\n  (\S+): ", str(refused.value)) == ["model.name_or_path"]
    assert (f"model.name_or_path: {str(tmp_path / 'old' / 'model')!r} in the checkpoint, {str(tmp_path / 'new' / 'model')!r} now, "
            "with other contents") in str(refused.value)


def test_checkpoint_resume_may_not_change_eval_steps_that_pick_the_best_model():
    # Evaluations decide early stopping and which model is reloaded: their cadence is trajectory.
    saved = changed(train={**SAVED["train"], "metric_for_best_model": "eval_accuracy"})
    current = changed(train={**saved["train"], "eval_steps": 10})
    assert resume_differences(saved, current) == ["train.eval_steps: 20 in the checkpoint, 10 now"]
    assert resume_differences(SAVED, changed(train={"eval_steps": 10})) == []  # without one they only report


@pytest.fixture
def prepared(tmp_path):
    """An accelerator with a tiny prepared model, optimizer and schedule, and a checkpoint of it at step 2."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from pipelines.checkpoint import TrainerState, save_checkpoint

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    folder = save_checkpoint(accelerator, tmp_path / "run", TrainerState(global_step=2), save_total_limit=None)
    yield accelerator, folder
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize("limit", [1, 2])
def test_checkpoint_save_total_limit_keeps_the_newest_complete_checkpoints(prepared, limit):
    from pipelines.checkpoint import TrainerState, complete_checkpoints, save_checkpoint

    accelerator, folder = prepared
    run_dir = folder.parent.parent
    for step in (4, 6, 8):
        save_checkpoint(accelerator, run_dir, TrainerState(global_step=step), save_total_limit=limit)
    assert [path.name for path in complete_checkpoints(run_dir)] == ["step-00000006", "step-00000008"][-limit:]


def test_checkpoint_saved_at_the_end_of_an_epoch_resumes(prepared):
    # The loop's state after an epoch's last batch holds batches_in_epoch == batches_per_epoch (the resume starts the
    # next epoch): the position check must take it, where it refuses a batch past the epoch's end.
    from pipelines.checkpoint import TrainerState, load_checkpoint, save_checkpoint
    from pipelines.config import TrainConfig
    from pipelines.optim import plan_steps

    accelerator, folder = prepared
    plan = plan_steps(TrainConfig(num_epochs=3), batches_per_epoch=5)
    at_the_end = save_checkpoint(accelerator, folder.parent.parent, TrainerState(global_step=5, epoch=0, batches_in_epoch=5),
                                 save_total_limit=None)
    state = load_checkpoint(accelerator, at_the_end, plan=plan)
    assert (state.global_step, state.epoch, state.batches_in_epoch) == (5, 0, 5)
    past_the_end = save_checkpoint(accelerator, folder.parent.parent, TrainerState(global_step=6, epoch=0, batches_in_epoch=6),
                                   save_total_limit=None)
    with pytest.raises(CheckpointError, match="cannot be resumed"):
        load_checkpoint(accelerator, past_the_end, plan=plan)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_checkpoint_resume_refuses_lost_random_states(prepared, damage):
    # Accelerate's load_state skips random states it cannot read with an info-level log line: the
    # resumed run would draw other dropout masks and end elsewhere than the uninterrupted one, silently.
    from pipelines.checkpoint import load_checkpoint

    accelerator, folder = prepared
    random_states = folder / "random_states_0.pkl"
    if damage == "missing":
        random_states.unlink()
    else:
        random_states.write_bytes(random_states.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=re.escape(str(random_states))):
        load_checkpoint(accelerator, folder)


def test_checkpoint_a_full_disk_is_one_error_naming_the_checkpoint(prepared, monkeypatch):
    # A full disk reaches torch.save as a RuntimeError (and safetensors as a SafetensorError), never as
    # an OSError, so the CLI showed a traceback and exit status 1.
    import torch

    from pipelines.checkpoint import TrainerState, complete_checkpoints, save_checkpoint

    def disk_full(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")  # as on a full tmpfs

    accelerator, folder = prepared
    monkeypatch.setattr(torch, "save", disk_full)
    run_dir = folder.parent.parent
    with pytest.raises(CheckpointError) as raised:
        save_checkpoint(accelerator, run_dir, TrainerState(global_step=4), save_total_limit=None)
    message = str(raised.value)
    assert str(run_dir / "checkpoints" / "step-00000004.partial") in message and "unexpected pos 576" in message
    assert f"train.resume_from_checkpoint=latest ({folder} is complete)" in message
    assert complete_checkpoints(run_dir) == [folder] and not (run_dir / "checkpoints" / "step-00000004.partial").exists()


@pytest.mark.parametrize("name", ["optimizer.bin", "trainer_state.json"])
def test_checkpoint_resume_names_the_truncated_file(prepared, name):
    from pipelines.checkpoint import load_checkpoint

    accelerator, folder = prepared
    damaged = folder / name
    damaged.write_bytes(damaged.read_bytes()[:20])
    with pytest.raises(CheckpointError, match=re.escape(str(damaged))):
        load_checkpoint(accelerator, folder)


def test_checkpoint_resume_by_more_processes_than_wrote_it_is_refused_naming_both_counts(prepared):
    # Process 0 finds its random states in a one-process checkpoint and used to resume silently while
    # process 1 had none; the message now names the checkpoint and both process counts.
    from pipelines.checkpoint import load_checkpoint

    accelerator, folder = prepared

    class OfTwoProcesses:
        num_processes, process_index = 2, 0

        def __getattr__(self, name):
            return getattr(accelerator, name)

    with pytest.raises(CheckpointError, match=rf"{re.escape(str(folder))} was written by a run of 1 process, and this run has 2"):
        load_checkpoint(OfTwoProcesses(), folder)


def test_checkpoint_from_before_the_process_count_was_recorded_is_checked_by_its_random_states(prepared):
    import json

    from pipelines.checkpoint import load_checkpoint

    accelerator, folder = prepared
    state = json.loads((folder / "trainer_state.json").read_text())
    del state["num_processes"]
    (folder / "trainer_state.json").write_text(json.dumps(state))
    load_checkpoint(accelerator, folder)  # one process, as it was written
    (folder / "random_states_1.pkl").write_bytes((folder / "random_states_0.pkl").read_bytes())
    with pytest.raises(CheckpointError, match=r"written by a run of 2 processes, and this run has 1"):
        load_checkpoint(accelerator, folder)


def _checkpoint_with_sources(tmp_path, saved, state=None):
    import yaml

    from pipelines.checkpoint import SOURCES_FILE, STATE_FILE, source_digests

    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(saved))
    (checkpoint / SOURCES_FILE).write_text(json.dumps(source_digests(saved)))
    if state is not None:
        (checkpoint / STATE_FILE).write_text(json.dumps(state))
    return checkpoint


def test_checkpoint_resume_at_the_same_paths_compares_contents_too(tmp_path):
    # Only moved paths were compared by contents: a teacher or base model retrained in place resumed silently.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_dropout_prob": 0.1}')
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "checkpoints").mkdir()  # a run's own checkpoints beneath it: not read
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n')
    saved = changed(model={**SAVED["model"], "name_or_path": str(model)},
                    data={**SAVED["data"], "files": {"train": str(tmp_path / "t.jsonl")}})
    checkpoint = _checkpoint_with_sources(tmp_path, saved)
    check_resume_config(checkpoint, saved)

    (model / "eval_test.json").write_text('{"eval_accuracy": 1.0}')  # bertpipe evaluate of that run
    (model / "checkpoints" / "step-1").mkdir()
    check_resume_config(checkpoint, saved)

    (model / "config.json").write_text('{"hidden_dropout_prob": 0.4}')
    (tmp_path / "t.jsonl").write_text('{"text": "b"}\n')
    with pytest.raises(CheckpointError) as refused:
        check_resume_config(checkpoint, saved)
    assert re.findall(r"\n  (\S+): ", str(refused.value)) == ["data.files.train", "model.name_or_path"]
    assert f"model.name_or_path: {str(model)!r}, the same path, but its contents changed since the checkpoint" in str(refused.value)


def test_checkpoint_resume_compares_a_task_models_contents(tmp_path, monkeypatch):
    # translation.encoder_name_or_path / decoder_name_or_path are kept as written (relative paths stay relative):
    # an encoder retrained in place was never digested, and the resume went on with other weights.
    monkeypatch.chdir(tmp_path)
    encoder = Path("encoder")
    encoder.mkdir()
    (encoder / "config.json").write_text('{"hidden_size": 32}')
    (encoder / "model.safetensors").write_bytes(b"weights")
    saved = changed(task="translation", translation={"encoder_name_or_path": "encoder", "decoder_name_or_path": "gpt2"})
    checkpoint = _checkpoint_with_sources(tmp_path, saved)
    check_resume_config(checkpoint, saved)

    (encoder / "model.safetensors").write_bytes(b"retrained")
    with pytest.raises(CheckpointError) as refused:
        check_resume_config(checkpoint, saved)
    assert re.findall(r"\n  (\S+): ", str(refused.value)) == ["translation.encoder_name_or_path"]
    assert "translation.encoder_name_or_path: 'encoder', the same path, but its contents changed" in str(refused.value)


def test_checkpoint_resume_compares_the_precision_trained_in_not_the_setting(tmp_path):
    # `auto` is bf16 on one CPU and fp32 on the next: equal settings, another precision.
    saved = changed(train={**SAVED["train"], "mixed_precision": "auto"})
    checkpoint = _checkpoint_with_sources(tmp_path, saved, state={"global_step": 4, "mixed_precision": "bf16"})
    check_resume_config(checkpoint, saved, mixed_precision="bf16")
    check_resume_config(checkpoint, changed(train={**SAVED["train"], "mixed_precision": "bf16"}), mixed_precision="bf16")
    with pytest.raises(CheckpointError) as refused:
        check_resume_config(checkpoint, saved, mixed_precision="no")
    assert ("train.mixed_precision: trained in bf16 up to the checkpoint, and 'auto' is fp32 here ('auto' follows the "
            "hardware: BERTPIPE_NATIVE_BF16=1 or 0 decides it on a CPU)") in str(refused.value)
    with pytest.raises(CheckpointError, match=r"'no' is fp32 here"):
        check_resume_config(checkpoint, changed(train={**SAVED["train"], "mixed_precision": "no"}), mixed_precision="no")

    # A checkpoint from before the precision was recorded: the settings are compared as written.
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    check_resume_config(checkpoint, saved, mixed_precision="no")
    with pytest.raises(CheckpointError, match=r"train.mixed_precision: 'auto' in the checkpoint, 'bf16' now"):
        check_resume_config(checkpoint, changed(train={**SAVED["train"], "mixed_precision": "bf16"}), mixed_precision="bf16")

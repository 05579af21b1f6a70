"""The fault catalogue (issue 16): each bad input or broken file ends in exit status 2 and one message
naming the file, key or row; nothing that existed before the command changes.

Most cases run the CLI in this process (they fail before any training, in well under a second);
``test_faults_cli.py`` runs a few as real subprocesses.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import sentiment_rows, write_jsonl
from tests.faults.conftest import bertpipe_in_process, tree_hashes


def new_dir(tmp_path: Path) -> str:
    return f"output_dir={tmp_path / 'new'}"


# ----- the config file ------------------------------------------------------------------------
def test_faults_config_is_a_folder(refused, tmp_path):
    refused("train", tmp_path, needles=[str(tmp_path), "is a folder"])


def test_faults_config_is_dev_null(refused):
    refused("train", "/dev/null", needles=["/dev/null", "not a regular file"])


def test_faults_config_missing(refused, tmp_path):
    refused("train", tmp_path / "nope.yaml", needles=[str(tmp_path / "nope.yaml"), "does not exist"])


def test_faults_config_duplicate_key(refused, finished_run, tmp_path):
    config = tmp_path / "twice.yaml"
    config.write_text(finished_run[0].read_text() + "seed: 8\n")
    refused("train", config, new_dir(tmp_path), needles=[str(config), "duplicate key 'seed'", "first given on line"])


def test_faults_a_setting_given_twice_on_the_command_line(refused, finished_run, run_copy, tmp_path):
    # The last one won silently; refused as a key given twice in a YAML file is.
    refused("train", finished_run[0], new_dir(tmp_path), "train.max_steps=3", "train.max_steps=5",
            needles=["train.max_steps is set twice on the command line ('train.max_steps=3', then 'train.max_steps=5')"])
    refused("evaluate", run_copy, "data.eval_split=validation", "data={eval_split: train}", needles=["data.eval_split is set twice"])


def test_faults_config_not_yaml(refused, tmp_path):
    config = tmp_path / "broken.yaml"
    config.write_text("task: classification\ndata: [unclosed\n")
    refused("train", config, needles=[str(config), "not valid YAML", "line"])


def test_faults_config_binary(refused, tmp_path):
    config = tmp_path / "model.yaml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    refused("train", config, needles=[str(config), "not UTF-8"])


def test_faults_config_unknown_key_and_wrong_type(refused, finished_run, tmp_path):
    refused("train", finished_run[0], new_dir(tmp_path), "train.learning_rat=1", needles=["train.learning_rat", "the command line", "learning_rate"])
    refused("train", finished_run[0], new_dir(tmp_path), "train.batch_size=many", needles=["train.batch_size", "many"])


# ----- data files -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [
        ("empty.jsonl", "", ["is empty"]),
        ("header.csv", "sentence,label\n", ["holds a header but no rows"]),
        ("bad.jsonl", '{"sentence": "good", "label": "positive"}\n{"sentence": "bad" "label": "negative"}\n', ["line 2: not valid JSON"]),
        ("ragged.csv", "sentence,label\ngood film,positive\nbad,film,negative\n", ["line 3", "3 field(s) where the header has 2"]),
        ("empty_label.csv", "sentence,label\ngood film,positive\nbad film,\ndull,negative\n", ["split 'train'", "row 2", "empty 'label' cell"]),
        ("empty_text.jsonl", '{"sentence": "good", "label": "positive"}\n{"sentence": "", "label": "negative"}\n', ["split 'train'", "row 2", "empty 'sentence' cell"]),
        # a zero-width space and a byte-order mark pass str.strip, yet the tokenizer reads nothing there
        ("invisible_text.jsonl", '{"sentence": "good", "label": "positive"}\n{"sentence": "\\u200b \\ufeff", "label": "negative"}\n',
         ["split 'train'", "row 2", "empty 'sentence' cell"]),
        ("latin1.jsonl", None, ["line 1", "not valid utf-8", "data.encoding"]),
        # JSON numbers are numbers (a csv cell of digits is text: its text column is read as written)
        ("numbers.jsonl", '{"sentence": 1, "label": "positive"}\n{"sentence": 2, "label": "negative"}\n', ["split 'train'", "column 'sentence' holds int64 values, not text"]),
        ("mixed.jsonl", '{"sentence": "good", "label": "positive"}\n{"sentence": "bad", "label": ["negative"]}\n', ["row 2", "'label' is read as a list where row 1 is read as a str"]),
    ],
)
def test_faults_bad_train_file(refused, finished_run, tmp_path, sentiment_files, name, content, needles):
    path = tmp_path / name
    if content is None:
        path.write_bytes('{"sentence": "Coppée was good", "label": "positive"}\n'.encode("latin-1"))
    else:
        path.write_text(content)
    validation = sentiment_files["validation"]
    if path.suffix == ".csv":  # one format per run
        validation = tmp_path / "validation.csv"
        validation.write_text("sentence,label\ngood,positive\nbad,negative\n")
    refused(
        "train", finished_run[0], new_dir(tmp_path), f"data.files.train={path}", f"data.files.validation={validation}",
        needles=["data.files.train", str(path), *needles],
    )


def test_faults_column_missing_from_one_split(refused, finished_run, tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood film,positive\nbad film,negative\n")
    validation = tmp_path / "validation.csv"
    validation.write_text("sentence\ngood\nbad\n")
    refused(
        "train", finished_run[0], new_dir(tmp_path), f"data.files.train={train}", f"data.files.validation={validation}",
        needles=["split 'validation'", str(validation), "has no column(s) ['label']"],
    )


def test_faults_missing_data_file_or_a_folder(refused, finished_run, tmp_path):
    refused("train", finished_run[0], new_dir(tmp_path), f"data.files.train={tmp_path / 'typo.jsonl'}",
            needles=["data.files.train", str(tmp_path / "typo.jsonl"), "does not exist"])
    (tmp_path / "folder.jsonl").mkdir()
    refused("train", finished_run[0], new_dir(tmp_path), f"data.files.train={tmp_path / 'folder.jsonl'}",
            needles=["data.files.train", str(tmp_path / "folder.jsonl"), "is a folder"])


def test_faults_label_outside_label_set_and_missing_column(refused, finished_run, tmp_path):
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"sentence": "fine", "label": "neutral"}])
    refused("train", finished_run[0], new_dir(tmp_path), f"data.files.validation={odd}", needles=["split 'validation'", "row 1 (rows count from 1)", "'neutral'", "label set"])
    refused("train", finished_run[0], new_dir(tmp_path), "data.text_column=review", needles=["no column(s) ['review']", "sentence"])


# ----- the model folder ------------------------------------------------------------------------
@pytest.fixture
def model_copy(tiny_bert, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_bert, tmp_path / "model"))


def test_faults_corrupt_model_config(refused, finished_run, tmp_path, model_copy):
    (model_copy / "config.json").write_text('{"model_type": "bert", "hidden_size": ')
    refused("train", finished_run[0], new_dir(tmp_path), f"model.name_or_path={model_copy}", needles=["model", str(model_copy), "cannot load"])


def test_faults_truncated_model_weights(refused, finished_run, tmp_path, model_copy):
    weights = model_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    refused("train", finished_run[0], new_dir(tmp_path), f"model.name_or_path={model_copy}",
            needles=["model.name_or_path", str(model_copy), "cannot load the model"])


def test_faults_unknown_hub_id(refused, finished_run, tmp_path):
    refused("train", finished_run[0], new_dir(tmp_path), "model.name_or_path=nobody/no-such-model",
            needles=["'nobody/no-such-model'", "BERTPIPE_MIRROR"])


@pytest.fixture
def long_train(tmp_path) -> Path:
    """Training rows, one of them longer than the tiny BERT's 64 positions."""
    rows = sentiment_rows(8, seed=3) + [{"sentence": " ".join(["good film"] * 60), "label": "positive"}]
    return write_jsonl(tmp_path / "long.jsonl", rows)


def test_faults_sequence_longer_than_positions(refused, finished_run, tmp_path, long_train):
    # The error must come before any training step, and only when the data is that long.
    message = refused("train", finished_run[0], new_dir(tmp_path), "data.max_seq_length=100", f"data.files.train={long_train}",
                      needles=["split 'train'", str(long_train), "up to 100 tokens", "64 positions", "data.max_seq_length to at most 64"])
    assert not (tmp_path / "new" / "config.yaml").exists(), message


# ----- the output folder ------------------------------------------------------------------------
def test_faults_output_dir_is_a_file_or_under_one(refused, finished_run, tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    refused("train", finished_run[0], f"output_dir={blocker}", needles=[str(blocker), "is a file"])
    refused("train", finished_run[0], f"output_dir={blocker / 'run'}", needles=[str(blocker / "run"), "lies under", "which is a file"])


def test_faults_output_dir_cannot_be_created(refused, finished_run):
    refused("train", finished_run[0], "output_dir=/proc/bertpipe-run", needles=["/proc/bertpipe-run", "cannot be created"])


def test_faults_finished_run_without_overwrite(refused, finished_run, run_copy):
    refused("train", finished_run[0], f"output_dir={run_copy}", needles=[str(run_copy), "already holds a finished run", "overwrite=true"])


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [(["data.files.train=/nowhere/train.jsonl"], ["data.files.train", "/nowhere/train.jsonl"]),
     (["model.name_or_path=nobody/no-such-model"], ["'nobody/no-such-model'"]),
     (["data.max_seq_length=100", "data.files.train=LONG"], ["data.max_seq_length to at most 64"])],
)
def test_faults_overwrite_keeps_the_old_run_when_the_new_one_is_invalid(refused, finished_run, run_copy, long_train, overrides, needles):
    overrides = [override.replace("LONG", str(long_train)) for override in overrides]
    refused("train", finished_run[0], f"output_dir={run_copy}", "overwrite=true", *overrides, needles=needles)
    assert (run_copy / "metrics.json").is_file() and (run_copy / "model.safetensors").is_file()


def test_faults_overwrite_never_deletes_a_folder_that_is_not_a_run(refused, finished_run, tmp_path):
    folder = tmp_path / "photos"
    (folder / "2024").mkdir(parents=True)
    (folder / "2024" / "beach.jpg").write_bytes(b"\xff\xd8 a photo")
    (folder / "notes.txt").write_text("keep me")
    refused("train", finished_run[0], f"output_dir={folder}", "overwrite=true", needles=[str(folder), "not a bertpipe run"])
    refused("train", finished_run[0], f"output_dir={folder}", needles=[str(folder), "not a bertpipe run"])


def test_faults_overwrite_never_deletes_the_runs_own_inputs(refused, finished_run, run_copy, sentiment_files):
    refused("train", finished_run[0], f"output_dir={run_copy}", "overwrite=true", f"model.name_or_path={run_copy}",
            needles=["model.name_or_path", str(run_copy), "lies inside it"])
    data = run_copy / "data"
    data.mkdir()
    shutil.copy(sentiment_files["train"], data / "train.jsonl")
    refused("train", finished_run[0], f"output_dir={run_copy}", "overwrite=true", f"data.files.train={data / 'train.jsonl'}",
            needles=["data.files.train", str(data / "train.jsonl"), "lies inside it"])


def test_faults_leftover_of_a_killed_run_is_refused(refused, finished_run, run_copy):
    (run_copy / "metrics.json").unlink()  # what a run killed after its checkpoints leaves
    message = refused("train", finished_run[0], f"output_dir={run_copy}", needles=[str(run_copy), "unfinished run", "checkpoint"])
    for way_out in ("train.resume_from_checkpoint=latest", "overwrite=true", "another output_dir"):
        assert way_out in message


def test_faults_overwrite_replaces_a_run_after_validation(capsys, finished_run, run_copy):
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_copy}", "overwrite=true",
                                         "train.max_steps=2", "train.save_steps=null")
    assert status == 0, stderr[-3000:]
    assert json.loads((run_copy / "metrics.json").read_text())["global_step"] == 2
    assert not (run_copy / "checkpoints").exists(), "the old run's checkpoints were kept beside the new run"


def test_faults_overwrite_keeps_the_old_run_until_the_new_one_has_finished(capsys, caplog, finished_run, run_copy, monkeypatch):
    # Deleted when the new run started, the old run was lost to a full disk (or a crash, Ctrl-C) in the
    # new one. It waits beside it, byte for byte, and goes when the resumed replacement finishes.
    from accelerate import Accelerator

    from pipelines.outputs import replaced_run_dir

    old = tree_hashes(run_copy)
    save_state = Accelerator.save_state

    def full_at_the_second_checkpoint(self, output_dir=None, **kwargs):
        if str(output_dir).endswith("step-00000004.partial"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(output_dir))
        return save_state(self, output_dir, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", full_at_the_second_checkpoint)
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_copy}", "overwrite=true", "seed=7")
    assert status == 2 and "No space left on device" in stderr, stderr[-3000:]
    aside = replaced_run_dir(run_copy)
    assert f"kept in {aside}" in caplog.text
    assert tree_hashes(aside) == {path.replace(str(run_copy), str(aside), 1): digest for path, digest in old.items()}
    assert not (run_copy / "metrics.json").exists()

    monkeypatch.undo()
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_copy}", "seed=7",
                                         "train.resume_from_checkpoint=latest")
    assert status == 0, stderr[-3000:]
    assert (run_copy / "metrics.json").is_file() and not aside.exists()


def test_faults_a_second_overwrite_keeps_the_last_finished_run(tmp_path):
    from pipelines.outputs import replaced_run_dir, set_aside_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    (run / "model").write_text("finished")
    aside = set_aside_run_dir(run)
    assert aside == replaced_run_dir(run) and (aside / "model").read_text() == "finished" and not any(run.iterdir())
    (run / "model").write_text("unfinished replacement")  # stopped before metrics.json
    assert set_aside_run_dir(run) == aside and (aside / "model").read_text() == "finished" and not any(run.iterdir())
    (run / "metrics.json").write_text("{}")  # a replacement that finished but stopped before dropping the old run
    (run / "model").write_text("newer")
    set_aside_run_dir(run)
    assert (aside / "model").read_text() == "newer"


# ----- resume -------------------------------------------------------------------------------------
def test_faults_resume_with_other_trajectory_settings_lists_each(refused, finished_run, run_copy):
    (run_copy / "metrics.json").unlink()
    message = refused(
        "train", finished_run[0], f"output_dir={run_copy}", "train.resume_from_checkpoint=latest",
        "train.batch_size=16", "train.learning_rate=0.001", "train.logging_steps=1", "train.save_total_limit=5",
        needles=["step-00000004", "train.batch_size: 8 in the checkpoint, 16 now",
                 "train.learning_rate: 0.003 in the checkpoint, 0.001 now"],
    )
    assert "logging_steps" not in message.split("\n", 1)[1].split("Resume with")[0]  # cadence may change
    assert "save_total_limit" not in message.split("\n", 1)[1].split("Resume with")[0]


def test_faults_resume_without_or_from_a_corrupt_checkpoint(refused, finished_run, run_copy, tmp_path):
    refused("train", finished_run[0], new_dir(tmp_path), "train.resume_from_checkpoint=latest", needles=["no complete checkpoint"])
    checkpoint = run_copy / "checkpoints" / "step-00000004"
    (checkpoint / "model.safetensors").write_bytes(b"truncated")
    (run_copy / "metrics.json").unlink()  # unfinished: a finished run has nothing to resume
    refused("train", finished_run[0], f"output_dir={run_copy}", f"train.resume_from_checkpoint={checkpoint}",
            needles=[str(checkpoint), "cannot be loaded"])


def test_faults_disk_full_while_checkpointing_keeps_the_complete_checkpoints(capsys, finished_run, tmp_path, monkeypatch):
    from accelerate import Accelerator

    save_state = Accelerator.save_state
    calls = []

    def fill_the_disk(self, output_dir=None, **kwargs):
        calls.append(output_dir)
        if len(calls) < 2:
            return save_state(self, output_dir, **kwargs)
        half = Path(output_dir) / "model.safetensors"
        half.parent.mkdir(parents=True, exist_ok=True)
        half.write_bytes(b"half a tensor")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(half))

    monkeypatch.setattr(Accelerator, "save_state", fill_the_disk)
    run_dir = tmp_path / "full"
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_dir}")
    assert status == 2 and "Traceback" not in stderr
    assert "No space left on device" in stderr and "step-00000004.partial" in stderr and "resume_from_checkpoint=latest" in stderr
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    assert checkpoints == ["step-00000002"], "a partial checkpoint was left behind or a complete one lost"
    assert (run_dir / "checkpoints" / "step-00000002" / "trainer_state.json").is_file()
    assert not (run_dir / "metrics.json").exists()



def test_faults_disk_full_at_the_first_checkpoint_says_to_start_again_and_nothing_else(capsys, finished_run, tmp_path, monkeypatch):
    """With no complete checkpoint, the way on is to start again; the CLI's full-disk hint ("resume with ...latest")
    was appended after the checkpoint's own "Free space, then start again", which it did not recognise by case."""
    from accelerate import Accelerator

    def fill_the_disk(self, output_dir=None, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(output_dir) / "model.safetensors"))

    monkeypatch.setattr(Accelerator, "save_state", fill_the_disk)
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={tmp_path / 'full'}")
    assert status == 2 and "Traceback" not in stderr
    assert "no checkpoint of this run is complete" in stderr and "overwrite=true" in stderr, stderr[-2000:]
    assert "resume_from_checkpoint=latest" not in stderr, stderr[-2000:]


def test_faults_ctrl_c_while_checkpointing_is_one_line_and_the_run_resumes(capsys, finished_run, tmp_path, monkeypatch):
    from accelerate import Accelerator

    save_state = Accelerator.save_state

    def interrupt_the_second_save(self, output_dir=None, **kwargs):
        if not str(output_dir).endswith("step-00000004.partial"):
            return save_state(self, output_dir, **kwargs)
        half = Path(output_dir) / "model.safetensors"
        half.parent.mkdir(parents=True, exist_ok=True)
        half.write_bytes(b"half a tensor")
        raise KeyboardInterrupt  # what Python's SIGINT handler raises

    monkeypatch.setattr(Accelerator, "save_state", interrupt_the_second_save)
    run_dir = tmp_path / "interrupted"
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_dir}")
    assert status == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.strip().splitlines()[-1].startswith("bertpipe train: interrupted") and "resume_from_checkpoint=latest" in stderr
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == ["step-00000002"], "half a checkpoint was left behind"

    monkeypatch.undo()
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_dir}", "train.resume_from_checkpoint=latest")
    assert status == 0, stderr[-3000:]
    resumed, uninterrupted = (json.loads((folder / "metrics.json").read_text()) for folder in (run_dir, finished_run[1]))
    for key in ("global_step", "eval_accuracy", "eval_f1_macro", "train_loss", "train_samples", "train_tokens"):
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-5, abs=1e-6), key



def test_faults_disk_full_while_a_resume_rewrites_the_config_keeps_the_run(refused, finished_run, run_copy, monkeypatch):
    # A resume rewrites config.yaml, the file that marks the folder as a bertpipe run: written in
    # place, a full disk left it empty, and the run could neither be resumed nor replaced.
    from pipelines import atomic_writes

    (run_copy / "metrics.json").unlink()

    def disk_full_at_the_config(path, *args, **kwargs):
        handle = open(path, *args, **kwargs)  # open() creates or truncates; the write after it is what the full disk refuses
        if Path(path).parent != run_copy or not Path(path).name.startswith("config.yaml"):
            return handle
        handle.close()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_writes, "open", disk_full_at_the_config, raising=False)
    refused("train", finished_run[0], f"output_dir={run_copy}", "train.resume_from_checkpoint=latest",
            needles=["No space left on device", str(run_copy / "config.yaml")])


def test_faults_disk_full_while_saving_the_trained_run_leaves_it_resumable(capsys, finished_run, tmp_path, monkeypatch):
    # A full disk reaches safetensors as a SafetensorError and torch.save as "RuntimeError: unexpected
    # pos", not as an OSError: the run ended in a traceback. It is one message, and the run, unfinished
    # (no metrics.json) with its checkpoints, resumes to the result of an uninterrupted one.
    import pipelines.train

    def disk_full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 9664 vs 9556")

    monkeypatch.setattr(pipelines.train, "write_model_card", disk_full)
    run_dir = tmp_path / "full"
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_dir}")
    assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert f"output_dir {run_dir}: the trained run could not be saved" in stderr and "unexpected pos" in stderr
    assert not (run_dir / "metrics.json").exists()

    monkeypatch.undo()
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={run_dir}", "train.resume_from_checkpoint=latest")
    assert status == 0, stderr[-3000:]
    resumed, uninterrupted = (json.loads((folder / "metrics.json").read_text()) for folder in (run_dir, finished_run[1]))
    for key in ("global_step", "eval_accuracy", "train_loss"):
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-5, abs=1e-6), key


# ----- predict and evaluate -------------------------------------------------------------------------
def test_faults_predict_output_is_the_input(refused, run_copy, tmp_path):
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text('{"sentence": "good film"}\n')
    refused("predict", run_copy, "--input", inputs, "--output", inputs, needles=["--output", str(inputs), "is the --input file"])
    refused("predict", run_copy, "--input", inputs, "--output", run_copy / "config.yaml", needles=[str(run_copy / "config.yaml"), "file of the run"])


def test_faults_predict_output_in_the_run_an_export_inside_it_came_from(refused, run_copy, tmp_path, capsys):
    """An export kept in RUN/onnx protected only its own files: predictions from it replaced the run's model and config."""
    status, stderr = bertpipe_in_process(capsys, "export", run_copy, "--out", run_copy / "onnx")
    assert status == 0, stderr[-3000:]
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good film"}])
    for name in ("model.safetensors", "config.yaml"):
        refused("predict", run_copy / "onnx", "--input", inputs, "--output", run_copy / name,
                needles=[f"--output {run_copy / name} is a file of the run {run_copy}"], roots=(run_copy,))
    refused("predict", run_copy, "--input", inputs, "--output", run_copy / "onnx" / "export.json",
            needles=[f"is a file of the export {run_copy / 'onnx'}"], roots=(run_copy,))
    status, stderr = bertpipe_in_process(capsys, "predict", run_copy / "onnx", "--input", inputs, "--output", run_copy / "onnx.jsonl")
    assert status == 0, stderr[-3000:]  # earlier predictions beside the run's model may still be replaced


def test_faults_predict_output_in_a_folder_the_run_reads(refused, run_copy, tmp_path, tiny_bert):
    """A run trained on a dataset folder (data.path): --output ds/train.jsonl replaced its training data, and a new file
    there would be read as data by a retrain. The base model's folder is an input too."""
    dataset = tmp_path / "ds"
    dataset.mkdir()
    write_jsonl(dataset / "train.jsonl", sentiment_rows(8, seed=3))
    config = run_copy / "config.yaml"
    config.write_text(config.read_text().replace("  path: null\n", f"  path: {dataset}\n", 1))
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good film"}])
    for output, key, folder in ((dataset / "train.jsonl", "data.path", dataset), (dataset / "new.jsonl", "data.path", dataset),
                                (tiny_bert / "predictions.jsonl", "model.name_or_path", tiny_bert)):
        refused("predict", run_copy, "--input", inputs, "--output", output, needles=[f"--output {output} lies in {key}={folder}"])
        assert not (dataset / "new.jsonl").exists() and not (tiny_bert / "predictions.jsonl").exists()


@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [("empty.jsonl", "", ["is empty"]), ("prose.jsonl", "this is not json\n", ["line 1: not valid JSON"]),
     ("empty.txt", "\n\n", ["holds no examples"]), ("blank_cell.csv", "sentence\ngood\n\"\"\n", ["row 2", "empty 'sentence' cell"]),
     ("numbers.jsonl", '{"sentence": 1}\n{"sentence": 2}\n', ["'sentence' holds int64 values, not text"])],
)
def test_faults_predict_bad_input(refused, run_copy, tmp_path, name, content, needles):
    inputs = tmp_path / name
    inputs.write_text(content)
    refused("predict", run_copy, "--input", inputs, "--output", tmp_path / "out.jsonl", needles=[str(inputs), *needles])
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(("row", "needles"), [
    ({"sentence": 5, "label": "positive"}, ["split 'validation'", "column 'sentence' holds Json values, not text"]),
    ({"sentence": "good", "label": 1}, ["split 'validation'", "row 3: 'label' is read as a int where row 1 is read as a str"]),
])
def test_faults_a_number_in_a_validation_column_of_text_is_refused_not_scored_as_json(refused, finished_run, tmp_path, row, needles):
    """Read with the train file, the validation file took its column types: a column of text holding one number was
    cast to text by writing each row as JSON ('"good film"', quotes included) and the run scored that."""
    validation = write_jsonl(tmp_path / "validation.jsonl", [*sentiment_rows(2, seed=5), row])
    refused("train", finished_run[0], f"output_dir={tmp_path / 'new'}", f"data.files.validation={validation}",
            needles=[*needles, str(validation)])


def test_faults_input_and_data_files_of_an_unknown_type_are_named(refused, run_copy, finished_run, tmp_path):
    """An input without a known suffix was refused as "data.files: unsupported file type(s) ['']", a key the
    command line does not set, without the file."""
    no_suffix = tmp_path / "inputs"
    no_suffix.write_text("good film\n")
    refused("predict", run_copy, "--input", no_suffix, "--output", tmp_path / "o.jsonl",
            needles=[f"--input {no_suffix}: unsupported file type ''", "'.jsonl'"])
    xml = tmp_path / "train.xml"
    xml.write_text("<rows/>")
    refused("train", finished_run[0], f"output_dir={tmp_path / 'new'}", f"data.files.train={xml}",
            needles=[f"data.files.train: {xml}: unsupported file type ['.xml']"])


def test_faults_predict_missing_input_and_not_a_run(refused, run_copy, tmp_path):
    refused("predict", run_copy, "--input", tmp_path / "none.jsonl", "--output", tmp_path / "o.jsonl", needles=[str(tmp_path / "none.jsonl"), "does not exist"])
    refused("predict", run_copy, "--input", run_copy, "--output", tmp_path / "o.jsonl", needles=[str(run_copy), "is a folder"])
    refused("predict", tmp_path, "--input", tmp_path / "none.jsonl", "--output", tmp_path / "o.jsonl", needles=[str(tmp_path), "not a bertpipe run"])


def test_faults_predict_and_evaluate_on_an_unfinished_run(refused, run_copy, tmp_path):
    (run_copy / "metrics.json").unlink()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (run_copy / name).unlink()  # a run killed mid-training has no model or tokenizer yet
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good"}])
    for command in (["predict", run_copy, "--input", inputs, "--output", tmp_path / "o.jsonl"], ["evaluate", run_copy]):
        refused(*command, needles=[str(run_copy), "no finished run", "resume_from_checkpoint=latest"])
    # An interrupted overwrite=true: the finished run it replaces waits aside, which train's refusal said and these did not.
    from pipelines.outputs import replaced_run_dir

    aside = replaced_run_dir(run_copy)
    aside.mkdir()
    (aside / "metrics.json").write_text("{}")
    for command in (["predict", run_copy, "--input", inputs, "--output", tmp_path / "o.jsonl"], ["evaluate", run_copy]):
        refused(*command, needles=["no finished run", f"still kept, whole, in {aside}"])


def test_faults_predict_and_evaluate_on_a_run_without_its_tokenizer_files(refused, run_copy, tmp_path):
    # Weights copied alone: transformers built a tokenizer of the 5 special tokens from config.json, every word read
    # as [UNK], and both commands exited 0 with meaningless predictions and metrics.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (run_copy / name).unlink()
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good"}])
    for command in (["predict", run_copy, "--input", inputs, "--output", tmp_path / "o.jsonl"], ["evaluate", run_copy]):
        refused(*command, needles=[f"{run_copy} holds no tokenizer vocabulary", "every word would read as [UNK]"])
    assert not (tmp_path / "o.jsonl").exists() and not (run_copy / "eval_validation.json").exists()


def test_faults_predict_and_evaluate_on_a_checkpoint_name_its_run(refused, run_copy, tmp_path):
    # A checkpoint's config.yaml names the run's output_dir: "resume from this folder's config" would
    # point back at the run, so the message names the run instead.
    checkpoint = run_copy / "checkpoints" / "step-00000004"
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"sentence": "good"}])
    for command in (["predict", checkpoint, "--input", inputs, "--output", tmp_path / "o.jsonl"], ["evaluate", checkpoint]):
        refused(*command, needles=[f"{checkpoint} is a training checkpoint of the run {run_copy}", f"bertpipe train {run_copy / 'config.yaml'}"])


def test_faults_predict_txt_skips_blank_lines(capsys, run_copy, tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("good film\n\nbad film\n  \u200b \nlovely\n")
    output = tmp_path / "predictions.jsonl"
    status, stderr = bertpipe_in_process(capsys, "predict", run_copy, "--input", inputs, "--output", output)
    assert status == 0, stderr[-3000:]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["text"] for row in rows] == ["good film", "bad film", "lovely"], "blank lines must get no prediction"
    assert all(row["label"] in ("positive", "negative") for row in rows)


# ----- export ---------------------------------------------------------------------------------------
def test_faults_export_overwrite_replaces_only_an_earlier_export(refused, capsys, run_copy, tmp_path):
    # export --overwrite empties --out before moving the export in: the run itself, a folder holding it
    # or a folder of someone else's files would be lost.
    refused("export", run_copy, "--out", run_copy, "--overwrite", needles=["--out", str(run_copy), "is the run"])
    refused("export", run_copy, "--out", tmp_path, "--overwrite", needles=["--out", str(tmp_path), "holds the run"])
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "beach.jpg").write_bytes(b"\xff\xd8 a photo")
    refused("export", run_copy, "--out", photos, "--overwrite", needles=["--out", str(photos), "not an earlier bertpipe export"])

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in ("export.json", "model.onnx", "stale.txt"):
        (earlier / name).write_text("from an earlier export")
    status, stderr = bertpipe_in_process(capsys, "export", run_copy, "--out", earlier, "--overwrite", "--parity-samples", "4")
    assert status == 0, stderr[-3000:]
    assert json.loads((earlier / "export.json").read_text())["format"] == "onnx" and not (earlier / "stale.txt").exists()


def test_faults_merge_never_writes_into_a_folder_that_holds_files(refused, capsys, finished_run, run_copy, tmp_path):
    lora = tmp_path / "lora"
    status, stderr = bertpipe_in_process(capsys, "train", finished_run[0], f"output_dir={lora}", "model.peft.method=lora",
                                         "model.peft.r=2", "train.max_steps=2", "train.save_steps=null")
    assert status == 0, stderr[-3000:]
    # Another run's trained model, and the adapter run itself, would be overwritten without a word.
    refused("merge", lora, "--out", run_copy, needles=["--out", str(run_copy), "is not empty"])
    refused("merge", lora, "--out", lora, needles=["--out", str(lora), "is not empty"])
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    refused("merge", lora, "--out", a_file, needles=["--out", str(a_file), "is a file, not a folder"])  # not "not empty"
    for _ in range(2):  # the run's own merged/ is the merge's to replace
        status, stderr = bertpipe_in_process(capsys, "merge", lora)
        assert status == 0 and (lora / "merged" / "model.safetensors").is_file(), stderr[-3000:]


def test_faults_convert_bert_other_kind_of_checkpoint_or_a_destination_holding_files(refused, tiny_bert, run_copy, tmp_path):
    refused("convert-bert", tiny_bert, tmp_path / "back", "--reverse", needles=[str(tiny_bert), "not a bertpipe_bert checkpoint"])
    refused("convert-bert", tiny_bert, run_copy, needles=["destination", str(run_copy), "is not empty"])
    refused("convert-bert", tiny_bert, tiny_bert, needles=["destination", str(tiny_bert), "is not empty"])

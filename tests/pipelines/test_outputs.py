"""The run directory's files: strict JSON whatever the metrics hold, each rewrite whole or not at all, and
refusals of an output_dir that leave nothing behind and say where an old run is kept."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pipelines.atomic_writes import write_json
from pipelines.outputs import StepLog


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_outputs_nan_and_infinite_metrics_are_written_as_null(tmp_path):
    # Pearson of constant predictions is NaN: written bare, metrics.json was not JSON to any strict reader.
    write_json(tmp_path / "metrics.json", {"eval_pearson": float("nan"), "curve": [float("inf"), 0.5], "nested": {"x": -float("inf")}})
    assert strict_json((tmp_path / "metrics.json").read_text()) == {"eval_pearson": None, "curve": [None, 0.5], "nested": {"x": None}}
    log = StepLog(tmp_path)
    log.write({"step": 1, "eval_spearmanr": float("nan")})
    log.close()
    assert [strict_json(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [{"step": 1, "eval_spearmanr": None}]


def test_outputs_an_unfinished_replacement_interrupted_while_being_discarded_stays_replaceable(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    # overwrite=true over an unfinished replacement (the last finished run waits aside) deletes the
    # replacement first. A Ctrl-C or kill within that deletion (a folder of checkpoints takes a while)
    # left a folder without config.yaml but with the rest: refused for good as "not a bertpipe run".
    import shutil

    from pipelines.config_loading import load_config
    from pipelines.outputs import check_output_dir, replaced_run_dir, set_aside_run_dir
    from tasks import get_task
    from tests.conftest import classification_config

    run = tmp_path / "run"
    aside = replaced_run_dir(run)
    aside.mkdir()
    (aside / "metrics.json").write_text("{}")
    run.mkdir()
    (run / "config.yaml").write_text(f"task: classification\noutput_dir: {run}\n")
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    (run / "checkpoints" / "step-00000002" / "model.safetensors").write_bytes(b"weights")

    delete = shutil.rmtree

    def interrupted(path, *args, **kwargs):
        if not (Path(path) / "config.yaml").is_file():
            return delete(path, *args, **kwargs)
        (Path(path) / "config.yaml").unlink()  # rmtree's order is the folder's: config.yaml may go first
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        set_aside_run_dir(run)
    monkeypatch.undo()

    config = load_config(classification_config(tmp_path, tiny_bert, sentiment_files), [f"output_dir={run}", "overwrite=true"],
                         lambda name: get_task(name).Options)
    check_output_dir(config)  # the same command again is accepted
    assert (aside / "metrics.json").is_file()


def _classifier(tiny_bert: Path, seed: int):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).eval()


def _logits(folder: Path, tiny_bert: Path) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    batch = AutoTokenizer.from_pretrained(tiny_bert)(["a good warm film", "dull"], padding=True, return_tensors="pt")
    with torch.no_grad():
        return AutoModelForSequenceClassification.from_pretrained(folder).eval()(**batch).logits


def _accelerator(is_main_process: bool = True):
    """What _save_model uses of an Accelerator, for one process of several."""
    return SimpleNamespace(unwrap_model=lambda model: model, get_state_dict=lambda model: model.state_dict(),
                           is_main_process=is_main_process, save=torch.save)


def _killed_mid_write(tensors, filename, metadata=None):
    Path(filename).write_bytes(b"\0" * 64)  # what a kill or a full disk leaves of the file
    raise KeyboardInterrupt


def test_outputs_a_model_save_killed_mid_write_leaves_the_saved_model_whole(tmp_path, tiny_bert, monkeypatch):
    # A resume of a finished run (and each new best model) saves over a saved model: written in place,
    # a kill mid-write left a "finished" run whose model.safetensors did not load.
    import transformers.modeling_utils

    from pipelines.train import _save_model

    run = tmp_path / "run"
    _save_model(_accelerator(), _classifier(tiny_bert, 0), run)
    before = _logits(run, tiny_bert)
    names = sorted(path.name for path in run.iterdir())

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        _save_model(_accelerator(), _classifier(tiny_bert, 1), run)
    monkeypatch.undo()
    torch.testing.assert_close(_logits(run, tiny_bert), before, rtol=0, atol=0)
    assert sorted(path.name for path in run.iterdir()) == names  # and no staging folder is left

    _save_model(_accelerator(is_main_process=False), _classifier(tiny_bert, 1), run)  # only the main process writes
    torch.testing.assert_close(_logits(run, tiny_bert), before, rtol=0, atol=0)
    _save_model(_accelerator(), _classifier(tiny_bert, 1), run)
    assert not torch.allclose(_logits(run, tiny_bert), before)
    assert sorted(path.name for path in run.iterdir()) == names


def test_outputs_a_model_saved_over_another_layout_is_the_one_that_loads(tmp_path, tiny_bert):
    # transformers loads model.safetensors before an index, and that before pytorch_model.bin: a weight file
    # of the old layout left beside the new one is loaded in its place, or lingers as a second model.
    from pipelines.atomic_writes import replacing_files
    from pipelines.train import _save_model

    old, new = _classifier(tiny_bert, 0), _classifier(tiny_bert, 1)
    run = tmp_path / "run"
    _save_model(_accelerator(), old, run)
    torch.save(old.state_dict(), run / "pytorch_model.bin")
    with replacing_files(run, "model") as staging:
        new.save_pretrained(staging, max_shard_size="40KB")
    shards = sorted(path.name for path in run.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (run / "model.safetensors").exists() and not (run / "pytorch_model.bin").exists()
    expected = _logits(run, tiny_bert)

    # Back to one file: the index and the shards go.
    _save_model(_accelerator(), new, run)
    assert sorted(path.name for path in run.iterdir()) == ["config.json", "model.safetensors"]
    torch.testing.assert_close(_logits(run, tiny_bert), expected, rtol=0, atol=0)


def test_outputs_refusals_name_the_finished_run_an_interrupted_overwrite_set_aside(tmp_path, tiny_bert, sentiment_files):
    # overwrite=true keeps the old run in .<name>.replaced until the new one finishes; after an interruption
    # every refusal of the folder read as if that finished run were lost.
    from pipelines.config_loading import load_config
    from pipelines.errors import OutputDirError
    from pipelines.outputs import check_output_dir, replaced_run_dir
    from tasks import get_task
    from tests.conftest import classification_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"task: classification\noutput_dir: {run}\n")
    path = classification_config(tmp_path, tiny_bert, sentiment_files)
    config = load_config(path, [f"output_dir={run}"], lambda name: get_task(name).Options)
    with pytest.raises(OutputDirError) as refused:
        check_output_dir(config)
    assert ".run.replaced" not in str(refused.value)

    aside = replaced_run_dir(run)
    aside.mkdir()
    (aside / "metrics.json").write_text("{}")
    for contents in ({}, {"checkpoints/step-00000004/trainer_state.json": "{}"}, {"metrics.json": "{}"}):
        for name, text in contents.items():
            (run / name).parent.mkdir(parents=True, exist_ok=True)
            (run / name).write_text(text)
        with pytest.raises(OutputDirError, match=rf"kept, whole, in {aside}"):
            check_output_dir(config)
    (run / "config.yaml").unlink()  # no longer a bertpipe run
    with pytest.raises(OutputDirError, match=rf"not a bertpipe run.*kept, whole, in {aside}"):
        check_output_dir(config)


def test_outputs_output_dir_is_checked_without_being_left_behind(tmp_path):
    from pipelines.outputs import _check_creatable

    _check_creatable(tmp_path / "new" / "run")
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    _check_creatable(tmp_path / "empty" / "run")
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


def test_outputs_training_curves_killed_mid_write_keep_the_earlier_image(tmp_path, monkeypatch):
    # A resumed finished run redraws training_curves.png, which publish uploads: a kill mid-write left it truncated.
    from matplotlib.figure import Figure

    from pipelines.outputs import plot_training_curves

    records = [{"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.5, "eval_loss": 0.6, "eval_accuracy": 0.7}]
    path = plot_training_curves(records, tmp_path / "training_curves.png")
    before = path.read_bytes()
    assert before.startswith(b"\x89PNG")
    draw = Figure.savefig

    def killed(self, fname, *args, **kwargs):
        draw(self, fname, *args, **kwargs)
        Path(fname).write_bytes(Path(fname).read_bytes()[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", killed)
    with pytest.raises(KeyboardInterrupt):
        plot_training_curves([*records, {"step": 3, "loss": 0.1}], path)
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def test_outputs_a_users_folder_holding_its_own_config_yaml_is_not_a_run(tmp_path, tiny_bert, sentiment_files):
    """Any config.yaml with task and output_dir made a folder a run: a project folder keeping its config there (output_dir
    naming the folder) was offered overwrite=true, which deleted the folder, config, notes and code."""
    from pipelines.config_loading import load_config
    from pipelines.errors import OutputDirError
    from pipelines.outputs import check_output_dir, is_run_dir
    from tasks import get_task

    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    (project / "config.yaml").write_text(
        f"task: classification\noutput_dir: {project}\nmodel:\n  name_or_path: {tiny_bert}\n"
        f"data:\n  files:\n    train: {sentiment_files['train']}\n    validation: {sentiment_files['validation']}\n"
        "  text_column: sentence\n")
    (project / "log.jsonl").write_text("{}\n")  # names other tools use too
    (project / "checkpoints" / "checkpoint-500").mkdir(parents=True)
    assert not is_run_dir(project)
    config = load_config(project / "config.yaml", ["overwrite=true"], lambda name: get_task(name).Options)
    with pytest.raises(OutputDirError, match=rf"output_dir {project} is not empty and is not a bertpipe run"):
        check_output_dir(config)

    (project / "tokenizer_config.json").write_text("{}")  # what a run writes beside its config.yaml from its start
    assert is_run_dir(project)


def test_outputs_overwrite_refuses_a_run_folder_holding_a_tasks_own_checkpoint(tmp_path, tiny_bert):
    """translation.encoder_name_or_path inside the run that overwrite=true replaces: the new run loaded it, then the old
    run was deleted with it, and the new config.yaml named a folder that no longer existed."""
    import shutil

    from pipelines.config_loading import load_config
    from pipelines.errors import OutputDirError
    from pipelines.outputs import check_output_dir
    from tasks import get_task

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"task: translation\noutput_dir: {run}\n")
    (run / "tokenizer_config.json").write_text("{}")
    shutil.copytree(tiny_bert, run / "encoder")
    config_path = tmp_path / "mt.yaml"
    config_path.write_text(f"task: translation\noutput_dir: {run}\nmodel:\n  name_or_path: {tiny_bert}\n"
                           f"data:\n  files:\n    train: {tmp_path / 't.jsonl'}\ntranslation:\n  source_lang: de\n  target_lang: en\n")
    options_for = lambda name: get_task(name).Options  # noqa: E731
    assert check_output_dir(load_config(config_path, ["overwrite=true"], options_for)) is True
    for key in ("encoder_name_or_path", "decoder_name_or_path"):
        config = load_config(config_path, ["overwrite=true", f"translation.{key}={run / 'encoder'}"], options_for)
        with pytest.raises(OutputDirError, match=rf"but translation.{key}={run / 'encoder'} lies inside it \(an input of this run\)"):
            check_output_dir(config)


def test_outputs_output_dir_inside_the_data_folder_is_refused_before_anything_is_written(tmp_path, tiny_bert, sentiment_files):
    """The data.path folder is read whole: a run inside it changed the data's digest with its own checkpoints (it could never
    resume), and evaluate's eval_validation.json was read as rows of the validation split (no later load could cast it)."""
    import shutil

    from pipelines.config_loading import load_config
    from pipelines.errors import OutputDirError
    from pipelines.outputs import check_output_dir
    from pipelines.sweep.run import run_sweep
    from tasks import get_task
    from tests.conftest import classification_config

    data = tmp_path / "ds"
    data.mkdir()
    for split, path in sentiment_files.items():
        shutil.copy(path, data / f"{split}.jsonl")
    path = classification_config(tmp_path, tiny_bert, sentiment_files)
    for output_dir in (data / "run", data / "deeper" / "run", data):
        config = load_config(path, ["data.files={}", f"data.path={data}", f"output_dir={output_dir}"], lambda name: get_task(name).Options)
        with pytest.raises(OutputDirError, match=rf"output_dir {output_dir} lies inside data.path={data}, a folder read whole"):
            check_output_dir(config)
        with pytest.raises(OutputDirError, match=rf"output_dir {output_dir} lies inside data.path={data}"):
            run_sweep(str(path), ["data.files={}", f"data.path={data}", f"output_dir={output_dir}"], get_task, trials=1)
    assert sorted(item.name for item in data.iterdir()) == ["train.jsonl", "validation.jsonl"]
    beside = load_config(path, ["data.files={}", f"data.path={data}", f"output_dir={tmp_path / 'ds-run'}"], lambda name: get_task(name).Options)
    assert check_output_dir(beside) is False  # a sibling whose name starts the same is outside
    unread = load_config(path, [f"data.path={data}", f"output_dir={data / 'run'}"], lambda name: get_task(name).Options)
    assert check_output_dir(unread) is False  # data.files given: data.path is not read

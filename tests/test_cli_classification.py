"""End to end through the CLI: train -> evaluate -> predict -> pipeline() on a tiny BERT built here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import classification_config, cli_env, run_cli, write_jsonl


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_bert, sentiment_files) -> Path:
    tmp_path = tmp_path_factory.mktemp("cls")
    config = classification_config(tmp_path, tiny_bert, sentiment_files)
    run_cli("train", str(config))
    return tmp_path / "run"


def test_cli_train_writes_a_complete_run_directory(trained_run):
    for name in ["model.safetensors", "config.json", "tokenizer.json", "config.yaml", "metrics.json", "log.jsonl",
                 "training_curves.png", "README.md"]:
        assert (trained_run / name).is_file(), name
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["eval_samples"] == 37
    assert metrics["num_processes"] == 1
    assert metrics["eval_accuracy"] >= 0.8, metrics  # the cue word decides the label: a tiny model learns it
    for key in ["train_runtime", "train_samples_per_second", "train_tokens_per_second", "eval_f1", "eval_matthews_correlation"]:
        assert key in metrics
    log = [json.loads(line) for line in (trained_run / "log.jsonl").read_text().splitlines()]
    assert any("loss" in record for record in log) and any("eval_accuracy" in record for record in log)
    saved = (trained_run / "config.yaml").read_text()
    assert "task: classification" in saved and "classification:" in saved


def test_cli_pipeline_returns_label_names(trained_run):
    from transformers import pipeline

    classifier = pipeline("text-classification", model=str(trained_run))
    result = classifier(["the film was superb and lovely", "the plot was awful"])
    assert {row["label"] for row in result} <= {"positive", "negative"}
    assert result[0]["label"] == "positive" and result[1]["label"] == "negative"


def test_cli_predict_and_the_model_cards_pipeline_call_agree_past_max_seq_length(trained_run, tmp_path):
    import re

    from transformers import AutoTokenizer, pipeline

    # The cue words come after the 32nd piece: only a pipeline that does not truncate sees them.
    text = "the story of the film " * 7 + "awful dull awful dull plot"
    pieces = len(AutoTokenizer.from_pretrained(trained_run)(text)["input_ids"])
    assert 32 < pieces <= 64, pieces  # past the run's max_seq_length (32), within the model's 64 positions
    inputs = tmp_path / "inputs.txt"
    inputs.write_text(text + "\n")
    run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(tmp_path / "out.jsonl"))
    predicted = json.loads((tmp_path / "out.jsonl").read_text())["scores"]

    # The call the run's model card shows: the pipeline truncates as training and predict did.
    card_call = re.search(r"predictor\((.*)\)\)", (trained_run / "README.md").read_text()).group(1)
    assert card_call.endswith("truncation=True, max_length=32"), card_call
    classifier = pipeline("text-classification", model=str(trained_run), top_k=None)
    served = {row["label"]: row["score"] for row in classifier([text], truncation=True, max_length=32)[0]}
    assert served == pytest.approx(predicted, abs=1e-5)
    # The text really is cut, so the kwargs matter (what the model then makes of the cut is training's luck:
    # comparing its logits with and without the cut failed whenever it had learnt the first 32 pieces alone).
    fed = lambda **cut: classifier.preprocess(text, **cut)["input_ids"].shape[-1]  # noqa: E731
    assert fed(truncation=True, max_length=32) == 32 < fed() == pieces


def test_cli_evaluate_matches_training_metrics(trained_run):
    result = run_cli("evaluate", str(trained_run))
    metrics = json.loads((trained_run / "eval_validation.json").read_text())
    trained = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["eval_samples"] == 37
    assert metrics["eval_accuracy"] == pytest.approx(trained["eval_accuracy"])
    assert "eval_accuracy" in result.stdout


def test_cli_predict_writes_one_object_per_input(trained_run, tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("the film was superb\nawful and dull plot\nthe scenes were warm and bright\n")
    output = tmp_path / "predictions.jsonl"
    run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(output))
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["text"] for row in rows] == inputs.read_text().splitlines()
    assert [row["label"] for row in rows] == ["positive", "negative", "positive"]
    assert all(abs(sum(row["scores"].values()) - 1) < 1e-4 for row in rows)


def test_cli_predict_copies_each_input_rows_other_columns_into_its_prediction(trained_run, tmp_path):
    # Only the text reached the output: predictions could not be joined back to the data by id.
    inputs = tmp_path / "inputs.csv"
    inputs.write_text("id,sentence,label,note\n007,the film was superb,positive,first\n008,awful and dull plot,positive,\n")
    output = tmp_path / "predictions.jsonl"
    result = run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(output))
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(row["id"], row["note"], row["text"]) for row in rows] == [
        ("007", "first", "the film was superb"), ("008", None, "awful and dull plot")]  # a csv cell as written
    assert "sentence" not in rows[0]  # the text, read by the task, is the output's "text"
    # A gold label column has the prediction's name: the prediction wins and stderr says so.
    assert [row["label"] for row in rows] == ["positive", "negative"]
    assert "column(s) ['label'] share names with prediction fields and are not copied" in result.stderr


def test_cli_predict_reads_inputs_in_the_encoding_given(trained_run, tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_bytes("the film was superb\nawful, dull plot: a déjà vu\n".encode("latin-1"))
    output = tmp_path / "predictions.jsonl"
    refused = run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(output), check=False)
    assert refused.returncode == 2 and not output.exists()
    assert f"input: {inputs}, line 2 (byte 41): byte 0xe9 is not valid utf-8" in refused.stderr
    assert "data.encoding" in refused.stderr and "Traceback" not in refused.stderr
    run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(output), "data.encoding=latin-1")
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["text"] for row in rows] == ["the film was superb", "awful, dull plot: a déjà vu"]



def test_cli_predict_writes_utf8_whatever_the_locale(trained_run, tmp_path):
    # Under a locale whose encoding is not UTF-8 (Windows' cp1252, a POSIX shell without UTF-8 mode), the
    # predictions were written in that encoding: CJK text failed with "'ascii' codec can't encode" or came
    # out as bytes no JSON reader decodes.
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(json.dumps({"sentence": "映画は素晴らしい, a déjà vu"}, ensure_ascii=False) + "\n", encoding="utf-8")
    output = tmp_path / "predictions.jsonl"
    ascii_locale = cli_env(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(output), env=ascii_locale)
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["text"] for row in rows] == ["映画は素晴らしい, a déjà vu"]

def test_cli_refuses_to_overwrite_a_finished_run(trained_run, tmp_path):
    config = trained_run / "config.yaml"
    result = run_cli("train", str(config), check=False)
    assert result.returncode == 2
    assert "already holds a finished run" in result.stderr and "Traceback" not in result.stderr


def test_cli_config_typo_names_key_file_and_suggestion(trained_run):
    config = trained_run / "config.yaml"
    result = run_cli("train", str(config), "train.learnig_rate=0.1", check=False)
    assert result.returncode == 2
    assert "train.learnig_rate" in result.stderr and "train.learning_rate" in result.stderr


def test_cli_label_outside_label_set_is_an_error(tmp_path, tiny_bert, sentiment_files):
    bad = write_jsonl(tmp_path / "validation.jsonl", [{"sentence": "good film", "label": "positive"}, {"sentence": "meh", "label": "neutral"}])
    config = classification_config(tmp_path, tiny_bert, {"train": sentiment_files["train"], "validation": bad})
    result = run_cli("train", str(config), check=False)
    assert result.returncode == 2
    assert "'neutral'" in result.stderr and "row 2 (rows count from 1)" in result.stderr


def test_cli_missing_column_names_the_available_ones(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files)
    result = run_cli("train", str(config), "data.text_column=review", check=False)
    assert result.returncode == 2
    assert "review" in result.stderr and "sentence" in result.stderr


def test_cli_early_stopping_best_model_and_tensorboard(tmp_path, tiny_bert, sentiment_files):
    # A learning rate this small cannot change the accuracy, so the first evaluation stays the best
    # and patience 1 stops the run at the second one.
    config = classification_config(
        tmp_path, tiny_bert, sentiment_files, run_name="patience", learning_rate=1e-12, eval_steps=2,
        metric_for_best_model="eval_accuracy", early_stopping_patience=1, load_best_model_at_end=True,
        report_to=["tensorboard"], logging_steps=3,
    )
    result = run_cli("train", str(config))
    assert "early stopping" in result.stdout
    metrics = json.loads((tmp_path / "patience" / "metrics.json").read_text())
    assert metrics["global_step"] == 4 and metrics["best_step"] == 2
    # The step after the last logged loss (3) still counts: logged at the stop, and in train_loss.
    losses = [record for record in map(json.loads, (tmp_path / "patience" / "log.jsonl").read_text().splitlines()) if "loss" in record]
    assert [record["step"] for record in losses] == [3, 4]
    assert metrics["train_loss"] == pytest.approx((3 * losses[0]["loss"] + losses[1]["loss"]) / 4, abs=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(metrics["best_metric"])
    assert list((tmp_path / "patience" / "tracking").rglob("events.out.tfevents*"))
    assert not (tmp_path / "patience" / "best_model").exists()


def test_cli_pack_sequences_is_refused_for_classification_before_anything_is_written(tiny_bert, sentiment_files, tmp_path):
    config = classification_config(tmp_path, tiny_bert, sentiment_files)
    refused = run_cli("train", str(config), "train.pack_sequences=true", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "train.pack_sequences" in refused.stderr and "classification" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "run").exists()


def test_cli_best_model_metric_the_task_does_not_report_is_refused_before_training(tiny_bert, sentiment_files, tmp_path):
    """eval_loss (the Trainer's usual choice) was refused at the first evaluation: eval_steps of training lost, and a
    run folder left that the corrected command refused without overwrite=true."""
    config = classification_config(tmp_path, tiny_bert, sentiment_files, eval_steps=2, metric_for_best_model="eval_loss",
                                   load_best_model_at_end=True)
    refused = run_cli("train", str(config), check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert ("train.metric_for_best_model='eval_loss' is not a metric the classification task reports with these settings; "
            "it reports eval_accuracy, eval_f1, eval_f1_macro, eval_f1_micro, eval_precision_macro, eval_recall_macro, "
            "eval_matthews_correlation") in refused.stderr
    assert not (tmp_path / "run").exists()


EVALUATION_WORKERS_SHOWN = """
import sys
import pipelines.evaluation as evaluation
loader_for = evaluation.eval_dataloader
def shown(*args, num_workers=0, **kwargs):
    print(f"evaluation loader workers: {num_workers}", flush=True)
    return loader_for(*args, num_workers=num_workers, **kwargs)
evaluation.eval_dataloader = shown
from tasks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_evaluate_of_a_held_out_split_refuses_a_train_file_changed_since_training(tiny_bert, sentiment_files, tmp_path):
    """data.validation_fraction carves the eval split out of the train file again at `evaluate`: after the file's rows
    were reordered, 18 of 24 rows scored were rows the model had trained on, and nothing said so."""
    train = tmp_path / "train.jsonl"
    shutil.copy(sentiment_files["train"], train)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=3, eval_steps=None, mixed_precision="no")
    run_cli("train", str(config), f"data.files={{train: {train}}}", "data.validation_fraction=0.25")
    run = tmp_path / "run"
    run_cli("evaluate", str(run))
    evaluated = json.loads((run / "eval_validation.json").read_text())
    assert evaluated["eval_samples"] == 24
    assert evaluated["eval_accuracy"] == pytest.approx(json.loads((run / "metrics.json").read_text())["eval_accuracy"])
    # Another split name was carved too: data.eval_split=test (no test file) scored the held-out rows as eval_test.json.
    refused = run_cli("evaluate", str(run), "data.eval_split=test", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (f"split 'test' not found in data.files.train: {train}; the run held out split 'validation' of it by "
            "data.validation_fraction: evaluate data.eval_split=validation, or give data.files.test=FILE") in refused.stderr
    assert not (run / "eval_test.json").exists()
    # Its ONNX export too: it kept no digests of the data, and scored other rows, some trained on, with exit status 0.
    run_cli("export", str(run), "--out", str(tmp_path / "onnx"))

    lines = train.read_text().splitlines(keepends=True)
    train.write_text("".join(reversed(lines)))  # the same rows, in another order
    for folder in (run, tmp_path / "onnx"):
        refused = run_cli("evaluate", str(folder), check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert (f"split 'validation' (held out of data.files.train by data.validation_fraction): data.files.train: {train} is not "
                "the file the run was trained on") in refused.stderr
    assert json.loads((run / "eval_validation.json").read_text()) == evaluated
    assert not (tmp_path / "onnx" / "eval_validation.json").exists()
    train.write_text("".join(lines))
    for folder in (run, tmp_path / "onnx"):
        refused = run_cli("evaluate", str(folder), "seed=8", check=False)
        assert refused.returncode == 2 and "seed=8, but the run held its rows out with seed=7" in refused.stderr, refused.stderr[-3000:]
    run_cli("evaluate", str(tmp_path / "onnx"))  # the file as trained on: the export scores the run's own rows
    assert json.loads((tmp_path / "onnx" / "eval_validation.json").read_text())["eval_accuracy"] == pytest.approx(evaluated["eval_accuracy"])
    run_cli("evaluate", str(run), "data.files.validation=" + str(sentiment_files["validation"]))  # a file of its own: any train file
    assert json.loads((run / "eval_validation.json").read_text())["eval_samples"] == 37
    # The evaluation's data loader takes train.dataloader_num_workers, as training's does (it was accepted and ignored).
    workers = run_cli("evaluate", str(run), "train.dataloader_num_workers=1", script=EVALUATION_WORKERS_SHOWN)
    assert "evaluation loader workers: 1" in workers.stdout, workers.stdout[-2000:]


def test_cli_evaluate_of_a_split_held_out_of_a_data_folder_refuses_a_folder_changed_since_training(tiny_bert, sentiment_files, tmp_path):
    """The same for a local data.path folder without an eval split of its own (it was not compared at all); a folder
    that has one held nothing out, and its files may change."""
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(sentiment_files["train"], folder / "train.jsonl")
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=3, eval_steps=None, mixed_precision="no")
    run_cli("train", str(config), "data.files={}", f"data.path={folder}", "data.validation_fraction=0.25")
    run = tmp_path / "run"
    run_cli("evaluate", str(run))
    lines = (folder / "train.jsonl").read_text().splitlines(keepends=True)
    (folder / "train.jsonl").write_text("".join(reversed(lines)))
    refused = run_cli("evaluate", str(run), check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (f"split 'validation' (held out of data.path by data.validation_fraction): data.path={folder} is not the data "
            "the run was trained on") in refused.stderr
    refused = run_cli("evaluate", str(run), "seed=8", check=False)
    assert refused.returncode == 2 and "seed=8, but the run held its rows out with seed=7" in refused.stderr, refused.stderr[-3000:]
    shutil.copy(sentiment_files["validation"], folder / "validation.jsonl")  # an eval split of its own now
    run_cli("evaluate", str(run))
    assert json.loads((run / "eval_validation.json").read_text())["eval_samples"] == 37


def test_cli_overwrite_of_an_output_dir_that_is_a_symbolic_link_replaces_the_folder_it_points_to(tiny_bert, sentiment_files, tmp_path):
    """The link itself was set aside as the old run, a real folder took its place, and the old run (the link's target)
    was never deleted: rmtree of a link fails, silently at the end of the run and with an OSError at the next overwrite."""
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real" / "run")
    config = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=2, eval_steps=None, mixed_precision="no")
    run_cli("train", str(config), f"output_dir={tmp_path / 'real' / 'run'}")
    first = (tmp_path / "real" / "run" / "metrics.json").read_text()
    for seed in (8, 9):
        run_cli("train", str(config), f"output_dir={link}", "overwrite=true", f"seed={seed}")
        assert link.is_symlink() and link.resolve() == tmp_path / "real" / "run"
        assert f"seed: {seed}\n" in (tmp_path / "real" / "run" / "config.yaml").read_text()
        assert (tmp_path / "real" / "run" / "metrics.json").read_text() != first
        assert sorted(path.name for path in tmp_path.iterdir()) == ["link", "real", "run.yaml"]
        assert sorted(path.name for path in (tmp_path / "real").iterdir()) == ["run"]  # the old run deleted, no .run.replaced


def test_cli_overwrite_never_deletes_a_project_folder_that_keeps_its_config_as_config_yaml(tiny_bert, sentiment_files, tmp_path):
    """`bertpipe train project/config.yaml overwrite=true` with output_dir naming the project: the folder was taken for a
    run (its config.yaml has task and output_dir), and replaced, config, notes and code, with exit 0."""
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    (project / "notes.txt").write_text("what I tried\n")
    classification_config(project, tiny_bert, sentiment_files, run_name="config", max_steps=2, mixed_precision="no")
    config = project / "config.yaml"
    config.write_text(config.read_text().replace(f"output_dir: {project / 'config'}", f"output_dir: {project}"))
    before = {path: path.read_bytes() for path in sorted(project.rglob("*")) if path.is_file()}
    for overwrite in ([], ["overwrite=true"]):
        refused = run_cli("train", str(config), *overwrite, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert f"output_dir {project} is not empty and is not a bertpipe run" in refused.stderr
        assert {path: path.read_bytes() for path in sorted(project.rglob("*")) if path.is_file()} == before


@pytest.mark.parametrize("when", ["logging step", "evaluation", "checkpoint"])
def test_cli_a_run_whose_loss_diverges_ends_with_exit_2_and_saves_no_model(tmp_path, tiny_bert, sentiment_files, when):
    """train.learning_rate=1000: the loss went 1884, 193648, 1.4e7, nan, and the run exited 0 with every weight NaN and
    a believable eval_accuracy (argmax over NaN logits is label 0, the majority class). The divergence is caught at
    whichever comes first of a logging step, an evaluation and a checkpoint."""
    config = classification_config(tmp_path, tiny_bert, sentiment_files)
    cadence = {"logging step": ["train.logging_steps=2", "train.eval_steps=null"],
               "evaluation": ["train.logging_steps=100", "train.eval_steps=6"],
               "checkpoint": ["train.logging_steps=100", "train.eval_steps=null", "train.save_steps=6"]}[when]
    result = run_cli("train", str(config), "train.learning_rate=1000", "train.max_grad_norm=null", "train.max_steps=60",
                     "train.warmup_fraction=0", *cadence, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "training diverged by step" in result.stderr and "train.learning_rate=1000 too high" in result.stderr
    assert "no gradient clipping (train.max_grad_norm)" in result.stderr
    run = tmp_path / "run"
    assert not (run / "metrics.json").exists() and not (run / "model.safetensors").exists()
    assert not list(run.glob("checkpoint-*")) and not (run / "best_model").exists()

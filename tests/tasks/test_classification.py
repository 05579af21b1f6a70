from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, Features, Sequence, Value

from pipelines.config import ConfigError
from pipelines.config_loading import load_config
from pipelines.errors import DataError
from tasks import get_task
from tasks.classification import ClassificationTask
from tests.conftest import write_jsonl


def make_task(tmp_path, tiny_bert, rows_train, rows_eval, *overrides):
    train = write_jsonl(tmp_path / "train.jsonl", rows_train)
    valid = write_jsonl(tmp_path / "valid.jsonl", rows_eval)
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"task: classification\noutput_dir: {tmp_path / 'run'}\nmodel:\n  name_or_path: {tiny_bert}\n"
                           f"data:\n  files:\n    train: {train}\n    validation: {valid}\n")
    config = load_config(config_path, list(overrides), lambda name: get_task(name).Options)
    task = ClassificationTask(config)
    raw = task.load()
    task.build_tokenizer(raw)
    return task, raw


def test_classification_string_labels_sorted_and_mapped(tmp_path, tiny_bert):
    rows = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}, {"text": "ok", "label": "mid"}]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows[:2])
    assert task.problem_type == "single_label" and task.label_names == ["mid", "neg", "pos"]
    features = task.preprocess(raw["validation"], train=False)
    assert features["labels"] == [2, 1]
    model = task.build_model(raw)
    assert model.config.id2label == {0: "mid", 1: "neg", 2: "pos"} and model.config.label2id["pos"] == 2


def test_classification_label_outside_the_set_names_split_and_row(tmp_path, tiny_bert):
    task, raw = make_task(tmp_path, tiny_bert, [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}],
                          [{"text": "a", "label": "x"}, {"text": "c", "label": "z"}])
    # The file is named too: the message named the split alone.
    source = re.escape(f"(data.files.validation: {task.config.data.files['validation']})")
    with pytest.raises(DataError, match=rf"split 'validation' {source}, row 2 \(rows count from 1\): label 'z' is not in the label set \['x', 'y'\]"):
        task.preprocess(raw["validation"], train=False)


def test_classification_explicit_label_names_fix_the_order(tmp_path, tiny_bert):
    rows = [{"text": "a", "label": "neg"}, {"text": "b", "label": "pos"}]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows, "classification.label_names=[pos, neg]")
    assert task.label_names == ["pos", "neg"]
    assert task.preprocess(raw["train"], train=True)["labels"] == [1, 0]


def test_classification_multi_label_multi_hot_and_metrics(tmp_path, tiny_bert):
    rows = [{"text": "a", "label": ["x", "y"]}, {"text": "b", "label": ["z"]}, {"text": "c", "label": []}]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows)
    assert task.problem_type == "multi_label" and task.label_names == ["x", "y", "z"]
    features = task.preprocess(raw["validation"], train=False)
    assert features["labels"] == [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    model = task.build_model(raw)
    assert model.config.problem_type == "multi_label_classification"
    logits = np.array([[5.0, 5.0, -5.0], [-5.0, -5.0, 5.0], [-5.0, 5.0, -5.0]])
    predictions = task.postprocess({"logits": logits}, features, raw["validation"])
    assert predictions["predictions"].tolist() == [[1, 1, 0], [0, 0, 1], [0, 1, 0]]
    metrics = task.compute_metrics(predictions, raw["validation"])
    assert metrics["accuracy"] == pytest.approx(2 / 3)  # subset accuracy
    assert metrics["f1_micro"] == pytest.approx(2 * 3 / (2 * 3 + 1))  # tp=3, fp=1, fn=0
    rows_out = task.format_predictions(predictions, raw["validation"])
    assert rows_out[0]["labels"] == ["x", "y"] and rows_out[2]["labels"] == ["y"]


def test_classification_label_column_of_the_other_kind_than_the_problem_type_is_refused_naming_why(tmp_path, tiny_bert):
    """A multi-label reading of string labels trained on their characters (labels 'a', 'e', 'g', ...), of int
    labels ended in a TypeError, and a single-label reading of lists named the labels "['pos']"."""
    single = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}]
    lists = [{"text": "good", "label": ["pos"]}, {"text": "bad", "label": ["neg"]}]
    train_file = re.escape(f"(data.files.train: {tmp_path / 'train.jsonl'})")
    with pytest.raises(DataError, match=rf"split 'train' {train_file}: label column 'label' holds one label per row \(e.g. 'pos'\), "
                                        r"but classification.problem_type is multi_label, which reads a list of labels per row"):
        make_task(tmp_path, tiny_bert, single, single, "classification.problem_type=multi_label")
    with pytest.raises(DataError, match=r"holds one label per row \(e.g. 1\), but classification.problem_type is multi_label"):
        make_task(tmp_path, tiny_bert, [{"text": "good", "label": 1}, {"text": "bad", "label": 0}],
                  [{"text": "fine", "label": 1}], "classification.problem_type=multi_label")
    with pytest.raises(DataError, match=r"holds lists of labels \(e.g. \['pos'\]\), but classification.problem_type is single_label, "
                                        r"which reads one label per row"):
        make_task(tmp_path, tiny_bert, lists, lists, "classification.problem_type=single_label")
    # A finished multi-label run evaluated on a file of single labels: the run's head says why.
    task, raw = make_task(tmp_path, tiny_bert, lists, lists)
    task.build_model(raw).save_pretrained(tmp_path / "run")
    task.tokenizer.save_pretrained(tmp_path / "run")
    valid = write_jsonl(tmp_path / "single.jsonl", single)
    config = load_config(tmp_path / "c.yaml", [f"data.files={{validation: {valid}}}"], lambda name: get_task(name).Options)
    evaluation = ClassificationTask(config)
    evaluation.build_tokenizer(None, model_path=str(tmp_path / "run"))
    evaluation.build_model(None, model_path=str(tmp_path / "run"))
    with pytest.raises(DataError, match=rf"holds one label per row \(e.g. 'pos'\), but the model in {re.escape(str(tmp_path / 'run'))} "
                                        r"is multi_label, which reads a list of labels per row"):
        evaluation.load(include_train=False)


def test_classification_json_labels_mixing_numbers_and_the_strings_they_spell_are_refused(tmp_path, tiny_bert):
    # datasets reads such a column as Json and decodes each string as JSON: 1 and "1" became one class, "true" a bool.
    rows = [{"text": "good", "label": 1}, {"text": "bad", "label": "0"}, {"text": "fine", "label": "1"}, {"text": "dull", "label": 0}]
    with pytest.raises(DataError, match=r"split 'train' .*: the rows' 'label' values mix kinds \(e.g. the number 1 and the string \"1\"\)"):
        make_task(tmp_path, tiny_bert, rows, rows)
    with pytest.raises(DataError, match=r"row 2: 'label' is read as a bool where row 1 is read as a int"):
        make_task(tmp_path, tiny_bert, [{"text": "good", "label": 1}, {"text": "bad", "label": "true"}], rows[:1])


def test_classification_max_seq_length_without_room_for_text_is_refused(tmp_path, tiny_bert):
    # At 3 a pair classifier read [CLS] [SEP] [SEP] alone (every input the same scores); at 1 or 2 the tokenizer
    # cut nothing while a warning said the texts were cut. Exit status 0 either way.
    rows = [{"text": "good", "text2": "fine", "label": "pos"}, {"text": "bad", "text2": "dull", "label": "neg"}]
    for length, texts, pair in ((4, "pair of texts", ["data.text_pair_column=text2"]), (2, "text", [])):
        with pytest.raises(ConfigError, match=rf"^data.max_seq_length={length} leaves no room for text: the tokenizer adds "
                                              rf"\d special token\(s\) to each {texts}; give at least {length + 1}"):
            make_task(tmp_path, tiny_bert, rows, rows, f"data.max_seq_length={length}", *pair)
    make_task(tmp_path, tiny_bert, rows, rows, "data.max_seq_length=5", "data.text_pair_column=text2")


def test_classification_regression_from_float_labels(tmp_path, tiny_bert):
    rows = [{"text": "a", "label": 0.5}, {"text": "b", "label": 4.0}, {"text": "c", "label": 2.5}]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows)
    assert task.problem_type == "regression"
    model = task.build_model(raw)
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    features = task.preprocess(raw["validation"], train=False)
    batch = task.collator(train=True)([features[i] for i in range(3)])
    assert batch["labels"].dtype == torch.float32
    assert model(**batch).loss.ndim == 0
    predictions = task.postprocess({"logits": np.array([[0.4], [3.9], [2.6]])}, features, raw["validation"])
    metrics = task.compute_metrics(predictions, raw["validation"])
    assert metrics["pearson"] > 0.99 and metrics["spearmanr"] == pytest.approx(1.0)
    assert metrics["mse"] == pytest.approx(np.mean([0.01, 0.01, 0.01]))


def test_classification_class_label_feature_gives_names(tmp_path, tiny_bert):
    task, _ = make_task(tmp_path, tiny_bert, [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}], [{"text": "a", "label": "x"}])
    data = Dataset.from_dict({"text": ["a", "b"], "label": [1, 0]},
                             features=Features({"text": Value("string"), "label": ClassLabel(names=["negative", "positive"])}))
    task.problem_type, _ = task._infer_problem_type(data, "train")
    assert task._infer_label_names(data) == ["negative", "positive"]
    multi = Dataset.from_dict({"text": ["a"], "label": [[0, 1]]},
                              features=Features({"text": Value("string"), "label": Sequence(ClassLabel(names=["u", "v"]))}))
    assert task._infer_problem_type(multi, "train") == ("multi_label", "split 'train' holds lists of labels (multi_label)")


def test_classification_tokenisation_is_cached(tmp_path, tiny_bert):
    rows = [{"text": f"sentence {i}", "label": "a" if i % 2 else "b"} for i in range(20)]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows[:5])
    first = task.preprocess(raw["train"], train=True)
    second = task.preprocess(raw["train"], train=True)
    assert first.cache_files and first.cache_files == second.cache_files


def test_classification_label_error_names_the_configured_train_split(tmp_path, tiny_bert):
    """The message names ``data.train_split`` as configured, not a literal "train"."""
    fit = write_jsonl(tmp_path / "fit.jsonl", [{"text": "a", "label": "x"}, {"text": "c", "label": "z"}])
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": "a", "label": "x"}])
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"task: classification\noutput_dir: {tmp_path / 'run'}\nmodel:\n  name_or_path: {tiny_bert}\n"
                           f"data:\n  files:\n    fit: {fit}\n    dev: {dev}\n  train_split: fit\n  eval_split: dev\n"
                           "classification:\n  label_names: [x, y]\n")
    task = ClassificationTask(load_config(config_path, [], lambda name: get_task(name).Options))
    raw = task.load()
    task.build_tokenizer(raw)
    with pytest.raises(DataError, match=r"split 'fit' \(data.files.fit: .*\), row 2 .*label 'z' is not in the label set"):
        task.preprocess(raw["fit"], train=True)


def test_classification_label_names_in_another_order_than_a_class_label_map_ids_by_name(tmp_path, tiny_bert):
    """classification.label_names in another order than a ClassLabel's names (e.g. GLUE MRPC's
    ``[not_equivalent, equivalent]``) maps every dataset id through its name, not by position."""
    rows = [{"text": "a", "label": "positive"}, {"text": "b", "label": "negative"}]
    task, _ = make_task(tmp_path, tiny_bert, rows, rows, "classification.label_names=[positive, negative]")
    names = ["negative", "positive"]
    single = Dataset.from_dict({"text": ["a", "b", "c"], "label": [0, 1, 0]},
                               features=Features({"text": Value("string"), "label": ClassLabel(names=names)}))
    assert task.preprocess(single, train=False)["labels"] == [1, 0, 1]  # negative is id 1 of the model

    task.problem_type = "multi_label"
    multi = Dataset.from_dict({"text": ["a", "b"], "label": [[0], [0, 1]]},
                              features=Features({"text": Value("string"), "label": Sequence(ClassLabel(names=names))}))
    assert task.preprocess(multi, train=False)["labels"] == [[0.0, 1.0], [1.0, 1.0]]


def test_classification_predict_inputs_with_gold_labels_outside_the_set_are_not_refused(tmp_path, tiny_bert):
    """An input file to predict may hold a label column (a test set with a class the run never saw,
    or unlabelled rows): predict does not read it, so it is no error (it named split 'validation')."""
    rows = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}]
    task, _ = make_task(tmp_path, tiny_bert, rows, rows)
    inputs = task.load_inputs(str(write_jsonl(tmp_path / "test.jsonl", [{"text": "fine", "label": "neutral"}, {"text": "meh", "label": None}])))
    features = task.preprocess(inputs, train=False, inputs=True)
    assert len(features) == 2 and "labels" not in features.column_names


def test_classification_training_rows_of_one_label_are_refused_naming_the_sample_limit(tmp_path, tiny_bert, caplog):
    """A file sorted by label, cut by data.max_train_samples: one class left would train a constant classifier."""
    rows = [{"text": f"bad film {i}", "label": "negative"} for i in range(6)] + [{"text": f"good film {i}", "label": "positive"} for i in range(6)]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows, "data.max_train_samples=4", "classification.label_names=[negative,positive]")
    with pytest.raises(DataError, match=r"split 'train' \(data.files.train: .*train.jsonl\): every training example has label "
                                        r"'negative'.*data.max_train_samples=4 keeps the split's first rows"):
        task.preprocess(raw["train"], train=True)
    task.preprocess(raw["validation"], train=False)  # an eval split of one label is fine

    three = [*rows, {"text": "fine film", "label": "neutral"}]
    task, raw = make_task(tmp_path, tiny_bert, three, three, "classification.label_names=[negative,neutral,positive]", "data.max_train_samples=8")
    with caplog.at_level("WARNING", logger="tasks.classification"):
        task.preprocess(raw["train"], train=True)
    assert "no examples of label(s) ['neutral']" in caplog.text


def test_classification_label_set_read_from_the_training_file_is_the_whole_files_not_the_cut_rows(tmp_path, tiny_bert, caplog):
    """Labels inferred from the rows data.max_train_samples kept: one label left made a one-way classifier that
    trained and scored 1.0 on an eval split of that label (exit 0); a lost label was named only by the eval split."""
    rows = [{"text": f"bad film {i}", "label": "negative"} for i in range(6)] + [{"text": f"good film {i}", "label": "positive"} for i in range(6)]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows[:3], "data.max_train_samples=4")
    assert task.label_names == ["negative", "positive"]
    with pytest.raises(DataError, match=r"every training example has label 'negative'.*data.max_train_samples=4 keeps"):
        task.preprocess(raw["train"], train=True)

    three = [*rows[:6], {"text": "fine film", "label": "neutral"}, *rows[6:]]
    task, raw = make_task(tmp_path, tiny_bert, three, three, "data.max_train_samples=7")
    assert task.label_names == ["negative", "neutral", "positive"]
    with caplog.at_level("WARNING", logger="tasks.classification"):
        task.preprocess(raw["train"], train=True)
    assert "no examples of label(s) ['positive']" in caplog.text
    assert task.preprocess(raw["validation"], train=False)["labels"][-1] == 2  # the eval split's positives are in the set


def test_classification_finished_runs_head_fixes_the_problem_type_of_the_eval_split(tmp_path, tiny_bert):
    """``bertpipe evaluate`` loads the run, then its eval split: labels 0/1 written as 0.0/1.0 must not turn a
    classifier's evaluation into regression (Pearson of the first logit, no error), nor whole-number similarity
    scores turn a regression run's into single-label classification (a TypeError with a traceback)."""
    def finished_run(name, rows):
        (tmp_path / name).mkdir()
        task, raw = make_task(tmp_path / name, tiny_bert, rows, rows)
        task.build_model(raw).save_pretrained(tmp_path / name / "run")
        task.tokenizer.save_pretrained(tmp_path / name / "run")
        return tmp_path / name / "run"

    def eval_features(run, rows):
        valid = write_jsonl(run.parent / "test.jsonl", rows)
        config = load_config(run.parent / "c.yaml", [f"data.files={{validation: {valid}}}"], lambda name: get_task(name).Options)
        task = ClassificationTask(config)
        task.build_tokenizer(None, model_path=str(run))
        task.build_model(None, model_path=str(run))
        return task, task.preprocess(task.load(include_train=False)["validation"], train=False)

    classifier = finished_run("classifier", [{"text": "good", "label": 1}, {"text": "bad", "label": 0}])
    task, features = eval_features(classifier, [{"text": "fine", "label": 1.0}, {"text": "awful", "label": 0.0}])
    assert task.problem_type == "single_label" and features["labels"] == [1, 0]
    metrics = task.compute_metrics(task.postprocess({"logits": np.array([[0.0, 2.0], [0.0, 1.0]])}, features, None), None)
    assert metrics["accuracy"] == 0.5 and "pearson" not in metrics

    regression = finished_run("regression", [{"text": "good", "label": 4.5}, {"text": "bad", "label": 0.5}])
    task, features = eval_features(regression, [{"text": "fine", "label": 4}, {"text": "awful", "label": 1}])
    assert task.problem_type == "regression" and features["labels"] == [4.0, 1.0]
    with pytest.raises(DataError, match=r"'validation' \(data.files.validation: .*\), row 2 \(rows count from 1\): label 'bad' is not a number"):
        eval_features(regression, [{"text": "fine", "label": "4"}, {"text": "awful", "label": "bad"}])


def test_classification_non_finite_labels_are_refused_naming_the_row(tmp_path, tiny_bert):
    """json reads NaN and Infinity: one NaN score trained every weight of a regression run to NaN, with exit status 0
    and metrics of null; a NaN among class labels became a class "nan"."""
    def labels(rows: list[dict], *overrides: str) -> list:
        task, raw = make_task(tmp_path, tiny_bert, rows, rows, *overrides)  # json.dumps writes NaN and Infinity
        return task.preprocess(raw["train"], train=True)["labels"]

    scores = [{"text": "good", "label": 4.5}, {"text": "bad", "label": 0.5}, {"text": "fine", "label": 2.0}]
    assert labels(scores) == [4.5, 0.5, 2.0]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(DataError, match=rf"row 3 \(rows count from 1\): label {bad!r} is not a finite number"):
            labels(scores[:2] + [{"text": "fine", "label": bad}])
    classes = [{"text": "good", "label": 1.0}, {"text": "bad", "label": float("nan")}, {"text": "fine", "label": 0.0}]
    with pytest.raises(DataError, match=r"row 2 \(rows count from 1\): label nan is not a finite number, nor a label"):
        labels(classes, "classification.problem_type=single_label")


def test_classification_a_label_that_differs_in_unicode_normalisation_alone_is_explained(tmp_path, tiny_bert):
    # "label 'café' is not in the label set ['café', 'neg']": two names that print alike, and no word on why.
    task, raw = make_task(tmp_path, tiny_bert, [{"text": "a", "label": "caf\u00e9"}, {"text": "b", "label": "neg"}],
                          [{"text": "c", "label": "cafe\u0301"}])
    expected = "label 'cafe\u0301' is not in the label set ['caf\u00e9', 'neg'] ('cafe\u0301' and 'caf\u00e9' differ only in Unicode normalisation"
    with pytest.raises(DataError, match=re.escape(expected)):
        task.preprocess(raw["validation"], train=False)


def test_classification_label_order_does_not_depend_on_the_order_labels_are_seen():
    """Label names are sorted from a set, whose order changes with each process's string-hash seed: ties
    ("1" and "01") or a "nan" label gave each process of a distributed run, and a resumed run, other label ids."""
    from itertools import permutations

    from tasks.classification import _natural_key

    names = ["10", "01", "nan", "2", "1", "b", "1.0", "a", "inf"]
    orders = {tuple(sorted(permuted, key=_natural_key)) for permuted in permutations(names[:6])}
    assert len(orders) == 1
    assert sorted(names, key=_natural_key) == sorted(names[::-1], key=_natural_key)
    assert sorted(names, key=_natural_key)[:5] == ["01", "1", "1.0", "2", "10"]


def test_classification_csv_texts_and_labels_are_read_as_written(tmp_path, tiny_bert):
    # pandas alone reads the intent label "None" as missing, a text column of numbers as numbers.
    train = tmp_path / "train.csv"
    train.write_text("text,label\n007,None\n1999,greet\nNA,None\n")
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"task: classification\noutput_dir: {tmp_path / 'run'}\nmodel:\n  name_or_path: {tiny_bert}\n"
                           f"data:\n  files:\n    train: {train}\n    validation: {train}\n")
    task = ClassificationTask(load_config(config_path, [], lambda name: get_task(name).Options))
    raw = task.load()
    assert raw["train"]["text"] == ["007", "1999", "NA"] and task.label_names == ["None", "greet"]
    inputs = tmp_path / "inputs.csv"
    inputs.write_text("text\n42\n")
    assert task.load_inputs(str(inputs))["text"] == ["42"]


def test_classification_regression_undefined_correlations_are_nan_with_one_warning_naming_the_split(tmp_path, tiny_bert, caplog):
    """A one-example eval split made scipy's pearsonr raise at the end of training (a traceback after the
    whole run); a split of one score gave two anonymous scipy warnings. Now: NaN and one warning."""
    import warnings

    rows = [{"text": "a", "label": 0.5}, {"text": "b", "label": 4.0}, {"text": "c", "label": 2.5}]
    for eval_rows, cause in [(rows[:1], "for 1 example"), ([{**row, "label": 3.0} for row in rows], "every reference score is 3")]:
        task, raw = make_task(tmp_path, tiny_bert, rows, eval_rows)
        features = task.preprocess(raw["validation"], train=False)
        logits = np.linspace(0.0, 1.0, len(eval_rows))[:, None]
        caplog.clear()
        with warnings.catch_warnings(), caplog.at_level("WARNING", logger="tasks.classification"):
            warnings.simplefilter("error")  # no scipy warning besides the task's own
            for _ in range(2):  # evaluated again at the next eval step: said once
                metrics = task.compute_metrics(task.postprocess({"logits": logits}, features, raw["validation"]), raw["validation"])
        assert np.isnan(metrics["pearson"]) and np.isnan(metrics["spearmanr"]) and np.isfinite(metrics["mse"])
        assert len(caplog.records) == 1, caplog.text
        assert "split 'validation' (data.files.validation: " in caplog.text and cause in caplog.text


def test_classification_texts_past_max_seq_length_are_cut_with_a_warning_naming_rows(tmp_path, tiny_bert, caplog):
    """Truncation to data.max_seq_length was silent in train, evaluate and predict."""
    long_text = "the story of the film " * 6
    rows = [{"text": "good", "label": "pos"}, {"text": long_text, "label": "neg"}, {"text": "bad", "label": "neg"},
            {"text": long_text + "again", "label": "pos"}]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows, "data.max_seq_length=12")
    reference = task.tokenizer(rows[1]["text"], truncation=True, max_length=12)["input_ids"]
    with caplog.at_level("WARNING", logger="tasks.classification"):
        features = task.preprocess(raw["train"], train=True)
    assert features.column_names == ["input_ids", "token_type_ids", "attention_mask", "labels"]
    assert features["input_ids"][1] == reference and features["input_ids"][0] == task.tokenizer("good")["input_ids"]
    assert len(caplog.records) == 1
    assert "split 'train': 2 of 4 text(s) (rows 2, 4, counting from 1) are longer than data.max_seq_length=12 tokens" in caplog.text

    caplog.clear()
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"text": "fine", "pair": long_text}])
    task, raw = make_task(tmp_path, tiny_bert, [{**row, "pair": "x"} for row in rows], [{**rows[0], "pair": "y"}],
                          "data.max_seq_length=12", "data.text_pair_column=pair")
    with caplog.at_level("WARNING", logger="tasks.classification"):
        features = task.preprocess(task.load_inputs(str(inputs)), train=False, inputs=True)
    assert len(features["input_ids"][0]) == 12
    assert f"--input {inputs}: 1 of 1 text pair(s) (rows 1, counting from 1) are longer than data.max_seq_length=12" in caplog.text


def test_classification_macro_averages_skip_a_class_absent_from_the_eval_split_and_never_predicted(tmp_path, tiny_bert):
    """A class trained on but absent from the eval split, and never predicted, has no precision or recall to
    average: counting it as 0 marked a perfect model down to 2/3 macro-F1 on a split without one of three labels
    (sklearn's and evaluate's macro averages, the ones users compare with, take the labels that occur)."""
    rows = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}, {"text": "meh", "label": "neutral"}]
    task, raw = make_task(tmp_path, tiny_bert, rows, rows[:2])
    features = task.preprocess(raw["validation"], train=False)
    pos, neg = task.label_names.index("pos"), task.label_names.index("neg")
    perfect = np.full((2, 3), -5.0)
    perfect[0, pos] = perfect[1, neg] = 5.0
    metrics = task.compute_metrics(task.postprocess({"logits": perfect}, features, raw["validation"]), raw["validation"])
    assert metrics["accuracy"] == 1.0
    assert metrics["f1_macro"] == metrics["precision_macro"] == metrics["recall_macro"] == 1.0

    # Predicting the absent class is a mistake, and scores as one.
    wrong = perfect.copy()
    wrong[1] = -5.0
    wrong[1, task.label_names.index("neutral")] = 5.0
    metrics = task.compute_metrics(task.postprocess({"logits": wrong}, features, raw["validation"]), raw["validation"])
    assert metrics["recall_macro"] == metrics["f1_macro"] == pytest.approx(1 / 3)


def _parquet_task(tmp_path, tiny_bert, train_table, eval_table):
    import pyarrow.parquet as pq

    pq.write_table(train_table, tmp_path / "train.parquet")
    pq.write_table(eval_table, tmp_path / "valid.parquet")
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"task: classification\noutput_dir: {tmp_path / 'run'}\nmodel:\n  name_or_path: {tiny_bert}\n"
                           f"data:\n  files:\n    train: {tmp_path / 'train.parquet'}\n    validation: {tmp_path / 'valid.parquet'}\n")
    task = ClassificationTask(load_config(config_path, [], lambda name: get_task(name).Options))
    raw = task.load()
    task.build_tokenizer(raw)
    return task, raw


def test_classification_large_list_labels_are_multi_label_as_lists_are(tmp_path, tiny_bert):
    """Polars writes list columns as Arrow large_list (datasets' LargeList, not a Sequence): read as one label per
    row, each combination became a class named "['x', 'y']" and the run trained with exit status 0."""
    import pyarrow as pa

    labels = [["x", "y"], ["z"], [], ["x"]]
    table = pa.table({"text": ["a", "b", "c", "d"], "label": pa.array(labels, pa.large_list(pa.string()))})
    task, raw = _parquet_task(tmp_path, tiny_bert, table, table)
    assert type(raw["train"].features["label"]).__name__ == "LargeList"
    assert task.problem_type == "multi_label" and task.label_names == ["x", "y", "z"]
    assert task.preprocess(raw["validation"], train=False)["labels"][:2] == [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


def test_classification_decimal_scores_are_regression(tmp_path, tiny_bert):
    """Parquet decimals (SQL and pandas-Decimal exports) were read as classes: one label per distinct score."""
    import decimal

    import pyarrow as pa

    scores = pa.array([decimal.Decimal(s) for s in ("0.5", "1.0", "4.5", "5.0")], pa.decimal128(2, 1))
    table = pa.table({"text": ["a", "b", "c", "d"], "label": scores})
    task, raw = _parquet_task(tmp_path, tiny_bert, table, table)
    assert task.problem_type == "regression"
    assert task.preprocess(raw["validation"], train=False)["labels"] == [0.5, 1.0, 4.5, 5.0]


def test_classification_multi_label_macro_averages_skip_a_label_absent_from_the_split_and_never_predicted(tmp_path, tiny_bert):
    """As for one label per row: sklearn's multi-label macro average took every column, so a perfect model on a
    split without one of three labels scored 2/3 macro F1, precision and recall."""
    train = [{"text": "good", "label": ["x", "y"]}, {"text": "bad", "label": ["z"]}, {"text": "ok", "label": ["x"]}]
    task, raw = make_task(tmp_path, tiny_bert, train, train[::2])
    features = task.preprocess(raw["validation"], train=False)
    references = np.asarray(features["labels"])
    perfect = np.where(references > 0, 5.0, -5.0)
    metrics = task.compute_metrics(task.postprocess({"logits": perfect}, features, raw["validation"]), raw["validation"])
    assert metrics["f1_macro"] == metrics["precision_macro"] == metrics["recall_macro"] == metrics["f1_micro"] == 1.0

    # Predicting the absent label is a mistake, and scores as one: z joins the averages with precision 0
    # (and recall 0, sklearn's value for a label without gold rows), as a class does for one label per row.
    wrong = perfect.copy()
    wrong[0, task.label_names.index("z")] = 5.0
    metrics = task.compute_metrics(task.postprocess({"logits": wrong}, features, raw["validation"]), raw["validation"])
    assert metrics["precision_macro"] == metrics["recall_macro"] == pytest.approx((1 + 1 + 0) / 3)


@pytest.mark.parametrize("family, saved_side, read_at", [("bert", "left", 0), ("xlnet", "right", -1), ("roberta", "left", 0)])
def test_classification_pads_after_the_token_the_head_reads_whatever_side_the_tokenizer_was_saved_with(
        family, saved_side, read_at, tmp_path):
    # BERT saved with padding_side=left: 7 of 8 training rows had [PAD] at position 0, the one BERT's pooler reads, and an
    # ONNX export (predicting in padded batches) flipped labels; XLNet saved with right padding, at the last position.
    import json

    from tests.families.builders import build_family

    checkpoint = build_family(family, tmp_path / "checkpoint")
    settings = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": saved_side}))
    rows = [{"text": " ".join(["good"] * (index % 5 + 1)), "label": "ab"[index % 2]} for index in range(8)]
    task, raw = make_task(tmp_path, checkpoint, rows, rows)
    features = task.preprocess(raw["train"], train=True)
    batch = task.collator(train=True)([features[index] for index in range(8)])
    read = batch["input_ids"][:, read_at].tolist()
    first = task.tokenizer("a")["input_ids"][read_at]  # [CLS], <s>, or XLNet's <cls> last
    assert set(read) == {first} and first != task.tokenizer.pad_token_id, task.tokenizer.convert_ids_to_tokens(read)
    task.tokenizer.save_pretrained(tmp_path / "saved")  # what the run folder, and so pipeline(), pads with
    assert json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())["padding_side"] == ("left" if read_at else "right")

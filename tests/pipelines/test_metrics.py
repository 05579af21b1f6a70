from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from pipelines.metrics import load_metric, local_metric_names


def test_metrics_local_modules_exist_for_classification():
    assert {"accuracy", "f1", "precision", "recall", "matthews_correlation", "pearsonr", "spearmanr"} <= set(local_metric_names())


def test_metrics_classification_modules_agree_with_sklearn():
    rng = np.random.default_rng(0)
    references, predictions = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    assert load_metric("accuracy").compute(predictions=predictions, references=references)["accuracy"] == pytest.approx(
        sk.accuracy_score(references, predictions)
    )
    for name, function in [("f1", sk.f1_score), ("precision", sk.precision_score), ("recall", sk.recall_score)]:
        for average in ("macro", "micro"):
            value = load_metric(name).compute(predictions=predictions, references=references, average=average)[name]
            assert value == pytest.approx(function(references, predictions, average=average))
    assert load_metric("matthews_correlation").compute(predictions=predictions, references=references)[
        "matthews_correlation"
    ] == pytest.approx(sk.matthews_corrcoef(references, predictions))


def test_metrics_hand_made_binary_values():
    result = load_metric("f1").compute(predictions=[1, 1, 0, 0], references=[1, 0, 1, 0])
    assert result["f1"] == pytest.approx(0.5)
    # The default is the positive class's F1 (every two-label run's eval_f1), not the macro average (0.7333 here).
    assert load_metric("f1").compute(predictions=[1, 1, 1, 0], references=[1, 0, 1, 0])["f1"] == pytest.approx(0.8)
    assert load_metric("accuracy").compute(predictions=[1, 1, 0, 1], references=[1, 0, 0, 1])["accuracy"] == 0.75


def test_metrics_correlations_agree_with_scipy():
    rng = np.random.default_rng(1)
    references = rng.normal(size=50)
    predictions = references + rng.normal(scale=0.5, size=50)
    assert load_metric("pearsonr").compute(predictions=predictions, references=references)["pearsonr"] == pytest.approx(
        stats.pearsonr(references, predictions).statistic
    )
    assert load_metric("spearmanr").compute(predictions=predictions, references=references)["spearmanr"] == pytest.approx(
        stats.spearmanr(references, predictions).statistic
    )


def _squad_references(gold: dict[str, list[str]]) -> list[dict]:
    return [{"id": qid, "answers": {"text": texts, "answer_start": [0] * len(texts)}} for qid, texts in gold.items()]


def test_metrics_squad_v1_f1_is_zero_for_answers_that_normalise_to_nothing():
    # evaluate-v1.1.py: "The" vs "the" is an exact match but shares no token after normalisation, so F1 0.
    predictions = [{"id": "1", "prediction_text": "the"}, {"id": "2", "prediction_text": "Paris"}]
    scores = load_metric("squad").compute(predictions=predictions, references=_squad_references({"1": ["The"], "2": ["Paris"]}))
    assert scores == pytest.approx({"exact_match": 100.0, "f1": 50.0})


def test_metrics_squad_v2_gold_text_normalising_to_nothing_is_has_answer():
    # evaluate-v2.0.py counts a question with any gold text as HasAns (bool(answers)), even "The".
    gold = {"q1": ["The"], "q2": [], "q3": ["Paris"]}
    predictions = {"q1": ("", 0.9), "q2": ("", 0.8), "q3": ("Paris", 0.1)}
    rows = [{"id": qid, "prediction_text": text, "no_answer_probability": na} for qid, (text, na) in predictions.items()]
    metric = load_metric("squad_v2")
    scores = metric.compute(predictions=rows, references=_squad_references(gold))
    assert (scores["HasAns_total"], scores["NoAns_total"]) == (2, 1)
    assert scores["HasAns_exact"] == scores["NoAns_exact"] == 100.0
    # Sweep: start at 1 (q2 abstains), answer q3 (+1), q2 (0), q1 (+1): 3/3 at threshold 0.9.
    assert (scores["best_exact"], scores["best_exact_thresh"]) == (pytest.approx(100.0), pytest.approx(0.9))
    # Abstaining on q1 (na 0.9 > 0.5) abstains on an answerable question: no credit.
    strict = metric.compute(predictions=rows, references=_squad_references(gold), no_answer_threshold=0.5)
    assert strict["exact"] == pytest.approx(200 / 3) and strict["HasAns_exact"] == pytest.approx(50.0)


@pytest.mark.parametrize("name", ["pearsonr", "spearmanr"])
def test_metrics_correlations_of_fewer_than_two_examples_are_nan_with_a_warning(name):
    # scipy: pearsonr raises ("length at least 2"), spearmanr gives NaN without a word; a constant input
    # gets NaN and a warning from both, the answer wanted for one example too.
    with pytest.warns(RuntimeWarning, match="needs 2 or more"):
        result = load_metric(name).compute(predictions=[0.5], references=[0.4], return_pvalue=True)
    assert np.isnan(result[name]) and np.isnan(result["p-value"])


def test_metrics_seqeval_without_entities_or_words_is_nan_with_one_warning():
    # An eval split with no entity scored F1 0.0 (a perfect all-O model read as a useless one, and a tie
    # that kept the first evaluation as the best model) under six numpy warnings; no words raised.
    import warnings

    seqeval = load_metric("seqeval")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = seqeval.compute(predictions=[["O", "O"], ["O"]], references=[["O", "O"], ["O"]])
    assert [str(w.message) for w in caught] == [
        "seqeval: no entities in the references or the predictions; entity precision, recall and F1 are undefined and NaN"
    ]
    assert all(np.isnan(result[f"overall_{name}"]) for name in ("precision", "recall", "f1")) and result["overall_accuracy"] == 1.0
    # Predicted entities and no gold ones: precision and F1 are 0 by definition, recall 0/0 -> zero_division.
    assert seqeval.compute(predictions=[["B-PER", "O"]], references=[["O", "O"]])["overall_f1"] == 0.0
    for empty in ([], [[]]):
        with pytest.warns(RuntimeWarning, match="no words to score"):
            result = seqeval.compute(predictions=empty, references=empty)
        assert all(np.isnan(value) for value in result.values())


@pytest.mark.parametrize("name", ["sacrebleu", "chrf"])
def test_metrics_translation_scores_of_no_segments_are_nan_with_a_warning(name):
    # sacreBLEU's corpus_score([], []) fails with an IndexError from inside sacreBLEU.
    with pytest.warns(RuntimeWarning, match="no segments to score"):
        result = load_metric(name).compute(predictions=[], references=[])
    assert np.isnan(result["score"])

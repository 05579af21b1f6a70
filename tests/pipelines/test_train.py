"""train()'s named steps that can be checked without training: best-model tracking and early stopping."""

from __future__ import annotations

import pytest
import torch

from pipelines.checkpoint import TrainerState
from pipelines.config import ConfigError
from pipelines.config_loading import load_config
from pipelines.train import BEST_MODEL_DIR, BestModel
from tasks import get_task


class ScoredTask:
    """What BestModel reads of a task: the metrics it reports and their directions."""

    name = "scored"
    higher_is_better = {"loss": False}

    def metric_names(self):
        return ("loss", "accuracy", "pearson")


def best_model(tmp_path, *overrides, task=None):
    config = load_config(None, ["train.eval_steps=1", *overrides],
                         base={"task": "classification", "output_dir": str(tmp_path / "run"), "data": {"path": "x"}})
    return BestModel.from_config(config, task or ScoredTask())


def test_train_best_model_refuses_a_metric_the_task_does_not_report_before_training(tmp_path):
    """Named only at the first evaluation, after eval_steps of training, in a run folder the corrected command refused."""
    with pytest.raises(ConfigError, match=r"^train.metric_for_best_model='eval_f1' is not a metric the scored task reports with "
                                          r"these settings; it reports eval_loss, eval_accuracy, eval_pearson$"):
        best_model(tmp_path, "train.metric_for_best_model=eval_f1")
    with pytest.raises(ConfigError, match="'accuracy' is not a metric"):
        best_model(tmp_path, "train.metric_for_best_model=accuracy")  # metrics.json's name is eval_accuracy
    options_for = lambda name: get_task(name).Options  # noqa: E731
    config = load_config(None, ["train.eval_steps=1", "train.metric_for_best_model=eval_loss"], options_for,
                         base={"task": "mlm", "output_dir": str(tmp_path / "mlm"), "data": {"path": "x"}})
    assert BestModel.from_config(config, get_task("mlm")(config)).greater_is_better is False
    config = load_config(None, ["train.eval_steps=1", "train.metric_for_best_model=eval_loss"], options_for,
                         base={"task": "qa", "output_dir": str(tmp_path / "qa"), "data": {"path": "x"}})
    with pytest.raises(ConfigError, match="it reports eval_exact_match, eval_f1$"):
        BestModel.from_config(config, get_task("qa")(config))


def test_train_best_model_saves_each_new_best_and_stops_when_patience_runs_out(tmp_path):
    best = best_model(tmp_path, "train.metric_for_best_model=eval_loss", "train.load_best_model_at_end=true",
                      "train.early_stopping_patience=2")
    assert best.greater_is_better is False and best.folder == tmp_path / "run" / BEST_MODEL_DIR  # the task's direction
    state, saved, stops = TrainerState(), [], []
    for step, loss in enumerate([1.0, 0.8, 0.9, 0.85], start=1):
        state.global_step = step
        stops.append(best.update({"eval_loss": loss}, state, save=lambda folder: saved.append((state.global_step, folder))))
    assert stops == [False, False, False, True]
    assert (state.best_metric, state.best_step, state.evaluations_without_improvement) == (0.8, 2, 2)
    assert saved == [(1, best.folder), (2, best.folder)]


def test_train_best_model_without_reload_saves_nothing_and_names_a_missing_metric(tmp_path):
    best = best_model(tmp_path, "train.metric_for_best_model=eval_accuracy")
    assert best.greater_is_better and best.folder is None and best.patience is None
    state = TrainerState()
    assert not best.update({"eval_accuracy": 0.5}, state, save=pytest.fail)
    with pytest.raises(ConfigError, match="eval_accuracy.*not among the eval metrics"):
        best.update({"eval_f1": 0.5}, state, save=pytest.fail)


def test_train_best_model_is_never_a_nan_evaluation(tmp_path):
    # Pearson of a regression model predicting a constant is NaN; NaN loses every comparison, so a first
    # NaN evaluation stayed the best model and was reloaded at the end.
    best = best_model(tmp_path, "train.metric_for_best_model=eval_pearson", "train.load_best_model_at_end=true")
    state, saved = TrainerState(), []
    for step, value in enumerate([float("nan"), 0.2, float("nan"), 0.1], start=1):
        state.global_step = step
        best.update({"eval_pearson": value}, state, save=lambda folder: saved.append(state.global_step))
    assert (state.best_metric, state.best_step, saved) == (0.2, 2, [2])


@pytest.mark.parametrize("scores, reloaded, final", [
    # The last model the best: it was never compared, and an earlier, worse best replaced it (0.6 kept, 0.9 lost).
    ([0.5, 0.6, 0.9], False, 0.9),
    # An earlier best: reloaded and evaluated for its own predictions; the last model's score is in the log, at its step.
    ([0.5, 0.9, 0.6, 0.9], True, 0.9),
])
def test_train_best_model_at_end_counts_the_last_model_among_the_candidates(tmp_path, tiny_bert, sentiment_files, monkeypatch,
                                                                            scores, reloaded, final):
    import json

    from pipelines import train as train_module
    from pipelines.cli import load_run_config
    from tests.conftest import classification_config

    evaluations, reloads = _scripted_accuracy(monkeypatch, train_module, scores)
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=6, eval_steps=2,
                                                                 mixed_precision="no", logging_steps=2)),
                             ["train.metric_for_best_model=eval_accuracy", "train.load_best_model_at_end=true"])
    metrics = train_module.train(config, get_task(config.task)(config))
    assert len(evaluations) == len(scores) and len(reloads) == reloaded
    assert metrics["eval_accuracy"] == final and metrics["best_metric"] == final and metrics["best_step"] == (4 if reloaded else 6)
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [(record["step"], record["eval_accuracy"]) for record in logged if "eval_accuracy" in record] == list(zip([2, 4, 6], scores))


@pytest.mark.parametrize("load_best", [False, True])
def test_train_early_stopping_evaluates_and_logs_the_stopping_step_once(tmp_path, tiny_bert, sentiment_files, monkeypatch, load_best):
    import json

    from pipelines import train as train_module
    from pipelines.cli import load_run_config
    from tests.conftest import classification_config

    evaluations, reloads = _scripted_accuracy(monkeypatch, train_module, [0.5, 0.4, 0.5])
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=20, eval_steps=2,
                                                                 mixed_precision="no", logging_steps=2)),
                             ["train.metric_for_best_model=eval_accuracy", "train.early_stopping_patience=1",
                              f"train.load_best_model_at_end={str(load_best).lower()}"])
    metrics = train_module.train(config, get_task(config.task)(config))
    # Stopped at step 4's evaluation, which is the last model's final one; the best (step 2) is evaluated again only to
    # be the saved model's own numbers, and logged once, at its step.
    assert metrics["global_step"] == 4 and len(evaluations) == (3 if load_best else 2) and len(reloads) == load_best
    assert metrics["eval_accuracy"] == (0.5 if load_best else 0.4) and metrics["best_step"] == 2
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [(record["step"], record["eval_accuracy"]) for record in logged if "eval_accuracy" in record] == [(2, 0.5), (4, 0.4)]


def _scripted_accuracy(monkeypatch, train_module, scores: list[float]) -> tuple[list[float], list]:
    """The loop's evaluations score ``scores`` in turn; each evaluation and each reload of the best model is recorded."""
    evaluations, reloads = [], []
    real_evaluate, real_reload = train_module.evaluate, train_module._load_best_model

    def scripted(accelerator, model, *args, **kwargs):
        predictions, metrics = real_evaluate(accelerator, model, *args, **kwargs)
        evaluations.append(scores[len(evaluations)])
        return predictions, {**metrics, "eval_accuracy": evaluations[-1]}

    monkeypatch.setattr(train_module, "evaluate", scripted)
    monkeypatch.setattr(train_module, "_load_best_model", lambda model, folder: reloads.append(folder) or real_reload(model, folder))
    return evaluations, reloads


def test_train_on_the_cpu_draws_every_dropout_mask_with_cheap_masks(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """The swaps happen in the loop (pipelines/dropout.py): each training forward of the tiny BERT draws
    one mask per nn.Dropout it runs (embeddings, 2 per layer, classifier) and one per layer's attention
    ([batch, heads, queries, keys]; the last layer's one query, pipelines/first_position.py), and
    evaluation draws none."""
    from transformers import AutoConfig

    from pipelines import dropout
    from pipelines.cli import load_run_config
    from pipelines.train import train
    from tests.conftest import classification_config

    drawn = []
    original = dropout.keep_mask
    monkeypatch.setattr(dropout, "keep_mask", lambda shape, p: drawn.append(tuple(shape)) or original(shape, p))
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=3, eval_steps=2,
                                                                 mixed_precision="no")), [])
    metrics = train(config, get_task(config.task)(config))
    bert = AutoConfig.from_pretrained(tiny_bert)
    assert bert.attention_probs_dropout_prob > 0 and bert.hidden_dropout_prob > 0
    per_forward = 1 + 2 * bert.num_hidden_layers + 1 + bert.num_hidden_layers
    assert metrics["global_step"] == 3
    assert len(drawn) == 3 * per_forward, drawn
    attention = [shape for shape in drawn if len(shape) == 4]
    assert len(attention) == 3 * bert.num_hidden_layers
    assert all(shape[1] == bert.num_attention_heads and shape[3] >= shape[2] for shape in attention), attention
    assert sum(shape[2] == 1 for shape in attention) == 3  # the last layer's query at position 0 alone


@pytest.mark.parametrize("max_grad_norm", [0.5, None])
def test_train_clips_every_update_with_max_grad_norm(tmp_path, tiny_bert, sentiment_files, monkeypatch, max_grad_norm):
    """Adam divides by the gradients' own scale, so clipping barely shows in the weights: the calls are counted."""
    from pipelines import train as train_module
    from pipelines.cli import load_run_config
    from tests.conftest import classification_config

    clipped = []
    original = train_module.clip_gradients
    monkeypatch.setattr(train_module, "clip_gradients", lambda accelerator, parameters, max_norm: clipped.append(max_norm)
                        or original(accelerator, parameters, max_norm))
    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=3, eval_steps=None,
                                                                 mixed_precision="no")),
                             [f"train.max_grad_norm={'null' if max_grad_norm is None else max_grad_norm}"])
    metrics = train_module.train(config, get_task(config.task)(config))
    assert metrics["global_step"] == 3
    assert clipped == ([] if max_grad_norm is None else [max_grad_norm] * 3)


def test_train_with_frozen_input_embeddings_saves_them_as_loaded_and_trains_the_rest(tmp_path, tiny_bert, sentiment_files):
    from safetensors.torch import load_file

    from pipelines.cli import load_run_config
    from pipelines.train import train
    from tests.conftest import classification_config

    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=4, eval_steps=None,
                                                                 mixed_precision="no")), ["model.freeze_input_embeddings=true"])
    metrics = train(config, get_task(config.task)(config))
    loaded, trained = load_file(tiny_bert / "model.safetensors"), load_file(tmp_path / "run" / "model.safetensors")
    words = "bert.embeddings.word_embeddings.weight"
    key = next(name for name in loaded if name.endswith("embeddings.word_embeddings.weight"))
    assert torch.equal(trained[words], loaded[key])
    positions = next(name for name in loaded if name.endswith("embeddings.position_embeddings.weight"))
    assert not torch.equal(trained["bert.embeddings.position_embeddings.weight"], loaded[positions])
    assert metrics["trainable_params"] == metrics["total_params"] - loaded[key].numel()


def test_train_with_frozen_input_embeddings_refuses_a_model_from_scratch_before_writing(tmp_path, tiny_bert, sentiment_files):
    from pipelines.cli import load_run_config
    from pipelines.train import _check_run_settings, train
    from tests.conftest import REPO_ROOT, classification_config

    config = load_run_config(get_task, str(classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=2)),
                             ["model.name_or_path=null", f"model.tokenizer_name_or_path={tiny_bert}", "model.freeze_input_embeddings=true"])
    with pytest.raises(ConfigError, match=r"model\.freeze_input_embeddings: the model starts from scratch"):
        train(config, get_task(config.task)(config))
    assert not (tmp_path / "run").exists()
    # A task that loads its model through an option of its own (translation's encoder) starts from trained embeddings.
    config = load_run_config(get_task, str(REPO_ROOT / "configs" / "translation" / "multi30k_de_en.yaml"),
                             [f"output_dir={tmp_path / 'translation'}", "model.name_or_path=null",
                              f"translation.encoder_name_or_path={tiny_bert}", "model.freeze_input_embeddings=true"])
    assert _check_run_settings(config, get_task(config.task)(config), "no") == (False, None)

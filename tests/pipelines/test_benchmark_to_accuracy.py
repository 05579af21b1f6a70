"""Time to accuracy: the target, the first evaluation that reaches it, and the table."""

from __future__ import annotations

import pytest

from pipelines.benchmark.to_accuracy import first_reaching, format_to_accuracy, mean_curve, shipped_config_tree, summarize_to_accuracy
from pipelines.config_loading import load_config
from tests.conftest import classification_config

CURVE = [{"seconds": 10.0, "step": 50, "metric": 0.70}, {"seconds": 20.0, "step": 100, "metric": 0.84},
         {"seconds": 30.0, "step": 150, "metric": 0.82}, {"seconds": 35.0, "step": 160, "metric": 0.86}]


def test_first_reaching_is_the_first_evaluation_at_or_beyond_the_target():
    assert first_reaching(CURVE, 0.84)["seconds"] == 20.0
    assert first_reaching(CURVE, 0.85)["step"] == 160
    assert first_reaching(CURVE, 0.90) is None
    # A loss: lower is better, so 0.82 is reached first at 0.70.
    assert first_reaching(CURVE, 0.75, greater_is_better=False)["seconds"] == 10.0


def _reference(seed: int, seconds: float, accuracy: float) -> dict:
    return {"setting": "trainer_default", "seed": seed, "wall_time": seconds, "metrics": {"accuracy": accuracy}}


def test_summary_targets_the_mean_reference_metric_and_times_every_seed():
    references = [_reference(1, 100.0, 0.83), _reference(2, 110.0, 0.85)]
    curves = [{"seed": 1, "curve": CURVE}, {"seed": 2, "curve": [*CURVE[:1], {"seconds": 40.0, "step": 120, "metric": 0.9}]}]
    summary = summarize_to_accuracy(references, curves, metric="accuracy")
    assert summary["target"] == pytest.approx(0.84)
    assert [row["seconds"] for row in summary["bertpipe"]] == [20.0, 40.0]
    assert summary["bertpipe_seconds"] == pytest.approx(30.0) and summary["reference_seconds"] == pytest.approx(105.0)
    assert summary["speedup"] == pytest.approx(3.5)
    table = format_to_accuracy(summary, {"config": "c.yaml", "precision": "fp32", "load_average": {"start": (0, 0, 0), "end": (0, 0, 0)}})
    assert "**3.50x** sooner" in table and "| 1 | 100.0 | 0.8300 | 20.0 | 100 | 0.8400 | 0.8600 (35.0) |" in table


def test_a_seed_that_never_reaches_the_target_gives_no_mean_and_says_so():
    summary = summarize_to_accuracy([_reference(1, 100.0, 0.95)], [{"seed": 1, "curve": CURVE}], metric="accuracy")
    assert summary["bertpipe"][0]["seconds"] is None and summary["bertpipe_seconds"] is None and summary["speedup"] is None
    table = format_to_accuracy(summary, {"config": "c.yaml", "precision": "fp32", "load_average": {"start": (0, 0, 0), "end": (0, 0, 0)}})
    assert "not reached" in table and "did not reach 0.9500" in table and "never reaches 0.9500" in table


def test_the_mean_curve_reaches_a_target_that_not_every_seed_reaches():
    """Seed 1 ends below the target and seed 2 above: the seed-mean curve still compares like with like."""
    low = [{"seconds": 10.0, "step": 100, "metric": 0.80}, {"seconds": 20.0, "step": 200, "metric": 0.83}]
    high = [{"seconds": 12.0, "step": 100, "metric": 0.84}, {"seconds": 22.0, "step": 200, "metric": 0.87}]
    curves = [{"seed": 1, "curve": low}, {"seed": 2, "curve": high}]
    assert mean_curve(curves) == [{"step": 100, "seconds": 11.0, "metric": pytest.approx(0.82)},
                                  {"step": 200, "seconds": 21.0, "metric": pytest.approx(0.85)}]
    summary = summarize_to_accuracy([_reference(1, 84.0, 0.84), _reference(2, 84.0, 0.84)], curves, metric="accuracy")
    assert summary["bertpipe_seconds"] is None  # seed 1 never gets there
    assert summary["mean_curve_point"]["step"] == 200 and summary["mean_curve_speedup"] == pytest.approx(4.0)
    # Seeds that evaluated at different steps cannot be averaged point by point.
    assert mean_curve([{"seed": 1, "curve": low}, {"seed": 2, "curve": high[:1]}]) == []


def test_shipped_config_keeps_its_evaluation_schedule_but_no_trackers(tmp_path, tiny_bert, sentiment_files):
    from tasks import get_task

    path = classification_config(tmp_path, tiny_bert, sentiment_files, eval_steps=3, save_steps=6)
    config = load_config(path, ["train.report_to=[tensorboard]"], lambda name: get_task(name).Options)
    tree = shipped_config_tree(config)
    assert tree["train"]["eval_steps"] == 3 and tree["train"]["save_steps"] == 6
    assert tree["train"]["report_to"] == [] and tree["overwrite"] is True


def test_to_accuracy_seeds_stopped_at_different_steps_are_not_reported_as_never_reaching():
    """Early stopping ends seeds at different steps: no mean curve exists, which is not a mean that misses the target."""
    stopped_early = [*CURVE[:2], {**CURVE[1], "seconds": 21.0}]  # stopped at step 100, then the final evaluation
    curves = [{"seed": 1, "curve": CURVE}, {"seed": 2, "curve": stopped_early}]
    summary = summarize_to_accuracy([_reference(1, 100.0, 0.84), _reference(2, 100.0, 0.84)], curves, metric="accuracy")
    assert [row["seconds"] for row in summary["bertpipe"]] == [20.0, 20.0] and summary["mean_curve_point"] is None
    table = format_to_accuracy(summary, {"config": "c.yaml", "precision": "fp32", "load_average": {"start": (0, 0, 0), "end": (0, 0, 0)}})
    assert "never reaches" not in table and "the seeds evaluated at different steps" in table
    assert "**5.00x** sooner" in table  # every seed reached it: the per-seed comparison stands


def test_to_accuracy_times_the_final_point_when_its_evaluation_ends_not_after_the_run_is_written(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """The scheduled evaluations were timed as they ended, the final one after train() returned: saving the model, the
    card and the plot counted too (45% of a small run's last point), exactly when a target falls at the last step."""
    import time

    from pipelines import train as train_module
    from pipelines.benchmark.runner import RunSpec
    from pipelines.benchmark.to_accuracy import run_bertpipe_curve
    from tasks import get_task

    path = classification_config(tmp_path, tiny_bert, sentiment_files, max_steps=4, eval_steps=2, mixed_precision="no")
    config = load_config(path, [], lambda name: get_task(name).Options)
    finish = train_module._finish_run
    monkeypatch.setattr(train_module, "_finish_run", lambda *args, **kwargs: (time.sleep(1.5), finish(*args, **kwargs))[1])
    spec = RunSpec(setting="bertpipe", seed=1, tree=shipped_config_tree(config), output_dir=str(tmp_path / "curve"))
    curve = run_bertpipe_curve(spec, get_task, "accuracy")["curve"]
    assert [point["step"] for point in curve] == [2, 4]
    assert curve[1]["seconds"] - curve[0]["seconds"] < 1.5, curve  # the 1.5 s of writing is not in it

"""scripts/where_time_goes.py: py-spy stacks of bertpipe's loop and of the Trainer land in the same phases."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO_ROOT

spec = importlib.util.spec_from_file_location("where_time_goes", REPO_ROOT / "scripts" / "where_time_goes.py")
where_time_goes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(where_time_goes)

LOOP = "<module> (bertpipe:8);main (tasks/cli.py:20);train (pipelines/train.py:300)"
TRAINER = "<module> (bertpipe:8);_run_trainer (pipelines/benchmark.py:290);train (transformers/trainer.py:1200)"


def test_phases_of_bertpipe_and_trainer_stacks():
    cases = {
        f"{LOOP};backward (accelerate/accelerator.py:2700);backward (torch/_tensor.py:625)": "backward",
        f"{LOOP};step (accelerate/optimizer.py:170);wrapper (torch/optim/optimizer.py:500)": "optimizer",
        f"{LOOP};__iter__ (accelerate/data_loader.py:560);__next__ (torch/utils/data/dataloader.py:730)": "data",
        f"{LOOP};_call_impl (torch/nn/modules/module.py:1780);forward (transformers/models/bert/modeling_bert.py:900)": "forward",
        f"{LOOP};evaluate (pipelines/evaluation.py:80);_call_impl (torch/nn/modules/module.py:1780)": "eval",
        f"{TRAINER};training_step (transformers/trainer.py:3900);backward (accelerate/accelerator.py:2700)": "backward",
        f"{TRAINER};compute_loss (transformers/trainer.py:3950);_call_impl (torch/nn/modules/module.py:1780)": "forward",
        f"{TRAINER};__call__ (transformers/data/data_collator.py:270)": "data",
        "<module> (bertpipe:8);_run_trainer (pipelines/benchmark.py:290);predict (transformers/trainer.py:4300)": "eval",
        "<module> (bertpipe:8);from_pretrained (transformers/modeling_utils.py:4000)": "setup",
        "<module> (bertpipe:8);run_benchmark (pipelines/benchmark.py:470);measure_matmul_peak (pipelines/benchmark.py:101)": "harness",
        "<module> (bertpipe:8);_find_and_load (<frozen importlib._bootstrap>:1176)": "imports",
        "_bootstrap_inner (threading.py:1045);run (tqdm/_monitor.py:60);TMonitor.run (tqdm/_monitor.py:60);Event.wait (threading.py:629)": "waiting",
        "<module> (bertpipe:8);main (tasks/cli.py:12)": "other",
        # bertpipe's own clip, which landed in "other" while the Trainer's (Accelerate's) counted as optimizer
        f"{LOOP};clip_gradients (pipelines/optim.py:160);_gradient_norm (pipelines/optim.py:190)": "optimizer",
        f"{LOOP};clip_gradients (pipelines/optim.py:160);_clip_grads_with_norm_ (torch/nn/utils/clip_grad.py:170)": "optimizer",
        f"{TRAINER};clip_grad_norm_ (accelerate/accelerator.py:2800)": "optimizer",
        # the parent's cache fill, under the name the function has now
        "<module> (bertpipe:8);run_benchmark (pipelines/benchmark/runner.py:190);prepare_job (pipelines/benchmark/runner.py:160)": "harness",
    }
    for stack, phase in cases.items():
        assert where_time_goes.phase_of(stack) == phase, stack


def test_table_reports_shares_and_seconds(tmp_path):
    profile = tmp_path / "run.txt"
    profile.write_text(
        f"{LOOP};backward (torch/_tensor.py:625) 60\n"
        f"{LOOP};_call_impl (torch/nn/modules/module.py:1780) 30\n"
        f"{LOOP};wrapper (torch/optim/optimizer.py:500) 10\n"
    )
    text = where_time_goes.table({"run": where_time_goes.read_profile(profile)}, rate=10.0)
    assert "| backward | 60.0% (6.0 s) |" in text
    assert "| forward | 30.0% (3.0 s) |" in text
    assert "| optimizer | 10.0% (1.0 s) |" in text
    assert "| total sampled | 10.0 s |" in text

from __future__ import annotations

import pytest
import torch

from pipelines.config import TrainConfig
from pipelines.optim import build_optimizer, build_scheduler, plan_steps


def test_optim_updates_per_epoch_round_up_partial_accumulation():
    plan = plan_steps(TrainConfig(num_epochs=3, gradient_accumulation_steps=4), batches_per_epoch=10)
    assert plan.updates_per_epoch == 3  # 4 + 4 + 2 batches
    assert plan.total_updates == 9 and plan.num_epochs == 3


def test_optim_max_steps_overrides_epochs():
    plan = plan_steps(TrainConfig(num_epochs=1, max_steps=25), batches_per_epoch=10)
    assert plan.total_updates == 25 and plan.num_epochs == 3


def test_optim_fractional_epochs_and_warmup_fraction():
    plan = plan_steps(TrainConfig(num_epochs=0.5, warmup_fraction=0.1), batches_per_epoch=40)
    assert plan.total_updates == 20 and plan.num_epochs == 1 and plan.warmup_updates == 2
    assert plan_steps(TrainConfig(warmup_steps=500, max_steps=10), 5).warmup_updates == 10


def test_optim_an_epoch_ends_with_a_partial_accumulation():
    # 10 batches at 4 per update: updates after batches 4, 8 and the epoch's last (2 batches).
    plan = plan_steps(TrainConfig(num_epochs=2, gradient_accumulation_steps=4), batches_per_epoch=10)
    assert (plan.updates_per_epoch, plan.total_updates, plan.num_epochs) == (3, 6, 2)


def test_optim_schedule_reaches_zero_at_the_last_update_for_any_world_size():
    for num_processes in (1, 2, 4):
        model = torch.nn.Linear(2, 2)
        train = TrainConfig(max_steps=10, warmup_steps=2, learning_rate=1.0)
        optimizer = build_optimizer(model, train)
        plan = plan_steps(train, 100)
        scheduler = build_scheduler(optimizer, train, plan, num_processes)
        rates = []
        for _ in range(plan.total_updates):
            for _ in range(num_processes):  # a prepared scheduler steps once per process
                scheduler.step()
            rates.append(scheduler.get_last_lr()[0])
        assert rates[0] == pytest.approx(0.5) and rates[1] == pytest.approx(1.0)
        assert rates[-1] == pytest.approx(0.0)


def test_optim_no_weight_decay_on_bias_and_norm():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    optimizer = build_optimizer(model, TrainConfig(weight_decay=0.1))
    decayed, undecayed = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and len(decayed["params"]) == 1
    assert undecayed["weight_decay"] == 0.0 and len(undecayed["params"]) == 3


def test_optim_loss_items_are_labelled_positions_of_per_token_labels_else_examples():
    from pipelines.optim import loss_items

    per_token = torch.tensor([[-100, 3, 4, -100], [-100, 1, -100, -100]])
    assert int(loss_items({"input_ids": torch.zeros(2, 4), "labels": per_token})) == 3  # NER, masked-LM, translation
    assert loss_items({"input_ids": torch.zeros(5, 4), "labels": torch.tensor([0, 1, 1, 0, 2])}) == 5  # classes
    assert loss_items({"input_ids": torch.zeros(2, 4), "labels": torch.rand(2, 3)}) == 2  # multi-label targets
    assert loss_items({"input_ids": torch.zeros(3, 4), "start_positions": torch.zeros(3), "end_positions": torch.zeros(3)}) == 3  # QA

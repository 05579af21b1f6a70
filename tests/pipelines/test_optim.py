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


def test_optim_warmup_fraction_rounds_up_as_the_trainer_does():
    # 0.1 of 18 updates is 1.8: two warmup updates (a short warmup rounded down would become none at all).
    assert plan_steps(TrainConfig(max_steps=18, warmup_fraction=0.1), batches_per_epoch=5).warmup_updates == 2
    assert plan_steps(TrainConfig(max_steps=5, warmup_fraction=0.01), batches_per_epoch=5).warmup_updates == 1


def test_optim_adamw_takes_the_configs_betas_epsilon_and_learning_rate():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    train = TrainConfig(adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-7, learning_rate=0.01)
    for group in build_optimizer(model, train).param_groups:
        assert (group["betas"], group["eps"], group["lr"]) == ((0.8, 0.95), 1e-7, 0.01)


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


def test_optim_no_weight_decay_on_relative_position_biases_that_are_matrices():
    # As the Trainer decides by name: XLNet's r_w_bias and MPNet's relative_attention_bias.weight are 2-D, and
    # the dimension alone decayed them.
    from transformers import MPNetConfig, MPNetForSequenceClassification, XLNetConfig, XLNetForSequenceClassification

    for model, biases in (
        (XLNetForSequenceClassification(XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32)),
         {"transformer.layer.0.rel_attn.r_w_bias", "transformer.layer.0.rel_attn.r_r_bias", "transformer.layer.0.rel_attn.r_s_bias"}),
        (MPNetForSequenceClassification(MPNetConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                    intermediate_size=32)), {"mpnet.encoder.relative_attention_bias.weight"}),
    ):
        names = {id(parameter): name for name, parameter in model.named_parameters()}
        decayed, undecayed = build_optimizer(model, TrainConfig(weight_decay=0.1)).param_groups
        assert biases <= {names[id(p)] for p in undecayed["params"]}
        assert not any("bias" in names[id(p)] or "norm" in names[id(p)].lower() for p in decayed["params"])
        assert any("word_embedding" in names[id(p)] for p in decayed["params"])  # matrices are still decayed


def test_optim_loss_items_are_labelled_positions_of_per_token_labels_else_examples():
    from pipelines.optim import loss_items

    per_token = torch.tensor([[-100, 3, 4, -100], [-100, 1, -100, -100]])
    assert int(loss_items({"input_ids": torch.zeros(2, 4), "labels": per_token})) == 3  # NER, masked-LM, translation
    assert loss_items({"input_ids": torch.zeros(5, 4), "labels": torch.tensor([0, 1, 1, 0, 2])}) == 5  # classes
    assert loss_items({"input_ids": torch.zeros(2, 4), "labels": torch.rand(2, 3)}) == 2  # multi-label targets
    assert loss_items({"input_ids": torch.zeros(3, 4), "start_positions": torch.zeros(3), "end_positions": torch.zeros(3)}) == 3  # QA


class _Accelerator:
    """What clip_gradients reads of an Accelerator; Accelerate's own clip records that it was handed the call."""

    def __init__(self, distributed_type):
        self.distributed_type, self.delegated = distributed_type, []

    def unscale_gradients(self):
        pass

    def clip_grad_norm_(self, parameters, max_norm):
        self.delegated.append((len(list(parameters)), max_norm))
        return torch.tensor(-1.0)


def _parameters_with_gradients(seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(30522, 384), (384,), (2, 384), (1536, 384)]  # MiniLM's word embedding, a bias, token types, a feed-forward
    parameters = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
    for parameter in parameters:
        parameter.grad = torch.randn(parameter.shape, generator=generator) * scale
    return parameters


def test_clip_gradients_takes_the_norm_to_float64_accuracy_and_rescales_as_torch_does():
    """One float32 sum over the 11.7M squares of an embedding-sized gradient is off by ~5e-4 (torch 2.13 on the
    CPU); the norm of the rows' norms is within 1e-6 of float64. The rescale is torch's, from that norm."""
    from accelerate.utils import DistributedType

    from pipelines.optim import clip_gradients

    parameters = _parameters_with_gradients()
    before = [parameter.grad.clone() for parameter in parameters]
    reference = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in before]))
    accelerator = _Accelerator(DistributedType.NO)
    total = clip_gradients(accelerator, iter(parameters), max_norm=1.0)
    assert accelerator.delegated == [] and total.dtype == torch.float32
    assert abs(total.double() - reference) / reference < 1e-6, (float(total), float(reference))
    coefficient = torch.clamp(1.0 / (total + 1e-6), max=1.0)
    assert coefficient < 1e-3
    for parameter, gradient in zip(parameters, before):
        assert torch.equal(parameter.grad, gradient * coefficient)

    # Under max_norm nothing changes, to the bit.
    small = _parameters_with_gradients(seed=1, scale=1e-6)
    before = [parameter.grad.clone() for parameter in small]
    assert clip_gradients(_Accelerator(DistributedType.MULTI_CPU), small, max_norm=1.0) < 1.0
    assert all(torch.equal(parameter.grad, gradient) for parameter, gradient in zip(small, before))


def test_clip_gradients_agrees_with_torchs_clip_to_float32_rounding():
    from accelerate.utils import DistributedType

    from pipelines.optim import clip_gradients

    ours, torchs = _parameters_with_gradients(seed=2), _parameters_with_gradients(seed=2)
    ours.append(torch.nn.Parameter(torch.zeros(3)))  # no gradient: skipped by both
    total = clip_gradients(_Accelerator(DistributedType.NO), ours, max_norm=5.0)
    torch.testing.assert_close(total, torch.nn.utils.clip_grad_norm_(torchs, max_norm=5.0), rtol=1e-3, atol=0)
    for mine, theirs in zip(ours, torchs):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-3, atol=1e-9)


@pytest.mark.parametrize("case", ["sharded", "device", "no gradients"])
def test_clip_gradients_leaves_sharded_device_or_missing_gradients_to_accelerate(case):
    from accelerate.utils import DistributedType

    from pipelines.optim import clip_gradients

    device = "meta" if case == "device" else "cpu"  # "meta" stands in for an accelerator's device
    parameters = [torch.nn.Parameter(torch.zeros(4, 4, device=device))]
    if case != "no gradients":
        parameters[0].grad = torch.ones(4, 4, device=device)
    accelerator = _Accelerator(DistributedType.FSDP if case == "sharded" else DistributedType.NO)
    assert clip_gradients(accelerator, parameters, max_norm=0.5) == -1.0
    assert accelerator.delegated == [(1, 0.5)]

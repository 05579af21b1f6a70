"""pipelines.dropout: the CPU dropout masks drawn as 32-bit integers keep torch's distribution and scaling."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipelines.dropout import CheapMaskDropout, draw_cheap_dropout_masks, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1e-3])
def test_dropout_keep_mask_drops_each_element_with_probability_p(p):
    torch.manual_seed(0)
    count = 2_000_003
    mask = keep_mask(torch.empty(count, dtype=torch.bfloat16), p)
    assert mask.dtype == torch.bool and mask.shape == (count,)
    dropped = count - int(mask.sum())
    sigma = math.sqrt(count * p * (1 - p))
    assert abs(dropped - count * p) < 5 * sigma, (dropped, count * p)


def test_dropout_keep_mask_elements_are_independent_of_their_neighbours():
    torch.manual_seed(1)
    p, count = 0.3, 1_000_000
    mask = keep_mask(torch.empty(count), p).view(-1, 2).double()
    pairs = count / 2
    for half in (0, 1):
        assert abs((1 - mask[:, half]).sum().item() - pairs * p) < 5 * math.sqrt(pairs * p * (1 - p))
    both_dropped = ((1 - mask[:, 0]) * (1 - mask[:, 1])).sum().item()
    assert abs(both_dropped - pairs * p * p) < 5 * math.sqrt(pairs * p * p * (1 - p * p))


def test_dropout_keep_mask_comes_from_torchs_generator():
    """Seeded runs and a resume (which restores torch's RNG state) draw the same masks."""
    torch.manual_seed(3)
    like = torch.empty(7, 5, 3).transpose(0, 2)  # not contiguous: the mask still has its shape
    first = keep_mask(like, 0.2)
    assert first.shape == like.shape
    state = torch.get_rng_state()
    second = keep_mask(like, 0.2)
    torch.manual_seed(3)
    assert torch.equal(keep_mask(like, 0.2), first)
    torch.set_rng_state(state)
    assert torch.equal(keep_mask(like, 0.2), second)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_scales_kept_elements_as_torchs_cpu_dropout_does_and_zeroes_the_rest(dtype):
    """Kept elements are multiplied by 1/(1-p) rounded to the input's dtype, the factor torch's own CPU
    dropout uses (bf16: 1.109375 for p=0.1, not 1.1111): only which elements are dropped differs."""
    p = 0.1
    torch.manual_seed(4)
    x = (torch.rand(64, 9, 48) + 0.5).to(dtype)
    scale = torch.ones((), dtype=dtype).div_(1 - p)
    if dtype == torch.bfloat16:
        assert scale.item() == 1.109375
    for out in (CheapMaskDropout(p).train()(x), nn.Dropout(p).train()(x)):
        kept = out != 0
        assert 0.85 < kept.double().mean().item() < 0.95
        assert torch.equal(out[kept], x[kept] * scale)


def test_dropout_backward_is_the_mask_times_the_scale():
    torch.manual_seed(5)
    x = torch.randn(16, 32, requires_grad=True)
    out = CheapMaskDropout(0.25).train()(x)
    out.sum().backward()
    kept = out.detach() != 0
    assert torch.equal(x.grad[~kept], torch.zeros_like(x.grad[~kept]))
    assert torch.allclose(x.grad[kept], torch.full_like(x.grad[kept], 1 / 0.75))
    assert torch.allclose(out[kept], x[kept] / 0.75)


def test_dropout_is_torchs_in_eval_at_p_zero_or_one_and_in_place_when_asked():
    torch.manual_seed(6)
    x = torch.randn(8, 8)
    assert torch.equal(CheapMaskDropout(0.5).eval()(x), x)
    assert torch.equal(CheapMaskDropout(0.0).train()(x), x)
    assert torch.equal(CheapMaskDropout(1.0).train()(x), torch.zeros_like(x))
    y = x.clone()
    out = CheapMaskDropout(0.5, inplace=True).train()(y)
    assert out.data_ptr() == y.data_ptr() and (y == 0).any() and (y != 0).any()


def test_dropout_leaves_tensors_off_the_cpu_to_torch():
    """A GPU tensor keeps torch's own kernel (fast there); meta stands in for one here."""
    x = torch.empty(4, 4, device="meta")
    assert CheapMaskDropout(0.5).train()(x).device.type == "meta"


def test_dropout_swap_changes_only_plain_dropout_modules_and_nothing_a_model_saves(tmp_path, tiny_bert):
    from transformers import AutoModelForSequenceClassification

    class OwnDropout(nn.Dropout):
        pass

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    model.own = OwnDropout(0.3)
    plain = [name for name, module in model.named_modules() if type(module) is nn.Dropout]
    state_before = {key: value.clone() for key, value in model.state_dict().items()}
    assert draw_cheap_dropout_masks(model) == len(plain) > 0
    assert all(type(module) is CheapMaskDropout for name, module in model.named_modules() if name in plain)
    assert type(model.own) is OwnDropout
    assert all(module.p == model.config.hidden_dropout_prob for name, module in model.named_modules()
               if name in plain and "classifier" not in name and "attention.self" not in name)
    state_after = model.state_dict()
    assert state_after.keys() == state_before.keys()
    assert all(torch.equal(state_after[key], state_before[key]) for key in state_before)
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved")
    assert not any(isinstance(module, CheapMaskDropout) for module in reloaded.modules())

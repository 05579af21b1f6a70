"""pipelines.dropout: the CPU dropout masks drawn as 32-bit integers keep torch's distribution and scaling;
attention dropout drawn so is SDPA's math path with that mask, and every other attention call is SDPA's."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pipelines import dropout
from pipelines.dropout import (
    SDPA_WITH_CHEAP_MASKS,
    CheapMaskDropout,
    attention_with_cheap_masks,
    draw_cheap_attention_dropout_masks,
    draw_cheap_dropout_masks,
    keep_mask,
)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1e-3])
def test_dropout_keep_mask_drops_each_element_with_probability_p(p):
    torch.manual_seed(0)
    count = 2_000_003
    mask = keep_mask((count,), p)
    assert mask.dtype == torch.bool and mask.shape == (count,)
    dropped = count - int(mask.sum())
    sigma = math.sqrt(count * p * (1 - p))
    assert abs(dropped - count * p) < 5 * sigma, (dropped, count * p)


def test_dropout_keep_mask_elements_are_independent_of_their_neighbours():
    torch.manual_seed(1)
    p, count = 0.3, 1_000_000
    mask = keep_mask((count,), p).view(-1, 2).double()
    pairs = count / 2
    for half in (0, 1):
        assert abs((1 - mask[:, half]).sum().item() - pairs * p) < 5 * math.sqrt(pairs * p * (1 - p))
    both_dropped = ((1 - mask[:, 0]) * (1 - mask[:, 1])).sum().item()
    assert abs(both_dropped - pairs * p * p) < 5 * math.sqrt(pairs * p * p * (1 - p * p))


def test_dropout_keep_mask_comes_from_torchs_generator():
    """Seeded runs and a resume (which restores torch's RNG state) draw the same masks."""
    torch.manual_seed(3)
    shape = torch.empty(7, 5, 3).transpose(0, 2).shape
    first = keep_mask(shape, 0.2)
    assert first.shape == shape and first.dtype == torch.bool
    state = torch.get_rng_state()
    second = keep_mask(shape, 0.2)
    torch.manual_seed(3)
    assert torch.equal(keep_mask(shape, 0.2), first)
    torch.set_rng_state(state)
    assert torch.equal(keep_mask(shape, 0.2), second)
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


class _Attention(nn.Module):
    """What transformers' attention functions read from the calling module."""

    is_causal = False


def _attention_inputs(dtype=torch.float32, *, batch=3, heads=4, length=10, size=8, seed=7):
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(batch, heads, length, size, generator=generator).to(dtype).requires_grad_()
                         for _ in range(3))
    # Block-diagonal, as packed rows are (pipelines/packing.py): every query keeps at least itself.
    segment = torch.tensor([0] * 4 + [1] * 3 + [2] * 3)
    mask = (segment[:, None] == segment[None, :]).expand(batch, 1, length, length).clone()
    mask[1, 0, :, 7:] = False
    mask[1, 0, 7:, 0] = True  # row 1's last example is padding: it attends to the row's first token only
    mask[2, 0, 5] = False  # a query with no key: the math path's softmax gives it zeros
    return query, key, value, mask


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """A boolean mask as SDPA's front end hands it to the math kernel (which adds its mask to the scores)."""
    return torch.zeros(mask.shape).masked_fill(mask.logical_not(), float("-inf"))


def _recorded_masks(monkeypatch) -> list[torch.Tensor]:
    drawn = []
    original = dropout.keep_mask
    monkeypatch.setattr(dropout, "keep_mask", lambda shape, p: drawn.append(original(shape, p)) or drawn[-1])
    return drawn


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_dropout_is_sdpas_math_path_with_the_drawn_mask(monkeypatch, dtype, mask_kind):
    """Output and gradients equal torch's own SDPA math kernel given the same keep mask (its test-only
    dropout_mask argument), in float32 and, for bf16 inputs, computed in float32 as that kernel does;
    for a boolean mask, an additive one (-inf at masked keys) and none (every query sees every key)."""
    p, scale = 0.25, 8 ** -0.5
    drawn = _recorded_masks(monkeypatch)
    query, key, value, mask = _attention_inputs(dtype)
    if mask_kind == "none":
        mask = torch.ones_like(mask)
    given = {"bool": mask, "additive": _additive(mask), "none": None}[mask_kind]
    output, weights = attention_with_cheap_masks(_Attention(), query, key, value, given, dropout=p, scaling=scale)
    assert weights is None and output.dtype == dtype and output.shape == (3, 10, 4, 8)
    assert len(drawn) == 1 and drawn[0].shape == (3, 4, 10, 10) and drawn[0].dtype == torch.bool
    assert 0.6 < drawn[0].double().mean().item() < 0.9
    gradient = torch.randn(output.shape, generator=torch.Generator().manual_seed(8)).to(dtype)
    ours = torch.autograd.grad(output, (query, key, value), gradient)

    inputs = [tensor.detach().float().requires_grad_() for tensor in (query, key, value)]
    reference = torch.ops.aten._scaled_dot_product_attention_math(
        *inputs, attn_mask=_additive(mask), dropout_p=p, dropout_mask=drawn[0], scale=scale)[0].transpose(1, 2)
    expected = torch.autograd.grad(reference, inputs, gradient.float())
    tolerance = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(output.float(), reference, **tolerance)
    assert output[2, 5].any() == (mask_kind == "none") and output.isfinite().all()
    for name, got, want in zip(("query", "key", "value"), ours, expected):
        assert got.isfinite().all(), name
        torch.testing.assert_close(got.float(), want, **tolerance, msg=lambda text, name=name: f"{name}: {text}")
    # A dropped probability reaches no output: value rows seen only through dropped pairs get no gradient.
    unread = (~drawn[0] | ~mask).all(dim=2)  # [batch, heads, keys]: no query of the head keeps the key
    assert unread.any() or mask_kind == "none"  # unmasked, each key is dropped for all 10 queries with p 1e-6
    assert not ours[2][unread].any() and ours[2][~unread].abs().sum(dim=-1).gt(0).all()


def test_attention_under_bf16_autocast_computes_in_float32_and_returns_bf16(monkeypatch):
    drawn = _recorded_masks(monkeypatch)
    query, key, value, mask = _attention_inputs(torch.bfloat16)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        output, _ = attention_with_cheap_masks(_Attention(), query, key, value, mask, dropout=0.1, scaling=0.3)
    reference = torch.ops.aten._scaled_dot_product_attention_math(
        query.float(), key.float(), value.float(), attn_mask=_additive(mask), dropout_p=0.1, dropout_mask=drawn[0], scale=0.3)[0]
    assert output.dtype == torch.bfloat16
    torch.testing.assert_close(output.float(), reference.transpose(1, 2).to(torch.bfloat16).float(), rtol=0, atol=0)


@pytest.mark.parametrize("case", ["no dropout", "no gradient", "causal without a mask", "position bias",
                                  "attention weights asked for", "a mask that learns", "off the cpu"])
def test_attention_calls_it_does_not_write_out_are_sdpas_own(monkeypatch, case):
    """Evaluation, causal attention left to SDPA's own kernel, and the calls with arguments only SDPA's
    wrapper handles run transformers' sdpa_attention_forward itself."""
    from transformers.integrations import sdpa_attention

    drawn = _recorded_masks(monkeypatch)
    handed_over = []
    original = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(dropout, "sdpa_attention_forward", lambda *args, **kwargs: handed_over.append(kwargs) or original(*args, **kwargs))
    query, key, value, mask = _attention_inputs()
    module, kwargs, p = _Attention(), {}, 0.2
    if case == "no dropout":
        p = 0.0
    elif case == "causal without a mask":
        module.is_causal, mask = True, None
    elif case == "position bias":
        kwargs["position_bias"] = torch.zeros(1, 4, 10, 10)
    elif case == "attention weights asked for":
        kwargs["output_attentions"] = True
    elif case == "a mask that learns":
        mask = _additive(mask).clamp_min(-1e4).requires_grad_()
    elif case == "off the cpu":
        query, key, value = (tensor.detach().to("meta") for tensor in (query, key, value))
        mask = mask.to("meta")
    context = torch.no_grad() if case == "no gradient" else torch.enable_grad()
    with context:
        attention_with_cheap_masks(module, query, key, value, mask, dropout=p, scaling=0.35, **kwargs)
    assert drawn == [] and len(handed_over) == 1
    assert handed_over[0]["dropout"] == p and handed_over[0]["scaling"] == 0.35


def test_attention_switch_changes_only_sdpa_models_and_nothing_they_compute_in_eval_or_save(tmp_path, tiny_bert):
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(0)
    reference = AutoModelForTokenClassification.from_pretrained(tiny_bert, num_labels=3).eval()
    torch.manual_seed(0)
    model = AutoModelForTokenClassification.from_pretrained(tiny_bert, num_labels=3).eval()
    eager = AutoModelForTokenClassification.from_pretrained(tiny_bert, num_labels=3, attn_implementation="eager")
    assert model.config._attn_implementation == "sdpa"
    assert draw_cheap_attention_dropout_masks(model) == 1
    assert draw_cheap_attention_dropout_masks(eager) == 0 and eager.config._attn_implementation == "eager"
    assert model.config._attn_implementation == SDPA_WITH_CHEAP_MASKS
    batch = {"input_ids": torch.tensor([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]]), "attention_mask": torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])}
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, reference(**batch).logits)
    model.save_pretrained(tmp_path / "saved")
    assert SDPA_WITH_CHEAP_MASKS not in (tmp_path / "saved" / "config.json").read_text()
    assert AutoModelForTokenClassification.from_pretrained(tmp_path / "saved").config._attn_implementation == "sdpa"


def test_attention_switch_draws_each_layers_mask_in_a_training_forward(monkeypatch, tiny_bert):
    from transformers import AutoModelForTokenClassification

    drawn = _recorded_masks(monkeypatch)
    model = AutoModelForTokenClassification.from_pretrained(tiny_bert, num_labels=3).train()
    draw_cheap_attention_dropout_masks(model)
    batch = {"input_ids": torch.tensor([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]]), "attention_mask": torch.tensor([[1] * 5, [1, 1, 1, 0, 0]]),
             "labels": torch.tensor([[0, 1, 2, 1, 0], [1, 2, 0, -100, -100]])}
    model(**batch).loss.backward()
    heads = model.config.num_attention_heads
    assert [tuple(mask.shape) for mask in drawn] == [(2, heads, 5, 5)] * model.config.num_hidden_layers

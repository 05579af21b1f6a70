"""Masks, score functions and multi-head attention against hand-written formulas."""

import math

import pytest
import torch

from models.attention import (
    AdditiveScore,
    BilinearScore,
    DotScore,
    MultiHeadAttention,
    make_causal_mask,
    make_padding_mask,
    merge_masks,
    scaled_attention,
)


def test_attention_padding_mask_gives_zero_weight_to_padding():
    lengths = [5, 3, 1]
    attention_mask = torch.tensor([[1] * n + [0] * (5 - n) for n in lengths])
    mask = make_padding_mask(attention_mask, torch.float32)
    assert mask.shape == (3, 1, 1, 5)
    scores = torch.randn(3, 2, 5, 5)
    weights = torch.softmax(scores + mask, dim=-1)
    for row, n in enumerate(lengths):
        assert torch.all(weights[row, :, :, n:] == 0)
        torch.testing.assert_close(weights[row, :, :, :n].sum(-1), torch.ones(2, 5))


def test_attention_masks_are_finite_dtype_min_and_fully_masked_rows_are_not_nan():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        mask = make_padding_mask(torch.tensor([[0, 0, 0]]), dtype)
        assert mask.dtype == dtype
        assert torch.all(mask == torch.finfo(dtype).min)
        assert torch.isfinite(mask).all()
    merged = merge_masks(
        make_padding_mask(torch.tensor([[1, 0, 0]]), torch.float32), make_causal_mask(3, 3, torch.float32)
    )
    assert torch.isfinite(merged).all()
    weights = torch.softmax(
        torch.randn(1, 1, 3, 3) + make_padding_mask(torch.tensor([[0, 0, 0]]), torch.float32), dim=-1
    )
    assert not torch.isnan(weights).any()


def test_attention_causal_mask_blocks_the_future():
    mask = make_causal_mask(4, 4, torch.float32)
    weights = torch.softmax(torch.randn(2, 3, 4, 4) + mask, dim=-1)
    future = torch.ones(4, 4, dtype=torch.bool).triu(diagonal=1)
    assert torch.all(weights[..., future] == 0)
    assert torch.all(weights[..., ~future] > 0)


def test_attention_causal_mask_with_cached_prefix_sees_all_past_keys():
    # 2 new queries after 3 cached steps: query 0 is position 3 and sees keys 0..3, query 1 sees 0..4.
    allowed = make_causal_mask(2, 5, torch.float32)[0, 0] == 0
    assert allowed.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_attention_merge_masks_combines_padding_and_look_ahead():
    merged = merge_masks(
        make_padding_mask(torch.tensor([[1, 1, 0]]), torch.float32), make_causal_mask(3, 3, torch.float32)
    )
    allowed = (merged[0, 0] == 0).tolist()
    assert allowed == [[True, False, False], [True, True, False], [True, True, False]]
    assert merge_masks(None, None) is None


@pytest.fixture
def qk():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 4, 5, generator=generator), torch.randn(2, 3, 6, 5, generator=generator)


def test_attention_dot_score_matches_formula(qk):
    q, k = qk
    scores = DotScore(3, 5)(q, k)
    b, h, i, j = 1, 2, 3, 4
    assert scores.shape == (2, 3, 4, 6)
    torch.testing.assert_close(scores[b, h, i, j], q[b, h, i] @ k[b, h, j] / math.sqrt(5))


def test_attention_bilinear_score_matches_formula(qk):
    q, k = qk
    score = BilinearScore(3, 5)
    with torch.no_grad():
        score.weight.normal_()
    scores = score(q, k)
    for b, h, i, j in [(0, 0, 0, 0), (1, 2, 3, 5)]:
        expected = q[b, h, i] @ score.weight[h] @ k[b, h, j] / math.sqrt(5)
        torch.testing.assert_close(scores[b, h, i, j], expected)
    # Initialised at W = I it is exactly the dot score.
    torch.testing.assert_close(BilinearScore(3, 5)(q, k), DotScore(3, 5)(q, k))


def test_attention_additive_score_matches_formula(qk):
    q, k = qk
    score = AdditiveScore(3, 5)
    scores = score(q, k)
    for b, h, i, j in [(0, 1, 2, 3), (1, 2, 3, 5)]:
        hidden = torch.tanh(q[b, h, i] @ score.w_query[h] + k[b, h, j] @ score.w_key[h])
        torch.testing.assert_close(scores[b, h, i, j], hidden @ score.v[h])


def test_attention_sdpa_fast_path_equals_explicit_path():
    torch.manual_seed(0)
    attention = MultiHeadAttention(hidden_size=16, num_heads=4, dropout=0.0, attention_score="dot").eval()
    x = torch.randn(3, 6, 16)
    mask = merge_masks(
        make_padding_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5]), torch.float32),
        make_causal_mask(6, 6, torch.float32),
    )
    fast, no_weights = attention(x, attention_mask=mask)
    explicit, weights = attention(x, attention_mask=mask, output_attentions=True)
    assert no_weights is None and weights.shape == (3, 4, 6, 6)
    torch.testing.assert_close(fast, explicit, atol=1e-6, rtol=1e-5)


def test_attention_multi_head_matches_per_head_formula():
    torch.manual_seed(0)
    attention = MultiHeadAttention(hidden_size=8, num_heads=2, dropout=0.0).eval()
    x, memory = torch.randn(1, 3, 8), torch.randn(1, 4, 8)
    out, weights = attention(x, key_value_states=memory, output_attentions=True)
    heads = []
    for h in range(2):
        cols = slice(4 * h, 4 * h + 4)
        q = attention.query(x)[0, :, cols]
        k = attention.key(memory)[0, :, cols]
        v = attention.value(memory)[0, :, cols]
        w = torch.softmax(q @ k.T / 2.0, dim=-1)
        torch.testing.assert_close(weights[0, h], w)
        heads.append(w @ v)
    torch.testing.assert_close(out[0], attention.output(torch.cat(heads, dim=-1)))


@pytest.mark.parametrize("score", ["bilinear", "additive"])
def test_attention_other_scores_run_through_multi_head(score):
    attention = MultiHeadAttention(hidden_size=8, num_heads=2, dropout=0.0, attention_score=score)
    mask = make_padding_mask(torch.tensor([[1, 1, 0]]), torch.float32)
    out, weights = attention(torch.randn(1, 3, 8), attention_mask=mask)
    assert out.shape == (1, 3, 8)
    assert torch.all(weights[..., 2] == 0)  # explicit path always returns weights for non-dot scores


def test_attention_scaled_attention_matches_softmax_formula():
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    context, weights = scaled_attention(q, k, v, DotScore(1, 4))
    expected = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, expected @ v)

"""Token + segment + position embeddings; the sinusoidal code against the paper's formula."""

import math

import torch

from models.embeddings import Embeddings, sinusoidal_position_encoding


def test_embeddings_sinusoidal_matches_formula():
    d_model = 10
    encoding = sinusoidal_position_encoding(torch.arange(7), d_model)
    assert encoding.shape == (7, d_model)
    for pos in range(7):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(encoding[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(encoding[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)


def test_embeddings_sinusoidal_odd_width_and_batched_positions():
    encoding = sinusoidal_position_encoding(torch.tensor([[0, 3], [5, 1]]), 5)
    assert encoding.shape == (2, 2, 5)
    torch.testing.assert_close(encoding[1, 0], sinusoidal_position_encoding(torch.tensor([5]), 5)[0])


def test_embeddings_learned_is_sum_then_norm():
    emb = Embeddings(20, 8, 16, 2, "learned", 1e-12, 0.0, pad_token_id=0).eval()
    ids = torch.tensor([[3, 4, 5]])
    segments = torch.tensor([[0, 1, 1]])
    expected = emb.token_embeddings(ids) + emb.segment_embeddings(segments) + emb.position_embeddings(torch.arange(3))
    torch.testing.assert_close(emb(ids, segments), emb.norm(expected))


def test_embeddings_sinusoidal_scaled_without_norm_continues_positions_after_cache():
    emb = Embeddings(20, 8, 16, 0, "sinusoidal", 1e-5, 0.0, scale=True, use_norm=False).eval()
    assert emb.segment_embeddings is None and emb.position_embeddings is None
    ids = torch.tensor([[7]])
    expected = emb.token_embeddings(ids) * math.sqrt(8) + sinusoidal_position_encoding(torch.tensor([[4]]), 8)
    torch.testing.assert_close(emb(ids, past_length=4), expected)

"""FFN, Add & Norm placements, and BatchNorm that leaves padding out of its statistics."""

import pytest
import torch

from models import BertpipeForSequenceClassification, BertpipeModel
from models.layers import FeedForward, MaskedBatchNorm, ResidualNorm


def test_layers_ffn_matches_formula():
    ffn = FeedForward(4, 6, "relu")
    x = torch.randn(2, 3, 4)
    expected = torch.relu(x @ ffn.w_1.weight.T + ffn.w_1.bias) @ ffn.w_2.weight.T + ffn.w_2.bias
    torch.testing.assert_close(ffn(x), expected)
    gelu = FeedForward(4, 6, "gelu")
    torch.testing.assert_close(gelu(x), gelu.w_2(torch.nn.functional.gelu(gelu.w_1(x))))


def test_layers_residual_norm_post_and_pre_placement():
    x, y = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    post = ResidualNorm(4, "layer", "post", 1e-5, 0.0)
    assert post.sublayer_input(x, None) is x
    torch.testing.assert_close(post.residual(x, y, None), torch.nn.functional.layer_norm(x + y, (4,), eps=1e-5))
    pre = ResidualNorm(4, "layer", "pre", 1e-5, 0.0)
    torch.testing.assert_close(pre.sublayer_input(x, None), torch.nn.functional.layer_norm(x, (4,), eps=1e-5))
    torch.testing.assert_close(pre.residual(x, y, None), x + y)


def test_layers_batch_norm_statistics_come_from_real_tokens_only():
    norm = MaskedBatchNorm(3)
    x = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    real = x[mask]
    expected = (x - real.mean(0)) / torch.sqrt(real.var(0, unbiased=False) + 1e-5)
    torch.testing.assert_close(norm(x, mask), expected)
    torch.testing.assert_close(norm.running_mean, 0.1 * real.mean(0))
    torch.testing.assert_close(norm.running_var, 0.9 + 0.1 * real.var(0, unbiased=True))
    norm.eval()
    torch.testing.assert_close(norm(x, mask), (x - norm.running_mean) / torch.sqrt(norm.running_var + 1e-5))


def test_layers_batch_norm_ignores_padding_in_the_whole_encoder(batch, make_bert_config):
    torch.manual_seed(0)
    model = BertpipeModel(make_bert_config(norm="batch")).train()  # batch statistics in use
    real = batch["attention_mask"].bool()
    changed = batch["input_ids"].clone()
    changed[~real] = torch.randint(5, 20, (int((~real).sum()),))
    first = model(**batch).last_hidden_state
    second = model(**{**batch, "input_ids": changed}).last_hidden_state
    torch.testing.assert_close(first[real], second[real])
    # Control: without the mask the padding does leak into the statistics.
    leaky = model(input_ids=changed, token_type_ids=batch["token_type_ids"]).last_hidden_state
    assert not torch.allclose(leaky[real], first[real])


@pytest.mark.parametrize(
    "overrides",
    [
        {"norm": "layer"},
        {"norm": "batch"},
        {"norm": "layer", "norm_placement": "pre"},
        {"norm": "batch", "norm_placement": "pre", "attention_score": "bilinear"},
        {"attention_score": "additive", "position_embedding": "sinusoidal"},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_layers_norm_variants_train_on_a_tiny_task(overrides, make_bert_config):
    """Label = whether token 5 occurs in the sequence; the loss must fall clearly within 60 steps."""
    torch.manual_seed(0)
    model = BertpipeForSequenceClassification(make_bert_config(num_labels=2, **overrides))
    input_ids = torch.randint(6, 25, (32, 6))
    labels = torch.arange(32) % 2
    input_ids[labels == 1, 3] = 5
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, 5] = 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses

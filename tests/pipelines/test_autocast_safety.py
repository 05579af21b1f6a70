"""pipelines/autocast_safety.py: DeBERTa (v1) runs under a bf16 autocast, and computes what it did outside one."""

from __future__ import annotations

import pytest
import torch
from transformers import DebertaConfig, DebertaForSequenceClassification
from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention

from pipelines.autocast_safety import make_autocast_safe


def tiny_deberta() -> DebertaForSequenceClassification:
    torch.manual_seed(0)
    # As microsoft/deberta-base: relative attention both ways (content->position and position->content).
    config = DebertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=64, relative_attention=True, pos_att_type=["c2p", "p2c"], num_labels=2)
    return DebertaForSequenceClassification(config)


BATCH = {"input_ids": torch.tensor([[1, 5, 6, 7, 2, 0], [1, 8, 9, 2, 0, 0]]),
         "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]), "labels": torch.tensor([1, 0])}


def test_transformers_deberta_still_fails_under_bf16_autocast_without_the_mend():
    """Why the mend exists; when transformers fixes its DeBERTa this fails, and pipelines/autocast_safety.py can go."""
    model = tiny_deberta()
    with pytest.raises(RuntimeError, match="cannot be converted to type c10::BFloat16 without overflow"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(**BATCH)


def test_mended_deberta_trains_under_bf16_autocast():
    model = tiny_deberta()
    assert make_autocast_safe(model) == 2  # one attention per layer
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(**BATCH)
    output.loss.backward()
    assert output.logits.dtype == torch.bfloat16 and torch.isfinite(output.loss)
    bias = model.deberta.encoder.layer[0].attention.self.q_bias
    assert bias.dtype == torch.float32 and bias.grad is not None and bias.grad.abs().sum() > 0


def test_mended_deberta_outside_autocast_is_the_familys_model_bit_for_bit(tmp_path):
    plain, mended = tiny_deberta().eval(), tiny_deberta().eval()  # no dropout: the same computation twice
    make_autocast_safe(mended)
    outputs = [model(**BATCH) for model in (plain, mended)]
    for output in outputs:
        output.loss.backward()
    assert torch.equal(outputs[0].logits, outputs[1].logits)
    for (name, a), (_, b) in zip(plain.named_parameters(), mended.named_parameters()):
        assert torch.equal(a.grad, b.grad), name
    # The class swap is the object's: the state dict is the family's, and the saved model loads as the family's.
    assert list(plain.state_dict()) == list(mended.state_dict())
    mended.save_pretrained(tmp_path)
    reloaded = DebertaForSequenceClassification.from_pretrained(tmp_path)
    assert type(reloaded.deberta.encoder.layer[0].attention.self) is DisentangledSelfAttention


def test_make_autocast_safe_leaves_other_families_alone():
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                     intermediate_size=32))
    classes = [type(module) for module in model.modules()]
    assert make_autocast_safe(model) == 0 and [type(module) for module in model.modules()] == classes

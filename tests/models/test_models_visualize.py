"""Attention heatmaps for our saved models and for transformers' BERT."""

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from models import (
    BertpipeForSequenceClassification,
    BertpipeTransformerConfig,
    BertpipeTransformerForConditionalGeneration,
)
from models.convert import convert_bert
from models.visualize import _load, attention_heatmaps, sentence_attentions

SENTENCE = "the cat sat on the mat"


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_visualize_writes_one_png_per_layer_for_a_saved_run(tmp_path, make_bert_config, tiny_tokenizer_dir):
    run = tmp_path / "run"
    BertpipeForSequenceClassification(make_bert_config(num_hidden_layers=3)).save_pretrained(run)
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(run)
    paths = attention_heatmaps(str(run), SENTENCE, str(tmp_path / "out"))
    assert [p.name for p in paths] == ["layer_01.png", "layer_02.png", "layer_03.png"]
    assert all(_is_png(p) for p in paths)
    tokens, attentions = sentence_attentions(*_load(str(run)), SENTENCE)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) == 8
    assert attentions[0].shape == (2, 8, 8)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(2, 8))


def test_visualize_transformers_bert_gives_the_same_weights_as_its_conversion(tmp_path, tiny_tokenizer_dir):
    torch.manual_seed(0)
    hf = tmp_path / "hf"
    BertModel(
        BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    ).save_pretrained(hf)
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(hf)
    paths = attention_heatmaps(str(hf), SENTENCE, str(tmp_path / "out"))
    assert len(paths) == 2 and all(_is_png(p) for p in paths)

    convert_bert(str(hf), str(tmp_path / "ours"))
    _, theirs = sentence_attentions(*_load(str(hf)), SENTENCE)
    _, ours = sentence_attentions(*_load(str(tmp_path / "ours")), SENTENCE)
    assert len(theirs) == len(ours) == 2
    for a, b in zip(theirs, ours, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_visualize_encoder_decoder_draws_encoder_self_attention(tmp_path, tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    config = BertpipeTransformerConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_decoder_layers=1,
        num_attention_heads=4,
        intermediate_size=32,
    )
    run = tmp_path / "mt"
    BertpipeTransformerForConditionalGeneration(config).save_pretrained(run)
    tokenizer.save_pretrained(run)
    paths = attention_heatmaps(str(run), SENTENCE, str(tmp_path / "out"))
    assert len(paths) == 2 and all(_is_png(p) for p in paths)

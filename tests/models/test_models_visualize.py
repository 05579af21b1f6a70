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


def test_visualize_refuses_what_it_cannot_draw_and_draws_a_model_without_a_position_limit(tmp_path, make_bert_config, tiny_tokenizer_dir):
    """A blank sentence drew [CLS] [SEP] (exit 0); Longformer's local-window weights were drawn as token-to-token
    heatmaps under token labels (or failed in matplotlib); XLNet (max_position_embeddings=-1) was refused as too long;
    an adapter run or an export failed in transformers' loader."""
    import pytest

    from tests.families.builders import build_family

    run = tmp_path / "run"
    BertpipeForSequenceClassification(make_bert_config(num_hidden_layers=1)).save_pretrained(run)
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(run)
    for blank in ("", " \u200b "):
        with pytest.raises(ValueError, match="the sentence is empty"):
            attention_heatmaps(str(run), blank, str(tmp_path / "blank"))
    for marker, message in (("adapter_config.json", r"peft adapter run: .*bertpipe merge"), ("export.json", "an ONNX export")):
        folder = tmp_path / marker.split(".")[0]
        folder.mkdir()
        (folder / marker).write_text("{}")
        with pytest.raises(ValueError, match=message):
            attention_heatmaps(str(folder), SENTENCE, str(tmp_path / "x"))
    longformer = build_family("longformer", tmp_path / "longformer")
    with pytest.raises(RuntimeError, match=r"not token to token"):
        attention_heatmaps(str(longformer), "Marguerite visited Copenhagen today with Roberto", str(tmp_path / "local"))
    assert not (tmp_path / "local").exists() and not (tmp_path / "blank").exists()
    xlnet = build_family("xlnet", tmp_path / "xlnet")
    tokens, attentions = sentence_attentions(*_load(str(xlnet)), "Marguerite visited Copenhagen")
    assert attentions[0].shape[-2:] == (len(tokens), len(tokens))


def test_visualize_a_bert2bert_model_refuses_a_sentence_past_its_encoders_positions_and_an_unfinished_run(tmp_path, tiny_tokenizer_dir):
    # EncoderDecoderConfig has no max_position_embeddings of its own: the check read "no limit" and the forward failed in a
    # tensor-size error; an interrupted run (checkpoints, no model) failed on a missing config.json.
    import pytest
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    sizes = dict(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=12)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(**sizes), BertConfig(**sizes, is_decoder=True, add_cross_attention=True))
    run = tmp_path / "b2b"
    EncoderDecoderModel(config=config).save_pretrained(run)
    tokenizer.save_pretrained(run)
    with pytest.raises(ValueError, match=r"past the model's 12 usable positions \(max_position_embeddings=12\)"):
        attention_heatmaps(str(run), " ".join(["word"] * 20), str(tmp_path / "long"))
    unfinished = tmp_path / "unfinished"
    (unfinished / "checkpoints").mkdir(parents=True)
    (unfinished / "config.yaml").write_text("task: classification\n")
    with pytest.raises(ValueError, match=r"holds no finished run .*resume_from_checkpoint=latest"):
        attention_heatmaps(str(unfinished), SENTENCE, str(tmp_path / "u"))

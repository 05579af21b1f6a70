"""Conversion to and from transformers BERT: exact outputs both ways, on tiny random models and on MiniLM."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from models import BertpipeModel
from models.convert import convert_bert

HEADS = [
    (BertModel, AutoModel, "last_hidden_state"),
    (BertForMaskedLM, AutoModelForMaskedLM, "logits"),
    (BertForSequenceClassification, AutoModelForSequenceClassification, "logits"),
    (BertForTokenClassification, AutoModelForTokenClassification, "logits"),
    (BertForQuestionAnswering, AutoModelForQuestionAnswering, "start_logits"),
]


def tiny_hf_config(num_labels=3):
    # BertForQuestionAnswering only works with two outputs (start, end).
    labels = ["A", "B", "C"][:num_labels]
    return BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=num_labels,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )


@pytest.mark.parametrize("hf_class, auto_class, field", HEADS, ids=lambda x: getattr(x, "__name__", str(x)))
def test_convert_tiny_heads_both_ways_give_identical_outputs(
    tmp_path, batch, tiny_tokenizer_dir, hf_class, auto_class, field
):
    torch.manual_seed(0)
    reference = hf_class(tiny_hf_config(2 if hf_class is BertForQuestionAnswering else 3)).eval()
    reference.save_pretrained(tmp_path / "hf")
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(tmp_path / "hf")

    convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["model_type"] == "bertpipe_bert" and config["architectures"][0].startswith("Bertpipe")
    assert (tmp_path / "ours" / "tokenizer.json").exists()
    ours = auto_class.from_pretrained(tmp_path / "ours").eval()
    assert type(ours).__name__.startswith("Bertpipe")
    assert ours.config.id2label == reference.config.id2label
    with torch.no_grad():
        expected = getattr(reference(**batch), field)
        torch.testing.assert_close(getattr(ours(**batch), field), expected, atol=1e-6, rtol=1e-6)

    convert_bert(str(tmp_path / "ours"), str(tmp_path / "back"), reverse=True)
    back = hf_class.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        torch.testing.assert_close(getattr(back(**batch), field), expected, atol=0, rtol=0)
    original, returned = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(tmp_path / "back" / "model.safetensors"),
    )
    for name, tensor in returned.items():
        assert torch.equal(tensor, original[name]), name


def test_convert_keeps_the_settings_a_runs_pipeline_reads_both_ways(tmp_path, tiny_tokenizer_dir):
    # Dropped, pipeline() on a converted QA run answered an unanswerable question and on an NER run tagged pieces.
    settings = {"question-answering": {"doc_stride": 12, "handle_impossible_answer": True, "max_seq_len": 40}}
    config = tiny_hf_config(2)
    config.task_specific_params = settings
    BertForQuestionAnswering(config).save_pretrained(tmp_path / "hf")
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(tmp_path / "hf")
    convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))
    convert_bert(str(tmp_path / "ours"), str(tmp_path / "back"), reverse=True)
    for folder in ("ours", "back"):
        assert json.loads((tmp_path / folder / "config.json").read_text())["task_specific_params"] == settings, folder


def test_convert_reverse_refuses_non_bert_architectures(tmp_path, make_bert_config):
    BertpipeModel(make_bert_config(attention_score="additive")).save_pretrained(tmp_path / "ours")
    with pytest.raises(ValueError, match="attention_score"):
        convert_bert(str(tmp_path / "ours"), str(tmp_path / "back"), reverse=True)
    with pytest.raises(ValueError, match="not a transformers BERT"):
        convert_bert(str(tmp_path / "ours"), str(tmp_path / "other"))


def test_convert_minilm_matches_transformers_bert_model(tmp_path, minilm):
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    batch = tokenizer(
        ["The cat sat on the mat.", "Paris is the capital of France and a rather big city"],
        ["It was tired after a long day of hunting mice.", "yes"],
        padding=True,
        return_tensors="pt",
    )
    assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 1).any()
    reference = BertModel.from_pretrained(minilm).eval()

    convert_bert(str(minilm), str(tmp_path / "ours"))
    ours = AutoModel.from_pretrained(tmp_path / "ours").eval()
    assert isinstance(ours, BertpipeModel)
    with torch.no_grad():
        expected = reference(**batch)
        actual = ours(**batch)
    real = batch["attention_mask"].bool()
    delta = (actual.last_hidden_state - expected.last_hidden_state)[real].abs().max().item()
    assert delta <= 1e-5, delta
    torch.testing.assert_close(actual.pooler_output, expected.pooler_output, atol=1e-5, rtol=0)

    convert_bert(str(tmp_path / "ours"), str(tmp_path / "back"), reverse=True)
    back = BertModel.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**batch).last_hidden_state, expected.last_hidden_state, atol=0, rtol=0)
    assert AutoTokenizer.from_pretrained(tmp_path / "back")("hello")["input_ids"] == tokenizer("hello")["input_ids"]


def test_convert_reverse_refuses_scaled_token_embeddings(tmp_path, make_bert_config):
    # transformers BERT has no √hidden_size factor: converting would silently change every output.
    BertpipeModel(make_bert_config(scale_embedding=True)).save_pretrained(tmp_path / "ours")
    with pytest.raises(ValueError, match="scale_embedding"):
        convert_bert(str(tmp_path / "ours"), str(tmp_path / "back"), reverse=True)
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize(
    "setting, match",
    [
        ({"is_decoder": True}, "is_decoder"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ],
)
def test_convert_refuses_settings_ours_cannot_reproduce_by_name(tmp_path, setting, match):
    torch.manual_seed(0)
    BertModel(tiny_hf_config()).save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **setting}))
    if "position_embedding_type" in setting:
        # As saved by a relative-position BERT: the distance table comes along with the config key.
        state = load_file(tmp_path / "hf" / "model.safetensors")
        state["encoder.layer.0.attention.self.distance_embedding.weight"] = torch.zeros(63, 16)
        save_file(state, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=match):
        convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))


def test_convert_pretraining_checkpoint_drops_the_unused_pooler(tmp_path, batch):
    # BertForPreTraining (and bert-base-uncased, saved as BertForMaskedLM) carry the NSP pooler, which the
    # masked-LM head never reads.
    torch.manual_seed(0)
    reference = BertForPreTraining(tiny_hf_config()).eval()
    reference.save_pretrained(tmp_path / "hf")
    assert any(".pooler." in name for name in load_file(tmp_path / "hf" / "model.safetensors"))

    convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))
    ours = AutoModelForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).logits, reference(**batch).prediction_logits, atol=1e-6, rtol=1e-6)


def test_convert_reads_the_legacy_layer_norm_names_bert_base_keeps(tmp_path, batch):
    """bert-base-uncased's own files name LayerNorm tensors gamma/beta (the TensorFlow conversion's names), which
    transformers renames on load: convert-bert refused them ("missing 'bert.embeddings.norm.bias'")."""
    torch.manual_seed(0)
    reference = BertForMaskedLM(tiny_hf_config()).eval()
    with torch.no_grad():
        for module in reference.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(), module.bias.normal_()  # not the defaults a dropped tensor would get
    reference.save_pretrained(tmp_path / "hf")
    state = load_file(tmp_path / "hf" / "model.safetensors")
    legacy = {name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): tensor
              for name, tensor in state.items()}
    assert legacy.keys() != state.keys()
    save_file(legacy, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})

    convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))
    ours = AutoModelForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).logits, reference(**batch).logits, atol=1e-6, rtol=1e-6)


def test_convert_untied_masked_lm_keeps_its_own_decoder_both_ways(tmp_path, batch):
    # With tie_word_embeddings=false the vocabulary projection (weight and bias: transformers unties both)
    # is a matrix of its own, not a copy of the input embeddings.
    torch.manual_seed(0)
    config = tiny_hf_config()
    config.tie_word_embeddings = False
    reference = BertForMaskedLM(config).eval()
    with torch.no_grad():
        reference.cls.predictions.decoder.weight.normal_()
        reference.cls.predictions.decoder.bias.normal_()
    assert reference.cls.predictions.decoder.weight is not reference.bert.embeddings.word_embeddings.weight
    reference.save_pretrained(tmp_path / "hf")

    convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))
    ours = AutoModelForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    assert ours.mlm_head.decoder.weight is not ours.bert.embeddings.token_embeddings.weight
    with torch.no_grad():
        expected = reference(**batch).logits
        torch.testing.assert_close(ours(**batch).logits, expected, atol=1e-6, rtol=1e-6)

    convert_bert(str(tmp_path / "ours"), str(tmp_path / "back"), reverse=True)
    back = BertForMaskedLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**batch).logits, expected, atol=0, rtol=0)


def test_convert_leaves_the_sources_weights_in_other_formats_behind(tmp_path):
    """A Hub BERT repo (sentence-transformers/all-MiniLM-L6-v2, bert-base-uncased) also holds its weights for
    TensorFlow, Flax, Rust, ONNX and OpenVINO: copied beside the converted model they would be the source's
    weights under a bertpipe config, and stale once it is fine-tuned and converted back."""
    torch.manual_seed(0)
    BertModel(tiny_hf_config()).save_pretrained(tmp_path / "hf")
    for name in ("tf_model.h5", "flax_model.msgpack", "rust_model.ot", "onnx/model.onnx", "openvino/openvino_model.bin",
                 "modules.json", "1_Pooling/config.json"):
        (tmp_path / "hf" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "hf" / name).write_text("x")
    convert_bert(str(tmp_path / "hf"), str(tmp_path / "ours"))
    copied = sorted(path.relative_to(tmp_path / "ours").as_posix() for path in (tmp_path / "ours").rglob("*") if path.is_file())
    assert copied == ["1_Pooling/config.json", "config.json", "model.safetensors", "modules.json"], copied

"""The encoder heads: loss semantics as transformers' BertFor*, save/load round trips, Auto classes, pipelines."""

import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    pipeline,
)
from transformers.utils import ModelOutput

import models
from models import (
    BertpipeBertConfig,
    BertpipeForMaskedLM,
    BertpipeForQuestionAnswering,
    BertpipeForSequenceClassification,
    BertpipeForTokenClassification,
    BertpipeModel,
)
from models.embeddings import sinusoidal_position_encoding

AUTO_HEADS = [
    (AutoModel, BertpipeModel),
    (AutoModelForMaskedLM, BertpipeForMaskedLM),
    (AutoModelForSequenceClassification, BertpipeForSequenceClassification),
    (AutoModelForTokenClassification, BertpipeForTokenClassification),
    (AutoModelForQuestionAnswering, BertpipeForQuestionAnswering),
]


def test_bert_auto_classes_resolve_registered_types(tiny_kwargs):
    labels = ["neg", "neu", "pos"]
    config = AutoConfig.for_model(
        "bertpipe_bert",
        **tiny_kwargs(),
        num_labels=3,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    assert isinstance(config, BertpipeBertConfig) and config.num_labels == 3 and config.id2label[2] == "pos"
    for auto_class, expected in AUTO_HEADS:
        assert type(auto_class.from_config(config)) is expected
    models.register()  # idempotent
    assert type(AutoModel.from_config(config)) is BertpipeModel


def test_bert_config_rejects_unknown_switch_values():
    with pytest.raises(Exception, match="norm"):
        BertpipeBertConfig(norm="group")
    with pytest.raises(Exception, match="multiple"):
        BertpipeBertConfig(hidden_size=10, num_attention_heads=3)


@pytest.mark.parametrize("auto_class, model_class", AUTO_HEADS, ids=lambda x: getattr(x, "__name__", ""))
def test_bert_save_load_round_trip_every_head(tmp_path, batch, make_bert_config, auto_class, model_class):
    torch.manual_seed(0)
    config = make_bert_config(num_labels=3, norm="batch", attention_score="additive")
    model = model_class(config)
    # Make batch-norm running statistics non-trivial so that they are part of what must round-trip.
    model.train()(**batch)
    model.eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is model_class
    expected, actual = model(**batch), loaded(**batch)
    for key in expected.keys():
        if isinstance(expected[key], torch.Tensor):
            torch.testing.assert_close(actual[key], expected[key], atol=0, rtol=0)
    assert set(model.state_dict()) == set(loaded.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_bert_masked_lm_is_tied_and_ignores_minus_100(tmp_path, batch, make_bert_config):
    model = BertpipeForMaskedLM(make_bert_config()).eval()
    assert model.mlm_head.decoder.weight is model.bert.embeddings.token_embeddings.weight
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 2], labels[1, 1] = 7, 9
    out = model(**batch, labels=labels)
    assert isinstance(out, ModelOutput) and out.logits.shape == (2, 7, model.config.vocab_size)
    expected = F.cross_entropy(torch.stack([out.logits[0, 2], out.logits[1, 1]]), torch.tensor([7, 9]))
    torch.testing.assert_close(out.loss, expected)
    model.save_pretrained(tmp_path)
    loaded = BertpipeForMaskedLM.from_pretrained(tmp_path)
    assert loaded.mlm_head.decoder.weight is loaded.bert.embeddings.token_embeddings.weight


def test_bert_sequence_classification_problem_types_follow_transformers(batch, make_bert_config):
    torch.manual_seed(0)
    single = BertpipeForSequenceClassification(make_bert_config(num_labels=3)).eval()
    out = single(**batch, labels=torch.tensor([2, 0]))
    assert single.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([2, 0])))

    multi = BertpipeForSequenceClassification(make_bert_config(num_labels=3)).eval()
    targets = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    out = multi(**batch, labels=targets)
    assert multi.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, targets))

    regression = BertpipeForSequenceClassification(make_bert_config(num_labels=1)).eval()
    out = regression(**batch, labels=torch.tensor([0.5, -1.0]))
    assert regression.config.problem_type == "regression" and out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(), torch.tensor([0.5, -1.0])))

    explicit = BertpipeForSequenceClassification(
        make_bert_config(num_labels=2, problem_type="multi_label_classification")
    )
    assert explicit(**batch, labels=torch.tensor([[1.0, 0.0], [0.0, 1.0]])).loss.ndim == 0
    assert single(**batch).loss is None


def test_bert_token_classification_ignores_minus_100(batch, make_bert_config):
    model = BertpipeForTokenClassification(make_bert_config(num_labels=4)).eval()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, :3] = torch.tensor([0, 3, 1])
    out = model(**batch, labels=labels)
    assert out.logits.shape == (2, 7, 4)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[0, :3], labels[0, :3]))


def test_bert_question_answering_loss_like_transformers(batch, make_bert_config):
    model = BertpipeForQuestionAnswering(make_bert_config()).eval()
    out = model(**batch, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 2]))
    assert out.start_logits.shape == out.end_logits.shape == (2, 7)
    expected = (
        F.cross_entropy(out.start_logits, torch.tensor([1, 2])) + F.cross_entropy(out.end_logits, torch.tensor([3, 2]))
    ) / 2
    torch.testing.assert_close(out.loss, expected)
    # Out-of-window answers (clamped to the length) and -100 are ignored: only the first example counts.
    out = model(**batch, start_positions=torch.tensor([1, 99]), end_positions=torch.tensor([3, -100]))
    expected = (
        F.cross_entropy(out.start_logits[:1], torch.tensor([1]))
        + F.cross_entropy(out.end_logits[:1], torch.tensor([3]))
    ) / 2
    torch.testing.assert_close(out.loss, expected)


def test_bert_outputs_hidden_states_attentions_and_tuples(batch, make_bert_config):
    model = BertpipeModel(make_bert_config()).eval()
    out = model(**batch, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert out.attentions[0].shape == (2, 2, 7, 7)
    assert torch.all(out.attentions[1][1, :, :, 4:] == 0)  # padding keys get no weight
    torch.testing.assert_close(model(**batch, return_dict=False)[0], out.last_hidden_state)


def test_bert_padding_does_not_change_real_positions(make_bert_config):
    model = BertpipeModel(make_bert_config(norm_placement="pre")).eval()
    ids = torch.tensor([[2, 7, 8, 9, 3]])
    padded = torch.tensor([[2, 7, 8, 9, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    torch.testing.assert_close(
        model(padded, attention_mask=mask).last_hidden_state[:, :5], model(ids).last_hidden_state, atol=1e-5, rtol=1e-5
    )


def _save_with_tokenizer(model, tokenizer_dir, out_dir):
    from transformers import AutoTokenizer

    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    return str(out_dir)


def test_bert_transformers_pipelines_run_on_saved_heads(tmp_path, tiny_tokenizer_dir, make_bert_config):
    torch.manual_seed(0)
    labels = {"id2label": {0: "NEG", 1: "POS"}, "label2id": {"NEG": 0, "POS": 1}}
    classifier = _save_with_tokenizer(
        BertpipeForSequenceClassification(make_bert_config(**labels)), tiny_tokenizer_dir, tmp_path / "cls"
    )
    result = pipeline("text-classification", model=classifier)("the cat sat on the mat")
    assert result[0]["label"] in {"NEG", "POS"} and 0 <= result[0]["score"] <= 1

    tags = {"id2label": {0: "O", 1: "B-LOC", 2: "B-PER"}, "label2id": {"O": 0, "B-LOC": 1, "B-PER": 2}}
    tagger = _save_with_tokenizer(
        BertpipeForTokenClassification(make_bert_config(**tags)), tiny_tokenizer_dir, tmp_path / "tok"
    )
    entities = pipeline("token-classification", model=tagger)("john lives in paris")
    assert all(entity["entity"] in {"B-LOC", "B-PER"} for entity in entities)

    filler = _save_with_tokenizer(BertpipeForMaskedLM(make_bert_config()), tiny_tokenizer_dir, tmp_path / "mlm")
    predictions = pipeline("fill-mask", model=filler, top_k=3)("the cat sat on the [MASK]")
    assert len(predictions) == 3 and all("token_str" in p for p in predictions)


def test_bert_half_precision_padding_gives_no_nan(batch, make_bert_config):
    model = BertpipeForTokenClassification(make_bert_config(attention_score="bilinear")).to(torch.bfloat16).eval()
    out = model(**batch, output_attentions=True)
    assert not torch.isnan(out.logits).any()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not torch.isnan(BertpipeModel(make_bert_config()).eval()(**batch).last_hidden_state).any()


def test_bert_activation_checkpointing_gives_the_same_gradients(batch, make_bert_config):
    torch.manual_seed(0)
    plain = BertpipeForSequenceClassification(make_bert_config())
    checkpointed = BertpipeForSequenceClassification(plain.config)
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.activation_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in checkpointed.bert.encoder.layers)
    for model in (plain, checkpointed):
        model.train()(**batch, labels=torch.tensor([0, 1])).loss.backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_bert_scale_embedding_multiplies_token_embeddings_by_sqrt_hidden(make_bert_config):
    from models import BertpipeModel

    torch.manual_seed(0)
    plain = BertpipeModel(make_bert_config(position_embedding="sinusoidal")).eval()
    scaled = BertpipeModel(make_bert_config(position_embedding="sinusoidal", scale_embedding=True)).eval()
    scaled.load_state_dict(plain.state_dict())
    ids, segments = torch.tensor([[3, 4, 5]]), torch.zeros(1, 3, dtype=torch.long)
    emb = plain.embeddings
    positions = sinusoidal_position_encoding(torch.arange(3), 16)
    rest = emb.segment_embeddings(segments) + positions
    torch.testing.assert_close(plain.embeddings(ids, segments), emb.norm(emb.token_embeddings(ids) + rest))
    torch.testing.assert_close(scaled.embeddings(ids, segments), emb.norm(emb.token_embeddings(ids) * 4.0 + rest))
    assert make_bert_config().scale_embedding is False  # BERT checkpoints convert unchanged

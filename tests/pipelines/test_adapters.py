"""PEFT for every head type, without the task modules: wrap -> train a step -> save the adapter ->
reload through ``load_model`` -> merge, on tiny transformers models built here.

Covers the heads the NER, QA, MLM and translation tasks use (token classification, question
answering, masked LM, a BERT2BERT ``EncoderDecoderModel``) plus sequence classification and IA3.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    EncoderDecoderConfig,
    EncoderDecoderModel,
)

from pipelines.adapters import (
    apply_peft, base_model_id, default_feedforward_modules, default_modules_to_save, default_target_modules, is_adapter_dir,
    is_peft_model, peft_task_type, save_adapter_run, save_merged_model,
)
from pipelines.config import ConfigError, ModelConfig, PeftConfig
from pipelines.config_loading import load_config
from pipelines.errors import ModelError
from pipelines.modeling import count_parameters, load_model

VOCAB = 60


def bert_config(**extra) -> BertConfig:
    return BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **extra,
    )


def save_base(directory, kind: str):
    """A tiny pretrained-looking base: a BERT encoder (or a BERT2BERT pair) saved with save_pretrained."""
    torch.manual_seed(0)
    if kind == "seq2seq":
        decoder = bert_config(is_decoder=True, add_cross_attention=True)
        config = EncoderDecoderConfig.from_encoder_decoder_configs(bert_config(), decoder)
        config.decoder_start_token_id, config.pad_token_id = 2, 0
        EncoderDecoderModel(config=config).save_pretrained(directory)
    else:
        AutoModelForMaskedLM.from_config(bert_config()).save_pretrained(directory)
    return directory


def batch_for(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, VOCAB, (4, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if kind != "seq2seq":  # a question and its context, a sentence pair: peft's QA wrapper dropped the segments
        batch["token_type_ids"] = (torch.arange(10) >= 4).long().expand(4, 10).contiguous()
    if kind == "seq-cls":
        batch["labels"] = torch.tensor([0, 1, 2, 1])
    elif kind == "token-cls":
        batch["labels"] = torch.randint(0, 5, (4, 10), generator=generator)
    elif kind == "qa":
        batch["start_positions"], batch["end_positions"] = torch.tensor([1, 2, 3, 4]), torch.tensor([2, 4, 3, 6])
    elif kind == "mlm":
        labels = torch.full_like(input_ids, -100)
        labels[:, 2] = input_ids[:, 2]
        batch["labels"] = labels
    elif kind == "seq2seq":
        batch["labels"] = torch.randint(5, VOCAB, (4, 6), generator=generator)
    return batch


# kind -> (Auto class, pipeline_tag, label maps, expected modules_to_save)
HEADS = {
    # The base is saved from an MLM model, which has no pooler: the pooler is random, so it is trained and saved too.
    "seq-cls": (AutoModelForSequenceClassification, "SEQ_CLS", 3, ["classifier", "bert.pooler.dense"]),
    "token-cls": (AutoModelForTokenClassification, "TOKEN_CLS", 5, ["classifier"]),
    "qa": (AutoModelForQuestionAnswering, "QUESTION_ANS", None, ["qa_outputs"]),
    "mlm": (AutoModelForMaskedLM, None, None, ["cls.predictions.transform"]),
    "seq2seq": (AutoModelForSeq2SeqLM, "SEQ_2_SEQ_LM", None, ["crossattention"]),
}


def label_maps(count: int | None) -> dict:
    if count is None:
        return {}
    names = [f"L{i}" for i in range(count)]
    return {"num_labels": count, "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}


def outputs_of(model, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        inputs = {key: value for key, value in batch.items() if key not in ("labels", "start_positions", "end_positions")}
        if "decoder_input_ids" not in inputs and model.config.is_encoder_decoder:
            inputs["decoder_input_ids"] = batch["labels"]
        out = model(**inputs)
    return out.start_logits if hasattr(out, "start_logits") else out.logits


def test_modeling_peft_task_type_per_task():
    from peft import TaskType

    from tasks import get_task

    assert peft_task_type(get_task("classification").peft_task_type) == TaskType.SEQ_CLS
    assert peft_task_type(get_task("ner").peft_task_type) == TaskType.TOKEN_CLS
    assert peft_task_type(get_task("qa").peft_task_type) == TaskType.QUESTION_ANS
    assert peft_task_type(get_task("translation").peft_task_type) == TaskType.SEQ_2_SEQ_LM
    assert peft_task_type(get_task("mlm").peft_task_type) is None
    with pytest.raises(ModelError, match="IMAGE_CLASSIFICATION"):
        peft_task_type("IMAGE_CLASSIFICATION")


def test_modeling_default_target_modules_per_architecture():
    assert default_target_modules(bert_config()) == ["query", "value"]
    assert default_target_modules(AutoConfig.for_model("t5")) == ["q", "v"]
    assert default_target_modules(AutoConfig.for_model("bart")) == ["q_proj", "v_proj"]
    assert default_target_modules(AutoConfig.for_model("deberta-v2")) == ["query_proj", "value_proj"]
    bert2bert = EncoderDecoderConfig.from_encoder_decoder_configs(bert_config(), bert_config(is_decoder=True, add_cross_attention=True))
    assert default_target_modules(bert2bert) == ["query", "value"]
    assert default_target_modules(bert_config(), "ia3") == ["key", "value", "output.dense"]
    # Types peft's table lacks get peft's own "all-linear" (the model's linear layers), never an error.
    for model_type in ("marian", "mbart", "distilbert", "albert", "modernbert"):
        assert default_target_modules(AutoConfig.for_model(model_type)) == "all-linear"
    assert default_target_modules(AutoConfig.for_model("xlm-roberta"), "ia3") == "all-linear"
    assert default_feedforward_modules(AutoConfig.for_model("xlm-roberta")) == []


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_modeling_default_modules_to_save_is_the_task_head(kind, tmp_path):
    auto_class, _, labels, expected = HEADS[kind]
    model = load_model(auto_class, ModelConfig(name_or_path=str(save_base(tmp_path / "base", kind))), label_maps=label_maps(labels))
    assert default_modules_to_save(model) == expected


def test_modeling_mlm_head_keeps_its_decoder_tied_to_the_embeddings(tmp_path):
    model = load_model(AutoModelForMaskedLM, ModelConfig(name_or_path=str(save_base(tmp_path / "base", "mlm"))))
    wrapped = apply_peft(model, PeftConfig(), None, base_model_name_or_path="base")
    base = wrapped.get_base_model()
    assert base.cls.predictions.decoder.weight is base.bert.embeddings.word_embeddings.weight
    assert not base.cls.predictions.decoder.weight.requires_grad


@pytest.mark.parametrize("kind", ["mlm", "seq2seq"])
def test_modeling_an_adapter_on_word_embeddings_the_output_projection_shares_is_refused(kind, tmp_path):
    # Trained, it changed the input lookup alone; merged into the one shared matrix it changed the decoder too:
    # `bertpipe merge` gave another model (top fillers changed) without a word.
    auto_class = AutoModelForMaskedLM if kind == "mlm" else AutoModelForSeq2SeqLM
    base = str(save_base(tmp_path / "base", kind))
    model = load_model(auto_class, ModelConfig(name_or_path=base))
    with pytest.raises(ConfigError, match=r"target_modules adapts .*word_embeddings, the input word embeddings, whose matrix"):
        apply_peft(model, PeftConfig(target_modules=["query", "value", "word_embeddings"]), None, base_model_name_or_path="base")
    # Untied, as a token classifier's embeddings are, the adapter merges exactly: allowed.
    classifier = load_model(AutoModelForTokenClassification, ModelConfig(name_or_path=str(save_base(tmp_path / "enc", "mlm"))))
    apply_peft(classifier, PeftConfig(target_modules=["query", "value", "word_embeddings"]), "TOKEN_CLS", base_model_name_or_path="base")


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_modeling_lora_wrap_train_save_reload_merge(kind, tmp_path):
    auto_class, tag, labels, head = HEADS[kind]
    base_dir = save_base(tmp_path / "base", kind)
    model_config = ModelConfig(name_or_path=str(base_dir), peft=PeftConfig(r=4, alpha=8, dropout=0.0))
    model = load_model(auto_class, model_config, label_maps=label_maps(labels))
    frozen_before = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    wrapped = apply_peft(model, model_config.peft, tag, base_model_name_or_path=base_model_id(model_config))
    trainable_names = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable_names and all("lora_" in name or ".modules_to_save." in name for name in trainable_names), trainable_names
    assert any(f"{head[0]}.modules_to_save" in name for name in trainable_names)
    trainable, total = count_parameters(wrapped)
    assert 0 < trainable < total / 2

    # One optimiser step through peft: the loss comes from the wrapped model's forward.
    batch = batch_for(kind)
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    wrapped.train()
    for _ in range(2):  # LoRA B starts at zero: the second step moves the adapter's output too
        loss = wrapped(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.isfinite(loss)
    lora_b = [p for name, p in wrapped.named_parameters() if "lora_B" in name]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)
    base_weights = wrapped.get_base_model().state_dict()
    for name, before in frozen_before.items():  # every base weight outside the head is untouched
        key = name.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        after = base_weights.get(name, base_weights.get(key))
        if after is not None and not any(h in name for h in head):
            assert torch.equal(after, before), name
    expected = outputs_of(wrapped, batch)

    run_dir = tmp_path / "run"
    save_adapter_run(wrapped, run_dir)
    saved = sorted(path.name for path in run_dir.iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json"} <= set(saved)
    assert "model.safetensors" not in saved
    adapter_config = json.loads((run_dir / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(base_dir.resolve())
    assert adapter_config["task_type"] == (None if kind == "mlm" else peft_task_type(tag).value)

    reloaded = load_model(auto_class, ModelConfig(), model_path=str(run_dir))
    assert is_peft_model(reloaded) and is_adapter_dir(run_dir)
    if labels:
        assert reloaded.config.id2label[labels - 1] == f"L{labels - 1}"
    torch.testing.assert_close(outputs_of(reloaded, batch), expected)

    merged_dir = save_merged_model(reloaded, None, tmp_path / "merged")
    merged = auto_class.from_pretrained(merged_dir)
    assert not is_peft_model(merged)
    assert not any("lora" in name for name in merged.state_dict())
    torch.testing.assert_close(outputs_of(merged, batch), expected, rtol=1e-4, atol=1e-5)


def test_modeling_ia3_trains_scaling_vectors_and_head(tmp_path):
    base_dir = save_base(tmp_path / "base", "seq-cls")
    model = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(base_dir)), label_maps=label_maps(3))
    wrapped = apply_peft(model, PeftConfig(method="ia3"), "SEQ_CLS", base_model_name_or_path=str(base_dir))
    trainable = [name for name, p in wrapped.named_parameters() if p.requires_grad]
    assert any("ia3_l" in name for name in trainable) and any("classifier.modules_to_save" in name for name in trainable)
    assert all("ia3_l" in name or "modules_to_save" in name for name in trainable)


def test_modeling_ia3_on_hand_named_attention_modules_scales_their_outputs(tmp_path):
    # The default feed-forward modules (output.dense) are not among the named ones; peft refuses feedforward_modules
    # outside target_modules, so none are passed: query and value are scaled on their outputs.
    base_dir = save_base(tmp_path / "base", "seq-cls")
    model = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(base_dir)), label_maps=label_maps(3))
    wrapped = apply_peft(model, PeftConfig(method="ia3", target_modules=["query", "value"]), "SEQ_CLS", base_model_name_or_path=str(base_dir))
    scaled = {name.split(".ia3_l")[0].rsplit(".", 1)[-1] for name, _ in wrapped.named_parameters() if "ia3_l" in name}
    assert scaled == {"query", "value"}
    assert not wrapped.peft_config["default"].feedforward_modules


def train_two_steps(wrapped, batch) -> None:
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2)
    wrapped.train()
    for _ in range(2):
        wrapped(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def seq_cls_adapter_run(model_config: ModelConfig, run_dir) -> tuple[dict, torch.Tensor, Any]:
    """A 3-label sequence-classification adapter on ``model_config``'s base, trained two steps and saved to
    ``run_dir``: (its batch, its outputs before saving, the run reloaded)."""
    model = load_model(AutoModelForSequenceClassification, model_config, label_maps=label_maps(3))
    wrapped = apply_peft(model, model_config.peft, "SEQ_CLS", base_model_name_or_path=base_model_id(model_config))
    batch = batch_for("seq-cls")
    train_two_steps(wrapped, batch)
    expected = outputs_of(wrapped, batch)
    save_adapter_run(wrapped, run_dir)
    return batch, expected, load_model(AutoModelForSequenceClassification, ModelConfig(), model_path=str(run_dir))


@pytest.mark.parametrize("family", ["roberta", "deberta-v2"])
def test_modeling_ia3_merge_keeps_a_head_of_several_layers(family, tmp_path):
    # RoBERTa's classifier is dense + out_proj, DeBERTa's head a pooler + classifier: modules_to_save
    # that are not one layer, which peft's IA3 unload could not put back in place.
    torch.manual_seed(0)
    size = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    AutoModelForMaskedLM.from_config(AutoConfig.for_model(family, **size)).save_pretrained(tmp_path / "base")
    model_config = ModelConfig(name_or_path=str(tmp_path / "base"), peft=PeftConfig(method="ia3"))
    batch, expected, reloaded = seq_cls_adapter_run(model_config, tmp_path / "run")
    merged = AutoModelForSequenceClassification.from_pretrained(save_merged_model(reloaded, None, tmp_path / "merged"))
    torch.testing.assert_close(outputs_of(merged, batch), expected, rtol=1e-4, atol=1e-5)
    # Training on from the IA3 run merges it the same way.
    continued = load_model(AutoModelForSequenceClassification, ModelConfig(name_or_path=str(tmp_path / "run")), label_maps=label_maps(3))
    torch.testing.assert_close(outputs_of(continued, batch), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["lora", "ia3"])
def test_modeling_mlm_adapter_on_a_checkpoint_without_an_mlm_head_reloads(method, tmp_path):
    # A bare encoder (AutoModel, as sentence-transformers checkpoints are saved) lacks the whole MLM head,
    # including the output bias of the vocabulary projection, which is tied to the embeddings.
    torch.manual_seed(0)
    AutoModel.from_config(bert_config()).save_pretrained(tmp_path / "base")
    model_config = ModelConfig(name_or_path=str(tmp_path / "base"), peft=PeftConfig(method=method, dropout=0.0))
    model = load_model(AutoModelForMaskedLM, model_config)
    assert default_modules_to_save(model) == ["cls.predictions.transform"]
    wrapped = apply_peft(model, model_config.peft, None, base_model_name_or_path=base_model_id(model_config))
    base = wrapped.get_base_model()
    assert base.cls.predictions.decoder.weight is base.bert.embeddings.word_embeddings.weight
    batch = batch_for("mlm")
    train_two_steps(wrapped, batch)
    expected = outputs_of(wrapped, batch)
    save_adapter_run(wrapped, tmp_path / "run")

    torch.manual_seed(1)  # whatever the checkpoint lacks is initialised again on reload: it must not depend on the seed
    reloaded = load_model(AutoModelForMaskedLM, ModelConfig(), model_path=str(tmp_path / "run"))
    torch.testing.assert_close(outputs_of(reloaded, batch), expected)
    merged = AutoModelForMaskedLM.from_pretrained(save_merged_model(reloaded, None, tmp_path / "merged"))
    torch.testing.assert_close(outputs_of(merged, batch), expected, rtol=1e-4, atol=1e-5)


def test_modeling_adapter_records_hub_id_and_reloads_through_the_mirror(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    save_base(mirror / "models" / "owner" / "tiny", "token-cls")
    monkeypatch.setenv("BERTPIPE_MIRROR", str(mirror))
    model_config = ModelConfig(name_or_path="owner/tiny", peft=PeftConfig())
    model = load_model(AutoModelForTokenClassification, model_config, label_maps=label_maps(5))
    wrapped = apply_peft(model, model_config.peft, "TOKEN_CLS", base_model_name_or_path=base_model_id(model_config))
    save_adapter_run(wrapped, tmp_path / "run")
    assert json.loads((tmp_path / "run" / "adapter_config.json").read_text())["base_model_name_or_path"] == "owner/tiny"
    reloaded = load_model(AutoModelForTokenClassification, ModelConfig(), model_path=str(tmp_path / "run"))
    batch = batch_for("token-cls")
    torch.testing.assert_close(outputs_of(reloaded, batch), outputs_of(wrapped, batch))


def test_modeling_adapter_reloads_its_base_at_the_revision_it_was_trained_on(tmp_path, monkeypatch):
    """The base revision (``model.revision`` when training) is recorded in the adapter and read back for the
    base alone: a revision asked for the adapter's own repository is not one of the base's."""
    import transformers

    mirror = tmp_path / "mirror"
    save_base(mirror / "models" / "owner" / "tiny", "token-cls")
    monkeypatch.setenv("BERTPIPE_MIRROR", str(mirror))
    model_config = ModelConfig(name_or_path="owner/tiny", revision="v1.0", peft=PeftConfig())
    model = load_model(AutoModelForTokenClassification, model_config, label_maps=label_maps(5))
    wrapped = apply_peft(model, model_config.peft, "TOKEN_CLS", base_model_name_or_path=base_model_id(model_config),
                         base_model_revision=model_config.revision)
    save_adapter_run(wrapped, tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["revision"] == "v1.0"

    asked = []
    from_pretrained = transformers.AutoConfig.from_pretrained.__func__

    def recording(cls, location, *args, revision=None, **kwargs):
        asked.append((Path(location).name, revision))
        return from_pretrained(cls, location, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(recording))
    load_model(AutoModelForTokenClassification, ModelConfig(name_or_path=str(tmp_path / "adapter"), revision="adapter-v2"),
               label_maps=label_maps(5))
    assert ("tiny", "v1.0") in asked and all(revision != "adapter-v2" for name, revision in asked if name == "tiny")


def test_modeling_adapter_run_whose_local_base_moved_names_the_file_and_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base_dir = save_base(tmp_path / "base", "token-cls")
    model_config = ModelConfig(name_or_path=str(base_dir), peft=PeftConfig())
    model = load_model(AutoModelForTokenClassification, model_config, label_maps=label_maps(5))
    wrapped = apply_peft(model, model_config.peft, "TOKEN_CLS", base_model_name_or_path=base_model_id(model_config))
    save_adapter_run(wrapped, tmp_path / "run")
    moved = base_dir.rename(tmp_path / "moved")

    adapter_config = tmp_path / "run" / "adapter_config.json"
    with pytest.raises(ModelError) as raised:
        load_model(AutoModelForTokenClassification, ModelConfig(), model_path=str(tmp_path / "run"))
    message = str(raised.value)
    assert f"{adapter_config} records its base model as the local folder {base_dir.resolve()}" in message
    assert "no longer exists" in message and "mirror" not in message
    # The remedy the message gives works.
    recorded = json.loads(adapter_config.read_text())
    adapter_config.write_text(json.dumps(recorded | {"base_model_name_or_path": str(moved)}))
    reloaded = load_model(AutoModelForTokenClassification, ModelConfig(), model_path=str(tmp_path / "run"))
    batch = batch_for("token-cls")
    torch.testing.assert_close(outputs_of(reloaded, batch), outputs_of(wrapped, batch))


def test_modeling_peft_needs_a_pretrained_base():
    model = AutoModelForSequenceClassification.from_config(bert_config())
    with pytest.raises(ModelError, match="model.name_or_path"):
        apply_peft(model, PeftConfig(), "SEQ_CLS", base_model_name_or_path=None)


def test_modeling_unknown_target_module_is_a_model_error(tmp_path):
    model = AutoModelForSequenceClassification.from_config(bert_config())
    with pytest.raises(ModelError, match="model.peft"):
        apply_peft(model, PeftConfig(target_modules=["q_lin"]), "SEQ_CLS", base_model_name_or_path="x")


def test_config_peft_section_is_typed_and_suggests_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: classification\noutput_dir: x\ndata: {path: d}\nmodel: {name_or_path: m, peft: {method: lora, r: 4}}\n")
    config = load_config(path)
    assert config.model.peft == PeftConfig(r=4) and config.model.peft.alpha == 16 and config.model.peft.merge is False
    assert load_config(path, ["model.peft=null"]).model.peft is None
    with pytest.raises(ConfigError, match="model.peft.alhpa.*did you mean 'model.peft.alpha'.*valid here: alpha, dropout"):
        load_config(path, ["model.peft.alhpa=4"])
    with pytest.raises(ConfigError, match="model.peft.method"):
        load_config(path, ["model.peft.method=prefix"])
    with pytest.raises(ConfigError, match="hub.repo_id"):
        load_config(path, ["hub.push=true"])


def test_config_sst2_lora_yaml_loads_with_a_lora_section():
    from pathlib import Path

    from tasks import get_task

    path = Path(__file__).resolve().parents[2] / "configs" / "classification" / "sst2_lora.yaml"
    assert path.read_text().startswith("# Run:  bertpipe train configs/classification/sst2_lora.yaml")
    config = load_config(path, [], lambda name: get_task(name).Options)
    assert config.model.peft == PeftConfig(method="lora", r=8, alpha=16, dropout=0.1, merge=False)
    assert config.train.learning_rate == 1e-3 and config.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2"


def test_modeling_bad_architecture_value_is_a_config_error_naming_the_key():
    from transformers import AutoModelForMaskedLM

    from pipelines.config import ConfigError, ModelConfig
    from pipelines.modeling import load_model

    bad = ModelConfig(model_type="bert", architecture={"hidden_size": 32, "num_attention_heads": 2, "layer_norm_eps": "abc"})
    with pytest.raises(ConfigError, match=r"model.architecture \(model.model_type=bert\): .*layer_norm_eps"):
        load_model(AutoModelForMaskedLM, bad)


def test_modeling_lora_saves_the_running_statistics_of_batch_norm_layers(tmp_path):
    """bertpipe's own BERT with ``norm: batch``: training updates its running mean and variance although
    the base is frozen, and an adapter saved without them reloaded onto the base's old statistics, so
    predict on the run scored other logits than the run's final evaluation (no error)."""
    from models import BertpipeBertConfig, BertpipeForSequenceClassification

    torch.manual_seed(0)
    config = BertpipeBertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                max_position_embeddings=32, norm="batch")
    BertpipeForSequenceClassification(config).save_pretrained(tmp_path / "base")
    model_config = ModelConfig(name_or_path=str(tmp_path / "base"), peft=PeftConfig(r=2, alpha=4, dropout=0.0))
    batch, expected, reloaded = seq_cls_adapter_run(model_config, tmp_path / "run")
    torch.testing.assert_close(outputs_of(reloaded, batch), expected)
    merged = AutoModelForSequenceClassification.from_pretrained(save_merged_model(reloaded, None, tmp_path / "merged"))
    torch.testing.assert_close(outputs_of(merged, batch), expected, rtol=1e-4, atol=1e-5)

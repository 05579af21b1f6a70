"""pipelines/first_position.py: the last layer of a listed sequence classifier computes position 0 only, with
the whole forward's logits and gradients; every other model is left as it is."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    DistilBertConfig,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    ElectraConfig,
    ElectraForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
)

from pipelines import first_position
from pipelines.first_position import last_layer_at_first_position

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=40, num_labels=3)
FAMILIES = {
    "bert": (BertConfig, BertForSequenceClassification, {}),
    "roberta": (RobertaConfig, RobertaForSequenceClassification, {"pad_token_id": 1}),
    "xlm-roberta": (XLMRobertaConfig, XLMRobertaForSequenceClassification, {"pad_token_id": 1}),
    # ELECTRA's embeddings are narrower than its layers (projected up): the swap must not care.
    "electra": (ElectraConfig, ElectraForSequenceClassification, {"embedding_size": 16}),
    # DistilBERT names its sizes and dropouts its own way and puts LayerNorm after each block's residual.
    "distilbert": (DistilBertConfig, DistilBertForSequenceClassification, {"seq_classif_dropout": 0.0}),
}
DISTILBERT_NAMES = {"hidden_size": "dim", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                    "intermediate_size": "hidden_dim", "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout"}


def _classifier(family: str, *, attention: str = "sdpa", hidden_dropout: float = 0.0, attention_dropout: float = 0.0,
                layers: int = 2) -> torch.nn.Module:
    config_class, model_class, extra = FAMILIES[family]
    settings = {**SIZES, "num_hidden_layers": layers, "hidden_dropout_prob": hidden_dropout,
                "attention_probs_dropout_prob": attention_dropout}
    if family == "distilbert":
        settings = {DISTILBERT_NAMES.get(key, key): value for key, value in settings.items()}
    config = config_class(**settings, attn_implementation=attention, **extra)
    torch.manual_seed(0)
    return model_class(config)


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    base = model.base_model
    return base.transformer.layer if hasattr(base, "transformer") else base.encoder.layer


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """Four rows of 9 positions, two of them padded (one down to 2 positions), with labels."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, SIZES["vocab_size"], (4, 9), generator=generator)
    attention_mask = torch.ones(4, 9, dtype=torch.long)
    attention_mask[1, 5:] = 0
    attention_mask[2, 2:] = 0
    input_ids[attention_mask == 0] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": torch.tensor([0, 1, 2, 1])}


def _logits_and_gradients(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    outputs = model(**batch)
    outputs.loss.backward()
    return outputs.logits.detach(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                                     if parameter.grad is not None}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_first_position_gives_the_whole_forwards_logits_and_gradients(family, attention):
    whole = _classifier(family, attention=attention).train()
    first_only = copy.deepcopy(whole)
    assert last_layer_at_first_position(first_only)
    last = _layers(first_only)[-1]
    assert type(last).__name__.startswith("FirstPosition")
    assert type(_layers(first_only)[0]) is type(_layers(whole)[0])  # only the last one

    batch = _batch()
    logits, gradients = _logits_and_gradients(whole, batch)
    seen = []
    last.register_forward_hook(lambda module, args, output: seen.append(tuple(output.shape)))
    first_logits, first_gradients = _logits_and_gradients(first_only, batch)

    assert seen == [(4, 1, SIZES["hidden_size"])]  # the layer really computed one position
    torch.testing.assert_close(first_logits, logits, rtol=1e-5, atol=1e-6)
    assert first_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(first_gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)
    # Every parameter of the last layer still learns: the key and value projections through position 0's attention.
    last_layer = [name for name in gradients if ".layer.1." in name]
    assert len(last_layer) == 16 and all(first_gradients[name].abs().sum() > 0 for name in last_layer)


def test_first_position_keeps_the_last_layers_attention_dropout():
    """A one-layer model whose only dropout is the attention's: training forwards differ from seed to seed, and
    in eval mode the swapped model gives the whole forward's logits."""
    whole = _classifier("bert", attention_dropout=0.5, layers=1)
    first_only = copy.deepcopy(whole)
    assert last_layer_at_first_position(first_only)
    batch = {key: value for key, value in _batch().items() if key != "labels"}
    first_only.train()
    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        draws.append(first_only(**batch).logits.detach())
    assert not torch.allclose(draws[0], draws[1])
    torch.testing.assert_close(first_only.eval()(**batch).logits, whole.eval()(**batch).logits, rtol=1e-5, atol=1e-6)


def test_first_position_under_bf16_autocast_stays_within_bf16_rounding():
    whole = _classifier("bert").train()
    first_only = copy.deepcopy(whole)
    last_layer_at_first_position(first_only)
    batch = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = _logits_and_gradients(whole, batch)
        first_logits, _ = _logits_and_gradients(first_only, batch)
    torch.testing.assert_close(first_logits.float(), logits.float(), rtol=2e-2, atol=2e-2)


def _untouched(model: torch.nn.Module) -> None:
    layer_classes = [type(module) for module in model.modules()]
    assert not last_layer_at_first_position(model)
    assert [type(module) for module in model.modules()] == layer_classes


def test_first_position_leaves_models_whose_heads_read_other_positions_alone():
    config = BertConfig(**SIZES)
    for model_class in (BertForTokenClassification, BertForQuestionAnswering):
        _untouched(model_class(config))
    distilbert = DistilBertConfig(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=64)
    _untouched(DistilBertForTokenClassification(distilbert))

    class MeanPooledClassifier(BertForSequenceClassification):
        """A subclass may read more than position 0 (here it could): only the listed classes themselves qualify."""

    _untouched(MeanPooledClassifier(config))
    _untouched(BertForSequenceClassification(BertConfig(**SIZES, is_decoder=True)))


def test_first_position_looks_through_a_lora_wrapper():
    from peft import LoraConfig, TaskType, get_peft_model

    whole = get_peft_model(_classifier("bert"), LoraConfig(task_type=TaskType.SEQ_CLS, r=4, target_modules=["query", "value"]))
    for name, parameter in whole.named_parameters():
        if "lora_B" in name:  # LoRA starts at zero; make the adapters matter
            torch.nn.init.normal_(parameter, std=0.1)
    first_only = copy.deepcopy(whole)
    assert last_layer_at_first_position(first_only)
    batch = _batch()
    logits, gradients = _logits_and_gradients(whole.train(), batch)
    first_logits, first_gradients = _logits_and_gradients(first_only.train(), batch)
    torch.testing.assert_close(first_logits, logits, rtol=1e-5, atol=1e-6)
    lora = [name for name in gradients if "lora_" in name and ".layer.1." in name]
    assert lora
    for name in lora:
        torch.testing.assert_close(first_gradients[name], gradients[name], rtol=1e-4, atol=1e-6, msg=name)


def test_first_position_model_saves_and_loads_as_its_family(tmp_path):
    whole = _classifier("roberta").eval()
    first_only = copy.deepcopy(whole)
    last_layer_at_first_position(first_only)
    first_only.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(_layers(loaded)[-1]) is type(_layers(whole)[-1])
    assert list(loaded.state_dict()) == list(whole.state_dict())
    batch = {key: value for key, value in _batch().items() if key != "labels"}
    torch.testing.assert_close(loaded(**batch).logits, whole(**batch).logits)


def test_first_position_runs_the_familys_own_forward_where_one_query_does_not_fit(monkeypatch):
    """An attention implementation outside the rule's list: the layer computes every position, as the family does."""
    whole = _classifier("bert").train()
    first_only = copy.deepcopy(whole)
    last_layer_at_first_position(first_only)
    monkeypatch.setattr(first_position, "_ATTENTION_FOR_ONE_QUERY", ("eager",))
    seen = []
    first_only.bert.encoder.layer[-1].register_forward_hook(lambda module, args, output: seen.append(tuple(output.shape)))
    batch = _batch()
    logits, _ = _logits_and_gradients(whole, batch)
    first_logits, _ = _logits_and_gradients(first_only, batch)
    assert seen == [(4, 9, SIZES["hidden_size"])]
    torch.testing.assert_close(first_logits, logits)


def _without_dropout(tiny_bert, folder):
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_training_and_predicting_apply_the_rule_with_the_whole_forwards_results(tmp_path, tiny_bert, sentiment_files, monkeypatch):
    """The loop applies the rule (pipelines/train.py): in fp32 without dropout, a run with it and a run without
    it end with the same weights. Predicting a finished run applies it too (pipelines/evaluation.py), with the
    whole forward's labels and scores."""
    from safetensors.torch import load_file

    from pipelines import train as train_module
    from pipelines.cli import load_run_config
    from tasks import get_task
    from tests.conftest import classification_config

    model_dir = _without_dropout(tiny_bert, tmp_path / "model")
    applied = []

    def run(name: str, apply: bool) -> dict[str, torch.Tensor]:
        monkeypatch.setattr(train_module, "last_layer_at_first_position",
                            lambda model: applied.append((name, last_layer_at_first_position(model) if apply else None)))
        config = load_run_config(get_task, str(classification_config(tmp_path, model_dir, sentiment_files, run_name=name,
                                                                     max_steps=6, eval_steps=3, mixed_precision="no")), [])
        metrics = train_module.train(config, get_task(config.task)(config))
        assert metrics["global_step"] == 6
        return load_file(tmp_path / name / "model.safetensors")

    with_rule, without_rule = run("first", True), run("whole", False)
    assert applied == [("first", True), ("whole", None)]
    assert with_rule.keys() == without_rule.keys()
    for name, weight in without_rule.items():
        torch.testing.assert_close(with_rule[name], weight, rtol=1e-4, atol=1e-5, msg=name)

    from pipelines import evaluation
    from pipelines.config_loading import load_config
    from pipelines.outputs import load_saved_config

    def predict(name: str, apply: bool) -> list[dict]:
        monkeypatch.setattr(evaluation, "last_layer_at_first_position",
                            lambda model: applied.append((name, last_layer_at_first_position(model) if apply else None)))
        config = load_config(None, [], lambda task: get_task(task).Options, base=load_saved_config(tmp_path / "first"))
        output = tmp_path / f"{name}.jsonl"
        evaluation.predict_file(config, get_task(config.task)(config), str(tmp_path / "first"), str(sentiment_files["validation"]), str(output))
        return [json.loads(line) for line in output.read_text().splitlines()]

    predicted, whole = predict("predict-first", True), predict("predict-whole", False)
    assert applied[-2:] == [("predict-first", True), ("predict-whole", None)]
    assert len(predicted) == 37
    assert [row["label"] for row in predicted] == [row["label"] for row in whole]
    # Scores are written to 6 decimals: a last-bit difference may round the sixth either way.
    assert [row["score"] for row in predicted] == pytest.approx([row["score"] for row in whole], abs=1.5e-6)

"""pipelines/labelled_positions.py: a listed masked-LM's forward with labels computes its head at the labelled
positions only, with the family's loss and gradients, and saves as the family's own; without labels it is the
family's forward; every other model is left as it is. (Every encoder family's checkpoint, with its real
tokenizer kind: tests/families/test_families_encoder_tasks.py.)"""

from __future__ import annotations

import copy
import inspect
import json

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForTokenClassification,
    DebertaConfig,
    DebertaForMaskedLM,
    DebertaV2Config,
    DebertaV2ForMaskedLM,
    EncoderDecoderModel,
    GPT2Config,
    GPT2LMHeadModel,
    ModernBertConfig,
    ModernBertForMaskedLM,
    T5Config,
    T5ForConditionalGeneration,
)

from pipelines.labelled_positions import IGNORE_INDEX, head_at_labelled_positions

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=40)


def _bert(model_class=BertForMaskedLM, *, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    return model_class(BertConfig(**SIZES, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """Four rows of 12 positions, two of them padded; about a third of the real positions labelled."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, SIZES["vocab_size"], (4, 12), generator=generator)
    attention_mask = torch.ones(4, 12, dtype=torch.long)
    attention_mask[1, 7:] = 0
    attention_mask[3, 3:] = 0
    labelled = (torch.rand(4, 12, generator=generator) < 0.35) & attention_mask.bool()
    labelled[3, 1] = True
    labels = torch.where(labelled, torch.randint(5, SIZES["vocab_size"], (4, 12), generator=generator), IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _run(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """Loss, the head's logits and every gradient of one forward and backward, dropout seeded alike."""
    model.zero_grad()
    torch.manual_seed(7)
    outputs = model(**batch)
    outputs.loss.backward()
    logits = outputs.prediction_logits if "prediction_logits" in outputs else outputs.logits
    return outputs.loss.detach(), logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _decoder_rows(model: torch.nn.Module) -> list[tuple[int, ...]]:
    """The shapes the decoder (the hidden x vocabulary matmul) is handed, from now on."""
    seen: list[tuple[int, ...]] = []
    model.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    return seen


@pytest.mark.parametrize("model_class", [BertForMaskedLM, BertForPreTraining])
def test_head_at_labelled_positions_gives_the_familys_loss_and_gradients(model_class):
    """In training mode with dropout: the head has none, so one seed draws the same masks in both models."""
    whole = _bert(model_class, dropout=0.1).train()
    narrowed = copy.deepcopy(whole)
    assert head_at_labelled_positions(narrowed)
    assert type(narrowed).__name__ == model_class.__name__ and isinstance(narrowed, model_class)
    batch = _batch()
    if model_class is BertForPreTraining:
        batch["next_sentence_label"] = torch.tensor([0, 1, 1, 0])
    labelled = batch["labels"] != IGNORE_INDEX

    loss, logits, gradients = _run(whole, batch)
    seen = _decoder_rows(narrowed)
    narrowed_loss, narrowed_logits, narrowed_gradients = _run(narrowed, batch)

    assert seen == [(int(labelled.sum()), SIZES["hidden_size"])]  # the head really computed the labelled rows alone
    torch.testing.assert_close(narrowed_loss, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(narrowed_logits, logits[labelled], rtol=1e-5, atol=1e-6)  # row-major order
    assert narrowed_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(narrowed_gradients[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


def test_head_at_labelled_positions_without_labels_is_the_familys_forward():
    whole, narrowed = _bert().eval(), _bert().eval()
    head_at_labelled_positions(narrowed)
    batch = {key: value for key, value in _batch().items() if key != "labels"}
    outputs = narrowed(**batch)
    assert outputs.loss is None and outputs.logits.shape == (4, 12, SIZES["vocab_size"])
    torch.testing.assert_close(outputs.logits, whole(**batch).logits)


def test_head_at_labelled_positions_called_positionally_or_for_a_tuple_is_the_familys_forward():
    """The loop passes keywords; a caller passing inputs by position or asking for a tuple gets the family's call."""
    whole, narrowed = _bert().eval(), _bert().eval()
    head_at_labelled_positions(narrowed)
    batch = _batch()
    positional = narrowed(batch["input_ids"], batch["attention_mask"], labels=batch["labels"])
    assert positional.logits.shape == (4, 12, SIZES["vocab_size"])
    torch.testing.assert_close(positional.loss, whole(**batch).loss)
    as_tuple = narrowed(**batch, return_dict=False)
    assert isinstance(as_tuple, tuple) and as_tuple[1].shape == (4, 12, SIZES["vocab_size"])


def test_head_at_labelled_positions_pretraining_without_next_sentence_labels_has_no_loss_as_the_family():
    whole, narrowed = _bert(BertForPreTraining).eval(), _bert(BertForPreTraining).eval()
    head_at_labelled_positions(narrowed)
    batch = _batch()
    assert whole(**batch).loss is None
    outputs = narrowed(**batch)
    assert outputs.loss is None and outputs.seq_relationship_logits.shape == (4, 2)


def test_head_at_labelled_positions_under_bf16_autocast_stays_within_bf16_rounding():
    whole, narrowed = _bert().train(), _bert().train()
    head_at_labelled_positions(narrowed)
    batch = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = _run(whole, batch)
        narrowed_loss, _, _ = _run(narrowed, batch)
    torch.testing.assert_close(narrowed_loss.float(), loss.float(), rtol=1e-2, atol=1e-2)


def test_head_at_labelled_positions_saves_as_the_familys_own(tmp_path):
    model = _bert()
    keys = list(model.state_dict())
    head_at_labelled_positions(model)
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is BertForMaskedLM
    batch = _batch()
    torch.testing.assert_close(reloaded(**batch).loss, model.eval()(**batch).loss)


def test_head_at_labelled_positions_through_a_lora_wrapper_keeping_the_head_trainable():
    """As the MLM task trains with ``model.peft``: a plain PeftModel, the head in ``modules_to_save``."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules=["query", "value"], modules_to_save=["cls"])
    whole = get_peft_model(_bert(), config).train()
    narrowed = get_peft_model(_bert(), config).train()
    assert head_at_labelled_positions(narrowed)
    batch = _batch()
    loss, _, gradients = _run(whole, batch)
    seen = []
    narrowed.get_base_model().cls.register_forward_hook(lambda module, args, output: seen.append(tuple(output.shape)))
    narrowed_loss, _, narrowed_gradients = _run(narrowed, batch)
    assert seen == [(int((batch["labels"] != IGNORE_INDEX).sum()), SIZES["vocab_size"])]  # peft's copy of the head
    torch.testing.assert_close(narrowed_loss, loss, rtol=1e-6, atol=1e-6)
    assert narrowed_gradients.keys() == gradients.keys() and any("lora_" in name for name in gradients)
    for name, gradient in gradients.items():
        torch.testing.assert_close(narrowed_gradients[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


def test_head_at_labelled_positions_switches_modernberts_own_sparse_prediction_but_not_its_config(tmp_path):
    config = ModernBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=40, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    torch.manual_seed(0)
    whole = ModernBertForMaskedLM(config).eval()
    narrowed = copy.deepcopy(whole)
    assert head_at_labelled_positions(narrowed)
    assert type(narrowed) is ModernBertForMaskedLM and narrowed.config.sparse_prediction is False
    batch = _batch()
    labelled = batch["labels"] != IGNORE_INDEX
    outputs = narrowed(**batch)
    assert outputs.logits.shape == (int(labelled.sum()), 120)
    torch.testing.assert_close(outputs.loss, whole(**batch).loss, rtol=1e-6, atol=1e-6)
    narrowed.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["sparse_prediction"] is False


@pytest.mark.parametrize("config_class, model_class", [(DebertaConfig, DebertaForMaskedLM), (DebertaV2Config, DebertaV2ForMaskedLM)])
def test_head_at_labelled_positions_of_debertas_non_legacy_head(config_class, model_class):
    """DeBERTa's head without ``legacy`` takes the word embeddings as a second input (the family matrix's
    checkpoints are legacy): the hidden states, its first, are the ones narrowed."""
    torch.manual_seed(0)
    whole = model_class(config_class(**SIZES, legacy=False)).eval()
    narrowed = copy.deepcopy(whole)
    assert head_at_labelled_positions(narrowed)
    batch = _batch()
    loss, logits, gradients = _run(whole, batch)
    narrowed_loss, narrowed_logits, narrowed_gradients = _run(narrowed, batch)
    torch.testing.assert_close(narrowed_loss, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(narrowed_logits, logits[batch["labels"] != IGNORE_INDEX], rtol=1e-5, atol=1e-6)
    for name, gradient in gradients.items():
        torch.testing.assert_close(narrowed_gradients[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


def _t5() -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(vocab_size=SIZES["vocab_size"], d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)).eval()


def test_head_at_labelled_positions_of_a_seq2seq_model_keeps_its_signature_and_generation():
    """Generation (evaluation inside the loop) passes no labels: the family's forward; generate() and peft read
    which inputs the model takes from the forward's signature, which stays the family's."""
    whole, narrowed = _t5(), _t5()
    assert head_at_labelled_positions(narrowed)
    assert inspect.signature(narrowed.forward) == inspect.signature(whole.forward)
    source = torch.randint(2, SIZES["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(3))
    generated = narrowed.generate(input_ids=source, attention_mask=torch.ones_like(source), max_new_tokens=5)
    assert torch.equal(generated, whole.generate(input_ids=source, attention_mask=torch.ones_like(source), max_new_tokens=5))
    # Training: target padding (-100) leaves the vocabulary projection; decoder inputs as the collator gives them.
    labels = torch.tensor([[5, 6, 7, 1], [8, 1, IGNORE_INDEX, IGNORE_INDEX]])
    batch = {"input_ids": source, "labels": labels, "decoder_input_ids": whole.prepare_decoder_input_ids_from_labels(labels=labels)}
    loss, logits, gradients = _run(whole, batch)
    narrowed_loss, narrowed_logits, narrowed_gradients = _run(narrowed, batch)
    assert narrowed_logits.shape == (6, SIZES["vocab_size"])
    torch.testing.assert_close(narrowed_loss, loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(narrowed_logits, logits[labels != IGNORE_INDEX], rtol=1e-5, atol=1e-6)
    for name, gradient in gradients.items():
        torch.testing.assert_close(narrowed_gradients[name], gradient, rtol=1e-4, atol=1e-7, msg=name)


def test_head_at_labelled_positions_leaves_an_encoder_decoder_with_an_unlisted_decoder_as_it_is():
    torch.manual_seed(0)
    model = EncoderDecoderModel(encoder=_bert().bert,
                                decoder=GPT2LMHeadModel(GPT2Config(vocab_size=120, n_embd=32, n_layer=1, n_head=4, add_cross_attention=True)))
    assert not head_at_labelled_positions(model)
    assert type(model) is EncoderDecoderModel


def test_head_at_labelled_positions_leaves_every_other_model_as_it_is():
    class Wrapper(torch.nn.Module):  # as distillation's: it compares every position's logits with the teacher's
        def __init__(self):
            super().__init__()
            self.student = _bert()

    torch.manual_seed(0)
    for model in (BertForTokenClassification(BertConfig(**SIZES)), Wrapper()):
        classes = [type(module) for module in model.modules()]
        assert not head_at_labelled_positions(model)
        assert [type(module) for module in model.modules()] == classes

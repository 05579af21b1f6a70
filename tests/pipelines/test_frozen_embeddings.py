"""``model.freeze_input_embeddings`` (:func:`pipelines.modeling.freeze_input_embeddings`): for every family, the
input word embeddings and every weight tied to them stay as loaded through real AdamW updates, and nothing else
is held back; the config refuses the combinations where freezing would be meaningless.

Models are tiny random ones of each family (the family matrix's configs); no tokenizer is needed.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForTokenClassification,
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertLMHeadModel,
    BertModel,
    EncoderDecoderModel,
    M2M100Config,
    M2M100ForConditionalGeneration,
    MarianConfig,
    MarianMTModel,
    T5Config,
    T5ForConditionalGeneration,
)

from pipelines.config import ConfigError, TaskOptions, TrainConfig
from pipelines.config_loading import load_config
from pipelines.modeling import freeze_input_embeddings
from pipelines.optim import build_optimizer
from tests.families.builders import ENCODER_FAMILIES, MLM_FAMILIES, PADDING_DEPENDENT_FAMILIES, _model_config
from tests.pipelines.test_modeling import VOCAB, _Vocabulary

SEQ2SEQ_VOCAB = 50


def _freeze_and_update(model: torch.nn.Module, batch: dict[str, torch.Tensor], frozen: list[torch.nn.Parameter]) -> None:
    """Freezes ``model``'s input embeddings, makes one AdamW update on ``batch``, and checks that exactly the
    ``frozen`` matrices (tied weights included) stayed as they were while the rest of the model trained."""
    trainable = {name: parameter.requires_grad for name, parameter in model.named_parameters()}
    assert all(trainable.values()) or model.config.model_type == "marian"  # Marian's sinusoidal positions never train
    assert freeze_input_embeddings(model) == sum(matrix.numel() for matrix in frozen)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    optimizer = build_optimizer(model, TrainConfig(learning_rate=1e-2))
    model.train()
    model(**batch).loss.backward()
    optimizer.step()
    frozen_ids = {id(parameter) for parameter in frozen}
    for name, parameter in model.named_parameters():
        if id(parameter) in frozen_ids:
            assert not parameter.requires_grad and parameter.grad is None, name
            assert torch.equal(parameter, before[name]), f"{name} moved"
        else:
            assert parameter.requires_grad == trainable[name], f"{name} was frozen too"
    moved = [name for name, parameter in model.named_parameters() if not torch.equal(parameter, before[name])]
    assert len(moved) > len(before) // 2, moved  # the rest of the model did train


def _encoder_model(family: str, auto_class) -> torch.nn.Module:
    if family == "bertpipe":
        from models import BertpipeBertConfig

        config = BertpipeBertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                    max_position_embeddings=32, pad_token_id=_Vocabulary.pad_token_id)
    else:
        config = _model_config(family, _Vocabulary())
    config.num_labels = 3
    torch.manual_seed(0)
    return auto_class.from_config(config)


def _encoder_batch(labels_from_inputs: bool) -> dict[str, torch.Tensor]:
    input_ids = torch.randint(4, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    labels = input_ids.clone() if labels_from_inputs else torch.randint(0, 3, (2, 9), generator=torch.Generator().manual_seed(2))
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}


@pytest.mark.parametrize("family", [*ENCODER_FAMILIES, *PADDING_DEPENDENT_FAMILIES, "bertpipe"])
def test_freeze_input_embeddings_of_a_token_classifier_keeps_the_word_embeddings_alone_as_loaded(family):
    model = _encoder_model(family, AutoModelForTokenClassification)
    _freeze_and_update(model, _encoder_batch(labels_from_inputs=False), [model.get_input_embeddings().weight])


@pytest.mark.parametrize("family", MLM_FAMILIES)
def test_freeze_input_embeddings_of_a_masked_lm_keeps_its_tied_decoder_too(family):
    """A masked-LM decoder tied to the word embeddings is the same matrix: it stays as loaded with them (its bias trains)."""
    model = _encoder_model(family, AutoModelForMaskedLM)
    words = model.get_input_embeddings().weight
    decoder = model.get_output_embeddings()
    if model.config.tie_word_embeddings and decoder is not None and decoder.weight.shape == words.shape:
        assert decoder.weight is words
    _freeze_and_update(model, _encoder_batch(labels_from_inputs=True), [words])


def _seq2seq(kind: str) -> tuple[torch.nn.Module, list[torch.nn.Parameter]]:
    """A tiny model of ``kind`` and the embedding matrices freezing must keep (its encoder's and decoder's)."""
    torch.manual_seed(0)
    shared = dict(vocab_size=SEQ2SEQ_VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=1,
                  eos_token_id=2, decoder_start_token_id=2)
    if kind == "t5":
        model = T5ForConditionalGeneration(T5Config(vocab_size=SEQ2SEQ_VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                                    decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    elif kind == "bart":
        model = BartForConditionalGeneration(BartConfig(bos_token_id=0, **shared))
    elif kind == "marian":
        model = MarianMTModel(MarianConfig(**shared))
    elif kind == "m2m100":
        model = M2M100ForConditionalGeneration(M2M100Config(bos_token_id=0, **shared))
    else:  # bert2bert, untied as configs/translation/multi30k_de_en.yaml: two matrices, the decoder's tied to its LM head
        sizes = dict(vocab_size=SEQ2SEQ_VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=32, pad_token_id=1)
        model = EncoderDecoderModel(encoder=BertModel(BertConfig(**sizes)),
                                    decoder=BertLMHeadModel(BertConfig(**sizes, is_decoder=True, add_cross_attention=True)))
        model.config.decoder_start_token_id, model.config.pad_token_id = 2, 1
        return model, [model.encoder.get_input_embeddings().weight, model.decoder.get_input_embeddings().weight]
    return model, [model.get_input_embeddings().weight]


@pytest.mark.parametrize("kind", ["t5", "bart", "marian", "m2m100", "bert2bert"])
def test_freeze_input_embeddings_of_a_seq2seq_model_keeps_the_encoders_and_decoders(kind):
    model, matrices = _seq2seq(kind)
    output = model.get_output_embeddings()
    # Each family's output projection is the (decoder's) input embeddings, as its released checkpoints have it.
    assert any(output.weight is matrix for matrix in matrices)
    source = torch.randint(3, SEQ2SEQ_VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(3, SEQ2SEQ_VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    _freeze_and_update(model, {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels}, matrices)


def test_freeze_input_embeddings_of_a_model_without_them_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.freeze_input_embeddings: the Linear model names no input embeddings"):
        freeze_input_embeddings(torch.nn.Linear(4, 4))


def test_freeze_input_embeddings_config_refuses_an_adapter(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("task: demo\noutput_dir: runs/x\nmodel:\n  name_or_path: some/model\ndata:\n  path: some/dataset\n")
    with pytest.raises(ConfigError, match=r"model\.freeze_input_embeddings: model\.peft already keeps"):
        load_config(path, ["model.freeze_input_embeddings=true", "model.peft.r=4"], lambda name: TaskOptions)
    assert load_config(path, ["model.freeze_input_embeddings=true"], lambda name: TaskOptions).model.freeze_input_embeddings
    assert not load_config(path, [], lambda name: TaskOptions).model.freeze_input_embeddings

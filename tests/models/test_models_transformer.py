"""The encoder-decoder: teacher forcing, causality, the generation cache, generate(), collator, save/load."""

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq

from models import BertpipeTransformerConfig, BertpipeTransformerForConditionalGeneration, BertpipeTransformerModel
from models.transformer import shift_tokens_right

PAD, START, EOS = 0, 1, 2


def tiny_config(**overrides):
    kwargs = dict(
        vocab_size=10,
        hidden_size=32,
        num_hidden_layers=1,
        num_decoder_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=16,
        pad_token_id=PAD,
        bos_token_id=START,
        eos_token_id=EOS,
        decoder_start_token_id=START,
    )
    kwargs.update(overrides)
    return BertpipeTransformerConfig(**kwargs)


def copy_batch(n, generator, max_len=5):
    """Sources of 3..max_len content tokens (3..9), right-padded; labels = source + EOS, -100 after."""
    lengths = torch.randint(3, max_len + 1, (n,), generator=generator)
    src = torch.full((n, max_len), PAD)
    labels = torch.full((n, max_len + 1), -100)
    for i, length in enumerate(lengths.tolist()):
        tokens = torch.randint(3, 10, (length,), generator=generator)
        src[i, :length] = tokens
        labels[i, :length] = tokens
        labels[i, length] = EOS
    return src, (src != PAD).long(), labels


def test_transformer_shift_tokens_right_builds_teacher_forcing_input():
    labels = torch.tensor([[5, 6, 2, -100], [7, 2, -100, -100]])
    assert shift_tokens_right(labels, PAD, START).tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]


@pytest.mark.parametrize(
    "overrides", [{}, {"norm_placement": "pre", "attention_score": "bilinear", "position_embedding": "learned"}]
)
def test_transformer_decoder_does_not_see_the_future(overrides):
    torch.manual_seed(0)
    model = BertpipeTransformerForConditionalGeneration(tiny_config(**overrides)).eval()
    src = torch.tensor([[3, 4, 5, 6]])
    decoder_input_ids = torch.tensor([[1, 7, 8, 9, 4]])
    changed = decoder_input_ids.clone()
    changed[0, 3:] = torch.tensor([3, 3])
    before = model(input_ids=src, decoder_input_ids=decoder_input_ids).logits
    after = model(input_ids=src, decoder_input_ids=changed).logits
    torch.testing.assert_close(before[:, :3], after[:, :3])
    assert not torch.allclose(before[:, 3:], after[:, 3:])


@pytest.mark.parametrize(
    "overrides",
    [{}, {"norm": "batch", "attention_score": "additive", "norm_placement": "pre", "num_decoder_layers": 2}],
    ids=["default", "batch-additive-pre"],
)
def test_transformer_cached_decoding_equals_full_recompute(overrides):
    torch.manual_seed(0)
    model = BertpipeTransformerForConditionalGeneration(tiny_config(**overrides))
    model.train()(input_ids=torch.randint(3, 10, (4, 5)), labels=torch.randint(3, 10, (4, 5)))  # fill BN running stats
    model.eval()
    src = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    attention_mask = (src != PAD).long()
    target = torch.tensor([[1, 5, 4, 3], [1, 9, 8, 7]])
    full = model(input_ids=src, attention_mask=attention_mask, decoder_input_ids=target, use_cache=False).logits
    encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=attention_mask)
    cache, steps = None, []
    for t in range(target.shape[1]):
        out = model(
            attention_mask=attention_mask,
            encoder_outputs=encoder_outputs,
            decoder_input_ids=target[:, t : t + 1],
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_transformer_learns_copy_task_and_generate_reproduces_inputs():
    torch.manual_seed(0)
    model = BertpipeTransformerForConditionalGeneration(tiny_config())
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(400):
        src, attention_mask, labels = copy_batch(32, generator)
        loss = model(input_ids=src, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05

    model.eval()
    src, attention_mask, _ = copy_batch(12, torch.Generator().manual_seed(123))
    for kwargs in ({}, {"num_beams": 3}, {"use_cache": False}, {"num_beams": 2, "use_cache": False}):
        generated = model.generate(input_ids=src, attention_mask=attention_mask, max_new_tokens=8, **kwargs)
        assert torch.all(generated[:, 0] == START)
        for row in range(src.shape[0]):
            length = int(attention_mask[row].sum())
            assert generated[row, 1 : length + 2].tolist() == src[row, :length].tolist() + [EOS], kwargs


def test_transformer_works_with_data_collator_for_seq2seq(tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    model = BertpipeTransformerForConditionalGeneration(
        tiny_config(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id)
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    features = [
        {"input_ids": [2, 5, 6, 3], "labels": [7, 8, 3]},
        {"input_ids": [2, 9, 3], "labels": [10, 3]},
    ]
    batch = collator(features)
    assert batch["labels"].tolist() == [[7, 8, 3], [10, 3, -100]]
    assert batch["decoder_input_ids"].tolist() == [[START, 7, 8], [START, 10, 3]]
    out = model(**batch)
    assert out.loss.ndim == 0 and out.logits.shape == (2, 3, tokenizer.vocab_size)


def test_transformer_auto_classes_and_save_load_round_trip(tmp_path):
    config = AutoConfig.for_model(
        "bertpipe_transformer",
        vocab_size=10,
        hidden_size=16,
        num_hidden_layers=1,
        num_decoder_layers=3,
        num_attention_heads=2,
        intermediate_size=32,
        norm="batch",
    )
    assert isinstance(config, BertpipeTransformerConfig)
    assert type(AutoModel.from_config(config)) is BertpipeTransformerModel
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert type(model) is BertpipeTransformerForConditionalGeneration
    embeddings = model.model.encoder.embeddings.token_embeddings.weight
    assert model.lm_head.weight is embeddings and model.model.decoder.embeddings.token_embeddings.weight is embeddings
    model.train()(input_ids=torch.randint(3, 10, (4, 5)), labels=torch.randint(3, 10, (4, 5)))
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight is loaded.model.encoder.embeddings.token_embeddings.weight
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    src = torch.tensor([[3, 4, 5, 6]])
    torch.testing.assert_close(
        loaded(input_ids=src, decoder_input_ids=torch.tensor([[1, 4]])).logits,
        model(input_ids=src, decoder_input_ids=torch.tensor([[1, 4]])).logits,
        atol=0,
        rtol=0,
    )
    # Three decoder layers but one encoder layer: the generation cache must be sized for the decoder.
    assert torch.equal(
        loaded.generate(src, max_new_tokens=5, num_beams=2),
        model.generate(src, max_new_tokens=5, num_beams=2, use_cache=False),
    )


def test_transformer_accepts_bert_tokenizer_output_in_forward_and_generate(tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    model = BertpipeTransformerForConditionalGeneration(tiny_config(vocab_size=tokenizer.vocab_size)).eval()
    encoded = tokenizer(["the cat sat", "a dog"], padding=True, return_tensors="pt")
    assert "token_type_ids" in encoded
    assert model(**encoded, labels=encoded["input_ids"]).loss.ndim == 0
    assert model.generate(**encoded, max_new_tokens=3, num_beams=2).shape[0] == 2

"""Fixtures for the models tests: tiny configs, the shared mirror location and a tiny WordPiece tokenizer."""

from pathlib import Path

import pytest
import torch

import models  # noqa: F401  (registers the Auto classes for every test)

MIRROR = Path(__file__).resolve().parents[2] / ".." / "shared" / "mirror"
MINILM = MIRROR / "models" / "sentence-transformers" / "all-MiniLM-L6-v2"

TINY_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a cat dog sat ran on under mat rug big small red blue paris is in london john lives".split()
)


def tiny_bert_kwargs(**overrides):
    kwargs = dict(
        vocab_size=len(TINY_VOCAB),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    kwargs.update(overrides)
    return kwargs


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny matrices: thread hand-offs cost more than they save, badly so on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_kwargs():
    """Factory: tiny architecture keyword arguments (for AutoConfig.for_model) with overrides."""
    return tiny_bert_kwargs


@pytest.fixture
def make_bert_config():
    """Factory: a tiny BertpipeBertConfig with keyword overrides."""
    from models import BertpipeBertConfig

    return lambda **overrides: BertpipeBertConfig(**tiny_bert_kwargs(**overrides))


@pytest.fixture
def batch():
    """Two sequences, the second padded after 4 tokens, with two segments in the first."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, len(TINY_VOCAB), (2, 7), generator=generator)
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[1, 4:] = 0
    input_ids[1, 4:] = 0
    token_type_ids = torch.zeros(2, 7, dtype=torch.long)
    token_type_ids[0, 4:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


@pytest.fixture
def tiny_tokenizer_dir(tmp_path):
    """A saved WordPiece tokenizer over TINY_VOCAB, built offline."""
    from transformers import BertTokenizer

    tokenizer = BertTokenizer(vocab={token: index for index, token in enumerate(TINY_VOCAB)})
    out = tmp_path / "tokenizer"
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def minilm():
    if not MINILM.is_dir():
        pytest.skip(f"shared mirror absent: {MINILM}")
    return MINILM

"""Toy parallel data and a tiny Marian checkpoint for the translation tests (nothing from the network)."""

from __future__ import annotations

import random
from pathlib import Path

# Whole words of the conftest WordPiece corpus: each is one token of build_tiny_bert's vocabulary.
TOY_WORDS = ["film", "story", "plot", "actors", "scenes", "very"]


def copy_rows(count: int, seed: int, *, reverse: bool = False) -> list[dict[str, str]]:
    """``de`` = 2-4 random words, ``en`` = the same words (or reversed): a task a 2-layer model learns fast."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        words = [rng.choice(TOY_WORDS) for _ in range(rng.randint(2, 4))]
        rows.append({"de": " ".join(words), "en": " ".join(reversed(words) if reverse else words)})
    return rows


def build_tiny_marian(directory: Path) -> Path:
    """A 1-layer MarianMTModel (d_model 16) with a word-level fast tokenizer (MarianTokenizer needs sentencepiece)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import MarianConfig, MarianMTModel, PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>"] + "der ein die film war gut schlecht the a film was good bad".split()
    vocab = {word: index for index, word in enumerate(dict.fromkeys(words))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    config = MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=1,
    )
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def wmt_rows(count: int, seed: int) -> list[dict]:
    """WMT layout: a ``translation`` column of {lang: text} dicts."""
    rng = random.Random(seed)
    pairs = [("der film war gut", "the film was good"), ("ein film war schlecht", "a film was bad"), ("die film", "the film")]
    return [{"translation": dict(zip(("de", "en"), rng.choice(pairs)))} for _ in range(count)]

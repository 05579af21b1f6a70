"""Tokenizers for masked-LM: a WordPiece tokenizer trained on the corpus, and any tokenizer's special-token template.

In:  corpus texts and the vocabulary options (:func:`train_wordpiece_tokenizer`); a fast tokenizer
     (:func:`special_template`).
Out: a BERT WordPiece ``BertTokenizerFast`` (``[PAD] [UNK] [CLS] [SEP] [MASK]``); a :class:`SpecialTemplate`
     saying where the tokenizer puts its special tokens around one or two segments, so packed blocks
     and sentence pairs are framed as the tokenizer itself would frame them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from transformers import PreTrainedTokenizerBase

from pipelines.errors import ModelError

DEFAULT_VOCAB_SIZE = 30522
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece_tokenizer(
    texts: Iterable[str], *, vocab_size: int, lowercase: bool, min_frequency: int, model_max_length: int
):
    """A BERT WordPiece tokenizer (``[PAD] [UNK] [CLS] [SEP] [MASK]``) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIAL_TOKENS, min_frequency=min_frequency)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return BertTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length, do_lower_case=lowercase)


@dataclass(frozen=True)
class SpecialTemplate:
    """Where a tokenizer puts its special tokens around one or two segments, and their segment ids."""

    prefix: list[int]
    middle: list[int]
    suffix: list[int]
    type_a: int = 0
    type_b: int = 1

    @property
    def single_overhead(self) -> int:
        return len(self.prefix) + len(self.suffix)

    @property
    def pair_overhead(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)

    def single(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """(input_ids, special_tokens_mask) of one segment."""
        return self.prefix + ids + self.suffix, [1] * len(self.prefix) + [0] * len(ids) + [1] * len(self.suffix)

    def pair(self, a: list[int], b: list[int]) -> tuple[list[int], list[int], list[int]]:
        """(input_ids, token_type_ids, special_tokens_mask) of a segment pair."""
        ids = self.prefix + a + self.middle + b + self.suffix
        types = [self.type_a] * (len(self.prefix) + len(a) + len(self.middle)) + [self.type_b] * (len(b) + len(self.suffix))
        special = [1] * len(self.prefix) + [0] * len(a) + [1] * len(self.middle) + [0] * len(b) + [1] * len(self.suffix)
        return ids, types, special


def special_template(tokenizer: PreTrainedTokenizerBase) -> SpecialTemplate:
    """Read the special-token template off the tokenizer by encoding two probe words with and without it."""
    a = tokenizer("a", add_special_tokens=False)["input_ids"]
    b = tokenizer("b", add_special_tokens=False)["input_ids"]
    single = tokenizer("a")["input_ids"]
    paired = tokenizer("a", "b")
    pair_ids, pair_types = paired["input_ids"], paired.get("token_type_ids") or [0] * len(paired["input_ids"])
    start = _find(single, a)
    prefix, suffix = single[:start], single[start + len(a):]
    a_at = _find(pair_ids, a)
    b_at = _find(pair_ids, b, a_at + len(a))
    if pair_ids[:a_at] != prefix or pair_ids[b_at + len(b):] != suffix:
        # Tokenizers whose pair template differs at the ends (rare) still get the pair's own ends.
        prefix, suffix = pair_ids[:a_at], pair_ids[b_at + len(b):]
    return SpecialTemplate(prefix, pair_ids[a_at + len(a):b_at], suffix, pair_types[a_at], pair_types[b_at])


def _find(haystack: list[int], needle: list[int], start: int = 0) -> int:
    for i in range(start, len(haystack) - len(needle) + 1):
        if haystack[i:i + len(needle)] == needle:
            return i
    raise ModelError("could not locate the text among the special tokens of the tokenizer's template")

"""Tiny random checkpoints of every model family a user brings, each with the tokenizer kind it really uses.

In:  a family name (``FAMILIES``) and an empty folder.
Out: the folder holding a 2-layer (hidden 32) random model of that family and its tokenizer, both saved
     with ``save_pretrained`` so that ``AutoTokenizer``/``AutoModel*``/``pipeline()`` load them exactly as
     they would load the real checkpoint. Nothing touches the network.

Tokenizers are trained with the ``tokenizers`` library on :func:`family_corpus` (a vocabulary small enough
that names and long words split into several pieces, which is where the defects live) and wrapped in the
family's own transformers 5 class, built the way ``from_pretrained`` builds it from a converted checkpoint:
  * WordPiece (BERT, DistilBERT, ELECTRA, MobileBERT): ``BertTokenizer``/``DistilBertTokenizer`` over a backend whose
    vocabulary is written out, not trained (``_wordpiece_backend`` says why; transformers 5's ``MobileBertTokenizer``
    is ``BertTokenizer``);
    MPNet: ``MPNetTokenizer(vocab=...)`` with its RoBERTa-style ``<s> A </s></s> B </s>``; Funnel:
    ``FunnelTokenizer(vocab=...)`` (``<cls>`` of token type 2);
  * byte-level BPE (RoBERTa, BART, Longformer): ``RobertaTokenizer(vocab=..., merges=...)`` (transformers 5 has no
    ``LongformerTokenizer``: longformer maps to RoBERTa's); DeBERTa (v1):
    ``DebertaTokenizer(vocab=..., merges=...)`` with GPT-2's pieces and BERT-style ``[CLS]``/``[SEP]``
    (``[PAD] [CLS] [SEP] [UNK]`` first and ``[MASK]`` last, as microsoft/deberta-base's vocabulary);
  * byte-level BPE behind the generic ``PreTrainedTokenizerFast`` (ModernBERT's tokenizer.json: BERT-style
    special tokens, a template post-processor that does not trim offsets);
  * Unigram (ALBERT, DeBERTa-v2/v3, XLM-R, XLNet, T5, mBART, BigBird): the class from ``vocab=[(piece, score), ...]``,
    which sets the family's own normalizer, Metaspace pre-tokenizer and special-token template (mBART adds
    its language codes; XLNet puts ``<sep> <cls>`` last and pads on the left; BigBird, as
    google/bigbird-roberta-base, has ``<pad> <s> </s>`` first but frames texts with ``[CLS]``/``[SEP]``, and
    turns runs of spaces into one ``▁``);
  * Pegasus: ``PegasusTokenizer(vocab=[(piece, score), ...])`` (Unigram, ``</s>`` appended, nothing prepended)
    over the converted google/pegasus-* layout: ``<pad> </s> <mask_1> <mask_2>``, 101 reserved ``<unk_x>``
    tokens, ``<unk>`` at id 105, then the pieces;
  * sentencepiece BPE (NLLB): ``NllbTokenizer(vocab={piece: id}, merges=[...])`` over pieces with the ``▁``
    word-start marker (the real ``sentencepiece.bpe.model``), fairseq's ``<s> <pad> </s> <unk>`` first, the
    202 language codes (``deu_Latn``...) and ``<mask>`` last; sources are ``deu_Latn text </s>``, targets
    ``eng_Latn text </s>``;
  * Marian: ``MarianTokenizer`` exists only as a slow sentencepiece tokenizer (``source.spm``/``target.spm``
    + ``vocab.json``), so it is trained with the ``sentencepiece`` library; without that package the Marian
    family is skipped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ENCODER_FAMILIES = ["bert", "roberta", "distilbert", "electra", "albert", "deberta-v2", "xlm-roberta", "modernbert", "mpnet", "xlnet",
                    "deberta", "longformer", "big_bird", "mobilebert"]
# ModernBERT bodies behind the tokenizer kinds of newer encoders, whose pre-split words need a prepended space:
# EuroBERT's Llama 3 tokenizer (a regex Split before byte-level BPE, the generic class) and mmBERT's Gemma tokenizer
# (spaces turned into "▁" by the normalizer, GemmaTokenizer, no CLS token, padding on the left). Checked where words
# arrive pre-split (NER) and where a head reads one position (classification, QA).
WORD_SPACE_FAMILIES = ["modernbert-llama3", "modernbert-gemma"]
MLM_FAMILIES = [family for family in ENCODER_FAMILIES if family != "xlnet"]  # XLNet pretrains by permutation LM
# Outputs that change when an example is padded (Funnel pools neighbouring positions): checked where padding
# matters, since transformers' own Funnel fails on inputs of one or two pieces that other cells feed it.
PADDING_DEPENDENT_FAMILIES = ["funnel"]
SEQ2SEQ_FAMILIES = ["t5", "bart", "marian", "mbart", "nllb", "bert2bert", "pegasus", "m2m100"]
FAMILIES = ENCODER_FAMILIES + PADDING_DEPENDENT_FAMILIES + SEQ2SEQ_FAMILIES
TOKENIZER_KIND = {
    "bert": "WordPiece", "distilbert": "WordPiece", "electra": "WordPiece", "bert2bert": "WordPiece",
    "roberta": "byte-level BPE", "bart": "byte-level BPE", "deberta": "byte-level BPE", "modernbert": "byte-level BPE (generic class)",
    "longformer": "byte-level BPE", "big_bird": "Unigram", "mobilebert": "WordPiece",
    "albert": "Unigram", "deberta-v2": "Unigram", "xlm-roberta": "Unigram", "t5": "Unigram", "mbart": "Unigram", "pegasus": "Unigram",
    "mpnet": "WordPiece", "xlnet": "Unigram", "funnel": "WordPiece",
    "marian": "sentencepiece (slow)", "nllb": "sentencepiece BPE", "m2m100": "sentencepiece BPE (slow)",
    "modernbert-llama3": "regex Split + byte-level BPE (generic class)", "modernbert-gemma": "BPE over '▁' (GemmaTokenizer)",
}
# The architecture (``config.model_type``) of families whose name is not it.
MODEL_TYPE = {"bert2bert": "bert", "nllb": "m2m_100", "m2m100": "m2m_100"}

# Words of the toy tasks. Names and places are long and rare enough in the corpus to be cut into pieces.
PERSONS = ["Alice", "Roberto", "Marguerite", "Bob", "Anastasia", "Kowalski"]
PLACES = ["Paris", "Berlin", "Copenhagen", "Rome", "Valparaiso", "Montevideo"]
WORDPIECE_VOCAB = 140  # every common word whole, every name in pieces
FILLER = ["the", "man", "visited", "met", "saw", "in", "with", "and", "today", "yesterday", "was", "a", "film",
          "very", "good", "bad", "story", "lives", "works", "where", "does", "who", "is", "of", "."]
GERMAN = {"the": "der", "man": "mann", "film": "film", "was": "war", "good": "gut", "bad": "schlecht", "a": "ein",
          "story": "geschichte", "very": "sehr", "today": "heute"}


def family_corpus(count: int = 600, seed: int = 0) -> list[str]:
    """Running text over every word the toy tasks use (English, German and the names), names kept rare."""
    rng = random.Random(seed)
    common = FILLER + list(GERMAN.values())
    lines = []
    for index in range(count):
        words = [rng.choice(common) for _ in range(rng.randint(4, 12))]
        if index % 40 == 0:  # every name appears, but too rarely to become a single piece
            words.insert(rng.randint(0, len(words)), (PERSONS + PLACES)[index // 40 % 12])
        lines.append(" ".join(words))
    return lines


# ----- tokenizer backends -------------------------------------------------------------------------
def _wordpiece_backend(special: list[str], *, template: bool = True):
    from tokenizers import processors

    from tests.conftest import written_wordpiece

    # Every common word whole, every name in pieces (letters); written out, not trained (see written_wordpiece).
    tokenizer = written_wordpiece(family_corpus(), special, split={name.lower() for name in PERSONS + PLACES})
    if not template:
        return tokenizer
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    from tokenizers import decoders

    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _byte_level_bpe(special: list[str]):
    """A byte-level BPE trained like RoBERTa's/GPT-2's (no prefix space: words after a space carry ``Ġ``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(family_corpus(), trainer)
    return tokenizer


def _bpe_vocab_merges(tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    model = json.loads(tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def _unigram_vocab(special: list[str], *, lowercase: bool = False) -> list[tuple[str, float]]:
    """(piece, log-probability) pairs, the special tokens first in the order the family's class expects.

    The pieces are estimated from the corpus counts, as a sentencepiece Unigram model is: every frequent
    word as one ``▁word`` piece, frequent 2-3 character substrings, and every character. (``tokenizers``'
    UnigramTrainer prunes this small corpus down to ~75 mostly single-character pieces, which would make
    every word a multi-piece word and hide the first-piece/whole-word distinction the tests need.)
    """
    import math
    from collections import Counter

    counts: Counter[str] = Counter()
    for line in family_corpus():
        for word in (line.lower() if lowercase else line).split():
            counts["▁" + word] += 1
            marked = "▁" + word
            for size in (1, 2, 3):
                counts.update(marked[i : i + size] for i in range(len(marked) - size + 1) if i > 0 or size > 1)
    pieces = {piece: count for piece, count in counts.items() if len(piece) == 1 or count >= 20 or (len(piece) == 2 and piece[0] == "▁")}
    pieces.setdefault("▁", 1)
    total = sum(pieces.values())
    scored = sorted(((piece, math.log(count / total)) for piece, count in pieces.items()), key=lambda item: -item[1])
    return [(token, 0.0) for token in special] + scored


def _unk_index(special: list[str]) -> int:
    return next(i for i, token in enumerate(special) if "unk" in token.lower())


def build_tokenizer(family: str):
    """The family's tokenizer (a transformers tokenizer object, not yet saved)."""
    from transformers import AlbertTokenizer, BertTokenizer, DebertaV2Tokenizer, DistilBertTokenizer, MBartTokenizer
    from transformers import PreTrainedTokenizerFast, RobertaTokenizer, T5Tokenizer, XLMRobertaTokenizer

    bert_special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if family in ("bert", "electra", "bert2bert", "mobilebert"):  # transformers' MobileBertTokenizer is BertTokenizer
        return BertTokenizer(tokenizer_object=_wordpiece_backend(bert_special), model_max_length=128)
    if family == "distilbert":
        return DistilBertTokenizer(tokenizer_object=_wordpiece_backend(bert_special), model_max_length=128)
    if family in ("roberta", "bart", "longformer"):  # allenai/longformer-* ship RoBERTa's tokenizer files
        vocab, merges = _bpe_vocab_merges(_byte_level_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]))
        return RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=128)
    if family == "deberta":
        from transformers import DebertaTokenizer

        vocab, merges = _bpe_vocab_merges(_byte_level_bpe(["[PAD]", "[CLS]", "[SEP]", "[UNK]"]))
        vocab["[MASK]"] = len(vocab)
        return DebertaTokenizer(vocab=vocab, merges=merges, model_max_length=128)
    if family == "modernbert":
        from tokenizers import processors

        backend = _byte_level_bpe(["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"])
        cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
        backend.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
            mask_token="[MASK]", model_max_length=128, model_input_names=["input_ids", "attention_mask"],
        )
    if family == "modernbert-llama3":
        return _llama3_tokenizer()
    if family == "modernbert-gemma":
        return _gemma_tokenizer()
    if family == "mpnet":  # WordPiece pieces, RoBERTa-style <s> </s></s> pairs
        from transformers import MPNetTokenizer

        vocab = _wordpiece_backend(["<s>", "<pad>", "</s>", "[UNK]", "<mask>"], template=False).get_vocab()
        return MPNetTokenizer(vocab=vocab, model_max_length=128)
    if family == "xlnet":  # Unigram; <cls> last, padding on the left
        from transformers import XLNetTokenizer

        return XLNetTokenizer(vocab=_unigram_vocab(["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"]), model_max_length=128)
    if family == "funnel":  # WordPiece; <cls> gets token type 2
        from transformers import FunnelTokenizer

        vocab = _wordpiece_backend(["<pad>", "<unk>", "<cls>", "<sep>", "<mask>", "<s>", "</s>"], template=False).get_vocab()
        return FunnelTokenizer(vocab=vocab, unk_token="<unk>", model_max_length=128)
    if family == "albert":
        return AlbertTokenizer(vocab=_unigram_vocab(["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"], lowercase=True), model_max_length=128)
    if family == "deberta-v2":
        special = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # DeBERTa-v3's spm order
        return DebertaV2Tokenizer(vocab=_unigram_vocab(special), unk_id=3, model_max_length=128)
    if family == "big_bird":
        from transformers import BigBirdTokenizer

        return BigBirdTokenizer(vocab=_unigram_vocab(["<pad>", "<s>", "</s>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]), model_max_length=128)
    if family == "xlm-roberta":
        return XLMRobertaTokenizer(vocab=_unigram_vocab(["<s>", "<pad>", "</s>", "<unk>", "<mask>"]), model_max_length=128)
    if family == "t5":
        return T5Tokenizer(vocab=_unigram_vocab(["<pad>", "</s>", "<unk>"]), extra_ids=0, model_max_length=128)
    if family == "mbart":
        from transformers.models.mbart.tokenization_mbart import FAIRSEQ_LANGUAGE_CODES

        vocab = _unigram_vocab(["<s>", "<pad>", "</s>", "<unk>"])
        vocab += [(code, 0.0) for code in FAIRSEQ_LANGUAGE_CODES] + [("<mask>", 0.0)]
        return MBartTokenizer(vocab=vocab, src_lang="de_DE", tgt_lang="en_XX", model_max_length=128)
    if family == "pegasus":
        return _pegasus_tokenizer()
    if family == "nllb":
        return _nllb_tokenizer()
    if family == "marian":
        return _marian_tokenizer()
    if family == "m2m100":
        return _m2m100_tokenizer()
    raise KeyError(family)


def _llama3_tokenizer():
    """Llama 3's layout (EuroBERT ships it): a regex ``Split`` isolates words with their leading space, then byte-level
    BPE without a prefix space; ``<|begin_of_text|> $A <|end_of_text|>``; the generic class."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|mask|>"]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(family_corpus(), trainers.BpeTrainer(vocab_size=420, special_tokens=special,
                                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = backend.token_to_id(special[0]), backend.token_to_id(special[1])
    backend.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{special[0]} $A {special[1]}", pair=f"{special[0]} $A {special[1]} $B {special[1]}",
                                      special_tokens=[(special[0], bos), (special[1], eos)]),
    ])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=special[0], eos_token=special[1], cls_token=special[0],
                                   sep_token=special[1], pad_token=special[2], mask_token=special[3], model_max_length=128,
                                   model_input_names=["input_ids", "attention_mask"])


def _gemma_tokenizer():
    """Gemma's layout (mmBERT ships it): ``GemmaTokenizer`` from BPE pieces that carry ``▁`` for the space before a
    word (its normalizer turns spaces into ``▁``; no pre-tokenizer splits words), byte fallback, no CLS token, padding
    on the left (the class's default, saved in tokenizer_config.json)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="▁", behavior="merged_with_next")  # sentencepiece: no piece across words
    backend.train_from_iterator(family_corpus(), trainers.BpeTrainer(vocab_size=160, special_tokens=special))  # names in pieces
    vocab, merges = _bpe_vocab_merges(backend)
    for byte in range(256):  # byte fallback's pieces, as Gemma's vocabulary holds them: "," is <0x2C>, not <unk>
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=128, padding_side="left")  # the class's own default, saved


def _pegasus_tokenizer():
    """Pegasus's Unigram as transformers' converter lays out google/pegasus-*: ``<pad> </s> <mask_1> <mask_2>``, the
    pretraining-only ``<unk_2>``...``<unk_102>`` (ids 4-104, score -100), ``<unk>`` at the ``offset`` of 103 + 2, then the pieces."""
    from transformers import PegasusTokenizer

    offset = 103
    reserved = [("<pad>", 0.0), ("</s>", 0.0), ("<mask_1>", 0.0), ("<mask_2>", 0.0)] + [(f"<unk_{i}>", -100.0) for i in range(2, offset)]
    vocab = reserved + _unigram_vocab(["<unk>"])
    assert vocab.index(("<unk>", 0.0)) == offset + 2
    return PegasusTokenizer(vocab=vocab, offset=offset, model_max_length=128)


def _nllb_tokenizer():
    """NLLB's sentencepiece BPE as its transformers 5 class builds it from a converted checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import NllbTokenizer
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    special = ["<s>", "<pad>", "</s>", "<unk>"]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.train_from_iterator(family_corpus(), trainers.BpeTrainer(vocab_size=WORDPIECE_VOCAB, special_tokens=special))
    vocab, merges = _bpe_vocab_merges(backend)
    for token in [*FAIRSEQ_LANGUAGE_CODES, "<mask>"]:
        vocab[token] = len(vocab)
    return NllbTokenizer(vocab=vocab, merges=merges, src_lang="deu_Latn", tgt_lang="eng_Latn", model_max_length=128)


def _marian_tokenizer():
    import tempfile

    import sentencepiece as spm
    from transformers import MarianTokenizer

    # The tokenizer keeps the sentencepiece model in memory (and saves it from there): its files need not outlive it.
    with tempfile.TemporaryDirectory(prefix="tiny-marian-spm-") as name:
        folder = Path(name)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(family_corpus()), model_prefix=str(folder / "spm"), vocab_size=160, model_type="unigram",
            pad_id=-1, unk_id=1, bos_id=-1, eos_id=0, eos_piece="</s>", hard_vocab_limit=False, character_coverage=1.0, minloglevel=2,
        )
        vocab = {"</s>": 0, "<unk>": 1}
        for line in (folder / "spm.vocab").read_text().splitlines():
            vocab.setdefault(line.split("\t")[0], len(vocab))
        vocab["<pad>"] = len(vocab)
        (folder / "vocab.json").write_text(json.dumps(vocab))
        model_file = str(folder / "spm.model")
        return MarianTokenizer(model_file, model_file, str(folder / "vocab.json"), source_lang="de", target_lang="en")


def _m2m100_tokenizer():
    """facebook/m2m100_418M's layout: a sentencepiece BPE model and fairseq's dictionary as ``vocab.json``."""
    import tempfile

    import sentencepiece as spm
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    with tempfile.TemporaryDirectory(prefix="tiny-m2m100-spm-") as name:
        folder = Path(name)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(family_corpus()), model_prefix=str(folder / "spm"), vocab_size=WORDPIECE_VOCAB, model_type="bpe",
            hard_vocab_limit=False, character_coverage=1.0, minloglevel=2,
        )
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for line in (folder / "spm.vocab").read_text().splitlines():
            vocab.setdefault(line.split("\t")[0], len(vocab))
        (folder / "vocab.json").write_text(json.dumps(vocab))
        # The Hub checkpoint's tokenizer_config lists the codes as special tokens; transformers 5's class would
        # not make them special by itself (so they would decode into the text).
        codes = [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
        return M2M100Tokenizer(str(folder / "vocab.json"), str(folder / "spm.model"), src_lang="de", tgt_lang="en",
                               additional_special_tokens=codes, model_max_length=128)


# ----- models -------------------------------------------------------------------------------------
def _model_config(family: str, tokenizer):
    import transformers as tf

    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    vocab = len(tokenizer)
    ids = dict(pad_token_id=tokenizer.pad_token_id)
    if family in ("bert", "bert2bert"):
        return tf.BertConfig(vocab_size=vocab, max_position_embeddings=128, **size, **ids)
    if family == "distilbert":
        return tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=128, **ids)
    if family == "electra":
        return tf.ElectraConfig(vocab_size=vocab, embedding_size=16, max_position_embeddings=128, **size, **ids)
    if family == "roberta":
        return tf.RobertaConfig(vocab_size=vocab, max_position_embeddings=130, bos_token_id=0, eos_token_id=2, **size, **ids)
    if family == "longformer":  # as allenai/longformer-base-4096: RoBERTa's positions; windows shrunk to the tiny inputs
        return tf.LongformerConfig(vocab_size=vocab, max_position_embeddings=130, attention_window=[8, 8], bos_token_id=0,
                                   eos_token_id=2, sep_token_id=tokenizer.sep_token_id, **size, **ids)
    if family == "mobilebert":
        # As google/mobilebert-uncased, shrunk: a 16-wide bottleneck inside a 32-wide body, 4 feed-forward networks per
        # layer, NoNorm instead of LayerNorm, trigram input embeddings of 16 projected to 32, shared query/key bottleneck.
        return tf.MobileBertConfig(
            vocab_size=vocab, max_position_embeddings=128, embedding_size=16, intra_bottleneck_size=16, use_bottleneck=True,
            use_bottleneck_attention=False, key_query_shared_bottleneck=True, num_feedforward_networks=4,
            normalization_type="no_norm", trigram_input=True, classifier_activation=False, **size, **ids,
        )
    if family == "big_bird":
        # As google/bigbird-roberta-base (block-sparse attention, 3 random blocks), with blocks of 8 pieces instead of
        # 64: inputs longer than (5 + 2 * 3) * 8 = 88 pieces run block-sparse, shorter ones fall back to full attention.
        # As the real threshold (704) lies above the usual data.max_seq_length (512), this one lies above the matrix's
        # 64; test_families_big_bird.py runs inputs on both sides of a lower one.
        return tf.BigBirdConfig(vocab_size=vocab, max_position_embeddings=128, attention_type="block_sparse", block_size=8,
                                num_random_blocks=3, bos_token_id=1, eos_token_id=2,  # <pad> <s> </s> first
                                sep_token_id=tokenizer.sep_token_id, **size, **ids)
    if family == "xlm-roberta":
        return tf.XLMRobertaConfig(vocab_size=vocab, max_position_embeddings=130, bos_token_id=0, eos_token_id=2, **size, **ids)
    if family == "mpnet":
        return tf.MPNetConfig(vocab_size=vocab, max_position_embeddings=130, bos_token_id=0, eos_token_id=2, **size, **ids)
    if family == "xlnet":
        return tf.XLNetConfig(vocab_size=vocab, d_model=32, n_layer=2, n_head=2, d_inner=64, bos_token_id=1, eos_token_id=2, **ids)
    if family == "funnel":
        return tf.FunnelConfig(vocab_size=vocab, block_sizes=[1, 1], d_model=32, n_head=2, d_head=16, d_inner=64, num_decoder_layers=1,
                               max_position_embeddings=128, **ids)
    if family == "albert":
        return tf.AlbertConfig(vocab_size=vocab, embedding_size=16, max_position_embeddings=128, **size, **ids)
    if family == "deberta-v2":  # v3 layout: relative positions, no absolute position embedding
        return tf.DebertaV2Config(
            vocab_size=vocab, max_position_embeddings=128, relative_attention=True, position_buckets=32,
            pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm", share_att_key=True, **size, **ids,
        )
    if family == "deberta":  # as microsoft/deberta-base: relative attention both ways, no absolute positions, no token types
        return tf.DebertaConfig(
            vocab_size=vocab, max_position_embeddings=128, relative_attention=True, pos_att_type=["c2p", "p2c"],
            max_relative_positions=-1, position_biased_input=False, type_vocab_size=0, **size, **ids,
        )
    if family in ["modernbert"] + WORD_SPACE_FAMILIES:
        return tf.ModernBertConfig(
            vocab_size=vocab, max_position_embeddings=128, global_attn_every_n_layers=2, local_attention=16,
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id, **size, **ids,
        )
    seq2seq = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                   encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128)
    if family == "t5":
        return tf.T5Config(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, decoder_start_token_id=0,
                           eos_token_id=tokenizer.eos_token_id, **ids)
    if family == "bart":
        return tf.BartConfig(vocab_size=vocab, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
                             **seq2seq, **ids)
    if family == "mbart":
        return tf.MBartConfig(vocab_size=vocab, bos_token_id=0, eos_token_id=2, forced_eos_token_id=2, **seq2seq, **ids)
    if family == "nllb":  # as facebook/nllb-200-distilled-600M: the decoder starts with </s>, not a language code
        return tf.M2M100Config(vocab_size=vocab, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, scale_embedding=True,
                               **seq2seq, **ids)
    if family == "m2m100":  # as facebook/m2m100_418M: the decoder starts with </s>, then the target code
        # Rows for the language codes and the 8 made-up words after them, which len(tokenizer) does not count.
        vocab = tokenizer.vocab_size + len(tokenizer.lang_token_to_id) + tokenizer.num_madeup_words
        return tf.M2M100Config(vocab_size=vocab, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, scale_embedding=True,
                               **seq2seq, **ids)
    if family == "pegasus":  # as google/pegasus-*: the decoder starts with <pad>; sinusoidal positions, scaled embeddings
        return tf.PegasusConfig(vocab_size=vocab, eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
                                forced_eos_token_id=tokenizer.eos_token_id, scale_embedding=True, **seq2seq, **ids)
    if family == "marian":
        return tf.MarianConfig(vocab_size=vocab, decoder_start_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                               forced_eos_token_id=tokenizer.eos_token_id, **seq2seq, **ids)
    raise KeyError(family)


def build_family(family: str, directory: Path) -> Path:
    """Save ``family``'s tiny random checkpoint (base model or seq2seq LM) and tokenizer into ``directory``."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    tokenizer = build_tokenizer(family)
    config = _model_config(family, tokenizer)
    torch.manual_seed(0)
    if family in SEQ2SEQ_FAMILIES and family != "bert2bert":
        model = AutoModelForSeq2SeqLM.from_config(config)
    elif family == "xlnet":
        model = AutoModelForCausalLM.from_config(config)  # XLNet is pretrained by permutation LM, not MLM
    elif family in ENCODER_FAMILIES + PADDING_DEPENDENT_FAMILIES + WORD_SPACE_FAMILIES:
        model = AutoModelForMaskedLM.from_config(config)  # released encoders carry their MLM head
    else:
        model = AutoModel.from_config(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory

"""The builder gives each family its real tokenizer class and kind, loadable as the Hub checkpoint would be."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoTokenizer

from tests.families.builders import FAMILIES, MODEL_TYPE, TOKENIZER_KIND

EXPECTED_CLASS = {
    "bert": "BertTokenizer", "distilbert": "DistilBertTokenizer", "electra": "BertTokenizer", "bert2bert": "BertTokenizer",
    "roberta": "RobertaTokenizer", "bart": "RobertaTokenizer", "modernbert": "TokenizersBackend",
    "albert": "AlbertTokenizer", "deberta-v2": "DebertaV2Tokenizer", "xlm-roberta": "XLMRobertaTokenizer",
    "t5": "T5Tokenizer", "mbart": "MBartTokenizer", "marian": "MarianTokenizer", "mpnet": "MPNetTokenizer", "xlnet": "XLNetTokenizer",
    "funnel": "FunnelTokenizer", "nllb": "NllbTokenizer", "deberta": "DebertaTokenizer",
    "longformer": "RobertaTokenizer", "pegasus": "PegasusTokenizer",
    "m2m100": "M2M100Tokenizer", "big_bird": "BigBirdTokenizer", "mobilebert": "BertTokenizer",
}
BACKEND_MODEL = {"WordPiece": "WordPiece", "byte-level BPE": "BPE", "byte-level BPE (generic class)": "BPE", "Unigram": "Unigram",
                 "sentencepiece BPE": "BPE"}


@pytest.mark.parametrize("family", FAMILIES)
def test_families_checkpoint_loads_with_its_tokenizer_kind(family, family_checkpoint):
    folder = family_checkpoint(family)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(tokenizer).__name__ == EXPECTED_CLASS[family]
    assert AutoConfig.from_pretrained(folder).model_type == MODEL_TYPE.get(family, family)
    kind = TOKENIZER_KIND[family]
    if kind in BACKEND_MODEL:
        assert type(tokenizer.backend_tokenizer.model).__name__ == BACKEND_MODEL[kind]
    # Names are rare in the corpus: several pieces, the case every word-piece defect needs.
    assert len(tokenizer.tokenize("Anastasia")) > 1
    assert tokenizer.unk_token_id not in tokenizer("Anastasia visited Copenhagen", add_special_tokens=False)["input_ids"]

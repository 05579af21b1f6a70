"""NER on every encoder family: pieces as in running text, labels on their words, predict == pipeline().

One short training run per family (module-scoped, shared by the checks). What each check catches:
  * byte-level BPE (RoBERTa, ModernBERT's generic tokenizer) encoding pre-split words without the
    leading-space marker (``Pari s`` instead of ``ĠParis``), and a run directory whose tokenizer cuts
    raw text differently from training; likewise Llama 3's (a regex split before byte-level BPE) and
    Gemma's (spaces turned into ``▁``) tokenizers on a ModernBERT body (EuroBERT's and mmBERT's kinds);
  * a tag aligned to the wrong word's pieces;
  * pieces left untrained (only first pieces labelled), which ``pipeline(..., aggregation_strategy="simple")``
    reads as much as first pieces (Unigram tokenizers make a lone ``▁`` the first piece of a rare word);
  * ``bertpipe predict`` and ``pipeline()`` feeding the model different pieces for the same words;
  * the documented ``pipeline("token-classification", model=RUN_DIR)`` finding other entities than
    ``bertpipe predict`` (transformers' own aggregations group pieces into words by per-tokenizer
    heuristics, so they disagree with word-level tags unless the model happens to tag every piece of
    a word alike: the 3-step models here do not, so agreement must hold by construction);
  * entity spans that include the space before a word (DeBERTa-v2's offsets) from any aggregation.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, pipeline

from tests.families.builders import ENCODER_FAMILIES, WORD_SPACE_FAMILIES
from tests.families.matrix import ner_rows, pieces_by_word, piece_word, predict, train, word_spans
from tests.conftest import write_jsonl

TEXTS = [  # first names are B-PER, surnames (Anastasia, Kowalski) I-PER, as in training
    "Marguerite visited Copenhagen today",
    "the man met Roberto Kowalski in Valparaiso",
    "Marguerite Anastasia and Bob saw a film in Montevideo",
    "Alice works in Berlin with Roberto",
    "yesterday Bob Kowalski was in Rome",
]


def train_ner(family: str, checkpoint, folder, steps: int):
    files = {"train": write_jsonl(folder / "train.jsonl", ner_rows(160, seed=1)),
             "validation": write_jsonl(folder / "validation.jsonl", ner_rows(24, seed=2))}
    return train(folder, "ner", checkpoint, files, train=f"  max_steps: {steps}")


@pytest.fixture(scope="module", params=ENCODER_FAMILIES + WORD_SPACE_FAMILIES)
def ner_run(request, family_checkpoint, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp(f"ner-{family}")
    return family, train_ner(family, family_checkpoint(family), folder, steps=3), folder


def test_families_ner_words_are_pieces_of_running_text(ner_run):
    """Pre-split words get the pieces they have in running text, with the tokenizer the run saved."""
    family, run, _ = ner_run
    tokenizer = AutoTokenizer.from_pretrained(run)
    for text in TEXTS:
        words = text.split()
        split = tokenizer(words, is_split_into_words=True, add_special_tokens=False)
        running = tokenizer(text, add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(split["input_ids"]) == tokenizer.convert_ids_to_tokens(running["input_ids"]), family
        by_word = pieces_by_word(tokenizer, text)
        assert None not in by_word and sorted(by_word) == list(range(len(words))), (family, by_word)


def test_families_ner_every_label_lands_on_its_word(ner_run):
    """Training features: every piece, placed by its character offsets, carries its own word's tag
    (the first piece the word's tag, later pieces its I- form: all pieces are trained)."""
    from pipelines.config_loading import load_config
    from tasks import get_task

    family, run, folder = ner_run
    task = get_task("ner")(load_config(folder / "ner.yaml", [], lambda name: get_task(name).Options))
    examples = task.load()["train"].select(range(24))
    task.build_tokenizer(None)
    features = task.preprocess(examples, train=True)
    for example, feature in zip(examples, features):
        text = " ".join(example["tokens"])
        running = task.tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert feature["input_ids"] == running["input_ids"], family
        spans, seen = word_spans(text), set()
        for label, (start, end), special in zip(feature["labels"], running["offset_mapping"], running["special_tokens_mask"]):
            if special:
                assert label == -100
                continue
            word = piece_word(text, start, end, spans)
            tag = example["tags"][word]
            expected = "I-" + tag[2:] if word in seen and tag.startswith("B-") else tag
            seen.add(word)
            assert label != -100 and task.label_names[label] == expected, (family, text, word, start, end)


def test_families_ner_predict_and_pipeline_read_the_same_pieces(ner_run):
    """Whatever the model learned: each word's tag from ``bertpipe predict`` is the tag ``pipeline()``
    gives that word's first piece of the raw text, and entity spans are exact."""
    family, run, folder = ner_run
    predicted = predict(run, [{"tokens": text.split()} for text in TEXTS], folder)
    tagger = pipeline("token-classification", model=str(run), aggregation_strategy="none", ignore_labels=[])
    for text, row in zip(TEXTS, predicted):
        assert row["text"] == text
        first_piece_tags = {}
        for piece in tagger(text):
            first_piece_tags.setdefault(piece_word(text, piece["start"], piece["end"], word_spans(text)), piece["entity"])
        assert [first_piece_tags[word] for word in range(len(row["tags"]))] == row["tags"], (family, text)
        for entity in row["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["word"] == entity["word"].strip()



# Multi-piece names, punctuation against words ("Copenhagen,", "Bob's", "U.S."), entities of several words,
# irregular whitespace, punctuation only, an empty text, and one text longer than a window (max_seq_length 64).
AGREEMENT_TEXTS = [
    "Marguerite Anastasia visited Copenhagen, Valparaiso and Montevideo today.",
    "Yesterday Bob's film (with Roberto Kowalski) was in Rome!",
    "the U.S. man met Alice-Kowalski in Berlin; Marguerite saw Paris.",
    "  spaced   out  Marguerite\tKowalski  lives in  Rome ",
    "?!",  # no word of letters ("" is refused in a jsonl input: an empty text cell)
    " ".join(["Marguerite Kowalski met Roberto Anastasia in Valparaiso, Montevideo and Copenhagen."] * 5),
]


def entity_keys(entities):
    return [(e["entity_group"], e["word"], e["start"], e["end"], e.get("start_word"), e.get("end_word")) for e in entities]


def assert_same_entities(expected, found, text, family):
    assert entity_keys(found) == entity_keys(expected), (family, text)
    for want, got in zip(expected, found):
        assert got["score"] == pytest.approx(want["score"], abs=1e-5), (family, text)
        assert text[got["start"] : got["end"]] == got["word"] == got["word"].strip() != "", (family, text)


def test_families_ner_documented_pipeline_finds_predicts_entities(ner_run):
    """The documented call, ``pipeline("token-classification", model=RUN_DIR)``, returns exactly the
    entities ``bertpipe predict`` writes (type, word, character span, score), on raw text and on word
    lists, one text at a time or batched, whatever the (barely trained) weights tag each piece."""
    import tasks

    tasks.load_tasks()  # as documented: registers bertpipe's pipeline("token-classification")
    family, run, folder = ner_run
    tagger = pipeline("token-classification", model=str(run))
    assert len(tagger.tokenizer(AGREEMENT_TEXTS[-1])["input_ids"]) > 64, family  # predict and pipeline() both cut windows
    raw = predict(run, [{"text": text} for text in AGREEMENT_TEXTS], folder)
    for text, row in zip(AGREEMENT_TEXTS, raw):
        assert_same_entities(row["entities"], tagger(text), text, family)
    for text, row, found in zip(AGREEMENT_TEXTS, raw, tagger(AGREEMENT_TEXTS, batch_size=4)):
        assert_same_entities(row["entities"], found, text, family)
    assert sum(len(row["entities"]) for row in raw) >= 3, family  # not vacuous: the barely trained model tags entities
    assert tagger("") == [], family

    word_lists = [text.split() for text in AGREEMENT_TEXTS if text.split()]
    given = predict(run, [{"tokens": words} for words in word_lists], folder)
    for row, found in zip(given, tagger(word_lists, is_split_into_words=True)):
        assert_same_entities(row["entities"], found, row["text"], family)


def test_families_ner_pipeline_gives_words_their_space_with_a_class_that_rebuilds_its_normalizer(family_checkpoint, tmp_path):
    """A run's tokenizer loaded as ``GemmaTokenizer`` (the class rebuilds its normalizer from its own code, losing the
    space the run prepends to each word): ``pipeline()`` gives each word its space again and finds predict's entities."""
    from transformers import GemmaTokenizer

    import tasks

    tasks.load_tasks()
    run = train_ner("modernbert-gemma", family_checkpoint("modernbert-gemma"), tmp_path, steps=3)
    tokenizer = GemmaTokenizer.from_pretrained(run)
    assert "Prepend" not in str(tokenizer.backend_tokenizer.normalizer)  # what the class rebuilt, without the run's space
    tagger = pipeline("token-classification", model=str(run), tokenizer=tokenizer)
    raw = predict(run, [{"text": text} for text in AGREEMENT_TEXTS[:4]], tmp_path)
    for text, row in zip(AGREEMENT_TEXTS, raw):
        assert_same_entities(row["entities"], tagger(text), text, "modernbert-gemma")
    assert sum(len(row["entities"]) for row in raw) >= 3


@pytest.mark.filterwarnings("ignore:Tokenizer does not support real words")  # "first" on BPE/Unigram, as expected
def test_families_ner_pipeline_spans_have_no_surrounding_whitespace(ner_run):
    """transformers' own aggregations on a run: every group's span starts and ends on a character of
    the text, not on the space before a word (DeBERTa-v2's offsets include it)."""
    family, run, _ = ner_run
    for strategy in ("simple", "first"):
        tagger = pipeline("token-classification", model=str(run), aggregation_strategy=strategy, ignore_labels=[])
        for text in TEXTS:
            groups = tagger(text)
            assert groups, (family, strategy, text)
            for group in groups:
                span = text[group["start"] : group["end"]]
                assert span and span == span.strip(), (family, strategy, text, group)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_families_ner_model_card_code_finds_entities_without_bertpipe(family, family_checkpoint, tmp_path):
    """The card's code, run where bertpipe is not (a fresh interpreter, no tasks.load_tasks()), printed one row per
    piece ('ĠA', 'g', 'l', a zero-width 'Ġ'): it now prints entities, each a span of the text."""
    import subprocess
    import sys

    import numpy

    from tests.families.matrix import card_code

    run = train_ner(family, family_checkpoint(family), tmp_path, steps=40)
    text = "Marguerite Anastasia visited Copenhagen today"
    code = card_code(run).replace('"Angela Merkel visited Paris in May."', repr(text))
    assert repr(text) in code and "load_tasks" in code
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    entities = eval(printed.strip().splitlines()[-1], {"np": numpy})  # scores print as np.float32(...)
    assert entities and all("entity_group" in entity and "entity" not in entity for entity in entities), entities
    for entity in entities:
        assert text[entity["start"]:entity["end"]].strip() and " " not in text[entity["start"]:entity["end"]][:1], entity

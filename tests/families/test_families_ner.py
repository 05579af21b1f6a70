"""NER on every encoder family: pieces as in running text, labels on their words, predict == pipeline().

One short training run per family (module-scoped, shared by the checks). What each check catches:
  * byte-level BPE (RoBERTa, ModernBERT's generic tokenizer) encoding pre-split words without the
    leading-space marker (``Pari s`` instead of ``ĠParis``), and a run directory whose tokenizer cuts
    raw text differently from training;
  * a tag aligned to the wrong word's pieces;
  * pieces left untrained (only first pieces labelled), which ``pipeline("token-classification",
    aggregation_strategy="simple")``, the documented call, reads as much as first pieces (Unigram
    tokenizers make a lone ``▁`` the first piece of a rare word);
  * ``bertpipe predict`` and ``pipeline()`` feeding the model different pieces for the same words.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer, pipeline

from tests.families.builders import ENCODER_FAMILIES
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


@pytest.fixture(scope="module", params=ENCODER_FAMILIES)
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
    from pipelines.config import load_config
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
    tagger = pipeline("token-classification", model=str(run), ignore_labels=[])
    for text, row in zip(TEXTS, predicted):
        assert row["text"] == text
        first_piece_tags = {}
        for piece in tagger(text):
            first_piece_tags.setdefault(piece_word(text, piece["start"], piece["end"], word_spans(text)), piece["entity"])
        assert [first_piece_tags[word] for word in range(len(row["tags"]))] == row["tags"], (family, text)
        for entity in row["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["word"] == entity["word"].strip()


"""Toy data for every task of the family matrix, and train / predict through ``bertpipe`` in this process.

In:  a family's checkpoint folder (``builders.build_family``) and a scratch folder.
Out: a finished run directory, ``bertpipe predict`` rows, and helpers that map word pieces back to the
     words of a text by character offsets (independently of the tokenizer's own ``word_ids()``).

Runs go through ``tasks.cli.main`` in the test process rather than a subprocess (importing torch and
transformers again costs seconds per run); every run pins ``train.mixed_precision=no`` so that numbers do
not depend on whether the CPU has native bf16.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from pipelines.files import json_lines
from tests.conftest import write_jsonl
from tests.families.builders import FILLER, GERMAN, PERSONS, PLACES

COMMON = [word for word in FILLER if word != "."]


def run_bertpipe(*args: str) -> None:
    """``bertpipe ARGS`` in this process; a fresh Accelerate state before and after (it is a singleton)."""
    from accelerate.state import AcceleratorState

    from tasks.cli import main

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        status = main(list(args))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert status == 0, f"bertpipe {' '.join(args)} exited with {status}"


def write_config(folder: Path, task: str, model: Path, files: dict[str, Path], *, data: str = "", train: str = "", section: str = "") -> Path:
    config = folder / f"{task}.yaml"
    config.write_text(f"""task: {task}
output_dir: {folder / 'run'}
seed: 5
model: {{name_or_path: {model}}}
data:
  files: {{{', '.join(f'{split}: {path}' for split, path in files.items())}}}
  max_seq_length: 64
{data}
train:
  mixed_precision: "no"
  batch_size: 8
  learning_rate: 3.0e-3
  lr_scheduler: constant
  logging_steps: 50
  torch_num_threads: 1
{train}
{section}
""")
    return config


def train(folder: Path, task: str, model: Path, files: dict[str, Path], *overrides: str, **sections: str) -> Path:
    config = write_config(folder, task, model, files, **sections)
    run_bertpipe("train", str(config), *overrides)
    return folder / "run"


def predict(run: Path, rows: list[dict], folder: Path) -> list[dict]:
    source, target = write_jsonl(folder / "predict_in.jsonl", rows), folder / "predict_out.jsonl"
    run_bertpipe("predict", str(run), "--input", str(source), "--output", str(target))
    return [json.loads(line) for _, line in json_lines(target.read_text(encoding="utf-8"))]


def card_code(run: Path) -> str:
    """The Python block of the run's model card, loading this run folder (the card names the model by the folder's name)."""
    code = re.search(r"```python\n(.*?)```", (run / "README.md").read_text(), re.S).group(1)
    return code.replace(f'"{run.name}"', f'"{run}"')


def run_card_code(code: str) -> str:
    """What the code prints, run in a namespace of its own."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    return printed.getvalue()


# ----- toy data -------------------------------------------------------------------------------------
def sentiment_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(["positive", "negative"])
        words = [rng.choice(["the", "film", "story", "was", "very", "a"]) for _ in range(rng.randint(2, 6))]
        words.insert(rng.randint(0, len(words)), "good" if label == "positive" else "bad")
        rows.append({"text": " ".join(words), "label": label})
    return rows


def ner_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    """Names are PER (a first name B-PER, sometimes a surname I-PER), places LOC, everything else O."""
    words, tags = [], []
    for _ in range(rng.randint(3, 8)):
        roll = rng.random()
        if roll < 0.2:
            words.append(rng.choice(PERSONS[:4])); tags.append("B-PER")
            if rng.random() < 0.4:
                words.append(rng.choice(PERSONS[4:])); tags.append("I-PER")
        elif roll < 0.35:
            words.append(rng.choice(PLACES)); tags.append("B-LOC")
        else:
            words.append(rng.choice(COMMON)); tags.append("O")
    return words, tags


def ner_rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [dict(zip(("tokens", "tags"), ner_sentence(rng))) for _ in range(count)]


def qa_rows(count: int, seed: int) -> list[dict]:
    """Who-lives-where contexts; the answer is a place, a name of several pieces."""
    rng = random.Random(seed)
    rows = []
    for index in range(count):
        people = rng.sample(PERSONS[:4], 2)
        places = rng.sample(PLACES, 2)
        context = f"{people[0]} lives in {places[0]} .  {people[1]} works in {places[1]} today ."
        asked = rng.randrange(2)
        question = f"where does {people[asked]} {'live' if asked == 0 else 'work'} ?"
        answer = places[asked]
        rows.append({"id": f"q{index}", "question": question, "context": context,
                     "answers": {"text": [answer], "answer_start": [context.index(answer)]}})
    return rows


def mlm_lines(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(COMMON + PERSONS + PLACES) for _ in range(rng.randint(5, 10))) for _ in range(count)]


def translation_rows(count: int, seed: int) -> list[dict]:
    """German -> English word by word over a small dictionary (the corpus holds both languages)."""
    rng = random.Random(seed)
    english = list(GERMAN)
    rows = []
    for _ in range(count):
        words = [rng.choice(english) for _ in range(rng.randint(2, 5))]
        rows.append({"de": " ".join(GERMAN[word] for word in words), "en": " ".join(words)})
    return rows


# ----- the vocabulary head at the labelled positions ---------------------------------------------------------
def head_at_labelled_positions_agrees(family: str, whole, batch: dict, labelled):
    """Narrows a copy of ``whole`` (eval mode) with pipelines/labelled_positions.py and checks that one forward and
    backward of ``batch`` gives the family's loss, the ``labelled`` rows' logits and every gradient; returns the copy."""
    import copy

    import torch

    from pipelines.labelled_positions import head_at_labelled_positions

    narrowed = copy.deepcopy(whole)
    assert head_at_labelled_positions(narrowed), family
    results = []
    for model in (whole, narrowed):
        outputs = model(**batch)
        outputs.loss.backward()
        results.append((outputs, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}))
    (whole_outputs, gradients), (narrowed_outputs, narrowed_gradients) = results
    assert narrowed_outputs.logits.shape == (int(labelled.sum()), whole_outputs.logits.shape[-1]), family
    torch.testing.assert_close(narrowed_outputs.logits, whole_outputs.logits[labelled], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(narrowed_outputs.loss, whole_outputs.loss, rtol=1e-6, atol=1e-6)
    assert narrowed_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(narrowed_gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=f"{family}: {name}")
    return narrowed


# ----- pieces and words -----------------------------------------------------------------------------
def word_spans(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in re.finditer(r"\S+", text)]


def piece_word(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> int | None:
    """The whitespace-delimited word a piece with offsets ``[start, end)`` belongs to.

    A piece whose offsets include the space before its word (DeBERTa-v2, ModernBERT) or that is only a
    word-start marker (a lone ``▁``/``Ġ``, zero-width or covering the space) belongs to the next word.
    """
    position = start
    while position < end and text[position].isspace():
        position += 1
    for index, (word_start, word_end) in enumerate(spans):
        if word_start <= position < word_end or (position == end and position <= word_start):
            return index
    return None


def pieces_by_word(tokenizer, text: str) -> dict[int, list[str]]:
    """Word index -> the pieces of ``text`` (tokenised as running text) that fall in that word."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = word_spans(text)
    grouped: dict[int, list[str]] = {}
    for token, (start, end) in zip(tokenizer.convert_ids_to_tokens(encoded["input_ids"]), encoded["offset_mapping"]):
        grouped.setdefault(piece_word(text, start, end, spans), []).append(token)
    return grouped


def strip_entity(entity: dict[str, Any], text: str) -> tuple[str, int, int]:
    """(type, start, end) of an entity with the span's surrounding whitespace left out."""
    start, end = int(entity["start"]), int(entity["end"])
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return entity["entity_group"], start, end

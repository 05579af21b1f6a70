"""Unit tests of the masked-LM task: corpus handling, packing, masking, metrics, model building, bad input."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset

from pipelines.config_loading import load_config
from pipelines.errors import DataError
from pipelines.errors import ModelError
from tasks import get_task
from tasks.mlm import (
    IGNORE_INDEX,
    MaskingCollator,
    MlmTask,
    clean_rows,
    choose_mask_targets,
    hold_out_documents,
    is_heading,
    make_sentence_pairs,
    mask_tokens,
    masked_lm_metrics,
    number_words,
    pack_blocks,
    random_token_ids,
    special_template,
    split_documents,
    train_wordpiece_tokenizer,
)
from tests.conftest import corpus_sentences

MASK_ID = 4


def mlm_config(tmp_path: Path, corpus: Path, *overrides: str):
    text = f"""task: mlm
output_dir: {tmp_path / 'run'}
seed: 3
model:
  architecture: {{num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64,
                  max_position_embeddings: 64, vocab_size: 200}}
data:
  files: {{train: {corpus}}}
  validation_fraction: 0.2
  max_seq_length: 32
mlm:
  tokenizer_min_frequency: 1
"""
    path = tmp_path / "mlm.yaml"
    path.write_text(text)
    return load_config(path, list(overrides), lambda name: get_task(name).Options)


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    sentences = corpus_sentences(300, seed=5)
    paragraphs = ["\n".join(sentences[i:i + 10]) for i in range(0, 300, 10)]
    path = tmp_path / "corpus.tokens"
    path.write_text(" = Heading = \n\n" + "\n\n".join(paragraphs) + "\n")
    return path


# ----- masking ----------------------------------------------------------------------------------
def _masking_inputs(rows=400, length=128, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, 1000, size=(rows, length))
    maskable = np.ones_like(ids, dtype=bool)
    maskable[:, 0] = maskable[:, -1] = False  # [CLS] ... [SEP]
    maskable[: rows // 2, length - 20:] = False  # padding on half the rows
    return ids, maskable


def test_mlm_masking_rates_match_bert():
    ids, maskable = _masking_inputs()
    corrupted, labels = mask_tokens(
        ids, maskable, None, rng=np.random.default_rng(1), mlm_probability=0.15, mask_replace_prob=0.8,
        random_replace_prob=0.1, mask_token_id=MASK_ID, random_token_ids=np.arange(10, 1000),
    )
    targets = labels != IGNORE_INDEX
    assert not targets[~maskable].any(), "a special or padding token was chosen"
    assert (corrupted[~targets] == ids[~targets]).all(), "a non-target token was changed"
    assert (labels[targets] == ids[targets]).all()
    assert targets[maskable].mean() == pytest.approx(0.15, abs=0.005)
    replaced = (corrupted == MASK_ID)[targets].mean()
    unchanged = (corrupted == ids)[targets].mean()
    randomised = 1 - replaced - unchanged
    assert replaced == pytest.approx(0.8, abs=0.015)
    # A random draw can equal the original id (1 in 990): the unchanged share is 10% plus that sliver.
    assert unchanged == pytest.approx(0.1, abs=0.01) and randomised == pytest.approx(0.1, abs=0.01)


def test_mlm_masking_shares_are_configurable():
    ids, maskable = _masking_inputs(rows=200)
    corrupted, labels = mask_tokens(
        ids, maskable, None, rng=np.random.default_rng(2), mlm_probability=0.3, mask_replace_prob=1.0,
        random_replace_prob=0.0, mask_token_id=MASK_ID, random_token_ids=np.arange(10, 1000),
    )
    targets = labels != IGNORE_INDEX
    assert targets[maskable].mean() == pytest.approx(0.3, abs=0.01)
    assert (corrupted[targets] == MASK_ID).all()


def test_mlm_whole_word_groups_are_masked_together():
    rng = np.random.default_rng(0)
    rows, length = 300, 64
    word_ids = np.full((rows, length), -1)
    for row in range(rows):
        position, word = 1, 0
        while position < length - 1:
            size = int(rng.integers(1, 4))  # words of 1-3 pieces
            word_ids[row, position:min(position + size, length - 1)] = word
            position += size
            word += 1
    maskable = word_ids >= 0
    targets = choose_mask_targets(maskable, word_ids, 0.15, np.random.default_rng(4))
    assert not targets[~maskable].any()
    chosen_words = 0
    for row in range(rows):
        for word in np.unique(word_ids[row][word_ids[row] >= 0]):
            group = targets[row][word_ids[row] == word]
            assert group.all() or not group.any(), f"row {row}: word {word} partly masked"
            chosen_words += int(group.all())
    total_words = sum(len(np.unique(r[r >= 0])) for r in word_ids)
    assert chosen_words / total_words == pytest.approx(0.15, abs=0.015)


def test_mlm_number_words_keeps_rows_apart():
    assert number_words([[None, 0, 0, 1], [0, 1, 1], [], [0]]) == [[-1, 0, 0, 1], [2, 3, 3], [], [4]]


def test_mlm_whole_words_follow_word_ids_of_the_tokenizer():
    tokenizer = train_wordpiece_tokenizer(
        corpus_sentences(100) + ["grim, happy."], vocab_size=90, lowercase=True, min_frequency=1, model_max_length=64
    )
    encoded = tokenizer(["superbly grim, happy"], add_special_tokens=False)
    words = number_words([encoded.word_ids(0)])[0]
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    assert words.count(0) >= 2  # "superbly" is several pieces of one word
    # Punctuation is a word of its own (its own word id) although it touches "grim".
    assert tokens[words.index(2)] == "," and words.count(2) == 1
    assert len(set(words)) == 4


def test_mlm_batch_without_targets_gets_one():
    ids = np.array([[2, 11, 12, 3]])
    maskable = np.array([[False, True, True, False]])
    _, labels = mask_tokens(
        ids, maskable, None, rng=np.random.default_rng(0), mlm_probability=1e-9, mask_replace_prob=0.8,
        random_replace_prob=0.1, mask_token_id=MASK_ID, random_token_ids=np.arange(10, 20),
    )
    assert (labels != IGNORE_INDEX).sum() == 1 and labels[0, 0] == labels[0, 3] == IGNORE_INDEX


def test_mlm_batch_without_targets_gets_one_whole_word():
    # A short row (an eval example, masked alone) often draws no word at 15%: the one target it then
    # gets must still be a whole word, never one piece of it.
    ids = np.array([[2, 11, 12, 13, 14, 3]])
    maskable = np.array([[False, True, True, True, True, False]])
    words = np.array([[-1, 0, 0, 0, 1, -1]])
    for seed in range(20):
        _, labels = mask_tokens(
            ids, maskable, words, rng=np.random.default_rng(seed), mlm_probability=1e-9, mask_replace_prob=0.8,
            random_replace_prob=0.1, mask_token_id=MASK_ID, random_token_ids=np.arange(10, 20),
        )
        assert (labels != IGNORE_INDEX).tolist()[0] in ([False, True, True, True, False, False], [False] * 4 + [True, False])


# ----- corpus and examples ----------------------------------------------------------------------
def test_mlm_pack_blocks_keeps_every_token_once():
    rows = [[1, 2, 3], [], [4, 5, 6, 7, 8], [9], [10, 11]]
    words = number_words([[0, 0, 1], [], [0, 1, 2, 3, 3], [0], [0, 1]])
    blocks = pack_blocks(rows, words, 4)
    assert [ids for ids, _ in blocks] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    assert [w for _, block_words in blocks for w in block_words] == [w for row in words for w in row]


def test_mlm_headings_and_empty_rows_are_dropped():
    assert is_heading(" = Valkyria Chronicles III = ") and is_heading(" = = = Gameplay = = = ")
    assert not is_heading("x = y + 1") and not is_heading("= not closed")
    rows = [" = Title = ", "", "  text one ", " = = Section = = ", "text two", "   "]
    assert clean_rows(rows, drop_headings=True) == ["text one", "text two"]
    assert clean_rows(rows, drop_headings=False) == ["= Title =", "text one", "= = Section = =", "text two"]


def test_mlm_documents_follow_headings_then_paragraphs():
    wiki = [" = A = ", "a1", " = = s = = ", "a2", " = B = ", "b1", " = C = ", "c1"]
    assert split_documents(wiki) == [[0, 1, 2, 3], [4, 5], [6, 7]]
    plain = ["p1", "p1b", "", "p2", "", "", "p3"]
    assert split_documents(plain) == [[0, 1], [3], [6]]
    assert split_documents(["r1", "r2"]) == [[0], [1]]


def test_mlm_hold_out_takes_whole_documents_in_order():
    documents = [list(range(i * 10, i * 10 + 10)) for i in range(20)]
    train, held = hold_out_documents(documents, 0.2, seed=1)
    assert sorted(train + held) == list(range(200)) and train == sorted(train) and held == sorted(held)
    assert len(held) == 40
    assert {row // 10 for row in held}.isdisjoint({row // 10 for row in train})
    assert hold_out_documents(documents, 0.2, seed=1) == (train, held)


def test_mlm_hold_out_of_a_single_document_is_a_data_error():
    with pytest.raises(DataError, match="data.validation_fraction: the corpus has a single document"):
        hold_out_documents([[0, 1, 2]], 0.2, seed=1)


@pytest.mark.parametrize("text", ["\n\n  \n", " = A = \n = B = \n = C = \n"], ids=["blank", "headings"])
def test_mlm_corpus_without_text_is_refused_naming_its_file_and_rows(tmp_path, text):
    # Checked before the hold-out: blank rows were refused as "a single document" by the hold-out, and
    # headings-only counted the rows left after it, named by the split alone.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    task = MlmTask(mlm_config(tmp_path, corpus))
    with pytest.raises(DataError, match=rf"^split 'train' \(data.files.train: {re.escape(str(corpus))}\): all 3 rows are empty "
                                        r"\(or headings\); the corpus holds no text$"):
        task.load()


def test_mlm_held_out_part_of_headings_alone_is_refused_naming_the_hold_out(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" = A = \ntext a\n = B = \ntext b\n = C = \n")  # documents A, B and C; C is its heading alone
    task = MlmTask(mlm_config(tmp_path, corpus))  # seed 3 holds out C
    with pytest.raises(DataError, match=r"^split 'validation' \(held out of data.files.train by data.validation_fraction\): "
                                        r"its only row is empty \(or headings\)"):
        task.load()


def test_mlm_sentence_pairs_label_continuations():
    rows = [list(range(i * 100, i * 100 + 7)) for i in range(200)]
    pairs = make_sentence_pairs(rows, 20, np.random.default_rng(0))
    labels = [label for _, _, label in pairs]
    assert 0.35 < np.mean(labels) < 0.65
    stream = [t for row in rows for t in row]
    for a, b, label in pairs:
        assert a and b and len(a) + len(b) <= 20
        if label == 0:  # B continues A in the corpus
            start = stream.index(a[0])
            assert stream[start:start + len(a)] == a and stream[start + len(a)] == b[0]


def test_mlm_special_template_of_a_bert_tokenizer(tiny_bert):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    template = special_template(tokenizer)
    assert template.prefix == [tokenizer.cls_token_id] and template.suffix == [tokenizer.sep_token_id]
    assert template.middle == [tokenizer.sep_token_id] and (template.type_a, template.type_b) == (0, 1)
    ids, types, special = template.pair([10, 11], [12])
    assert ids == tokenizer("good bad", "sad")["input_ids"][:1] + [10, 11, tokenizer.sep_token_id, 12, tokenizer.sep_token_id]
    assert types == [0, 0, 0, 0, 1, 1] and special == [1, 0, 0, 1, 0, 1]


def test_mlm_trained_tokenizer_has_the_special_tokens():
    tokenizer = train_wordpiece_tokenizer(corpus_sentences(200), vocab_size=120, lowercase=True, min_frequency=1, model_max_length=64)
    for token in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]:
        assert tokenizer.convert_tokens_to_ids(token) is not None
    assert (tokenizer.mask_token, tokenizer.pad_token, tokenizer.cls_token) == ("[MASK]", "[PAD]", "[CLS]")
    encoded = tokenizer("The FILM [MASK] good")
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and "[MASK]" in tokens and "the" in tokens
    assert len(tokenizer) <= 120


def test_mlm_random_replacements_are_drawn_from_every_token_but_the_special_ones():
    # The 10% of targets replaced by a random token must never become [MASK], [CLS], [PAD]...: the model would learn
    # to predict a word where the input shows a special token.
    tokenizer = train_wordpiece_tokenizer(corpus_sentences(200), vocab_size=120, lowercase=True, min_frequency=1, model_max_length=64)
    pool = set(random_token_ids(tokenizer).tolist())
    assert pool == set(range(len(tokenizer))) - set(tokenizer.all_special_ids) and tokenizer.mask_token_id not in pool


# ----- metrics and evaluation -------------------------------------------------------------------
def test_mlm_metrics_weight_every_masked_token():
    metrics = masked_lm_metrics(np.array([2.0, 4.0]), np.array([1, 3]), np.array([1.0, 2.0]))
    assert metrics["loss"] == pytest.approx(1.5)  # not the mean of example means (2 + 4/3) / 2
    assert metrics["perplexity"] == pytest.approx(np.exp(1.5))
    assert metrics["accuracy"] == pytest.approx(0.75)
    with pytest.raises(DataError):
        masked_lm_metrics(np.zeros(2), np.zeros(2), np.zeros(2))


def test_mlm_csv_corpus_rows_are_the_text_written(tmp_path):
    # pandas alone reads a row "1999" as the number 1999 and "NA" as a missing value.
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("text\n1999\nNA\nthe film was fine\n007 returns\n")
    task = MlmTask(mlm_config(tmp_path, corpus, "data.validation_fraction=null", "data.files.validation=" + str(corpus)))
    assert task.load()["train"]["text"] == ["1999", "NA", "the film was fine", "007 returns"]
    inputs = tmp_path / "inputs.csv"
    inputs.write_text("text\n42\n")
    assert task.load_inputs(str(inputs))["text"] == ["42"]


def test_mlm_jsonl_text_column_of_numbers_or_mixed_values_is_refused_naming_split_and_file(tmp_path):
    # A number reached str.strip (an AttributeError traceback), and a row of 0 or false was dropped as empty.
    texts = ["the film was fine", "a dull plot"]
    for odd, kind in (([7], "Json"), ([["a", "list"]], "Json"), ([0], "Json")):
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts + odd))
        task = MlmTask(mlm_config(tmp_path, corpus, "data.validation_fraction=null", "data.files.validation=" + str(corpus)))
        with pytest.raises(DataError, match=rf"split '(train|validation)' \(data.files.\w+: {re.escape(str(corpus))}\): column 'text' holds "
                                            rf"{kind} values, not text; point data.text_column at a text column"):
            task.load()
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text("".join(json.dumps({"text": number}) + "\n" for number in (1, 2)))
    task = MlmTask(mlm_config(tmp_path, numbers, "data.validation_fraction=null", "data.files.validation=" + str(numbers)))
    with pytest.raises(DataError, match=r"column 'text' holds int64 values, not text"):
        task.load()
    with pytest.raises(DataError, match=rf"--input {re.escape(str(numbers))}: column 'text' holds int64 values, not text"):
        task.load_inputs(str(numbers))


def test_mlm_inputs_with_a_text_column_beside_the_configured_one_read_the_configured_one(tmp_path):
    # data.text_column=sentence and an input row that also holds "text": renaming sentence to text raised
    # datasets' ValueError (a raw traceback from bertpipe predict).
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"sentence": f"the film number {index} was fine"}) + "\n" for index in range(4)))
    task = MlmTask(mlm_config(tmp_path, corpus, "data.text_column=sentence", "data.validation_fraction=null",
                              "data.files.validation=" + str(corpus)))
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(json.dumps({"text": "a note", "sentence": "the [MASK] was fine"}) + "\n")
    assert task.load_inputs(str(inputs))["text"] == ["the [MASK] was fine"]


@pytest.fixture
def prepared(tmp_path, corpus_file):
    config = mlm_config(tmp_path, corpus_file)
    task = MlmTask(config)
    raw = task.load()
    task.build_tokenizer(raw)
    torch.manual_seed(0)
    model = task.build_model(raw).eval()
    return task, raw, model


def test_mlm_perplexity_is_exp_of_mean_masked_token_loss(prepared):
    task, raw, model = prepared
    features = task.preprocess(raw["validation"], train=False)
    collate = task.collator(train=False)
    outputs = {}
    with torch.no_grad():
        for start, stop in [(0, 3), (3, 4), (4, len(features))]:  # uneven batches
            for key, value in task.predict_step(model, collate([features[i] for i in range(start, stop)])).items():
                outputs.setdefault(key, []).append(value.numpy())
        everything = collate([features[i] for i in range(len(features))])
        reference_loss = model(**everything).loss.item()  # one batch: mean over all its masked tokens
    metrics = task.compute_metrics({key: np.concatenate(value) for key, value in outputs.items()}, raw["validation"])
    assert metrics["perplexity"] == pytest.approx(np.exp(reference_loss), rel=1e-4)
    assert metrics["loss"] == pytest.approx(reference_loss, rel=1e-5)


def test_mlm_evaluation_with_the_head_at_labelled_positions_gives_the_same_sums(prepared):
    """The loop and `bertpipe evaluate` narrow a masked-LM's head to the labelled positions
    (pipelines/labelled_positions.py); predict_step reads their logits from either model alike."""
    import copy

    from pipelines.labelled_positions import head_at_labelled_positions

    task, raw, model = prepared
    narrowed = copy.deepcopy(model)
    assert head_at_labelled_positions(narrowed)
    features = task.preprocess(raw["validation"], train=False)
    batch = task.collator(train=False)([features[i] for i in range(len(features))])
    with torch.no_grad():
        whole, narrow = task.predict_step(model, batch), task.predict_step(narrowed, batch)
    assert whole.keys() == narrow.keys() and whole["masked_tokens"].sum() > 0
    assert torch.equal(narrow["masked_tokens"], whole["masked_tokens"])
    assert torch.equal(narrow["masked_correct"], whole["masked_correct"])
    torch.testing.assert_close(narrow["masked_loss_sum"], whole["masked_loss_sum"], rtol=1e-5, atol=1e-5)


def test_mlm_fill_mask_with_the_head_at_the_mask_positions_gives_the_same_fillers(prepared):
    """Fill-mask prediction hands the mask positions to the model as labels: a narrowed model computes its head
    there alone (one row per mask), the family's model at every position; both give the same fillers."""
    import copy

    from pipelines.labelled_positions import head_at_labelled_positions

    task, raw, model = prepared
    narrowed = copy.deepcopy(model)
    assert head_at_labelled_positions(narrowed)
    handed = []
    narrowed.get_output_embeddings().register_forward_pre_hook(lambda module, args: handed.append(tuple(args[0].shape)))
    mask = task.tokenizer.mask_token
    examples = Dataset.from_dict({"text": [f"the {mask} was fine", f"{mask} and {mask} of the story here", f"a {mask}"]})
    features = task.preprocess(examples, train=False, inputs=True)
    batch = task.collator(train=False)([features[i] for i in range(len(features))])
    with torch.no_grad():
        whole, narrow = task.predict_step(model, batch), task.predict_step(narrowed, batch)
    masks = int((batch["input_ids"] == task.tokenizer.mask_token_id).sum())
    assert masks == 4 and handed == [(masks, model.config.hidden_size)]
    assert torch.equal(narrow["top_token_ids"], whole["top_token_ids"])
    assert (whole["top_token_ids"][..., 0] >= 0).sum() == masks
    torch.testing.assert_close(narrow["top_scores"], whole["top_scores"], rtol=1e-5, atol=1e-6)


def test_mlm_training_and_evaluation_compute_the_head_at_the_labelled_positions_only(tmp_path, corpus_file, monkeypatch):
    """Through the loop (pipelines/train.py) every forward of the run, training steps and evaluations, and
    through `bertpipe evaluate` (pipelines/evaluation.py) every forward of the finished run, hands the decoder
    the labelled positions' rows only."""
    from pipelines import evaluation
    from pipelines import train as train_module

    handed = []
    original = train_module.head_at_labelled_positions

    def narrow_and_watch(model):
        model.get_output_embeddings().register_forward_pre_hook(lambda module, args: handed.append(args[0].dim()))
        return original(model)

    monkeypatch.setattr(train_module, "head_at_labelled_positions", narrow_and_watch)
    config = mlm_config(tmp_path, corpus_file, "train.max_steps=3", "train.eval_steps=2", "train.mixed_precision=no")
    metrics = train_module.train(config, MlmTask(config))
    assert metrics["global_step"] == 3 and np.isfinite(metrics["eval_perplexity"])
    assert len(handed) > 3 and set(handed) == {2}, handed  # [labelled rows, hidden], never [batch, length, hidden]

    handed.clear()
    monkeypatch.setattr(evaluation, "head_at_labelled_positions", narrow_and_watch)
    evaluated = evaluation.evaluate_run(config, MlmTask(config), str(config.output_dir))
    assert evaluated["eval_perplexity"] == pytest.approx(metrics["eval_perplexity"], rel=1e-5)
    assert handed and set(handed) == {2}, handed

    handed.clear()  # `bertpipe predict` (fill-mask): the mask positions' rows only
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("the [MASK] was a story\n[MASK] of the [MASK]\n")
    assert evaluation.predict_file(config, MlmTask(config), str(config.output_dir), str(inputs), str(tmp_path / "fills.jsonl")) == 2
    assert handed and set(handed) == {2}, handed


def test_mlm_evaluation_masks_are_deterministic_training_masks_are_fresh(prepared):
    task, raw, _ = prepared
    first = task.preprocess(raw["validation"], train=False)
    second = task.preprocess(raw["validation"], train=False)
    assert first["input_ids"] == second["input_ids"] and first["labels"] == second["labels"]
    assert any(label != IGNORE_INDEX for row in first["labels"] for label in row)
    train = task.preprocess(raw["train"], train=True)
    collate = task.collator(train=True)
    rows = [train[i] for i in range(4)]
    # The same batch is masked alike (a resumed run redraws exactly what it would have drawn) ...
    assert torch.equal(collate(rows)["labels"], collate(rows)["labels"])
    assert set(collate(rows)) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    # ... and an example among other batch-mates, as every epoch's shuffle gives it, gets fresh masks.
    width = len(rows[0]["input_ids"])
    masks_of_first = {tuple(collate([rows[0], *(train[i + j] for i in range(3))])["labels"][0, :width].tolist()) for j in range(4, 40, 3)}
    assert len(masks_of_first) > 6


def test_mlm_unknown_tokens_in_the_corpus_are_never_targets(tmp_path):
    sentences = [s.replace(" ", " <unk> ", 1) for s in corpus_sentences(300, seed=5)]
    corpus = tmp_path / "unk.tokens"
    corpus.write_text("\n\n".join("\n".join(sentences[i:i + 10]) for i in range(0, 300, 10)) + "\n")
    task = MlmTask(mlm_config(tmp_path, corpus, "mlm.mlm_probability=0.5"))
    raw = task.load()
    unk = task.build_tokenizer(raw).unk_token_id
    evaluation = task.preprocess(raw["validation"], train=False)
    assert not any(label == unk for row in evaluation["labels"] for label in row)
    train = task.preprocess(raw["train"], train=True)
    assert any(unk in row for row in train["input_ids"])
    labels = task.collator(train=True)([train[i] for i in range(len(train))])["labels"]
    assert not (labels == unk).any()


def test_mlm_held_out_split_and_packing(prepared, corpus_file):
    task, raw, _ = prepared
    lines = clean_rows(corpus_file.read_text().splitlines(), drop_headings=True)
    assert sorted(list(raw["train"]["text"]) + list(raw["validation"]["text"])) == sorted(lines)
    features = task.preprocess(raw["train"], train=True)
    lengths = [len(ids) for ids in features["input_ids"]]
    assert set(lengths[:-1]) == {32} and lengths[-1] <= 32
    text_tokens = task.tokenizer(list(raw["train"]["text"]), add_special_tokens=False)["input_ids"]
    packed = [t for ids, special in zip(features["input_ids"], features["special_tokens_mask"]) for t, s in zip(ids, special) if not s]
    assert packed == [t for row in text_tokens for t in row]


def test_mlm_from_scratch_model_matches_the_trained_tokenizer(prepared):
    task, _, model = prepared
    assert model.config.vocab_size == len(task.tokenizer) <= 200
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    # Trained during data preparation, when the run may still be refused: output_dir is not touched yet.
    assert not Path(task.config.output_dir).exists()


def test_mlm_resume_reads_the_tokenizer_the_run_trained_or_refuses(tmp_path, corpus_file):
    first = MlmTask(mlm_config(tmp_path, corpus_file))
    raw = first.load()
    trained = first.build_tokenizer(raw)
    resumed = MlmTask(mlm_config(tmp_path, corpus_file, "train.resume_from_checkpoint=latest"))
    # A retraining may break frequency ties otherwise and give the checkpoint another vocabulary.
    with pytest.raises(ModelError, match="resume_from_checkpoint: .* holds no tokenizer.json, the tokenizer this run trained"):
        resumed.build_tokenizer(raw)
    trained.save_pretrained(tmp_path / "run")  # as the loop does when the run starts
    assert resumed.build_tokenizer(raw).get_vocab() == trained.get_vocab()


# ----- continued pretraining and the chain -----------------------------------------------------
def test_mlm_continued_pretraining_ties_a_new_head(tmp_path, tiny_bert, corpus_file):
    config = mlm_config(tmp_path, corpus_file, f"model.name_or_path={tiny_bert}")
    task = MlmTask(config)
    raw = task.load()
    task.build_tokenizer(raw)
    model = task.build_model(raw)
    assert type(model).__name__ == "BertForMaskedLM"
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    model.save_pretrained(tmp_path / "pretrained")
    task.tokenizer.save_pretrained(tmp_path / "pretrained")
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "pretrained")
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    classifier, info = AutoModelForSequenceClassification.from_pretrained(tmp_path / "pretrained", num_labels=2, output_loading_info=True)
    assert all(key.startswith("cls.") for key in info["unexpected_keys"]), info
    assert all(key.startswith(("classifier.", "bert.pooler.")) for key in info["missing_keys"]), info
    assert torch.equal(classifier.bert.embeddings.word_embeddings.weight, model.bert.embeddings.word_embeddings.weight)


def test_mlm_next_sentence_prediction_builds_pairs(tmp_path, corpus_file):
    config = mlm_config(tmp_path, corpus_file, "mlm.next_sentence_prediction=true")
    task = MlmTask(config)
    raw = task.load()
    task.build_tokenizer(raw)
    model = task.build_model(raw)
    assert type(model).__name__ == "BertForPreTraining"
    features = task.preprocess(raw["train"], train=True)
    batch = task.collator(train=True)([features[i] for i in range(6)])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    assert batch["token_type_ids"].max() == 1 and batch["input_ids"].shape[1] <= 32
    assert torch.isfinite(model(**batch).loss)
    eval_features = task.preprocess(raw["validation"], train=False)
    with torch.no_grad():
        outputs = task.predict_step(model.eval(), task.collator(train=False)([eval_features[i] for i in range(4)]))
    assert set(outputs) == {"masked_loss_sum", "masked_tokens", "masked_correct", "nsp_correct"}


def test_mlm_next_sentence_prediction_refuses_an_update_over_several_batches(tmp_path, corpus_file, monkeypatch):
    # Its loss is a mean over masked tokens plus one over pairs; weighting each accumulated (or per-process) batch
    # by its masked tokens weighted the pairs' term by them too: not the update of one big batch, without a word.
    from types import SimpleNamespace

    import accelerate.state

    from pipelines.config import ConfigError

    config = mlm_config(tmp_path, corpus_file, "mlm.next_sentence_prediction=true", "train.gradient_accumulation_steps=2")
    task = MlmTask(config)
    raw = task.load()
    task.build_tokenizer(raw)
    with pytest.raises(ConfigError, match=r"^mlm.next_sentence_prediction=true with train.gradient_accumulation_steps=2 on 1 process"):
        task.build_model(raw)
    task = MlmTask(mlm_config(tmp_path, corpus_file, "mlm.next_sentence_prediction=true"))
    task.build_tokenizer(raw)
    monkeypatch.setattr(accelerate.state, "PartialState", lambda: SimpleNamespace(num_processes=2))
    with pytest.raises(ConfigError, match=r"train.gradient_accumulation_steps=1 on 2 process\(es\)"):
        task.build_model(raw)
    monkeypatch.undo()
    plain = MlmTask(mlm_config(tmp_path, corpus_file, "train.gradient_accumulation_steps=2"))  # masked tokens alone: exact
    plain.build_tokenizer(raw)
    assert type(plain.build_model(raw)).__name__ == "BertForMaskedLM"


def test_mlm_next_sentence_pairs_mask_whole_words_when_asked(tmp_path, corpus_file):
    """With NSP the words must survive the pair cuts: a ``##`` piece is a target exactly when the piece
    before it (same segment) is, in training batches and in the fixed evaluation masks."""
    config = mlm_config(tmp_path, corpus_file, "mlm.next_sentence_prediction=true", "mlm.whole_word_mask=true",
                        "mlm.mlm_probability=0.3", "mlm.tokenizer_vocab_size=60")
    task = MlmTask(config)
    raw = task.load()
    tokenizer = task.build_tokenizer(raw)
    plain = MlmTask(mlm_config(tmp_path, corpus_file, "mlm.next_sentence_prediction=true", "mlm.mlm_probability=0.3"))
    plain.tokenizer = tokenizer
    train = task.preprocess(raw["train"], train=True)
    assert train["input_ids"] == plain.preprocess(raw["train"], train=True)["input_ids"]  # the same pairs as without words
    labels = task.collator(train=True)([train[i] for i in range(len(train))])["labels"].tolist()
    evaluation = task.preprocess(raw["validation"], train=False)
    # Evaluation inputs are already corrupted: a target's own token is its label.
    uncorrupted = [[i if l == IGNORE_INDEX else l for i, l in zip(ids, ls)] for ids, ls in zip(evaluation["input_ids"], evaluation["labels"])]
    for ids_rows, specials, targets in ((train["input_ids"], train["special_tokens_mask"], labels),
                                        (uncorrupted, evaluation["special_tokens_mask"], evaluation["labels"])):
        pieces = joined = 0
        for ids, special, target in zip(ids_rows, specials, targets):
            tokens = tokenizer.convert_ids_to_tokens(ids)
            for position in range(1, len(ids)):
                if tokens[position].startswith("##") and not special[position - 1]:
                    pieces += 1
                    joined += (target[position] != IGNORE_INDEX) == (target[position - 1] != IGNORE_INDEX)
        assert pieces > 100 and joined == pieces, (pieces, joined)


# ----- bad input ---------------------------------------------------------------------------------
def test_mlm_empty_corpus_is_an_error(tmp_path):
    corpus = tmp_path / "empty.txt"
    corpus.write_text("\n  \n = Only A Heading = \n\n")
    task = MlmTask(mlm_config(tmp_path, corpus, "data.validation_fraction=null",
                              f"data.files={{train: {corpus}, validation: {corpus}}}"))
    with pytest.raises(DataError, match="no text"):
        task.load()


def test_mlm_corpus_shorter_than_one_block_is_an_error(tmp_path, corpus_file):
    task = MlmTask(mlm_config(tmp_path, corpus_file, "data.max_seq_length=64"))
    raw = task.load()
    task.build_tokenizer(raw)
    short = raw["validation"].select([0])
    with pytest.raises(DataError, match="fewer than one block"):
        task.preprocess(short, train=True)
    task_lines = MlmTask(mlm_config(tmp_path, corpus_file, "data.max_seq_length=64", "mlm.packing=false"))
    task_lines.tokenizer = task.tokenizer
    assert len(task_lines.preprocess(short, train=True)) == 1


def test_mlm_tokenizer_without_mask_token_is_an_error(tmp_path, tiny_bert, corpus_file):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    tokenizer.mask_token = None
    tokenizer.save_pretrained(tmp_path / "no-mask")
    task = MlmTask(mlm_config(tmp_path, corpus_file, f"model.tokenizer_name_or_path={tmp_path / 'no-mask'}"))
    with pytest.raises(ModelError, match="no mask token"):
        task.build_tokenizer(task.load())


def test_mlm_vocab_size_disagreeing_with_the_tokenizer_is_an_error(tmp_path, tiny_bert, corpus_file):
    task = MlmTask(mlm_config(tmp_path, corpus_file, f"model.tokenizer_name_or_path={tiny_bert}"))
    raw = task.load()
    task.build_tokenizer(raw)
    with pytest.raises(ModelError, match="vocab_size=200 disagrees"):
        task.build_model(raw)


def test_mlm_config_ships_and_loads():
    config = load_config(Path(__file__).resolve().parents[2] / "configs/pretrain/wikitext2_mlm.yaml", [], lambda name: get_task(name).Options)
    assert config.task == "mlm" and config.model.name_or_path is None
    assert config.model.architecture["num_hidden_layers"] == 4 and config.data.max_seq_length == 128
    assert config.task_options.packing and config.data.validation_fraction == 0.1
    continued = load_config(Path(__file__).resolve().parents[2] / "configs/pretrain/minilm_wikitext2_continued.yaml", [], lambda name: get_task(name).Options)
    assert continued.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2" and continued.task_options.whole_word_mask


def test_mlm_collator_pads_eval_labels_with_ignore_index(tiny_bert):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    collate = MaskingCollator(tokenizer, None, seed=0)
    batch = collate([
        {"input_ids": [2, 10, 3], "attention_mask": [1, 1, 1], "special_tokens_mask": [1, 0, 1], "labels": [-100, 10, -100]},
        {"input_ids": [2, 3], "attention_mask": [1, 1], "special_tokens_mask": [1, 1], "labels": [-100, -100]},
    ])
    assert batch["labels"].tolist() == [[-100, 10, -100], [-100, -100, -100]]
    assert batch["input_ids"][1, 2] == tokenizer.pad_token_id and batch["attention_mask"][1, 2] == 0


def test_mlm_held_out_documents_raise_no_warning_that_validation_fraction_was_unused(tmp_path, corpus_file, caplog):
    """The hold-out of whole documents is data.validation_fraction's doing; the split it made was then taken for
    the data's own, and every MLM run warned that the setting it had just used was unused."""
    task = MlmTask(mlm_config(tmp_path, corpus_file))
    with caplog.at_level(logging.WARNING):
        splits = task.load()
    assert len(splits["validation"]) > 0 and "validation_fraction" not in caplog.text


def test_mlm_whole_word_mask_refuses_a_tokenizer_that_holds_a_row_as_one_word():
    # Gemma's (and Llama 2's) normalizer turns spaces into "▁" before the pre-tokenizer, so word_ids() numbered every
    # token of a row 0: whole-word masking masked whole rows or nothing, without a word.
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    from pipelines.config import ConfigError
    from tasks.mlm.task import _check_words_are_split

    texts = ["the man visited paris today", "a film was good", "the man met a man"] * 20
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="▁", behavior="merged_with_next")
    backend.train_from_iterator(["▁" + text for text in texts], trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"]))
    model = json.loads(backend.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    gemma = GemmaTokenizer(vocab=model["vocab"], merges=merges)
    encoded = gemma(texts[:2], add_special_tokens=False)
    word_ids = [encoded.word_ids(i) for i in range(2)]
    assert {word for word in word_ids[0] if word is not None} == {0}  # the whole row one "word"
    with pytest.raises(ConfigError, match=r"^mlm.whole_word_mask=true: the tokenizer .* holds 'the man visited paris today' as one word"):
        _check_words_are_split(texts[:2], word_ids, gemma)
    _check_words_are_split(["the man", "paris"], [[0, 1], [0, 0]], gemma)  # words apart, or one word alone: fine

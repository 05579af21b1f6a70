"""Units of the translation task: data layouts, labels and collation, BERT2BERT building and weight
sharing, generation settings on save/reload, the sacreBLEU/chrF modules, a tiny Marian run, the configs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from datasets import Dataset

from pipelines.config import ConfigError
from pipelines.config_loading import load_config
from pipelines.errors import DataError
from pipelines.errors import ModelError
from pipelines.metrics import load_metric
from tasks import get_task
from tasks.translation import (
    TranslationTask,
    empty_rows,
    generated_lengths,
    strip_decoder_start,
    cut_generations,
    tie_encoder_decoder_weights,
    to_language_columns,
    tokenizer_lowercases,
)
from tests.conftest import REPO_ROOT, write_jsonl
from tests.tasks.translation_data import TOY_WORDS, build_tiny_marian, copy_rows, wmt_rows

OPTIONS = lambda name: get_task(name).Options  # noqa: E731


def make_task(tmp_path: Path, model_dir: Path, *, rows=None, overrides: list[str] = ()) -> TranslationTask:
    files = {
        "train": write_jsonl(tmp_path / "train.jsonl", rows or copy_rows(24, seed=1)),
        "validation": write_jsonl(tmp_path / "validation.jsonl", copy_rows(5, seed=2)),
    }
    config = tmp_path / "translation.yaml"
    config.write_text(f"""task: translation
output_dir: {tmp_path / 'run'}
model:
  name_or_path: {model_dir}
data:
  files: {{train: {files['train']}, validation: {files['validation']}}}
  max_seq_length: 16
translation:
  num_beams: 3
  max_new_tokens: 7
  length_penalty: 0.8
""")
    return TranslationTask(load_config(config, list(overrides), OPTIONS))


# ----- data -----------------------------------------------------------------------------
def test_translation_to_language_columns_unpacks_the_wmt_layout():
    split = Dataset.from_list(wmt_rows(4, seed=0))
    flat = to_language_columns(split, ["de", "en"], "translation", "train")
    assert set(flat.column_names) == {"de", "en"}
    assert [row["de"] for row in split["translation"]] == flat["de"]


def test_translation_to_language_columns_keeps_flat_columns():
    split = Dataset.from_list([{"en": "a film", "de": "ein film", "id": 1}])
    assert to_language_columns(split, ["de", "en"], "translation", "train") is split


def test_translation_missing_language_key_names_row_and_languages():
    split = Dataset.from_list([{"translation": {"de": "ein film", "en": "a film"}}, {"translation": {"de": "gut", "fr": "bon"}}])
    with pytest.raises(DataError, match=r"row 2 \(rows count from 1\).*\['de', 'fr'\].*'en'"):
        to_language_columns(split, ["de", "en"], "translation", "train")


def test_translation_missing_columns_lists_the_available_ones():
    split = Dataset.from_list([{"source": "ein film", "target": "a film"}])
    with pytest.raises(DataError, match=r"no column\(s\) \['de', 'en'\].*\['source', 'target'\]"):
        to_language_columns(split, ["de", "en"], "translation", "train")


def test_translation_empty_rows_finds_blank_sources_and_targets():
    split = Dataset.from_list([{"de": "a", "en": "b"}, {"de": " ", "en": "b"}, {"de": "a", "en": ""}, {"de": "c", "en": "d"},
                               {"de": "e", "en": "\u200b"}, {"de": "\ufeff\u200d ", "en": "f"}, {"de": "\u200bg", "en": "h"}])
    # Zero-width and byte-order marks are no text: a target of them alone taught the model to say nothing.
    assert empty_rows(split, ["de", "en"]) == [1, 2, 4, 5]


def test_translation_empty_lines_fail_or_are_skipped_as_configured(tmp_path, tiny_bert):
    rows = copy_rows(6, seed=3)
    rows[2]["en"] = ""
    task = make_task(tmp_path, tiny_bert, rows=rows)
    with pytest.raises(DataError, match=r"split 'train': 1 row\(s\).*rows 3, counting from 1.*empty_lines=skip"):
        task.load()
    skipping = make_task(tmp_path, tiny_bert, rows=rows, overrides=["translation.empty_lines=skip"])
    assert len(skipping.load()["train"]) == 5


def test_translation_load_inputs_reads_txt_lines_and_jsonl_source_field(tmp_path, tiny_bert):
    task = make_task(tmp_path, tiny_bert)
    lines = tmp_path / "inputs.txt"
    lines.write_text("film story\nplot very\n")
    assert task.load_inputs(str(lines))["de"] == ["film story", "plot very"]
    jsonl = write_jsonl(tmp_path / "inputs.jsonl", [{"de": "film plot", "id": 3}])
    assert task.load_inputs(str(jsonl))["de"] == ["film plot"]
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"fr": "bon film"}])
    with pytest.raises(DataError, match=r"no 'de' field"):
        task.load_inputs(str(wrong))


def test_translation_predict_inputs_with_references_are_not_tokenised_as_labels(tmp_path, tiny_bert):
    """An input file to predict may be a test set holding references, some missing or longer than the decoder's
    positions: predict never reads them, so they must neither crash the tokenizer (a None reference raised a
    TypeError with a traceback) nor refuse the run (``labels of up to N tokens``)."""
    task = make_task(tmp_path, tiny_bert)
    task.build_tokenizer(None)
    path = write_jsonl(tmp_path / "test.jsonl", [{"de": "film story", "en": "film " * 100}, {"de": "plot very", "en": None}])
    features = task.preprocess(task.load_inputs(str(path)), train=False, inputs=True)
    assert len(features) == 2 and "labels" not in features.column_names


@pytest.mark.parametrize("where", ["train", "input"])
def test_translation_source_or_target_that_is_not_text_names_split_and_column(tmp_path, tiny_bert, where):
    """A column of numbers (a csv of ids, a jsonl mixing numbers and strings) used to reach the tokenizer and
    end in a TypeError traceback."""
    rows = copy_rows(24, seed=1)
    if where == "train":
        rows[3]["en"] = 7
        with pytest.raises(DataError, match=r"split 'train' .*column 'en' holds .*not text"):
            make_task(tmp_path, tiny_bert, rows=rows).load()
    else:
        path = write_jsonl(tmp_path / "test.jsonl", [{"de": "film story"}, {"de": 5}])
        with pytest.raises(DataError, match=rf"--input {re.escape(str(path))}: column 'de' holds Json values, not text"):
            make_task(tmp_path, tiny_bert).load_inputs(str(path))

def test_translation_predict_keeps_rows_with_an_empty_source_in_place(tmp_path, tiny_bert, caplog):
    """With empty_lines=skip, predict dropped such rows: output row i was no longer input row i."""
    task = make_task(tmp_path, tiny_bert, overrides=["translation.empty_lines=skip"])
    task.build_tokenizer(None)
    path = write_jsonl(tmp_path / "test.jsonl", [{"de": "film story"}, {"de": " "}, {"de": None}, {"de": "plot very"}])
    with caplog.at_level("WARNING"):
        examples = task.load_inputs(str(path))
    assert examples["de"] == ["film story", " ", None, "plot very"]
    assert "2 row(s) with an empty 'de' (rows 2, 3, counting from 1) are not translated" in caplog.text
    features = task.preprocess(examples, train=False, inputs=True)
    assert len(features) == 4
    generated = np.array([[101, 7, 102]] * 4)  # whatever the model made of the empty rows, they stay empty
    predictions = task.postprocess({"generated_tokens": generated}, features, examples)
    rows = task.format_predictions(predictions, examples)
    assert [row["translation_text"] == "" for row in rows] == [False, True, True, False]
    with pytest.raises(DataError, match=r"--input .*rows 2, 3, counting from 1.*empty_lines=skip to give them an empty translation"):
        make_task(tmp_path, tiny_bert).load_inputs(str(path))


def test_translation_preprocess_warns_once_of_sources_and_targets_cut_to_their_limit(tmp_path, tiny_bert, caplog):
    """Sources longer than data.max_seq_length and targets longer than max_target_length were cut in silence."""
    rows = copy_rows(24, seed=1)
    rows[4]["de"] = " ".join(TOY_WORDS * 5)  # 30 words + [CLS] [SEP]
    rows[9]["de"] = " ".join(TOY_WORDS * 3)
    rows[7]["en"] = " ".join(TOY_WORDS * 2)
    task = make_task(tmp_path, tiny_bert, rows=rows, overrides=["translation.max_target_length=10"])
    raw = task.load()
    task.build_tokenizer(raw)
    with caplog.at_level("WARNING"):
        features = task.preprocess(raw["train"], train=True)
    assert set(features.column_names) == {"input_ids", "attention_mask", "labels"}
    assert max(len(ids) for ids in features["input_ids"]) == 16 and max(len(ids) for ids in features["labels"]) == 9
    assert features[4]["input_ids"][-1] == task.tokenizer.sep_token_id  # cut, still ended
    warnings = [record.getMessage() for record in caplog.records if "cut there" in record.getMessage()]
    assert len(warnings) == 2, warnings
    assert "split 'train': 2 of 24 source(s) are longer than data.max_seq_length=16 tokens (the longest has 32)" in warnings[0]
    assert "1 of 24 target(s) are longer than translation.max_target_length=10 tokens (the longest has 14)" in warnings[1]
    caplog.clear()
    path = write_jsonl(tmp_path / "test.jsonl", [{"de": "film story"}, {"de": " ".join(TOY_WORDS * 4)}])
    with caplog.at_level("WARNING"):
        task.preprocess(task.load_inputs(str(path)), train=False, inputs=True)
    assert f"--input {path}: 1 of 2 source(s) (rows 2, counting from 1) are longer than data.max_seq_length=16" in caplog.text


# ----- labels, collation ------------------------------------------------------------------
def test_translation_strip_decoder_start_drops_only_a_leading_start_token():
    assert strip_decoder_start([2, 7, 8, 3], 2) == [7, 8, 3]
    assert strip_decoder_start([7, 2, 3], 2) == [7, 2, 3]
    assert strip_decoder_start([7, 8, 3], None) == [7, 8, 3]


def test_translation_generated_lengths_stop_at_the_first_end_token():
    # decoder start 2, end 3, pad 0; beam search fills finished rows with 3 when pad is 0
    generated = np.array([[2, 7, 8, 3, 3, 3], [2, 7, 8, 9, 5, 3], [2, 7, 3, 0, 0, 0], [2, 7, 8, 9, 5, 6]])
    assert generated_lengths(generated, 3, 0).tolist() == [3, 5, 2, 5]
    assert generated_lengths(generated, [3, 9], 0).tolist() == [3, 3, 2, 3]


def test_translation_cut_generations_are_the_rows_stopped_by_max_new_tokens():
    # decoder start 2, end 3, pad 0; max_new_tokens 4
    generated = np.array([[2, 7, 8, 9, 5], [2, 7, 8, 9, 3], [2, 7, 3, 0, 0], [2, 7, 8, 3, 3]])
    gen_lens = generated_lengths(generated, 3, 0)
    assert cut_generations(gen_lens, generated, 3, 4, None).tolist() == [True, False, False, False]
    # With forced_eos_token_id, generate() puts the end token at the limit itself: row 2 was cut as well.
    assert cut_generations(gen_lens, generated, 3, 4, 3).tolist() == [True, True, False, False]


def test_translation_postprocess_warns_of_translations_cut_at_max_new_tokens(tmp_path, caplog):
    task = make_task(tmp_path, build_tiny_marian(tmp_path / "marian"))
    task.build_tokenizer(None)
    task.build_model(None)  # max_new_tokens 7; Marian forces its end token (1) at the limit
    examples = Dataset.from_list([{"de": "der film"}] * 3)
    generated = np.array([[0, 3, 4, 5, 6, 7, 8, 1], [0, 3, 4, 1, 0, 0, 0, 0], [0, 3, 4, 5, 6, 7, 8, 9]])
    with caplog.at_level("WARNING"):
        task.postprocess({"generated_tokens": generated}, None, examples)
    assert "2 of 3 translation(s) (rows 1, 3, counting from 1, in output order) reached translation.max_new_tokens=7" in caplog.text


def test_translation_tokenizer_lowercases_detects_uncased_wordpiece(tiny_bert, tmp_path):
    from transformers import AutoTokenizer

    assert tokenizer_lowercases(AutoTokenizer.from_pretrained(tiny_bert))
    assert not tokenizer_lowercases(AutoTokenizer.from_pretrained(build_tiny_marian(tmp_path / "marian")))


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_translation_collator_pads_labels_with_minus_100_and_shifts_decoder_inputs(tmp_path, tiny_bert, padding_side):
    """Labels are padded on the right whatever the tokenizer's padding side: left-padded labels would put
    pad tokens between the decoder start and the first word of every shorter target in a batch."""
    task = make_task(tmp_path, tiny_bert)
    raw = task.load()
    tokenizer = task.build_tokenizer(raw)
    tokenizer.padding_side = padding_side  # a checkpoint may ship a left-padding tokenizer
    features = task.preprocess(raw["train"], train=True)
    model = task.build_model(raw)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    assert all(ids[0] != cls and ids[-1] == sep for ids in features["labels"])  # [CLS] is the decoder start, not a label
    batch = task.collator(train=True)([features[i] for i in range(6)])
    lengths = [len(features[i]["labels"]) for i in range(6)]
    assert len(set(lengths)) > 1
    assert set(batch) == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}
    for row, length in enumerate(lengths):
        assert (batch["labels"][row, length:] == -100).all() and (batch["labels"][row, :length] != -100).all()
    assert (batch["decoder_input_ids"][:, 0] == cls).all()
    shifted = batch["labels"][:, :-1].masked_fill(batch["labels"][:, :-1] == -100, pad)
    assert torch.equal(batch["decoder_input_ids"][:, 1:], shifted)
    assert model(**batch).loss.item() > 0
    assert tokenizer.padding_side == padding_side  # the run's tokenizer (saved with it) is left as it came
    eval_batch = task.collator(train=False)([features[i] for i in range(3)])
    assert set(eval_batch) == {"input_ids", "attention_mask"}


# ----- BERT2BERT, weight sharing, generation settings ---------------------------------------
def test_translation_bert2bert_sets_special_tokens_and_generation_settings(tmp_path, tiny_bert):
    task = make_task(tmp_path, tiny_bert)
    raw = task.load()
    tokenizer = task.build_tokenizer(raw)
    model = task.build_model(raw)
    assert type(model).__name__ == "EncoderDecoderModel"
    assert model.encoder.pooler is None  # unused by the decoder: DDP would fail on its missing gradients
    # Saved without it, the run loads without a report of encoder.pooler.dense as MISSING ("newly initialized").
    from transformers import AutoModelForSeq2SeqLM

    model.save_pretrained(tmp_path / "saved")
    _, loading = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    assert model.config.decoder.is_decoder and model.config.decoder.add_cross_attention
    for holder in (model.config, model.generation_config):
        assert (holder.decoder_start_token_id, holder.eos_token_id, holder.pad_token_id) == (
            tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    gen = model.generation_config
    assert (gen.num_beams, gen.max_new_tokens, gen.length_penalty) == (3, 7, 0.8)
    assert task.output_pad_values["generated_tokens"] == tokenizer.pad_token_id

    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded_task = make_task(tmp_path, tiny_bert)
    reloaded_task.build_tokenizer(None, model_path=str(tmp_path / "saved"))
    reloaded = reloaded_task.build_model(None, model_path=str(tmp_path / "saved"))
    assert type(reloaded).__name__ == "EncoderDecoderModel"
    gen = reloaded.generation_config
    assert (gen.num_beams, gen.max_new_tokens, gen.length_penalty, gen.decoder_start_token_id) == (3, 7, 0.8, tokenizer.cls_token_id)
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert saved["num_beams"] == 3 and saved["max_new_tokens"] == 7
    # Generation is bounded by max_new_tokens, not by a 20-token default.
    inputs = tokenizer(["film story plot"], return_tensors="pt", return_token_type_ids=False)
    long_run = reloaded.generate(**inputs, max_new_tokens=30, min_new_tokens=30, num_beams=1)
    assert long_run.shape[1] == 31


def test_translation_max_new_tokens_past_the_decoders_positions_is_refused_before_training(tmp_path, tiny_bert):
    """tiny_bert has 64 positions: 64 new tokens fit, 65 would fail inside generate() mid-evaluation."""
    task = make_task(tmp_path, tiny_bert, overrides=["translation.max_new_tokens=64", "translation.num_beams=1"])
    raw = task.load()
    tokenizer = task.build_tokenizer(raw)
    model = task.build_model(raw).eval()
    inputs = tokenizer(["film story plot"], return_tensors="pt", return_token_type_ids=False)
    assert model.generate(**inputs, min_new_tokens=64).shape[1] == 65  # the decoder start + 64: the limit is exact

    too_long = make_task(tmp_path, tiny_bert, overrides=["translation.max_new_tokens=65"])
    too_long.build_tokenizer(raw)
    with pytest.raises(ConfigError, match=r"translation\.max_new_tokens=65 exceeds the 64 positions of the decoder.*at most 64"):
        too_long.build_model(raw)


@pytest.mark.parametrize("limit", [1, 2])
def test_translation_max_target_length_without_room_for_a_word_is_refused(tmp_path, tiny_bert, limit):
    """BERT targets carry [CLS] and [SEP]: below two the tokenizer did not truncate at all (targets stayed whole while
    the warning called them cut), at two every target was [SEP] alone."""
    task = make_task(tmp_path, tiny_bert, overrides=[f"translation.max_target_length={limit}"])
    with pytest.raises(ConfigError, match=rf"translation\.max_target_length={limit} leaves no room for a target word.*adds 2 special"):
        task.build_tokenizer(task.load())
    roomy = make_task(tmp_path, tiny_bert, overrides=["translation.max_target_length=3"])
    roomy.build_tokenizer(roomy.load())


def test_translation_tied_bert2bert_shares_weights_and_survives_reload(tmp_path, tiny_bert):
    from transformers import AutoModelForSeq2SeqLM

    task = make_task(tmp_path, tiny_bert, overrides=["translation.tie_encoder_decoder=true"])
    raw = task.load()
    task.build_tokenizer(raw)
    model = task.build_model(raw)
    encoder_weight = model.encoder.embeddings.word_embeddings.weight
    assert model.decoder.bert.embeddings.word_embeddings.weight is encoder_weight
    assert model.decoder.bert.encoder.layer[1].attention.self.query.weight is model.encoder.encoder.layer[1].attention.self.query.weight
    assert model.decoder.bert.encoder.layer[0].crossattention.self.query.weight is not None  # the decoder's own
    untied = sum(p.numel() for p in make_untied(tmp_path, tiny_bert).parameters())
    assert sum(p.numel() for p in model.parameters()) < untied
    with torch.no_grad():
        encoder_weight.add_(0.5)  # move the shared weights away from the checkpoint's
    model.save_pretrained(tmp_path / "tied")
    task.tokenizer.save_pretrained(tmp_path / "tied")

    plain = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "tied")  # what pipeline() loads: full copies on disk
    assert torch.equal(plain.decoder.bert.embeddings.word_embeddings.weight, encoder_weight)
    reloaded_task = make_task(tmp_path, tiny_bert)
    reloaded_task.build_tokenizer(None, model_path=str(tmp_path / "tied"))
    reloaded = reloaded_task.build_model(None, model_path=str(tmp_path / "tied"))
    assert reloaded.decoder.bert.embeddings.word_embeddings.weight is reloaded.encoder.embeddings.word_embeddings.weight
    assert torch.equal(reloaded.encoder.embeddings.word_embeddings.weight, encoder_weight)


def test_translation_finetuned_bert2bert_as_checkpoint_keeps_the_label_rule(tmp_path, tiny_bert):
    first = make_task(tmp_path, tiny_bert)
    raw = first.load()
    tokenizer = first.build_tokenizer(raw)
    first.build_model(raw).save_pretrained(tmp_path / "bert2bert")
    tokenizer.save_pretrained(tmp_path / "bert2bert")
    again = make_task(tmp_path, tmp_path / "bert2bert")  # continue training a finished BERT2BERT
    raw = again.load()
    again.build_tokenizer(raw)
    assert again.warm_start is False
    features = again.preprocess(raw["train"], train=True)
    assert all(ids[0] != tokenizer.cls_token_id for ids in features["labels"])
    assert type(again.build_model(raw)).__name__ == "EncoderDecoderModel"


def make_untied(tmp_path: Path, tiny_bert: Path):
    folder = tmp_path / "untied"
    folder.mkdir()
    task = make_task(folder, tiny_bert)
    raw = task.load()
    task.build_tokenizer(raw)
    return task.build_model(raw)


def test_translation_tie_weights_needs_common_parameters(tmp_path, tiny_bert):
    task = make_task(tmp_path, tiny_bert)
    raw = task.load()
    task.build_tokenizer(raw)
    model = task.build_model(raw)
    assert tie_encoder_decoder_weights(model) == len(list(model.encoder.embeddings.parameters())) + len(
        [name for name, _ in model.encoder.encoder.named_parameters()])


def test_translation_encoder_that_cannot_decode_is_a_clear_error(tmp_path, tiny_bert):
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

    distil = tmp_path / "distil"
    config = DistilBertConfig(vocab_size=AutoTokenizer.from_pretrained(tiny_bert).vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    DistilBertModel(config).save_pretrained(distil)
    task = make_task(tmp_path, tiny_bert, overrides=[f"translation.decoder_name_or_path={distil}"])
    raw = task.load()
    task.build_tokenizer(raw)
    with pytest.raises(ModelError, match=r"cannot serve as a decoder.*decoder_name_or_path"):
        task.build_model(raw)


# ----- metrics ------------------------------------------------------------------------------
HYPOTHESES = ["The cat sat on the mat.", "A dog runs in the park today", "Hello world"]
REFERENCES = ["The cat sat on a mat.", "a dog is running in the park.", "hello , world"]
SECOND_REFERENCES = ["A cat sat on the mat.", "The dog runs in a park.", "Hello world!"]


def test_translation_t5_prefix_fills_an_unset_source_prefix_only(tmp_path):
    from tests.families.builders import build_family

    checkpoint = build_family("t5", tmp_path / "t5")
    unset = make_task(tmp_path, checkpoint)
    unset._plan(None)
    assert unset.source_prefix == "translate German to English: "
    empty = make_task(tmp_path, checkpoint, overrides=["translation.source_prefix=''"])
    empty._plan(None)
    assert empty.source_prefix == ""


def test_translation_run_saves_only_the_prefix_it_trains_with(tmp_path):
    from transformers import AutoConfig

    from tests.families.builders import build_family

    checkpoint = build_family("bart", tmp_path / "bart")
    base = AutoConfig.from_pretrained(checkpoint)
    base.prefix = " "  # as BART-CNN's config carries
    base.save_pretrained(checkpoint)
    task = make_task(tmp_path, checkpoint)
    task.build_tokenizer(None)
    model = task.build_model(None)
    assert task.source_prefix == "" and not model.config.prefix
    model.save_pretrained(tmp_path / "run")
    task.tokenizer.save_pretrained(tmp_path / "run")
    reloaded = make_task(tmp_path, checkpoint)
    reloaded.build_tokenizer(None, model_path=str(tmp_path / "run"))
    assert reloaded.source_prefix == ""  # evaluate/predict/pipeline() prepend what training did: nothing
    # An explicit "" at predict time overrides a prefix the run saved.
    model.config.prefix = "translate: "
    model.save_pretrained(tmp_path / "run")
    overridden = make_task(tmp_path, checkpoint, overrides=["translation.source_prefix=''"])
    overridden.build_tokenizer(None, model_path=str(tmp_path / "run"))
    assert overridden.source_prefix == ""


def test_translation_sacrebleu_module_matches_sacrebleu():
    metric = load_metric("sacrebleu")
    result = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    direct = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert result["score"] == pytest.approx(direct.score)
    assert result["counts"] == direct.counts and result["sys_len"] == direct.sys_len
    lower = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES], lowercase=True)
    assert lower["score"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True).score)
    assert lower["score"] > result["score"] and "case:lc" in lower["signature"] and "tok:13a" in lower["signature"]
    two = metric.compute(predictions=HYPOTHESES, references=[list(p) for p in zip(REFERENCES, SECOND_REFERENCES)])
    assert two["score"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, SECOND_REFERENCES]).score)
    perfect = metric.compute(predictions=REFERENCES, references=[[r] for r in REFERENCES])
    assert perfect["score"] == pytest.approx(100.0)
    # No 3- or 4-gram in common: the score is the smoothing's (sacrebleu's default, exp), 0 or another value under others.
    unsmoothed = metric.compute(predictions=["a cat sat here"], references=[["the cat sat there"]])
    assert unsmoothed["score"] > 0
    assert unsmoothed["score"] == pytest.approx(sacrebleu.corpus_bleu(["a cat sat here"], [["the cat sat there"]]).score)
    assert "smooth:exp" in unsmoothed["signature"]


def test_translation_chrf_module_matches_sacrebleu():
    metric = load_metric("chrf")
    result = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    assert result["score"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    plus = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES], word_order=2, lowercase=True)
    direct = sacrebleu.metrics.CHRF(word_order=2, lowercase=True).corpus_score(HYPOTHESES, [REFERENCES])
    assert plus["score"] == pytest.approx(direct.score) and "nw:2" in plus["signature"]


def test_translation_compute_metrics_lowercases_for_an_uncased_tokenizer(tmp_path, tiny_bert):
    task = make_task(tmp_path, tiny_bert)
    task.build_tokenizer(None, model_path=str(tiny_bert))
    examples = Dataset.from_list([{"de": "x", "en": r} for r in REFERENCES])
    hypotheses = [h.lower() for h in HYPOTHESES]
    metrics = task.compute_metrics({"hypotheses": hypotheses, "gen_lens": np.array([6, 7, 2])}, examples)
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [REFERENCES], lowercase=True).score)
    assert metrics["gen_len"] == pytest.approx(5.0) and metrics["bleu_lowercased"] == 1.0


# ----- a seq2seq checkpoint (Marian) through the loop, and the configs ------------------------
def test_translation_marian_config_trains_a_tiny_marian(tmp_path):
    from pipelines.train import train

    marian = build_tiny_marian(tmp_path / "marian")
    train_file = write_jsonl(tmp_path / "train.jsonl", wmt_rows(16, seed=0))
    valid_file = write_jsonl(tmp_path / "validation.jsonl", wmt_rows(5, seed=1))
    config = load_config(REPO_ROOT / "configs/translation/wmt16_marian.yaml", [
        f"model.name_or_path={marian}", f"output_dir={tmp_path / 'run'}",
        f"data.files={{train: {train_file}, validation: {valid_file}}}",
        "train.max_steps=2", "train.batch_size=4", "train.eval_steps=null", "train.torch_num_threads=1",
        "translation.max_new_tokens=5", "translation.num_beams=2",
    ], OPTIONS)
    metrics = train(config, get_task("translation")(config))
    assert metrics["global_step"] == 2 and metrics["eval_samples"] == 5
    assert {"eval_bleu", "eval_chrf", "eval_gen_len"} <= set(metrics) and 0 < metrics["eval_gen_len"] <= 5
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model_type"] == "marian" and saved["decoder_start_token_id"] == 0
    generation = json.loads((tmp_path / "run" / "generation_config.json").read_text())
    assert generation["num_beams"] == 2 and generation["max_new_tokens"] == 5
    assert len((tmp_path / "run" / "generations.jsonl").read_text().splitlines()) == 5


def test_translation_checkpoint_without_its_tokenizer_files_is_refused_naming_it(tmp_path, tiny_bert):
    # Weights and config.json alone: a BERT2BERT warm start built a tokenizer of the special tokens (every word read
    # as [UNK], and training went on); a Marian checkpoint ended in a TypeError traceback.
    bert = Path(shutil.copytree(tiny_bert, tmp_path / "bert"))
    marian = build_tiny_marian(tmp_path / "marian")
    for folder in (bert, marian):
        for path in folder.iterdir():
            if path.name not in ("config.json", "model.safetensors", "generation_config.json"):
                path.unlink()
    with pytest.raises(ModelError, match=rf"{re.escape(str(bert))} holds no tokenizer vocabulary.*every word would read as \[UNK\]"):
        make_task(tmp_path, bert).build_tokenizer(None)
    with pytest.raises(ModelError, match=rf"cannot load a tokenizer from {re.escape(str(marian))}"):
        make_task(tmp_path, marian).build_tokenizer(None)


def test_translation_configs_load():
    multi30k = load_config(REPO_ROOT / "configs/translation/multi30k_de_en.yaml", [], OPTIONS)
    assert multi30k.task == "translation" and multi30k.data.path == "bentrevett/multi30k"
    assert multi30k.model.name_or_path == "sentence-transformers/all-MiniLM-L6-v2"
    assert (multi30k.task_options.source_lang, multi30k.task_options.target_lang) == ("de", "en")
    marian = load_config(REPO_ROOT / "configs/translation/wmt16_marian.yaml", [], OPTIONS)
    assert marian.model.name_or_path == "Helsinki-NLP/opus-mt-de-en" and marian.data.name == "de-en"
    for path in (REPO_ROOT / "configs/translation").glob("*.yaml"):
        assert path.read_text().startswith("# Run:"), path


def test_translation_csv_sentences_are_read_as_written(tmp_path):
    # pandas alone reads a column of numbers ("2024", "1.50") as numbers and "NA" as missing.
    from pipelines.config_loading import load_config
    from tasks import get_task

    rows = tmp_path / "train.csv"
    rows.write_text("de,en\n2024,2024\n1.50,1.50\nNA,NA\n")
    config_path = tmp_path / "c.yaml"
    config_path.write_text(f"task: translation\noutput_dir: {tmp_path / 'run'}\n"
                           f"data:\n  files:\n    train: {rows}\n    validation: {rows}\ntranslation: {{source_lang: de, target_lang: en}}\n")
    task = get_task("translation")(load_config(config_path, [], lambda name: get_task(name).Options))
    raw = task.load()
    assert raw["train"]["de"] == ["2024", "1.50", "NA"] and raw["train"]["en"] == ["2024", "1.50", "NA"]


def test_translation_decoding_keeps_a_sentencepiece_vocabularys_spaces_and_cleans_up_wordpiece():
    """A Unigram vocabulary holds ``▁!``: ``oui !`` generated exactly was decoded as ``oui!`` (BLEU 0 with
    bleu_tokenize none); WordPiece pieces carry no spaces, and there the clean-up restores ``it's``."""
    from transformers import T5Tokenizer

    from tasks.translation.generation import cleans_up_spaces, decode
    from tasks.translation.pipeline import TranslationPipeline

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(piece, -1.0) for piece in ("▁oui", "▁!", "▁c", "'", "est", "▁vrai", "▁?")]
    unigram = T5Tokenizer(vocab=vocab, extra_ids=0)
    generated = np.array([[0] + unigram.convert_tokens_to_ids(["▁oui", "▁!"]) + [1, 0, 0, 0],  # padded as generate() pads
                          [0] + unigram.convert_tokens_to_ids(["▁c", "'", "est", "▁vrai", "▁?"]) + [1]])
    assert not cleans_up_spaces(unigram)
    assert decode(unigram, generated) == ["oui !", "c'est vrai ?"]
    pipe = TranslationPipeline.__new__(TranslationPipeline)
    pipe.tokenizer = unigram
    assert [row["translation_text"] for row in pipe.postprocess({"output_ids": torch.tensor(generated)})] == ["oui !", "c'est vrai ?"]

    from tokenizers import decoders
    from transformers import BertTokenizerFast

    from tests.conftest import written_wordpiece

    backend = written_wordpiece(["it's a man, riding."], ["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    backend.decoder = decoders.WordPiece()
    wordpiece = BertTokenizerFast(tokenizer_object=backend)
    ids = wordpiece("it's a man, riding.", add_special_tokens=False)["input_ids"]
    assert cleans_up_spaces(wordpiece) and decode(wordpiece, np.array([ids])) == ["it's a man, riding."]

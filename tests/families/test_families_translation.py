"""Translation on every seq2seq family: T5 (source prefix), BART, Marian, mBART, NLLB and M2M100 (language codes), BERT2BERT, Pegasus.

A few training steps each; then: the model is fed what its family expects (T5's ``translate German to
English: `` prefix, recorded for ``pipeline()``; mBART's source language code after ``</s>`` and the
target code as the decoder start; NLLB's and M2M100's codes opening both sides, ``</s>`` as the decoder start and the target
code forced after it; Pegasus's ``<pad>`` as the decoder start and its reserved tokens kept out of the text),
``bertpipe predict`` and ``pipeline("translation")`` give the same text, and LoRA attaches without naming
target modules.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, pipeline

from pipelines.adapters import apply_peft
from pipelines.config import ModelConfig, PeftConfig
from pipelines.modeling import count_parameters, load_model
from tasks.translation.generation import decode
from tests.conftest import write_jsonl
from tests.families.builders import SEQ2SEQ_FAMILIES
from tests.families.matrix import card_code, head_at_labelled_positions_agrees, predict, run_bertpipe, run_card_code, train, translation_rows

GENERATION = "num_beams: 2, max_new_tokens: 8"
OPTIONS = {"mbart": f"src_lang: de_DE, tgt_lang: en_XX, {GENERATION}",
           # After 3 steps the tiny NLLB repeats the code every target opens with, which decodes to "": no
           # repeated token, so that its translations hold words for predict and pipeline() to agree on.
           "nllb": f"src_lang: deu_Latn, tgt_lang: eng_Latn, forced_bos_token: eng_Latn, no_repeat_ngram_size: 1, {GENERATION}",
           # M2M100 names its codes by language (de -> __de__); the target code is forced without being named.
           "m2m100": f"src_lang: de, tgt_lang: en, no_repeat_ngram_size: 1, {GENERATION}"}

# Families whose source and target open with a language code (NLLB by code, M2M100 by language: __de__ text </s>).
FORCED_CODES = {"nllb": ("deu_Latn", "eng_Latn"), "m2m100": ("__de__", "__en__")}

@pytest.fixture(scope="module", params=SEQ2SEQ_FAMILIES)
def translation_run(request, family_checkpoint, tmp_path_factory):
    family = request.param
    folder = tmp_path_factory.mktemp(f"translation-{family}")
    files = {"train": write_jsonl(folder / "train.jsonl", translation_rows(32, 1)),
             "validation": write_jsonl(folder / "validation.jsonl", translation_rows(8, 2))}
    run = train(folder, "translation", family_checkpoint(family), files, train="  max_steps: 3",
                section=f"translation: {{{OPTIONS.get(family, GENERATION)}}}")
    return family, run, folder


def test_families_translation_feeds_each_family_its_conventions(translation_run):
    family, run, _ = translation_run
    config = AutoConfig.from_pretrained(run)
    tokenizer = AutoTokenizer.from_pretrained(run)
    if family == "t5":
        assert config.prefix == "translate German to English: "
    if family == "mbart":
        ids = tokenizer("der mann")["input_ids"]
        assert tokenizer.convert_ids_to_tokens(ids[-2:]) == ["</s>", "de_DE"]
        assert config.decoder_start_token_id == tokenizer.convert_tokens_to_ids("en_XX")
    if family in FORCED_CODES:  # the codes open both sides; generation starts with </s>, then the forced target code
        source_code, target_code = FORCED_CODES[family]
        assert tokenizer.convert_ids_to_tokens(tokenizer("der mann")["input_ids"])[::3] == [source_code, "</s>"]
        assert tokenizer.convert_ids_to_tokens(tokenizer(text_target="the man")["input_ids"])[::3] == [target_code, "</s>"]
        generation = GenerationConfig.from_pretrained(run)
        assert generation.decoder_start_token_id == tokenizer.eos_token_id
        assert generation.forced_bos_token_id == tokenizer.convert_tokens_to_ids(target_code)
        # What predict decodes (and BLEU scores) leaves the codes out, after the run's tokenizer was reloaded.
        ids = [tokenizer.eos_token_id, *tokenizer(text_target="the man")["input_ids"], tokenizer.pad_token_id]
        assert decode(tokenizer, np.array([ids])) == ["the man"]
    if family == "pegasus":  # no prefix or codes; the decoder starts with <pad>; 101 reserved <unk_x> and <mask_1/2> never decode
        from pipelines.modeling import usable_positions

        assert tokenizer.convert_ids_to_tokens(tokenizer("der mann")["input_ids"])[-1] == "</s>" and config.prefix is None
        assert GenerationConfig.from_pretrained(run).decoder_start_token_id == tokenizer.pad_token_id == 0
        reserved = tokenizer.convert_tokens_to_ids(["<mask_1>", "<mask_2>", "<unk_2>", "<unk_102>"])
        assert reserved == [2, 3, 4, 104]
        ids = [tokenizer.pad_token_id, *reserved[:2], *tokenizer(text_target="the man")["input_ids"], reserved[3], tokenizer.pad_token_id]
        assert decode(tokenizer, np.array([ids])) == ["the man"]
        # Sinusoidal positions: a fixed table of exactly max_position_embeddings rows, none kept for padding.
        assert usable_positions(config) == config.max_position_embeddings
    if family == "bert2bert":
        assert config.model_type == "encoder-decoder" and config.decoder.is_decoder and config.decoder.add_cross_attention
    assert config.decoder_start_token_id is not None and config.pad_token_id is not None


def test_families_translation_predict_and_pipeline_agree(translation_run):
    from tasks import load_tasks

    load_tasks()  # registers pipeline("translation") for bertpipe's runs

    family, run, folder = translation_run
    sources = [row["de"] for row in translation_rows(4, 3)]
    predicted = predict(run, [{"de": source} for source in sources], folder)
    served = pipeline("translation", model=str(run))(sources)
    assert [row["translation_text"] for row in predicted] == [row["translation_text"] for row in served], family
    assert any(row["translation_text"] for row in predicted), f"{family}: only empty translations, nothing compared"
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 3


@pytest.mark.parametrize("family", ["marian", "pegasus"])
def test_families_translation_sinusoidal_position_tables_stay_fixed_and_evaluate_scores_the_trained_model(family, family_checkpoint, tmp_path):
    """transformers 5's from_pretrained returns the tables these classes build frozen as trainable: they were trained,
    and Marian's, which save_pretrained leaves out, came back recomputed at every load: metrics.json scored the trained
    tables, evaluate, predict and pipeline() the recomputed ones (BLEU 4.52 against 4.86 after 600 steps)."""
    files = {"train": write_jsonl(tmp_path / "train.jsonl", translation_rows(32, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", translation_rows(8, 2))}
    run = train(tmp_path, "translation", family_checkpoint(family), files, "train.learning_rate=0.02",
                train="  max_steps: 40", section=f"translation: {{{GENERATION}}}")
    metrics = json.loads((run / "metrics.json").read_text())
    checkpoint = AutoModelForSeq2SeqLM.from_pretrained(family_checkpoint(family))
    tables = sum(parameter.numel() for name, parameter in checkpoint.named_parameters() if "embed_positions" in name)
    assert tables and metrics["trainable_params"] == metrics["total_params"] - tables
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(run)
    for name, parameter in reloaded.named_parameters():
        if "embed_positions" in name:
            assert torch.equal(parameter, dict(checkpoint.named_parameters())[name]), name
    run_bertpipe("evaluate", str(run))
    evaluated = json.loads((run / "eval_validation.json").read_text())
    for key in ("eval_bleu", "eval_chrf", "eval_gen_len"):
        assert evaluated[key] == pytest.approx(metrics[key], abs=1e-9), key


def test_families_translation_head_at_labelled_positions_gives_the_familys_loss_and_gradients(translation_run):
    """Training hands each family's vocabulary projection the target positions that are not padding only
    (pipelines/labelled_positions.py): the family's loss, those rows' logits and every gradient."""
    from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right

    family, run, _ = translation_run
    tokenizer = AutoTokenizer.from_pretrained(run)
    whole = AutoModelForSeq2SeqLM.from_pretrained(run).eval()  # no dropout: the two forwards see the same network
    rows = translation_rows(3, 5)
    batch = dict(tokenizer([row["de"] for row in rows], text_target=[row["en"] for row in rows], padding=True, return_tensors="pt"))
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    batch["labels"] = labels
    # As DataCollatorForSeq2Seq gives them (M2M100 and NLLB have no method for it: shifted as they shift).
    batch["decoder_input_ids"] = (whole.prepare_decoder_input_ids_from_labels(labels=labels)
                                  if hasattr(whole, "prepare_decoder_input_ids_from_labels")
                                  else shift_tokens_right(labels, whole.config.pad_token_id, whole.config.decoder_start_token_id))
    labelled = labels != -100
    assert 0 < int(labelled.sum()) < labels.numel(), family  # some target padding to leave out
    narrowed = head_at_labelled_positions_agrees(family, whole, batch, labelled)
    # Without decoder inputs (M2M100's and NLLB's training batches) they are built as the family builds them.
    del batch["decoder_input_ids"]
    with torch.no_grad():
        narrowed_outputs, whole_outputs = narrowed(**batch), whole(**batch)
    torch.testing.assert_close(narrowed_outputs.logits, whole_outputs.logits[labelled], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(narrowed_outputs.loss, whole_outputs.loss, rtol=1e-6, atol=1e-6)


def test_families_translation_model_cards_code_translates_as_predict_does(translation_run):
    """The card's code reads the run's prefix (T5), truncation length and generation settings from what the run saved."""
    import ast
    import re

    family, run, folder = translation_run
    code = card_code(run)
    sources = ast.literal_eval(re.search(r"^sources = (.*)$", code, re.M).group(1))
    assert sources == ["Ein Mann fährt Fahrrad."]  # the run's source language (de)
    printed = ast.literal_eval(run_card_code(code).strip().splitlines()[-1])
    predicted = predict(run, [{"de": source} for source in sources], folder)
    assert printed == [row["translation_text"] for row in predicted], family


@pytest.mark.parametrize("family", [family for family in SEQ2SEQ_FAMILIES if family != "bert2bert"])
def test_families_translation_lora_attaches_without_naming_target_modules(family, family_checkpoint):
    checkpoint = family_checkpoint(family)
    model = load_model(AutoModelForSeq2SeqLM, ModelConfig(name_or_path=str(checkpoint)))
    wrapped = apply_peft(model, PeftConfig(method="lora", r=4), "SEQ_2_SEQ_LM", base_model_name_or_path=str(checkpoint))
    assert any(name.endswith("lora_A") for name, _ in wrapped.named_modules())
    trainable, total = count_parameters(wrapped)
    assert 0 < trainable < total / 2
    ids = torch.tensor([[5, 6, 7, 2]])
    wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in wrapped.named_parameters() if "lora_B" in n)


def test_families_translation_adapter_run_generates_with_the_runs_settings_not_the_bases(family_checkpoint, tmp_path):
    """pipeline("translation", model=RUN_DIR) of a LoRA run, and the card's code, read the run's generation_config.json:
    they generated with the base checkpoint's (greedy, transformers' 20-token default) where predict used the run's beams."""
    from pipelines.adapters import load_adapter_model, save_adapter_run
    from pipelines.card import usage_snippet
    from tasks import get_task

    task = get_task("translation")  # which lets pipeline() load adapter runs, as bertpipe's task modules do
    checkpoint = family_checkpoint("t5")
    model = load_model(AutoModelForSeq2SeqLM, ModelConfig(name_or_path=str(checkpoint)))
    wrapped = apply_peft(model, PeftConfig(method="lora", r=4), "SEQ_2_SEQ_LM", base_model_name_or_path=str(checkpoint))
    settings = {"num_beams": 3, "max_new_tokens": 7, "early_stopping": True}
    for key, value in settings.items():
        setattr(wrapped.get_base_model().generation_config, key, value)
    run = tmp_path / "run"
    save_adapter_run(wrapped, run)
    AutoTokenizer.from_pretrained(checkpoint).save_pretrained(run)
    assert GenerationConfig.from_pretrained(checkpoint).num_beams != 3
    for loaded in (load_adapter_model(AutoModelForSeq2SeqLM, run), pipeline("translation", model=str(run)).model):
        assert {key: getattr(loaded.generation_config, key) for key in settings} == settings
    snippet = usage_snippet(task, str(run), base_model=str(checkpoint), adapter=True)
    assert f'base.generation_config = GenerationConfig.from_pretrained("{run}")' in snippet


@pytest.mark.parametrize("family, key, code", [
    ("mbart", "src_lang", "de_de"), ("mbart", "tgt_lang", "en_xx"), ("m2m100", "src_lang", "de_DE"), ("m2m100", "tgt_lang", "__en__"),
    ("mbart", "tgt_lang", "de"), ("nllb", "src_lang", "es"), ("nllb", "tgt_lang", "it"), ("marian", "src_lang", "de"),
])
def test_families_translation_language_code_the_tokenizer_lacks_is_refused(family, key, code, family_checkpoint, tmp_path):
    """A mistyped code is no error to mBART's tokenizer: it becomes <unk> in every source, label and decoder start.
    M2M100's names codes by language (de, not de_DE or __de__); its KeyError for another becomes the same message. A
    code that is an ordinary piece of the vocabulary (mBART's de for de_DE, NLLB's es and it) trained and generated it
    as a word ("dededede"), and a tokenizer without language codes (Marian) has none to set."""
    from pipelines.config import ConfigError
    from pipelines.config_loading import load_config
    from tasks import get_task
    from tests.families.matrix import write_config

    files = {"train": write_jsonl(tmp_path / "train.jsonl", translation_rows(4, 1))}
    options = {"mbart": {"src_lang": "de_DE", "tgt_lang": "en_XX"}, "nllb": {"src_lang": "deu_Latn", "tgt_lang": "eng_Latn"}}.get(
        family, {"src_lang": "de", "tgt_lang": "en"})
    options[key] = code
    config = write_config(tmp_path, "translation", family_checkpoint(family), files,
                          section=f"translation: {{src_lang: {options['src_lang']}, tgt_lang: {options['tgt_lang']}}}")
    task = get_task("translation")(load_config(config, [], lambda name: get_task(name).Options))
    with pytest.raises(ConfigError, match=rf"translation\.{key}='{code}' is not a language code of the tokenizer"):
        task.build_tokenizer(None)


@pytest.mark.parametrize("family, src_lang, tgt_lang, forced", [("nllb", "deu_Latn", "eng_Latn", "eng_Latn"), ("mbart", "de_DE", "en_XX", None),
                                                               ("m2m100", "de", "en", "__en__")])
def test_families_translation_target_code_opening_labels_is_forced_first(family, src_lang, tgt_lang, forced, family_checkpoint, tmp_path):
    """NLLB and M2M100 (whose codes are named by language: tgt_lang en is __en__) open every label with the target
    code but start the decoder with </s>: unforced, generation picks a language itself. mBART starts the decoder with the code, so nothing is forced after it."""
    from pipelines.config_loading import load_config
    from tasks import get_task
    from tests.families.matrix import write_config

    files = {"train": write_jsonl(tmp_path / "train.jsonl", translation_rows(4, 1))}
    config = write_config(tmp_path, "translation", family_checkpoint(family), files,
                          section=f"translation: {{src_lang: {src_lang}, tgt_lang: {tgt_lang}, num_beams: 1, max_new_tokens: 4}}")
    task = get_task("translation")(load_config(config, [], lambda name: get_task(name).Options))
    tokenizer = task.build_tokenizer(None)
    model = task.build_model(None)
    expected = None if forced is None else tokenizer.convert_tokens_to_ids(forced)
    assert model.generation_config.forced_bos_token_id == expected
    generated = model.generate(**tokenizer(["der mann"], return_tensors="pt", return_token_type_ids=False))[0].tolist()
    start = [model.generation_config.decoder_start_token_id] + ([expected] if forced else [])
    assert generated[: len(start)] == start
    assert tokenizer.convert_ids_to_tokens(tokenizer(text_target="the man")["input_ids"]).count(forced or tgt_lang) == 1


def test_families_translation_mbart_generates_from_the_decoder_start_training_used(family_checkpoint, tmp_path):
    """mBART's shift_tokens_right starts the decoder with each target's last token (its tgt_lang code): a checkpoint
    naming another decoder start (mbart-large-en-ro: ro_RO) trained into en_XX generated from ro_RO."""
    import shutil

    from pipelines.config_loading import load_config
    from tasks import get_task
    from tests.families.matrix import write_config

    checkpoint = tmp_path / "mbart-en-ro"
    shutil.copytree(family_checkpoint("mbart"), checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    romanian, english = tokenizer.convert_tokens_to_ids(["ro_RO", "en_XX"])
    for name in ("config.json", "generation_config.json"):
        saved = json.loads((checkpoint / name).read_text())
        saved["decoder_start_token_id"] = romanian
        (checkpoint / name).write_text(json.dumps(saved))
    files = {"train": write_jsonl(tmp_path / "train.jsonl", translation_rows(4, 1))}
    config = write_config(tmp_path, "translation", checkpoint, files,
                          section="translation: {src_lang: de_DE, tgt_lang: en_XX, num_beams: 1, max_new_tokens: 4}")
    task = get_task("translation")(load_config(config, [], lambda name: get_task(name).Options))
    tokenizer = task.build_tokenizer(None)
    model = task.build_model(None)
    labels = torch.tensor([tokenizer(text_target="the man")["input_ids"]])
    trained_start = int(model.prepare_decoder_input_ids_from_labels(labels=labels)[0, 0])
    assert trained_start == english
    assert model.config.decoder_start_token_id == model.generation_config.decoder_start_token_id == english
    generated = model.generate(**tokenizer(["der mann"], return_tensors="pt", return_token_type_ids=False))[0].tolist()
    assert generated[0] == english


@pytest.mark.parametrize("family, prefix", [("t5", "de2en: "), ("bart", ">>en<< ")])
def test_families_translation_continuing_a_run_keeps_the_prefix_it_learned(family, prefix, family_checkpoint, tmp_path):
    """model.name_or_path=RUN_DIR (docs/translation.md's way to continue a run) fed T5 its default prefix and BART none."""
    from pipelines.config_loading import load_config
    from tasks import get_task
    from tests.families.matrix import write_config

    files = {"train": write_jsonl(tmp_path / "train.jsonl", translation_rows(8, 1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", translation_rows(4, 2))}
    first = tmp_path / "first"
    first.mkdir()
    run = train(first, "translation", family_checkpoint(family), files, train="  max_steps: 1",
                section=f"translation: {{source_prefix: '{prefix}', num_beams: 1, max_new_tokens: 4}}")
    assert AutoConfig.from_pretrained(run).prefix == prefix
    options = lambda name: get_task(name).Options  # noqa: E731
    for section, expected in (("translation: {num_beams: 1, max_new_tokens: 4}", prefix),
                              ("translation: {source_prefix: '', num_beams: 1, max_new_tokens: 4}", "")):
        task = get_task("translation")(load_config(write_config(tmp_path, "translation", run, files, section=section), [], options))
        task.build_tokenizer(None)
        assert task.source_prefix == expected

"""End to end through the CLI: BERT2BERT from a tiny BERT learns a copy task -> evaluate -> predict ->
pipeline("translation") on the run directory agrees with predict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, write_config, write_jsonl
from tests.tasks.translation_data import copy_rows


def translation_config(tmp_path: Path, tiny_bert: Path, files: dict[str, Path]) -> Path:
    return write_config(tmp_path / "copy.yaml", f"""# test config
task: translation
output_dir: {tmp_path / 'run'}
seed: 3
model:
  name_or_path: {tiny_bert}
data:
  files:
    train: {files['train']}
    validation: {files['validation']}
  max_seq_length: 16
train:
  num_epochs: 12
  batch_size: 16
  learning_rate: 5.0e-3
  lr_scheduler: constant
  logging_steps: 20
  torch_num_threads: 1
translation:
  source_lang: de
  target_lang: en
  num_beams: 2
  max_new_tokens: 8
""")


@pytest.fixture(scope="module")
def copy_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("copy-data")
    return {
        "train": write_jsonl(folder / "train.jsonl", copy_rows(240, seed=1)),
        "validation": write_jsonl(folder / "validation.jsonl", copy_rows(21, seed=2)),
    }


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, tiny_bert, copy_files) -> Path:
    tmp_path = tmp_path_factory.mktemp("translation")
    run_cli("train", str(translation_config(tmp_path, tiny_bert, copy_files)))
    return tmp_path / "run"


def test_cli_translation_trains_bert2bert_that_learns_to_copy(trained_run):
    for name in ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "metrics.json",
                 "generations.jsonl", "sacrebleu_signature.json", "README.md"]:
        assert (trained_run / name).is_file(), name
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["eval_samples"] == 21
    assert metrics["eval_bleu"] >= 60 and metrics["eval_chrf"] >= 75, metrics
    assert 3 <= metrics["eval_gen_len"] <= 5  # 2-4 one-token words + [SEP]
    config = json.loads((trained_run / "config.json").read_text())
    assert config["model_type"] == "encoder-decoder" and config["decoder"]["add_cross_attention"]
    generation = json.loads((trained_run / "generation_config.json").read_text())
    assert generation["num_beams"] == 2 and generation["max_new_tokens"] == 8
    rows = [json.loads(line) for line in (trained_run / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == 21 and set(rows[0]) == {"source", "reference", "hypothesis"}
    assert sum(row["hypothesis"] == row["reference"] for row in rows) >= 10
    signature = json.loads((trained_run / "sacrebleu_signature.json").read_text())
    assert "case:lc" in signature["bleu"] and "tok:13a" in signature["bleu"]


def test_cli_translation_evaluate_matches_training_metrics(trained_run):
    run_cli("evaluate", str(trained_run))
    metrics = json.loads((trained_run / "eval_validation.json").read_text())
    trained = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["eval_samples"] == 21
    assert metrics["eval_bleu"] == pytest.approx(trained["eval_bleu"])
    assert metrics["eval_chrf"] == pytest.approx(trained["eval_chrf"])


@pytest.fixture(scope="module")
def predicted(trained_run, tmp_path_factory) -> tuple[list[str], list[dict]]:
    folder = tmp_path_factory.mktemp("predict")
    sources = [row["de"] for row in copy_rows(6, seed=9)]
    (folder / "inputs.txt").write_text("\n".join(sources) + "\n")
    run_cli("predict", str(trained_run), "--input", str(folder / "inputs.txt"), "--output", str(folder / "out.jsonl"))
    return sources, [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()]


def test_cli_translation_predict_may_not_replace_the_runs_generations(trained_run, tmp_path):
    """Every *.jsonl beside the model but the step log counted as earlier predictions: --output RUN/generations.jsonl
    replaced the run's own eval generations, exit 0."""
    (tmp_path / "inputs.txt").write_text("ein haus\n")
    generations = (trained_run / "generations.jsonl").read_bytes()
    result = run_cli("predict", str(trained_run), "--input", str(tmp_path / "inputs.txt"), "--output",
                     str(trained_run / "generations.jsonl"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"--output {trained_run / 'generations.jsonl'} is a file of the run" in result.stderr
    assert (trained_run / "generations.jsonl").read_bytes() == generations


def test_cli_translation_predict_carries_the_columns_it_did_not_read(trained_run, tmp_path):
    """The sources came from the source language's column: a `text` column beside it is the caller's and was dropped."""
    inputs = write_jsonl(tmp_path / "inputs.jsonl", [{"de": "ein haus", "text": "a note", "id": 7}])
    run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(tmp_path / "out.jsonl"))
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert row["text"] == "a note" and row["id"] == 7 and row["source"] == "ein haus"


def test_cli_translation_predict_translates_a_txt_file(predicted):
    sources, rows = predicted
    assert [row["source"] for row in rows] == sources
    assert sum(row["translation_text"] == source for row, source in zip(rows, sources)) >= 3


def test_cli_translation_pipeline_agrees_with_predict(trained_run, predicted):
    from tasks import load_tasks

    load_tasks()  # registers the "translation" pipeline
    from transformers import pipeline

    sources, rows = predicted
    translator = pipeline("translation", model=str(trained_run), device="cpu")
    assert type(translator.model).__name__ == "EncoderDecoderModel"
    single = translator(sources[0])
    assert single == [{"translation_text": rows[0]["translation_text"]}]
    assert [row["translation_text"] for row in translator(sources)] == [row["translation_text"] for row in rows]


def test_cli_translation_pipeline_truncates_long_sources_like_predict(trained_run, tmp_path):
    from tasks import load_tasks
    from tests.tasks.translation_data import TOY_WORDS

    load_tasks()
    from transformers import pipeline

    sources = [" ".join(TOY_WORDS * 5), " ".join(reversed(TOY_WORDS * 4))]  # 30 and 24 tokens > max_seq_length 16
    (tmp_path / "long.txt").write_text("\n".join(sources) + "\n")
    run_cli("predict", str(trained_run), "--input", str(tmp_path / "long.txt"), "--output", str(tmp_path / "out.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    translator = pipeline("translation", model=str(trained_run), device="cpu")
    assert translator.preprocess(sources[0])["input_ids"].shape[1] == 16
    assert [row["translation_text"] for row in translator(sources)] == [row["translation_text"] for row in rows]


def test_cli_translation_predict_keeps_rows_in_place_and_says_what_was_cut(trained_run, tmp_path):
    """Rows with an empty source were dropped (empty_lines=skip), so output row i was no longer input row i; long
    sources and translations stopped by max_new_tokens were cut without a word."""
    from tests.tasks.translation_data import TOY_WORDS

    sources = ["film story", "", " ".join(TOY_WORDS * 4), "plot very actors"]
    write_jsonl(tmp_path / "inputs.jsonl", [{"de": source, "id": index} for index, source in enumerate(sources)])
    result = run_cli("predict", str(trained_run), "--input", str(tmp_path / "inputs.jsonl"), "--output", str(tmp_path / "out.jsonl"),
                     "translation.empty_lines=skip", "translation.max_new_tokens=2")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["source"] for row in rows] == sources and rows[1]["translation_text"] == ""
    assert [row["id"] for row in rows] == [0, 1, 2, 3]  # the input's other columns, copied: predictions join back by id
    assert "1 row(s) with an empty 'de' (rows 2, counting from 1) are not translated" in result.stderr
    assert "1 of 4 source(s) (rows 3, counting from 1) are longer than data.max_seq_length=16 tokens (the longest has 26)" in result.stderr
    assert "of 4 translation(s) (rows 1, 3, 4, counting from 1, in output order) reached translation.max_new_tokens=2" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_translation_empty_target_is_an_error_naming_the_row(tmp_path, tiny_bert, copy_files):
    rows = copy_rows(8, seed=4)
    rows[5]["en"] = "   "
    files = {"train": write_jsonl(tmp_path / "train.jsonl", rows), "validation": copy_files["validation"]}
    result = run_cli("train", str(translation_config(tmp_path, tiny_bert, files)), check=False)
    assert result.returncode == 2
    assert "rows 6, counting from 1" in result.stderr and "empty_lines=skip" in result.stderr and "Traceback" not in result.stderr


def test_cli_translation_lora_adapter_run_trains_and_reloads(tmp_path, tiny_bert, copy_files, trained_run):
    from tests.conftest import check_lora_run

    config = translation_config(tmp_path, tiny_bert, copy_files)
    refused = run_cli("train", str(config), "model.peft.method=lora", check=False)
    assert refused.returncode == 2 and "warm start" in refused.stderr
    # A finished BERT2BERT run is a real seq2seq checkpoint: LoRA on top of it trains and reloads.
    check_lora_run(config, tmp_path / "lora", "eval_chrf", f"model.name_or_path={trained_run}", pipeline_input="a b c")

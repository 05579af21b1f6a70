"""End to end through the CLI: pretrain a tiny BERT from scratch -> evaluate -> fill-mask -> fine-tune it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.config_loading import load_config
from pipelines.errors import DataError
from tasks import get_task
from tasks.mlm import MlmTask
from tests.conftest import corpus_sentences, run_cli, sentiment_rows, write_config, write_jsonl
from tests.test_cli_classification import classification_config


def pretrain_config(tmp_path: Path, corpus: Path) -> Path:
    return write_config(tmp_path / "pretrain.yaml", f"""# test config
task: mlm
output_dir: {tmp_path / 'run'}
seed: 11
model:
  architecture: {{num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 2, intermediate_size: 128,
                  max_position_embeddings: 64}}
data:
  files: {{train: {corpus}}}
  validation_fraction: 0.15
  max_seq_length: 32
mlm:
  tokenizer_vocab_size: 160
  tokenizer_min_frequency: 1
  whole_word_mask: true
train:
  num_epochs: 5
  batch_size: 16
  learning_rate: 3.0e-3
  lr_scheduler: constant
  logging_steps: 5
  eval_steps: 30
  # One thread: on a shared 2-core machine two OpenMP threads spin against other jobs (25x slower).
  torch_num_threads: 1
  # fp32 on every CPU: `auto` would pretrain in bf16 on AVX-512-BF16/AMX machines and the fine-tuning
  # threshold below was set in fp32 (bf16 on this tiny model reached 0.62).
  mixed_precision: "no"
""")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return corpus_file(tmp_path_factory.mktemp("corpus"))


def corpus_file(folder: Path) -> Path:
    """Paragraphs of filler and sentiment sentences, with WikiText-style headings and blank lines."""
    sentences = corpus_sentences(500, seed=3) + [row["sentence"] for row in sentiment_rows(500, seed=4)]
    np.random.default_rng(0).shuffle(sentences)
    parts = []
    for index in range(0, len(sentences), 25):
        parts.append(f" = Part {index // 25} = \n\n" + "\n".join(sentences[index:index + 25]) + "\n")
    path = folder / "corpus.tokens"
    path.write_text("\n".join(parts))
    return path


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, corpus) -> Path:
    tmp_path = tmp_path_factory.mktemp("mlm")
    run_cli("train", str(pretrain_config(tmp_path, corpus)), "train.eval_on_start=true")
    return tmp_path / "run"


def fresh_model_perplexity(run_dir: Path) -> float:
    """Validation perplexity of a new, untrained model of the run's shape, on the run's fixed masks."""
    config = load_config(None, [], lambda name: get_task(name).Options, base=__import__("yaml").safe_load((run_dir / "config.yaml").read_text()))
    task = MlmTask(config)
    examples = task.load(include_train=False)[config.data.eval_split]
    task.build_tokenizer(None, model_path=str(run_dir))
    task.trained_tokenizer = True
    torch.manual_seed(0)
    model = task.build_model(None).eval()
    features = task.preprocess(examples, train=False)
    collate = task.collator(train=False)
    outputs: dict[str, list] = {}
    with torch.no_grad():
        for start in range(0, len(features), 32):
            batch = collate([features[i] for i in range(start, min(start + 32, len(features)))])
            for key, value in task.predict_step(model, batch).items():
                outputs.setdefault(key, []).append(value.numpy())
    return task.compute_metrics({key: np.concatenate(value) for key, value in outputs.items()}, examples)["perplexity"]


def test_cli_mlm_pretraining_lowers_validation_perplexity(pretrained):
    for name in ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "metrics.json", "log.jsonl", "README.md"]:
        assert (pretrained / name).is_file(), name
    metrics = json.loads((pretrained / "metrics.json").read_text())
    assert {"eval_perplexity", "eval_accuracy", "eval_loss", "train_tokens_per_second"} <= set(metrics)
    assert metrics["eval_perplexity"] == pytest.approx(np.exp(metrics["eval_loss"]))
    start = fresh_model_perplexity(pretrained)
    assert start > 50  # an untrained model is close to uniform over the ~160-token vocabulary
    assert metrics["eval_perplexity"] < 0.5 * start, (start, metrics["eval_perplexity"])
    log = [json.loads(line) for line in (pretrained / "log.jsonl").read_text().splitlines()]
    # train.eval_on_start: the curve starts at the untrained model (another random init than `start`'s).
    assert log[0]["step"] == 0 and log[0]["eval_perplexity"] == pytest.approx(start, rel=0.1)
    assert any("eval_perplexity" in record for record in log[1:-1])  # an intermediate evaluation too


def test_cli_mlm_evaluate_reproduces_the_final_evaluation(pretrained):
    run_cli("evaluate", str(pretrained))
    again = json.loads((pretrained / "eval_validation.json").read_text())
    trained = json.loads((pretrained / "metrics.json").read_text())
    assert again["eval_perplexity"] == pytest.approx(trained["eval_perplexity"], rel=1e-5)
    assert again["eval_accuracy"] == trained["eval_accuracy"]


def test_cli_mlm_predict_fills_masks(pretrained, tmp_path):
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("the film was [MASK] and lovely\nthe [MASK] was a [MASK] story\n")
    output = tmp_path / "fills.jsonl"
    run_cli("predict", str(pretrained), "--input", str(inputs), "--output", str(output))
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["text"] for row in rows] == inputs.read_text().splitlines()
    assert [len(row["masks"]) for row in rows] == [1, 2]
    for row in rows:
        for mask in row["masks"]:
            scores = [p["score"] for p in mask["predictions"]]
            assert len(scores) == 5 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
        assert "[MASK]" not in row["sequence"]


def test_cli_mlm_run_serves_the_fill_mask_pipeline(pretrained):
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(pretrained), top_k=3)
    result = fill("the film was [MASK] and lovely")
    assert len(result) == 3 and all(set(row) >= {"token_str", "score", "sequence"} for row in result)


def test_cli_mlm_predict_and_the_model_cards_fill_mask_call_agree_past_max_seq_length(pretrained, tmp_path):
    import re

    from transformers import pipeline

    text = "the film was [MASK] and lovely " + "the story of the film " * 6
    fill = pipeline("fill-mask", model=str(pretrained), top_k=5)
    assert 32 < len(fill.tokenizer(text)["input_ids"]) <= 64  # past max_seq_length (32), within 64 positions
    inputs = tmp_path / "inputs.txt"
    inputs.write_text(text + "\n")
    run_cli("predict", str(pretrained), "--input", str(inputs), "--output", str(tmp_path / "fills.jsonl"))
    (mask,) = json.loads((tmp_path / "fills.jsonl").read_text())["masks"]
    predicted = [(p["token_id"], p["score"]) for p in mask["predictions"]]

    card_call = re.search(r"predictor\((.*)\)\)", (pretrained / "README.md").read_text()).group(1)
    assert card_call.endswith('tokenizer_kwargs={"truncation": True, "max_length": 32}'), card_call
    served = lambda **kwargs: [(row["token"], row["score"]) for row in fill(text, **kwargs)]  # noqa: E731
    cut = served(tokenizer_kwargs={"truncation": True, "max_length": 32})
    assert [token for token, _ in cut] == [token for token, _ in predicted]
    assert [score for _, score in cut] == pytest.approx([score for _, score in predicted], abs=1e-5)
    assert [score for _, score in served()] != pytest.approx([score for _, score in cut], abs=1e-5)  # the cut matters


def test_cli_mlm_chain_pretrain_then_fine_tune(pretrained, tmp_path, sentiment_files):
    # At the shared test config's 3e-3 this pretrained tiny model collapses onto the majority class (0.59) in
    # about half the seeds, on which side being dropout-mask luck; at 1e-3 seeds 7-12 all reached 0.97-1.0
    # (12 epochs, 2026-12-05).
    config = classification_config(tmp_path, pretrained, sentiment_files, num_epochs=12, eval_steps=None, torch_num_threads=1,
                                   mixed_precision="no", learning_rate=1e-3)
    run_cli("train", str(config))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["eval_samples"] == 37 and metrics["eval_accuracy"] >= 0.7, metrics
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["architectures"] == ["BertForSequenceClassification"]


def test_cli_mlm_input_without_mask_token_is_named(pretrained, tmp_path):
    config = load_config(None, [], lambda name: get_task(name).Options, base=__import__("yaml").safe_load((pretrained / "config.yaml").read_text()))
    task = MlmTask(config)
    task.build_tokenizer(None, model_path=str(pretrained))
    inputs = tmp_path / "inputs.txt"
    inputs.write_text("a [MASK] here\nno mask on this line\n")
    with pytest.raises(DataError, match=rf"--input {re.escape(str(inputs))}, line 2 \('no mask on this line'\) holds no \[MASK\]"):
        task.preprocess(task.load_inputs(str(inputs)), train=False, inputs=True)
    # Blank lines are skipped before the examples are read: the example's index named line 2 of a line-5 text.
    inputs.write_text("a [MASK] here\n\n\n\nno mask on this line\n")
    with pytest.raises(DataError, match=r", line 5 \('no mask on this line'\)"):
        task.preprocess(task.load_inputs(str(inputs)), train=False, inputs=True)
    rows = write_jsonl(tmp_path / "inputs.jsonl", [{"text": "a [MASK] here"}, {"text": "no mask in this row"}])
    with pytest.raises(DataError, match=rf"--input {re.escape(str(rows))}, row 2 \(rows count from 1\) \('no mask in this row'\)"):
        task.preprocess(task.load_inputs(str(rows)), train=False, inputs=True)


def test_cli_mlm_corpus_shorter_than_a_block_fails_clearly(tmp_path):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("good film\n\nbad film\n\nthe plot\n")
    config = pretrain_config(tmp_path, corpus)
    result = run_cli("train", str(config), "data.max_seq_length=64", check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "fewer than one block" in result.stderr and "Traceback" not in result.stderr


def test_cli_mlm_lora_continued_pretraining_trains_and_reloads(pretrained, corpus, tmp_path):
    from tests.conftest import check_lora_run

    check_lora_run(pretrain_config(tmp_path, corpus), tmp_path / "lora", "eval_perplexity", f"model.name_or_path={pretrained}",
                   pipeline_input="the film was [MASK] and lovely")


def test_cli_mlm_failed_overwrite_keeps_the_old_run_and_its_tokenizer(corpus, tmp_path):
    """A from-scratch run trains its tokenizer during data preparation; a command refused after that (here:
    data.max_seq_length past the model's positions, found when the model is built) must leave an old run
    byte for byte, and leave a new output_dir as empty as it found it, so that the corrected command is accepted."""
    config = pretrain_config(tmp_path, corpus)
    run = tmp_path / "run"
    run_cli("train", str(config), "train.max_steps=2", "train.eval_steps=null")
    before = {path.relative_to(run): path.read_bytes() for path in sorted(run.rglob("*")) if path.is_file()}
    assert Path("tokenizer.json") in before and Path("metrics.json") in before
    siblings = sorted(path.name for path in tmp_path.iterdir())

    result = run_cli("train", str(config), "overwrite=true", "data.max_seq_length=128", check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "max_position_embeddings" in result.stderr and "Traceback" not in result.stderr
    after = {path.relative_to(run): path.read_bytes() for path in sorted(run.rglob("*")) if path.is_file()}
    assert after.keys() == before.keys() and all(after[name] == before[name] for name in before)

    fresh = tmp_path / "fresh"
    result = run_cli("train", str(config), f"output_dir={fresh}", "data.max_seq_length=128", check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert not fresh.exists() or not any(fresh.iterdir()), sorted(path.name for path in fresh.iterdir())
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(siblings + ["fresh"] * fresh.exists())

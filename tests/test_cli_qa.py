"""End to end through the CLI: QA train -> evaluate -> predict -> pipeline("question-answering"), v1.1 and v2.

The data is a synthetic nested-SQuAD JSON written here: each context holds one name among filler
words (or, for v2 unanswerable questions, none) and the question asks for it; contexts are long
enough that many examples span several windows.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import FILLER_WORDS, build_tiny_bert, run_cli, write_config, write_jsonl

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
QUESTION = "who is named here ?"


def synthetic_squad(questions: int, seed: int, *, unanswerable: float = 0.0) -> dict:
    rng = random.Random(seed)
    paragraphs = []
    for index in range(questions):
        words = [rng.choice(FILLER_WORDS) for _ in range(rng.randint(4, 50))]
        qa = {"id": f"s{seed}-{index}", "question": QUESTION}
        if rng.random() < unanswerable:
            qa.update(answers=[], is_impossible=True)
        else:
            name = rng.choice(NAMES)
            position = rng.randint(0, len(words))
            before = " ".join(words[:position])
            qa["answers"] = [{"text": name, "answer_start": len(before) + 1 if before else 0}]
            words.insert(position, name)
        paragraphs.append({"context": " ".join(words), "qas": [qa]})
    articles = [{"title": f"article {a}", "paragraphs": paragraphs[a::3]} for a in range(3)]
    return {"version": "synthetic", "data": articles}


def qa_config(folder: Path, model: Path, data: dict[str, Path], *, v2: bool, **train) -> Path:
    train = {"num_epochs": 12, "batch_size": 16, "learning_rate": 3e-3, "lr_scheduler": "constant", "logging_steps": 5,
             "torch_num_threads": 1, **train}
    train_yaml = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in train.items())
    return write_config(folder / "qa.yaml", f"""# test config
task: qa
output_dir: {folder / 'run'}
seed: 3
model:
  name_or_path: {model}
data:
  files:
    train: {data['train']}
    validation: {data['validation']}
  max_seq_length: 40
train:
{train_yaml}
qa:
  version_2_with_negative: {str(v2).lower()}
  doc_stride: 12
""")


@pytest.fixture(scope="module")
def qa_model(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-qa-bert"), vocab_words=NAMES * 5)


def write_data(folder: Path, *, unanswerable: float) -> dict[str, Path]:
    paths = {"train": folder / "train.json", "validation": folder / "dev.json"}
    paths["train"].write_text(json.dumps(synthetic_squad(60, seed=1, unanswerable=unanswerable)))
    paths["validation"].write_text(json.dumps(synthetic_squad(25, seed=2, unanswerable=unanswerable)))
    return paths


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, qa_model) -> Path:
    folder = tmp_path_factory.mktemp("qa")
    run_cli("train", str(qa_config(folder, qa_model, write_data(folder, unanswerable=0.0), v2=False)))
    return folder / "run"


def test_cli_qa_train_writes_metrics_and_prediction_files(trained_run):
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["eval_samples"] == 25  # examples, not windows
    assert metrics["eval_exact_match"] >= 80 and metrics["eval_f1"] >= metrics["eval_exact_match"], metrics
    predictions = json.loads((trained_run / "predictions.json").read_text())
    nbest = json.loads((trained_run / "nbest_predictions.json").read_text())
    assert len(predictions) == 25 and set(nbest) == set(predictions)
    first = next(iter(nbest.values()))
    assert first[0]["text"] == predictions[next(iter(nbest))]
    assert sum(candidate["probability"] for candidate in first) == pytest.approx(1.0, abs=1e-6)
    assert not (trained_run / "null_odds.json").exists()
    saved = json.loads((trained_run / "config.json").read_text())
    assert saved["task_specific_params"]["question-answering"]["doc_stride"] == 12


def test_cli_qa_evaluate_matches_training_metrics(trained_run):
    run_cli("evaluate", str(trained_run))
    metrics = json.loads((trained_run / "eval_validation.json").read_text())
    trained = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["eval_samples"] == 25
    assert metrics["eval_f1"] == pytest.approx(trained["eval_f1"])
    assert metrics["eval_exact_match"] == pytest.approx(trained["eval_exact_match"])


def test_cli_qa_predict_and_the_registered_pipeline_agree(trained_run, tmp_path):
    long_context = " ".join(["the film was a story with very and plot"] * 4 + ["grace"] + ["it is of scenes"] * 3)
    rows = [
        {"id": "short", "question": QUESTION, "context": "the plot was dull and bob was fine", "source": "a"},
        {"question": QUESTION, "context": long_context, "source": "b"},  # several windows; no id
    ]
    inputs = write_jsonl(tmp_path / "inputs.jsonl", rows)
    output = tmp_path / "answers.jsonl"
    run_cli("predict", str(trained_run), "--input", str(inputs), "--output", str(output))
    answers = [json.loads(line) for line in output.read_text().splitlines()]
    assert [a["id"] for a in answers] == ["short", "2"]  # a row without an id: its number, counting from 1
    assert [a["source"] for a in answers] == ["a", "b"]  # the input's other columns, copied; the context is not
    assert all("context" not in a for a in answers)
    assert [a["answer"] for a in answers] == ["bob", "grace"]
    for row, answer in zip(rows, answers):
        assert row["context"][answer["start"] : answer["end"]] == answer["answer"]

    from tasks import load_tasks

    load_tasks()  # registers the question-answering pipeline
    from transformers import pipeline

    qa = pipeline("question-answering", model=str(trained_run))
    for row, answer in zip(rows, answers):
        served = qa(question=row["question"], context=row["context"])
        assert (served["answer"], served["start"], served["end"]) == (answer["answer"], answer["start"], answer["end"])
        assert served["score"] == pytest.approx(answer["score"], abs=1e-4)
    listed = qa(question=[row["question"] for row in rows], context=[row["context"] for row in rows])
    assert [item["answer"] for item in listed] == ["bob", "grace"]
    top = qa(question=QUESTION, context=long_context, top_k=3)
    assert len(top) == 3 and top[0]["answer"] == "grace"


def test_cli_qa_predict_writes_ids_as_written_and_carries_nothing_from_a_nested_document(trained_run, tmp_path):
    """An integer id came back as the string "17" (joined back to nothing); a nested SQuAD document in a .jsonl,
    which the reader takes, was carried as a one-row table: with one question its prediction held the whole
    document ('version', 'data'), with two the count mismatch ended in a traceback (exit 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    context = "the plot was dull and bob was fine"
    for name in ("ids.jsonl", "ids.parquet"):
        rows = [{"id": 17, "question": QUESTION, "context": context}, {"id": 4, "question": QUESTION, "context": context}]
        source = tmp_path / name
        if name.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(rows), source)
        else:
            write_jsonl(source, rows)
        output = tmp_path / f"{name}.out.jsonl"
        run_cli("predict", str(trained_run), "--input", str(source), "--output", str(output))
        assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == [17, 4], name

    questions = [{"id": "a1", "question": QUESTION}, {"id": "a2", "question": "who was fine ?"}]
    for count in (1, 2):
        document = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": questions[:count]}]}]}
        source, output = tmp_path / f"nested{count}.jsonl", tmp_path / f"nested{count}.out.jsonl"
        source.write_text(json.dumps(document) + "\n")
        run_cli("predict", str(trained_run), "--input", str(source), "--output", str(output))
        answers = [json.loads(line) for line in output.read_text().splitlines()]
        assert [sorted(answer) for answer in answers] == [["answer", "end", "id", "question", "score", "start"]] * count
        assert [answer["id"] for answer in answers] == ["a1", "a2"][:count]


def test_cli_qa_v2_reports_has_and_no_answer_splits(tmp_path, qa_model):
    config = qa_config(tmp_path, qa_model, write_data(tmp_path, unanswerable=0.35), v2=True, num_epochs=1, max_steps=8)
    run_cli("train", str(config))
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ["eval_exact_match", "eval_f1", "eval_HasAns_f1", "eval_NoAns_f1", "eval_best_f1", "eval_best_f1_thresh",
                "eval_HasAns_total", "eval_NoAns_total"]:
        assert key in metrics, key
    assert metrics["eval_HasAns_total"] + metrics["eval_NoAns_total"] == 25
    null_odds = json.loads((run / "null_odds.json").read_text())
    assert len(null_odds) == 25 and all(0.0 <= p <= 1.0 for p in null_odds.values())
    assert len(set(null_odds.values())) > 1  # a real probability, not a constant
    assert 0.0 <= metrics["eval_best_f1_thresh"] <= 1.0


def test_cli_qa_bad_answer_names_the_example(tmp_path, qa_model):
    data = write_data(tmp_path, unanswerable=0.0)
    document = json.loads(data["train"].read_text())
    qa = document["data"][0]["paragraphs"][1]["qas"][0]
    qa["answers"][0]["answer_start"] += 1
    data["train"].write_text(json.dumps(document))
    result = run_cli("train", str(qa_config(tmp_path, qa_model, data, v2=False)), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert qa["id"] in result.stderr and "qa.answer_mismatch=skip" in result.stderr


def test_cli_qa_lora_adapter_run_trains_and_reloads(tmp_path, qa_model):
    from tests.conftest import check_lora_run

    config = qa_config(tmp_path, qa_model, write_data(tmp_path, unanswerable=0.0), v2=False)
    check_lora_run(config, tmp_path / "lora", "eval_f1", pipeline_input={"question": "who met bob?", "context": "alice met bob in paris."})

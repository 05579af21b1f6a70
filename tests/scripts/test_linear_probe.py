"""scripts/linear_probe.py: frozen-encoder features read by logistic regression, random inits reproducible."""

from __future__ import annotations

import importlib.util
import json
import random

import pytest
import torch

from tests.conftest import REPO_ROOT, sentiment_rows, write_jsonl

spec = importlib.util.spec_from_file_location("linear_probe", REPO_ROOT / "scripts" / "linear_probe.py")
linear_probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(linear_probe)


@pytest.fixture(scope="module")
def probe_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probe")
    train, evaluation = sentiment_rows(300, seed=11), sentiment_rows(200, seed=12)
    shuffled = [dict(row) for row in train]
    labels = [row["label"] for row in shuffled]
    random.Random(0).shuffle(labels)
    for row, label in zip(shuffled, labels):
        row["label"] = label
    return {
        "train": write_jsonl(folder / "train.jsonl", train),
        "validation": write_jsonl(folder / "validation.jsonl", evaluation),
        "shuffled": write_jsonl(folder / "shuffled.jsonl", shuffled),
    }


def run_probe(encoders, train_file, eval_file, *extra):
    return linear_probe.main([*encoders, "--train-file", str(train_file), "--eval-file", str(eval_file), "--train-samples", "300", *extra])


def test_probe_reads_a_label_the_features_carry_and_not_one_they_do_not(tiny_bert, probe_files, tmp_path):
    # One cue word decides the label, so even a random encoder's token mean carries it; labels shuffled
    # across the training sentences carry nothing for the eval set.
    out = tmp_path / "probe.json"
    rows = run_probe([f"random:{tiny_bert}"], probe_files["train"], probe_files["validation"], "--json", str(out), "--c", "1.0")
    assert rows[0]["mean_accuracy"] > 0.85
    assert json.loads(out.read_text()) == rows
    shuffled = run_probe([f"random:{tiny_bert}"], probe_files["shuffled"], probe_files["validation"], "--c", "1.0")
    assert 0.3 < shuffled[0]["mean_accuracy"] < 0.7


def test_random_encoder_is_a_seeded_fresh_init_of_the_models_shape(tiny_bert):
    saved, _ = linear_probe.load_encoder(str(tiny_bert), seed=42)
    first, tokenizer = linear_probe.load_encoder(f"random:{tiny_bert}", seed=42)
    again, _ = linear_probe.load_encoder(f"random:{tiny_bert}", seed=42)
    other, _ = linear_probe.load_encoder(f"random:{tiny_bert}", seed=43)
    assert type(first) is type(saved)
    assert (first.config.num_hidden_layers, first.config.hidden_size) == (saved.config.num_hidden_layers, saved.config.hidden_size)
    assert len(tokenizer) == saved.config.vocab_size
    weights = {name: p for name, p in first.state_dict().items() if name.endswith("word_embeddings.weight")}
    name = next(iter(weights))
    assert torch.equal(weights[name], again.state_dict()[name])
    assert not torch.equal(weights[name], other.state_dict()[name])
    assert not torch.equal(weights[name], saved.state_dict()[name])


def test_probe_features_ignore_padding(tiny_bert):
    encoder, tokenizer = linear_probe.load_encoder(str(tiny_bert), seed=0)
    alone = linear_probe.sentence_features(encoder, tokenizer, ["good film"], max_length=32)
    padded = linear_probe.sentence_features(encoder, tokenizer, ["good film", "the film was a story with very long plot and actors"], max_length=32)
    assert alone["mean"][0] == pytest.approx(padded["mean"][0], abs=1e-5)
    assert alone["cls"][0] == pytest.approx(padded["cls"][0], abs=1e-5)


def test_probe_with_a_single_training_label_is_a_clear_error(tiny_bert, tmp_path):
    rows = [{"sentence": f"good film {i}", "label": "positive"} for i in range(10)]
    one_label = write_jsonl(tmp_path / "one.jsonl", rows)
    with pytest.raises(SystemExit, match="single label"):
        run_probe([str(tiny_bert)], one_label, one_label)


def test_probe_without_an_eval_file_is_refused_and_a_bad_encoder_keeps_the_rows_before_it(tiny_bert, probe_files, tmp_path):
    # --train-file alone scored the probe on the rows it was fitted on ("eval accuracy"); an encoder that does not load
    # ended in a traceback, exit 1, after the probes before it were lost (--json was written at the end).
    import subprocess
    import sys

    script = str(REPO_ROOT / "scripts" / "linear_probe.py")
    alone = subprocess.run([sys.executable, script, str(tiny_bert), "--train-file", str(probe_files["train"])],
                           capture_output=True, text=True)
    assert alone.returncode == 2 and "--train-file needs --eval-file" in alone.stderr
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, script, f"random:{tiny_bert}", str(tmp_path / "no-such-encoder"), "--train-file",
                             str(probe_files["train"]), "--eval-file", str(probe_files["validation"]), "--json", str(out)],
                            capture_output=True, text=True, env={**__import__("os").environ, "BERTPIPE_MIRROR": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr and "linear_probe.py: error:" in result.stderr, result.stderr
    assert [row["encoder"] for row in json.loads(out.read_text())] == [f"random:{tiny_bert}"]

"""bertpipe's own BERT through the CLI: convert a transformers BERT, draw attention, fine-tune it."""

from __future__ import annotations

import json

import torch

from tasks.cli import main
from tests.conftest import classification_config, run_cli


def test_cli_convert_bert_then_attention_then_train(tmp_path, tiny_bert, sentiment_files, capsys):
    from transformers import AutoModel, AutoTokenizer

    converted = tmp_path / "ours"
    assert main(["convert-bert", str(tiny_bert), str(converted)]) == 0
    ours = AutoModel.from_pretrained(converted).eval()
    theirs = AutoModel.from_pretrained(tiny_bert).eval()
    assert ours.config.model_type == "bertpipe_bert"
    batch = AutoTokenizer.from_pretrained(tiny_bert)(["the film was good", "bad"], padding=True, return_tensors="pt")
    with torch.no_grad():
        difference = (ours(**batch).last_hidden_state - theirs(**batch).last_hidden_state).abs().max().item()
    assert difference <= 1e-5

    heatmaps = tmp_path / "heatmaps"
    assert main(["attention", str(converted), "the film was good", "--out", str(heatmaps)]) == 0
    assert len(list(heatmaps.glob("*.png"))) == ours.config.num_hidden_layers

    config = classification_config(tmp_path, converted, sentiment_files, run_name="ours")
    run_cli("train", str(config))
    metrics = json.loads((tmp_path / "ours" / "metrics.json").read_text())
    assert metrics["eval_accuracy"] >= 0.8
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "bertpipe_bert"

"""BigBird's block-sparse attention on inputs on both sides of its block threshold.

transformers' BigBird runs an input longer than ``(5 + 2 * num_random_blocks) * block_size`` pieces block-sparse
(blocks laid out over the padded length) and a shorter one with full attention, and the first short input
switches the loaded model to full attention for good. ``pipeline()`` loaded for one text runs it as the
checkpoint says; ``bertpipe predict`` must give every text exactly that, whatever else the file holds.
"""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from transformers import AutoTokenizer, pipeline

from tests.conftest import write_jsonl
from tests.families.matrix import ner_rows, predict, train
from tests.families.test_families_ner import assert_same_entities, train_ner

BLOCK_SIZE = 2  # threshold (5 + 2 * 3) * 2 = 22 pieces, below data.max_seq_length 64
TEXTS = [  # short ones first: with the switch kept, they decided how the long ones ran
    "the man met Bob",
    "Alice visited Rome today",
    "Marguerite Anastasia visited Copenhagen, Valparaiso and Montevideo today with Roberto Kowalski.",
    "yesterday Bob Kowalski was in Rome and Alice Kowalski saw a very good film in Berlin with Marguerite",
    " ".join(["Marguerite Kowalski met Roberto Anastasia in Valparaiso, Montevideo and Copenhagen."] * 2),
]


@pytest.fixture(scope="module")
def low_threshold_checkpoint(family_checkpoint, tmp_path_factory):
    folder = shutil.copytree(family_checkpoint("big_bird"), tmp_path_factory.mktemp("big-bird") / "checkpoint")
    config = json.loads((folder / "config.json").read_text())
    assert config["attention_type"] == "block_sparse" and config["num_random_blocks"] == 3
    (folder / "config.json").write_text(json.dumps({**config, "block_size": BLOCK_SIZE}))
    return folder


def test_families_big_bird_predict_gives_each_text_what_pipeline_gives_it_alone(low_threshold_checkpoint, tmp_path):
    """Before: predict ran every text after the first short one with full attention (the padding probe's short
    example switched the model), so a long text's entity scores were ~2e-4 off what pipeline() gives it alone."""
    import tasks

    tasks.load_tasks()  # bertpipe's pipeline("token-classification"), as documented
    logging.getLogger("transformers.models.big_bird.modeling_big_bird").setLevel(logging.ERROR)  # the switch's warning
    run = train_ner("big_bird", low_threshold_checkpoint, tmp_path, steps=3)
    tokenizer = AutoTokenizer.from_pretrained(run)
    threshold = (5 + 2 * 3) * BLOCK_SIZE
    lengths = [len(tokenizer(text, truncation=True, max_length=64)["input_ids"]) for text in TEXTS]
    assert min(lengths) <= threshold < max(lengths), lengths  # both attentions
    predicted = predict(run, [{"text": text} for text in TEXTS], tmp_path)
    kept = pipeline("token-classification", model=str(run))
    for text, row in zip(TEXTS, predicted):
        alone = pipeline("token-classification", model=str(run))(text)  # a freshly loaded model per text
        assert_same_entities(row["entities"], alone, text, "big_bird")
        # One pipeline for every text, the short ones first: it switched itself to full attention for good.
        assert_same_entities(row["entities"], kept(text), text, "big_bird")
    assert sum(len(row["entities"]) for row in predicted[2:]) >= 2  # long texts' entities compared


def test_families_big_bird_export_is_refused_where_inputs_reach_block_sparse_attention(family_checkpoint, tmp_path, capsys):
    """Eval examples below the block threshold (88 pieces here, 704 on google/bigbird-roberta-base), served inputs
    up to data.max_seq_length 120: the graph, traced on a short example, gave a long input full attention where
    the run gives it block-sparse (entity scores ~1e-4 off, while export.json claimed 1.5e-7). Refused now,
    naming the key, before anything is written."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from pipelines.cli import main as pipelines_main
    from tasks import get_task
    from tests.families.matrix import run_bertpipe

    logging.getLogger("transformers.models.big_bird.modeling_big_bird").setLevel(logging.ERROR)
    files = {"train": write_jsonl(tmp_path / "train.jsonl", ner_rows(48, seed=1)),
             "validation": write_jsonl(tmp_path / "validation.jsonl", ner_rows(8, seed=2))}
    run = train(tmp_path, "ner", family_checkpoint("big_bird"), files, "data.max_seq_length=120", train="  max_steps: 3")
    capsys.readouterr()
    assert pipelines_main(["export", str(run), "--out", str(tmp_path / "export")], get_task=get_task) == 2
    message = capsys.readouterr().err
    assert "data.max_seq_length=120" in message and "data.max_seq_length <= 88" in message and "Traceback" not in message
    assert not (tmp_path / "export").exists()

    # At the threshold every input takes full attention, as the graph does: exported, and exact for the longest.
    run_bertpipe("train", str(tmp_path / "ner.yaml"), "data.max_seq_length=88", "overwrite=true")
    run_bertpipe("export", str(run), "--out", str(tmp_path / "export"))
    claimed = json.loads((tmp_path / "export" / "export.json").read_text())["parity"]["fp32"]["max_abs_diff"]
    text = " ".join(["Marguerite Kowalski met Roberto Anastasia in Valparaiso, Montevideo and Copenhagen."] * 3)
    assert len(AutoTokenizer.from_pretrained(run)(text, truncation=True, max_length=88)["input_ids"]) == 88
    (from_run,), (from_export,) = predict(run, [{"text": text}], tmp_path), predict(tmp_path / "export", [{"text": text}], tmp_path)
    assert from_run["entities"], "nothing to compare"
    assert [e["score"] for e in from_export["entities"]] == pytest.approx([e["score"] for e in from_run["entities"]], abs=claimed + 1e-5)

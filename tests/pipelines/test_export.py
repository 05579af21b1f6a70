"""ONNX export and onnxruntime prediction for every encoder task, on tiny BERT runs trained here.

For classification, NER and QA: the export's own parity check (max |Δ output| ≤ 1e-4 against torch,
every eval feature predicting the same labels), dynamic batch and sequence axes in the graph, and
``predict`` on the export directory giving the torch run's predictions (the same task code formats
both). int8: smaller, MatMuls quantised, attention products and LayerNorm left fp32, and most labels
unchanged. Runs train in-process for a few steps (fp32 pinned: the numbers compared assume it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from pipelines.config_loading import load_config  # noqa: E402
from pipelines.evaluation import predict_file  # noqa: E402
from pipelines.export import ExportError, compare_outputs, export_run  # noqa: E402
from pipelines.onnx_model import EXPORT_FILE, ONNX_FILE, OnnxModel  # noqa: E402
from pipelines.outputs import load_saved_config  # noqa: E402
from tasks import get_task  # noqa: E402
from tests.conftest import build_tiny_bert, classification_config, sentiment_rows, write_jsonl  # noqa: E402
from tests.test_cli_ner import ner_sentences, toy_ner_config, toy_ner_model  # noqa: E402
from tests.test_cli_qa import NAMES, QUESTION, qa_config, write_data  # noqa: E402

PINNED = ["train.mixed_precision='no'", "train.torch_num_threads=1", "train.eval_steps=null"]


def options_for(name: str):
    return get_task(name).Options


def train_in_process(config_path: Path, *overrides: str) -> Path:
    from pipelines.train import train

    config = load_config(config_path, [*PINNED, *overrides], options_for)
    train(config, get_task(config.task)(config))
    return Path(config.output_dir)


def task_for(run_dir: Path):
    config = load_config(None, [], options_for, base=load_saved_config(run_dir))
    return config, get_task(config.task)(config)


def export(run_dir: Path, out: Path, **options) -> dict:
    config, task = task_for(run_dir)
    return export_run(config, task, run_dir, out, **options)


def predict(folder: Path, inputs: Path, output: Path) -> list[dict]:
    config, task = task_for(folder)
    predict_file(config, task, str(folder), str(inputs), str(output))
    return [json.loads(line) for line in output.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("edge-runs")
    tiny = build_tiny_bert(root / "tiny")
    files = {
        "train": write_jsonl(root / "train.jsonl", sentiment_rows(96, seed=1)),
        "validation": write_jsonl(root / "validation.jsonl", sentiment_rows(37, seed=2)),
    }
    classification = train_in_process(classification_config(root, tiny, files, run_name="cls"), "train.max_steps=24")
    (root / "ner").mkdir()
    ner = train_in_process(toy_ner_config(root / "ner", toy_ner_model(root / "ner")), "train.max_steps=30")
    (root / "qa").mkdir()
    qa_model = build_tiny_bert(root / "qa" / "tiny", vocab_words=NAMES * 5)
    qa = train_in_process(qa_config(root / "qa", qa_model, write_data(root / "qa", unanswerable=0.0), v2=False), "train.max_steps=30")
    return {"classification": classification, "ner": ner, "qa": qa}


def prediction_inputs(task: str, folder: Path) -> Path:
    if task == "classification":
        path = folder / "inputs.txt"
        path.write_text("the film was superb\nawful and dull plot\nthe scenes were warm and bright\ngrim\n")
    elif task == "ner":
        sentences = ner_sentences(6, seed=5, long_every=3)  # some longer than a window
        path = write_jsonl(folder / "inputs.jsonl", [{"tokens": words} for words, _ in sentences])
    else:
        long_context = " ".join(["the film was a story with very and plot"] * 4 + ["grace"] + ["it is of scenes"] * 3)
        path = write_jsonl(folder / "inputs.jsonl", [
            {"id": "short", "question": QUESTION, "context": "the plot was dull and bob was fine"},
            {"id": "long", "question": QUESTION, "context": long_context},
        ])
    return path


@pytest.mark.parametrize("task", ["classification", "ner", "qa"])
def test_export_onnx_matches_torch_and_predicts_the_same(runs, task, tmp_path):
    import onnx

    run_dir = runs[task]
    summary = export(run_dir, tmp_path / "onnx")
    saved = json.loads((tmp_path / "onnx" / EXPORT_FILE).read_text())
    assert saved == json.loads(json.dumps(summary))
    assert saved["precision"] == "fp32" and saved["opset"] >= 18 and saved["task"] == task
    parity = saved["parity"]["fp32"]
    assert parity["max_abs_diff"] <= 1e-4, parity
    assert parity["agreement"] == 1.0 and parity["features_compared"] >= saved["parity"]["examples"] > 0, parity

    graph = onnx.load(str(tmp_path / "onnx" / ONNX_FILE)).graph
    per_token = task != "classification"  # NER and QA outputs have a sequence axis, classification's a label axis
    for node in [*graph.input, *(graph.output if per_token else [])]:
        dims = node.type.tensor_type.shape.dim
        assert dims[0].dim_param and dims[1].dim_param, f"{node.name} has a fixed batch or sequence axis"
    assert all(node.type.tensor_type.shape.dim[0].dim_param for node in graph.output)
    assert {p.name for p in (tmp_path / "onnx").iterdir()} >= {ONNX_FILE, EXPORT_FILE, "config.json", "config.yaml", "tokenizer.json"}

    inputs = prediction_inputs(task, tmp_path)
    from_torch = predict(run_dir, inputs, tmp_path / "torch.jsonl")
    from_onnx = predict(tmp_path / "onnx", inputs, tmp_path / "onnx.jsonl")
    assert len(from_onnx) == len(from_torch) > 0
    for torch_row, onnx_row in zip(from_torch, from_onnx):
        assert set(onnx_row) == set(torch_row)
        for key, value in torch_row.items():
            if key == "score":
                assert onnx_row[key] == pytest.approx(value, abs=1e-4)
            elif key == "scores":
                assert onnx_row[key] == pytest.approx(value, abs=1e-4)
            elif key == "entities":
                assert [{k: v for k, v in e.items() if k != "score"} for e in onnx_row[key]] == \
                       [{k: v for k, v in e.items() if k != "score"} for e in value]
            elif key not in ("tag_scores", "no_answer_probability"):
                assert onnx_row[key] == value, key


def test_export_int8_is_smaller_quantises_matmuls_and_keeps_most_labels(runs, tmp_path):
    run_dir = runs["classification"]
    fp32 = export(run_dir, tmp_path / "fp32")
    int8 = export(run_dir, tmp_path / "int8", quantize="int8")
    assert int8["precision"] == "int8"
    assert int8["size_bytes"] < fp32["size_bytes"]
    quantization = int8["quantization"]
    assert quantization["quantized_ops"]["MatMulInteger"] >= 2 * 6  # 6 weight MatMuls per layer, 2 layers
    # Attention's two activation products stay fp32 in each layer, and so does LayerNorm.
    assert quantization["kept_fp32_ops"]["MatMul"] == 2 * 2 and quantization["kept_fp32_ops"]["LayerNormalization"] >= 2
    chosen = quantization["max_abs_diff_per_channel" if quantization["per_channel"] else "max_abs_diff_per_tensor"]
    assert chosen == min(quantization["max_abs_diff_per_channel"], quantization["max_abs_diff_per_tensor"])
    assert int8["parity"]["int8"]["agreement"] >= 0.8, int8["parity"]
    assert 0 < int8["parity"]["int8"]["max_abs_diff"] < 0.5

    inputs = prediction_inputs("classification", tmp_path)
    rows = predict(tmp_path / "int8", inputs, tmp_path / "int8.jsonl")
    reference = predict(run_dir, inputs, tmp_path / "torch.jsonl")
    assert sum(a["label"] == b["label"] for a, b in zip(rows, reference)) >= len(rows) - 1


def test_export_onnx_model_takes_any_batch_and_sequence_length(runs, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    export(runs["classification"], tmp_path / "onnx", parity_samples=4)
    onnx_model = OnnxModel(tmp_path / "onnx")
    assert onnx_model.config.id2label == {0: "negative", 1: "positive"}
    # No memory pattern kept per input shape: text batches rarely repeat one (peak RSS, docs/edge.md).
    assert onnx_model.session.get_session_options().enable_mem_pattern is False
    tokenizer = AutoTokenizer.from_pretrained(runs["classification"])
    torch_model = AutoModelForSequenceClassification.from_pretrained(runs["classification"]).eval()
    for texts in (["grim"], ["the film was lovely and the actors were great " * 2, "bad", "a story", "warm bright scenes"]):
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            expected = torch_model(**batch).logits
        torch.testing.assert_close(onnx_model(**batch).logits, expected, atol=1e-4, rtol=1e-4)


def test_export_fp32_disagreeing_with_torch_is_said_at_once(runs, tmp_path, monkeypatch, caplog):
    import pipelines.export

    real = pipelines.export.compare_outputs

    def one_flip(*args, **kwargs):  # as a faulty exporter or runtime would give
        result = real(*args, **kwargs)
        return {**result, "features_agreeing": result["features_compared"] - 1, "agreement": 1 - 1 / result["features_compared"]}

    monkeypatch.setattr(pipelines.export, "compare_outputs", one_flip)
    with caplog.at_level("WARNING", logger="pipelines.export"):
        export(runs["classification"], tmp_path / "onnx", parity_samples=4)
    assert "the fp32 export predicts other labels than torch for 1 of 4 features" in caplog.text
    monkeypatch.setattr(pipelines.export, "compare_outputs", real)
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipelines.export"):
        export(runs["classification"], tmp_path / "onnx2", parity_samples=4)
    assert "other labels than torch" not in caplog.text


def test_export_compare_outputs_masks_padding_and_counts_label_flips():
    import numpy as np

    mask = np.array([[1, 1, 0], [1, 1, 1]])
    reference = [{"logits": np.array([[[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])}]
    # Padding differs wildly (ignored); example 1 flips its last token's label.
    candidate = [{"logits": np.array([[[0.0, 1.0], [2.0, 0.0], [9.0, -9.0]], [[1.0, 0.0], [0.0, 1.0], [0.7, 0.5]]])}]
    result = compare_outputs(reference, candidate, [mask], ("logits",))
    assert result["max_abs_diff"] == pytest.approx(0.7)
    assert result["features_agreeing"] == 1 and result["features_compared"] == 2


def test_export_compare_outputs_counts_nan_outputs_as_differences():
    import math

    import numpy as np

    nan = float("nan")
    # Classification: a NaN row's argmax is 0, the reference's label too; a NaN is still not agreement.
    reference = [{"logits": np.array([[1.0, 0.0], [0.0, 1.0]])}]
    candidate = [{"logits": np.array([[nan, nan], [0.0, 1.0]])}]
    result = compare_outputs(reference, candidate, [np.ones((2, 3))], ("logits",))
    assert math.isnan(result["max_abs_diff"]) and result["features_agreeing"] == 1, result

    # NER: a NaN at a real position (padding is still ignored); the NaN batch comes after a clean one.
    mask = np.array([[1, 1, 0]])
    clean = {"logits": np.array([[[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]])}
    broken = {"logits": np.array([[[1.0, 0.0], [nan, 0.0], [0.0, 0.0]]])}
    result = compare_outputs([clean, clean], [clean, broken], [mask, mask], ("logits",))
    assert math.isnan(result["max_abs_diff"]) and (result["features_agreeing"], result["features_compared"]) == (1, 2), result
    padding_only = {"logits": np.array([[[1.0, 0.0], [1.0, 0.0], [nan, nan]]])}
    assert compare_outputs([clean], [padding_only], [mask], ("logits",))["agreement"] == 1.0

    # QA: NaN start logits whose argmax would land on the reference's start.
    ref = {"start_logits": np.array([[5.0, 0.0, 0.0]]), "end_logits": np.array([[0.0, 5.0, 0.0]])}
    cand = {"start_logits": np.array([[nan, 0.0, 0.0]]), "end_logits": np.array([[0.0, 5.0, 0.0]])}
    result = compare_outputs([ref], [cand], [np.array([[1, 1, 1]])], ("start_logits", "end_logits"))
    assert math.isnan(result["max_abs_diff"]) and result["features_agreeing"] == 0, result


def test_export_multi_label_parity_counts_labels_switched_on_or_off(tmp_path, monkeypatch):
    """A multi-label head predicts every label with sigmoid >= classification.multi_label_threshold: an
    export whose logits keep the argmax but switch labels on or off predicts other labels, and its
    parity must say so (the argmax alone read it as agreeing)."""
    import numpy as np

    import pipelines.export

    rows = [{"sentence": row["sentence"], "label": [row["label"]] + (["long"] if len(row["sentence"].split()) > 6 else [])}
            for row in sentiment_rows(40, seed=3)]
    files = {"train": write_jsonl(tmp_path / "train.jsonl", rows[:28]), "validation": write_jsonl(tmp_path / "validation.jsonl", rows[28:])}
    run_dir = train_in_process(classification_config(tmp_path, build_tiny_bert(tmp_path / "tiny"), files, run_name="multi"), "train.max_steps=4")
    assert json.loads((run_dir / "config.json").read_text())["problem_type"] == "multi_label_classification"
    real_session = pipelines.export.inference_session

    class ShiftedFirstRow:  # as an export that moves one example's logits together would give
        def __init__(self, path):
            self.session, self.shifted = real_session(path), False

        def run(self, names, feed):
            values = self.session.run(names, feed)
            if not self.shifted:
                logits = values[0]
                all_on = bool((logits[0] >= 0).all())
                logits[0] += -20.0 if all_on else 20.0  # same argmax, every label on (or off)
                self.shifted = True
            return values

    monkeypatch.setattr(pipelines.export, "inference_session", ShiftedFirstRow)
    summary = export(run_dir, tmp_path / "onnx", parity_samples=8)
    parity = summary["parity"]["fp32"]
    assert parity["features_compared"] == 8 and parity["features_agreeing"] == 7, parity
    assert np.isclose(parity["max_abs_diff"], 20.0, atol=1e-3)


def test_export_overwrite_interrupted_as_the_new_export_moves_in_keeps_the_old_one(runs, tmp_path, monkeypatch):
    """``export --overwrite`` deleted the earlier export before moving the new one in: Ctrl-C or a kill between
    the two kept neither. The earlier export is renamed aside until the new one is in place."""
    import pipelines.atomic_writes as atomic_writes

    out = tmp_path / "onnx"
    export(runs["classification"], out, parity_samples=2)
    before = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}

    replace = os.replace

    def interrupted(source, destination):
        if Path(destination) == out and Path(source).name != f".{out.name}.old.partial":  # the finished export moving in
            raise KeyboardInterrupt
        return replace(source, destination)

    monkeypatch.setattr(atomic_writes.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(runs["classification"], out, parity_samples=2, overwrite=True)
    assert {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["onnx"]  # no staging or set-aside folder left


def test_export_whose_graph_comes_out_fixed_to_the_sample_shape_is_refused_and_writes_nothing(runs, tmp_path, monkeypatch):
    """A model that reads its sequence length as a Python int (Funnel builds its relative positions from
    ``list(range(seq_len))``) makes torch.export fix the axis; torch.onnx.export then exports again at the sample's
    shape without an error. export.json claimed dynamic axes, and every other length failed in predict (with
    ``--parity-samples 1``) or in the parity check (a raw onnxruntime traceback)."""
    import pipelines.export

    out = tmp_path / "onnx"
    export(runs["classification"], out, parity_samples=2)
    before = {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()}
    forward = pipelines.export._PositionalOutputs.forward

    def reads_its_length(self, *inputs):
        list(range(inputs[0].shape[1]))  # as Funnel's position tables do
        return forward(self, *inputs)

    monkeypatch.setattr(pipelines.export._PositionalOutputs, "forward", reads_its_length)
    # One parity example: every parity batch has the sample's shape, so only the graph's inputs tell.
    with pytest.raises(ExportError, match=r"^the bert model of this run cannot be exported to ONNX: the exported graph has fixed "
                                          r"shapes \(input_ids \[\w+, \d+\], .*not dynamic batch and sequence axes"):
        export(runs["classification"], out, parity_samples=1, overwrite=True)
    assert {path.relative_to(out): path.read_bytes() for path in out.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["onnx"]  # no staging folder left


def test_export_graph_onnxruntime_cannot_run_on_the_parity_inputs_is_an_export_error(runs, tmp_path, monkeypatch):
    """An onnxruntime failure in the parity check (a graph that loads but refuses an input's shape, an op that
    fails) escaped as a raw traceback; it names the graph and the shapes it was fed."""
    import pipelines.export

    real_session = pipelines.export.inference_session

    class RefusesTheInputs:  # onnxruntime's own refusal, of a feed with an extra axis
        def __init__(self, path):
            self.session = real_session(path)

        def run(self, names, feed):
            return self.session.run(names, {name: value[None] for name, value in feed.items()})

    monkeypatch.setattr(pipelines.export, "inference_session", RefusesTheInputs)
    with pytest.raises(ExportError, match=r"^onnxruntime cannot run the exported graph of the bert model on the parity inputs "
                                          r"\(input_ids \[\d+, \d+\].*\): InvalidArgument"):
        export(runs["classification"], tmp_path / "onnx", parity_samples=2)
    assert list(tmp_path.iterdir()) == []

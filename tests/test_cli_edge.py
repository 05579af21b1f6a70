"""The edge commands end to end through the CLI entry point (``tasks.cli.main``, in-process to stay cheap):
export -> predict/evaluate on the export directory, LoRA merge -> export, distill -> export the student,
and bad inputs (unfinished run, non-encoder task, adapter-only run, low opset, occupied --out, a bad
teacher) as exit status 2 with one message naming the problem and no traceback.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys

import pytest
import yaml

pytest.importorskip("onnxruntime")

from tasks.cli import main  # noqa: E402
from tests.conftest import classification_config  # noqa: E402

PINNED = ["train.mixed_precision='no'", "train.torch_num_threads=1", "train.eval_steps=null"]


def cli(*args: str) -> int:
    return main([str(arg) for arg in args])


def expect_error(capsys, *args: str, naming: list[str]) -> str:
    capsys.readouterr()
    assert cli(*args) == 2
    err = capsys.readouterr().err
    message = err[err.index(f"bertpipe {args[0]}: error:"):]  # progress bars may come first
    assert "Traceback" not in err, err
    for fragment in naming:
        assert fragment in message, (fragment, err)
    return err


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert, sentiment_files):
    root = tmp_path_factory.mktemp("edge-cli")
    config = classification_config(root, tiny_bert, sentiment_files, run_name="run")
    assert cli("train", config, *PINNED, "train.max_steps=60") == 0
    inputs = root / "inputs.txt"
    inputs.write_text("the film was superb\nawful and dull plot\ngrim sad story\n")
    return {"root": root, "config": config, "run": root / "run", "inputs": inputs}


def test_cli_export_then_predict_and_evaluate_on_the_export(setup, tmp_path):
    run, out = setup["run"], tmp_path / "onnx"
    assert cli("export", run, "--out", out, "--opset", "18") == 0
    assert json.loads((out / "export.json").read_text())["parity"]["fp32"]["max_abs_diff"] <= 1e-4

    assert cli("predict", out, "--input", setup["inputs"], "--output", tmp_path / "onnx.jsonl") == 0
    assert cli("predict", run, "--input", setup["inputs"], "--output", tmp_path / "torch.jsonl") == 0
    onnx_rows = [json.loads(line) for line in (tmp_path / "onnx.jsonl").read_text().splitlines()]
    torch_rows = [json.loads(line) for line in (tmp_path / "torch.jsonl").read_text().splitlines()]
    assert [row["label"] for row in onnx_rows] == [row["label"] for row in torch_rows]
    assert [set(row) for row in onnx_rows] == [set(row) for row in torch_rows]

    assert cli("evaluate", out) == 0
    evaluated = json.loads((out / "eval_validation.json").read_text())
    trained = json.loads((run / "metrics.json").read_text())
    assert evaluated["eval_accuracy"] == pytest.approx(trained["eval_accuracy"])


def test_cli_predict_on_an_export_runs_onnxruntime_on_the_configs_thread_count(setup, tmp_path, monkeypatch):
    # train.torch_num_threads (the run's, or an override) reached torch's evaluations but not the onnxruntime session.
    import torch

    from pipelines import onnx_model

    out = tmp_path / "onnx"
    assert cli("export", setup["run"], "--out", out) == 0
    opened = []
    session = onnx_model.inference_session
    monkeypatch.setattr(onnx_model, "inference_session",
                        lambda path, *, num_threads=None: opened.append(num_threads) or session(path, num_threads=num_threads))
    threads = torch.get_num_threads()
    try:
        assert cli("predict", out, "--input", setup["inputs"], "--output", tmp_path / "p.jsonl", "train.torch_num_threads=1") == 0
    finally:
        torch.set_num_threads(threads)
    assert opened == [1]


def test_cli_export_bad_inputs_exit_2_naming_the_problem(setup, tmp_path, capsys):
    run = setup["run"]
    expect_error(capsys, "export", tmp_path / "nowhere", "--out", tmp_path / "o", naming=["nowhere", "does not exist"])

    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished)
    (unfinished / "metrics.json").unlink()
    expect_error(capsys, "export", unfinished, "--out", tmp_path / "o", naming=[str(unfinished), "not a finished run"])

    # Same files, but the saved config says MLM: the task decides what can be exported.
    mlm = tmp_path / "mlm"
    shutil.copytree(run, mlm)
    saved = yaml.safe_load((mlm / "config.yaml").read_text())
    saved.pop("classification", None)
    saved["task"] = "mlm"
    (mlm / "config.yaml").write_text(yaml.safe_dump(saved))
    expect_error(capsys, "export", mlm, "--out", tmp_path / "o", naming=["'mlm'", "cannot be exported", "classification, ner, qa"])

    expect_error(capsys, "export", run, "--out", tmp_path / "o", "--opset", "17", naming=["--opset 17", "18"])
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    expect_error(capsys, "export", run, "--out", occupied, naming=[str(occupied), "--overwrite"])
    assert (occupied / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "o").exists()



def test_cli_export_bad_options_and_missing_exporter_packages_exit_2(setup, tmp_path, capsys, monkeypatch):
    import onnx

    run = setup["run"]
    for samples in ("0", "-3"):
        expect_error(capsys, "export", run, "--out", tmp_path / "o", "--parity-samples", samples, naming=[f"--parity-samples {samples}"])
    # An --out that is a file is refused before the export runs, and kept.
    taken = tmp_path / "taken.onnx"
    taken.write_text("mine")
    expect_error(capsys, "export", run, "--out", taken, naming=[f"--out {taken}", "is a file"])
    assert taken.read_text() == "mine"
    expect_error(capsys, "export", run, "--out", tmp_path / "o", "--opset", "99", naming=["--opset 99", str(onnx.defs.onnx_opset_version())])
    # The newest opset onnx knows: the exporter may fail to convert its graph to it (torch 2.13: 26-28), or
    # onnxruntime may not run every op at it. Either it exports, or exit 2 naming --opset, without the converter's traceback.
    newest = onnx.defs.onnx_opset_version()
    # A handler that torch or logging.basicConfig bound to an earlier test's captured (now closed) stderr
    # would print logging's own "--- Logging error --- Traceback" into this one's.
    monkeypatch.setattr(logging, "raiseExceptions", False)
    capsys.readouterr()
    status = cli("export", run, "--out", tmp_path / "newest", "--opset", newest, "--parity-samples", "4")
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert status == 0 or (status == 2 and f"bertpipe export: error: --opset {newest}" in err), (status, err)
    assert status == 0 or not (tmp_path / "newest").exists()
    # onnxruntime alone does not export: torch.onnx.export(dynamo=True) needs onnx and onnxscript.
    for package in ("onnxscript", "onnx"):
        with monkeypatch.context() as patched:
            patched.setitem(sys.modules, package, None)  # `import package` raises ImportError
            expect_error(capsys, "export", run, "--out", tmp_path / "o", naming=[f"needs {package}", "bertpipe[edge]"])
    assert not (tmp_path / "o").exists()

def test_cli_export_lora_run_needs_merge_then_exports_the_merged_model(setup, tmp_path, capsys):
    lora = tmp_path / "lora"
    assert cli("train", setup["config"], *PINNED, f"output_dir={lora}", "train.max_steps=4", "model.peft.method=lora") == 0
    expect_error(capsys, "export", lora, "--out", tmp_path / "o", naming=[str(lora), "only a peft adapter", f"bertpipe merge {lora}"])
    assert cli("merge", lora) == 0
    assert cli("export", lora, "--out", tmp_path / "onnx") == 0
    summary = json.loads((tmp_path / "onnx" / "export.json").read_text())
    assert summary["source"].endswith("merged") and summary["parity"]["fp32"]["max_abs_diff"] <= 1e-4
    assert cli("predict", tmp_path / "onnx", "--input", setup["inputs"], "--output", tmp_path / "p.jsonl") == 0


def test_cli_distill_student_is_a_run_that_exports_and_bad_teachers_exit_2(setup, tmp_path, capsys):
    student = tmp_path / "student"
    assert cli("distill", setup["run"], setup["config"], *PINNED, f"output_dir={student}", "train.max_steps=12",
               "distill.num_layers=1", "distill.temperature=3") == 0
    assert json.loads((student / "config.json").read_text())["num_hidden_layers"] == 1
    saved = yaml.safe_load((student / "config.yaml").read_text())
    assert saved["distill"]["teacher"] == str(setup["run"]) and saved["distill"]["temperature"] == 3
    assert cli("export", student, "--out", tmp_path / "int8", "--quantize", "int8") == 0
    assert cli("predict", tmp_path / "int8", "--input", setup["inputs"], "--output", tmp_path / "p.jsonl") == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 3

    unfinished = tmp_path / "unfinished"
    shutil.copytree(setup["run"], unfinished)
    (unfinished / "metrics.json").unlink()
    expect_error(capsys, "distill", unfinished, setup["config"], *PINNED, f"output_dir={tmp_path / 's2'}",
                 naming=[str(unfinished), "not a finished run"])
    expect_error(capsys, "distill", setup["run"], setup["config"], f"output_dir={tmp_path / 's3'}", "distill.init=model",
                 "distill.num_layers=1", naming=["distill", "distill.init=teacher"])


def test_cli_distill_teacher_of_another_task_exits_2_naming_both_tasks(setup, tmp_path, capsys):
    """A teacher's config.yaml holds its own task's section; read with the student's task options it
    failed on those keys ("unknown key 'ner.label_all_tokens'"), after the student was built from it."""
    teacher = tmp_path / "ner-teacher"
    shutil.copytree(setup["run"], teacher)
    saved = yaml.safe_load((teacher / "config.yaml").read_text())
    saved.pop("classification", None)
    saved.update(task="ner", ner={"label_all_tokens": False})
    (teacher / "config.yaml").write_text(yaml.safe_dump(saved))
    err = expect_error(capsys, "distill", teacher, setup["config"], *PINNED, f"output_dir={tmp_path / 'student'}",
                       naming=[str(teacher), "is a 'ner' run", "this run's task is 'classification'"])
    assert "unknown key" not in err
    assert not (tmp_path / "student").exists()


def test_cli_predict_and_evaluate_on_a_damaged_export_exit_2_naming_the_folder_and_the_file(setup, tmp_path, capsys):
    """A run folder with truncated weights exits 2 naming it; a damaged export folder ended in raw tracebacks: a
    truncated model.onnx (onnxruntime's InvalidProtobuf), no config.json (transformers' "Unrecognized model"), a
    corrupt export.json (evaluate's JSONDecodeError), and a graph of fixed input shapes, as Funnel's export was
    written (onnxruntime's InvalidArgument on every other shape)."""
    import onnx

    export = tmp_path / "onnx"
    assert cli("export", setup["run"], "--out", export, "--parity-samples", "2") == 0

    def damaged(name: str, damage) -> tuple:
        folder = shutil.copytree(export, tmp_path / name)
        damage(folder)
        return folder, {path.name: path.read_bytes() for path in folder.iterdir()}

    def fix_input_shapes(folder):
        graph = onnx.load(str(folder / "model.onnx"))
        for node in graph.graph.input:
            node.type.tensor_type.shape.dim[0].dim_value, node.type.tensor_type.shape.dim[1].dim_value = 1, 5
        onnx.save(graph, str(folder / "model.onnx"))

    cases = [
        (damaged("truncated", lambda f: (f / "model.onnx").write_bytes((f / "model.onnx").read_bytes()[:1000])),
         ("predict", "evaluate"), lambda f: ["cannot load the model from", str(f / "model.onnx"), "InvalidProtobuf"]),
        (damaged("no-config", lambda f: (f / "config.json").unlink()), ("predict", "evaluate"), lambda f: ["has no config.json"]),
        (damaged("bad-summary", lambda f: (f / "export.json").write_text("{")), ("evaluate",), lambda f: [f"cannot read {f / 'export.json'}"]),
        (damaged("fixed-shapes", fix_input_shapes), ("predict",), lambda f: ["fixed input shapes", "input_ids [1, 5]", "InvalidArgument"]),
    ]
    for (folder, files), commands, naming in cases:
        for command in commands:
            output = tmp_path / f"{folder.name}.jsonl"
            args = ["--input", setup["inputs"], "--output", output] if command == "predict" else []
            expect_error(capsys, command, folder, *args, naming=[f"export directory {folder}", *naming(folder)])
            assert not output.exists()
        assert {path.name: path.read_bytes() for path in folder.iterdir()} == files, folder  # no eval_*.json beside a damaged export

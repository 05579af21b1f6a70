"""The run folder's files that a later command rewrites -- ``log.jsonl`` on a resume, the model card, NER's
``eval_predictions.conll``, translation's ``generations.jsonl`` and ``sacrebleu_signature.json``, a
checkpoint's ``trainer_state.json`` -- are replaced whole or not at all: a write that fails midway (a full
disk, a kill) leaves the earlier file as it was."""

from __future__ import annotations

import builtins
import errno
import io
import json
import math
import os
from pathlib import Path

import pytest
from datasets import Dataset

from pipelines.config_loading import load_config
from pipelines.outputs import StepLog
from tasks import get_task
from tests.conftest import REPO_ROOT

OPTIONS = lambda name: get_task(name).Options  # noqa: E731


class _HalfWritten:
    """A file that takes the first half of what is written to it, then fails as a full disk does."""

    def __init__(self, handle):
        self._handle = handle

    def write(self, text):
        self._handle.write(text[: len(text) // 2])
        self._handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()

    def __getattr__(self, name):
        return getattr(self._handle, name)


@pytest.fixture
def disk_full_on(monkeypatch):
    """``disk_full_on("README.md")``: writing a file of that name (or its temporary twin) fails midway,
    whichever way it is opened (``open``, ``Path.open``/``write_text``)."""
    real_open = io.open

    def arm(name: str) -> None:
        def opened(file, mode="r", *args, **kwargs):
            handle = real_open(file, mode, *args, **kwargs)
            written = isinstance(file, (str, bytes, os.PathLike)) and any(flag in mode for flag in "wax")
            return _HalfWritten(handle) if written and Path(os.fsdecode(file)).name in (name, f"{name}.tmp") else handle

        monkeypatch.setattr(io, "open", opened)
        monkeypatch.setattr(builtins, "open", opened)

    return arm


def _check_kept(folder: Path, name: str, before: str, write, disk_full_on) -> None:
    (folder / name).write_text(before)
    disk_full_on(name)
    with pytest.raises(OSError):
        write()
    assert (folder / name).read_text() == before
    assert not (folder / f"{name}.tmp").exists()


# ----- log.jsonl --------------------------------------------------------------------------------
RECORDS = [{"step": step, "loss": 1.0 / step} for step in range(1, 7)]


def test_run_files_resumed_step_log_holds_the_checkpoint_history_then_the_new_records(tmp_path):
    # The interrupted run logged steps 1..6; its checkpoint holds the history up to step 4.
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(record) + "\n" for record in RECORDS))
    log = StepLog(tmp_path, RECORDS[:4])
    assert [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()] == RECORDS[:4]
    log.write({"step": 5, "loss": 0.5})
    log.close()
    assert [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()] == [*RECORDS[:4], {"step": 5, "loss": 0.5}]
    StepLog(tmp_path).close()  # a new run starts an empty log
    assert (tmp_path / "log.jsonl").read_text() == ""


def test_run_files_resumed_step_log_interrupted_while_rewritten_keeps_the_earlier_log(tmp_path, disk_full_on):
    # Opened with "w" and written back record by record, a kill right after the reopen left an empty log.
    before = "".join(json.dumps(record) + "\n" for record in RECORDS)
    _check_kept(tmp_path, "log.jsonl", before, lambda: StepLog(tmp_path, RECORDS[:4]), disk_full_on)


# ----- the model card -----------------------------------------------------------------------------
def test_run_files_model_card_written_midway_keeps_the_earlier_card(tmp_path, disk_full_on):
    from pipelines.card import write_model_card

    config = load_config(None, [f"output_dir={tmp_path}"], OPTIONS, base={
        "task": "classification", "data": {"path": "glue", "name": "sst2"}, "model": {"name_or_path": "bert-base-uncased"},
    })
    task = get_task("classification")(config)
    write_model_card(tmp_path, config, task, {"eval_accuracy": 0.5})
    assert "eval_accuracy" in (tmp_path / "README.md").read_text()
    rewrite = lambda: write_model_card(tmp_path, config, task, {"eval_accuracy": 0.9})  # noqa: E731
    _check_kept(tmp_path, "README.md", "the card of the finished run\n", rewrite, disk_full_on)


# ----- the tasks' eval artifacts --------------------------------------------------------------------
def test_run_files_ner_eval_predictions_written_midway_keep_the_earlier_file(tmp_path, disk_full_on):
    config = load_config(REPO_ROOT / "configs/ner/conll2003.yaml", [f"output_dir={tmp_path}"], OPTIONS)
    task = get_task("ner")(config)
    examples = Dataset.from_dict({"tokens": [["Peter", "left"], ["Acme"]], "tags": [["B-PER", "O"], ["B-ORG"]]})
    predictions = {"tags": [["B-PER", "O"], ["O"]]}
    task.save_artifacts(predictions, examples, str(tmp_path))
    assert (tmp_path / "eval_predictions.conll").read_text() == "Peter B-PER B-PER\nleft O O\n\nAcme B-ORG O\n\n"
    rewrite = lambda: task.save_artifacts(predictions, examples, str(tmp_path))  # noqa: E731
    _check_kept(tmp_path, "eval_predictions.conll", "earlier\n", rewrite, disk_full_on)


@pytest.mark.parametrize("name", ["generations.jsonl", "sacrebleu_signature.json"])
def test_run_files_translation_generations_written_midway_keep_the_earlier_files(tmp_path, disk_full_on, name):
    config = load_config(REPO_ROOT / "configs/translation/multi30k_de_en.yaml", [f"output_dir={tmp_path}"], OPTIONS)
    task = get_task("translation")(config)
    source, target = task.options.source_lang, task.options.target_lang
    examples = Dataset.from_dict({source: ["Ein Hund läuft.", "Zwei Männer."], target: ["A dog runs.", "Two men."]})
    predictions = {"hypotheses": ["A dog is running.", "Two men."]}
    task.signatures = {"bleu": "nrefs:1|case:mixed", "chrf": "nrefs:1|case:mixed"}
    task.save_artifacts(predictions, examples, str(tmp_path))
    rows = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows[0] == {"source": "Ein Hund läuft.", "reference": "A dog runs.", "hypothesis": "A dog is running."} and len(rows) == 2
    assert json.loads((tmp_path / "sacrebleu_signature.json").read_text())["bleu"] == "nrefs:1|case:mixed"
    rewrite = lambda: task.save_artifacts(predictions, examples, str(tmp_path))  # noqa: E731
    _check_kept(tmp_path, name, "earlier\n", rewrite, disk_full_on)


# ----- a checkpoint's state -------------------------------------------------------------------------
def test_run_files_checkpoint_state_is_on_disk_before_its_rename_and_keeps_nan(tmp_path, monkeypatch):
    # trainer_state.json is what makes a checkpoint folder complete: renamed into place before its
    # contents reached the disk, a power loss could leave a "complete" checkpoint with an empty state.
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from pipelines.checkpoint import TrainerState, complete_checkpoints, save_checkpoint

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    state = TrainerState(global_step=3, best_metric=math.nan, log_history=[{"step": 2, "loss": math.nan}])
    AcceleratorState._reset_state(reset_partial_state=True)  # a process-wide singleton another test may hold
    try:
        folder = save_checkpoint(Accelerator(cpu=True), tmp_path, state, None)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert complete_checkpoints(tmp_path) == [folder]
    assert any(path.endswith("trainer_state.json.tmp") for path in synced), synced
    # Lossless, unlike metrics.json's strict JSON: a NaN read back as null would break the resumed loop's sums.
    read = TrainerState.read(folder)
    assert math.isnan(read.best_metric) and math.isnan(read.log_history[0]["loss"])


# ----- the temporary file beside ------------------------------------------------------------------
def test_run_files_written_beside_never_touch_a_file_named_like_the_temporary(tmp_path):
    # predict --output answers.jsonl wrote through answers.jsonl.tmp: a file of that name (the user's notes, or
    # predict's own --input) was overwritten and then deleted.
    from pipelines.atomic_writes import write_text_atomically
    from pipelines.outputs import save_figure

    notes = tmp_path / "answers.jsonl.tmp"
    notes.write_text("precious notes")
    write_text_atomically(tmp_path / "answers.jsonl", '{"answer": "x"}\n')
    assert (tmp_path / "answers.jsonl").read_text() == '{"answer": "x"}\n' and notes.read_text() == "precious notes"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["answers.jsonl", "answers.jsonl.tmp"]

    from matplotlib.figure import Figure

    (tmp_path / "curves.png.tmp").write_text("mine")
    save_figure(Figure(), tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG") and (tmp_path / "curves.png.tmp").read_text() == "mine"


def test_run_files_written_through_a_symbolic_link_replace_its_target_and_keep_the_link(tmp_path):
    from pipelines.atomic_writes import write_text_atomically

    target = tmp_path / "predictions" / "2026-12-03.jsonl"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    write_text_atomically(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    assert sorted(path.name for path in target.parent.iterdir()) == ["2026-12-03.jsonl"]

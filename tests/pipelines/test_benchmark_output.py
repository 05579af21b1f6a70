"""pipelines/benchmark/output.py: which --output-dir a benchmark accepts, and that it appears only when finished."""

from __future__ import annotations

import pytest

from pipelines.benchmark import RESULTS_JSON, benchmark_folder
from pipelines.config import TaskOptions
from pipelines.config_loading import load_config
from pipelines.errors import OutputDirError


def earlier_benchmark(folder):
    (folder / "runs" / "bertpipe-seed42").mkdir(parents=True)
    (folder / "runs" / "bertpipe-seed42" / "metrics.json").write_text("{}")
    (folder / RESULTS_JSON).write_text('{"earlier": true}')
    return folder


def contents(folder):
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_benchmark_folder_appears_only_when_the_benchmark_has_finished(tmp_path):
    out = tmp_path / "bench"
    with pytest.raises(RuntimeError, match="a run failed"):
        with benchmark_folder(out) as staging:
            (staging / "runs").mkdir()
            assert not out.exists()
            raise RuntimeError("a run failed")
    assert sorted(tmp_path.iterdir()) == []  # no folder, no staging beside it

    with benchmark_folder(out) as staging:
        (staging / RESULTS_JSON).write_text("{}")
    assert [path.name for path in out.iterdir()] == [RESULTS_JSON] and sorted(p.name for p in tmp_path.iterdir()) == ["bench"]


def test_benchmark_folder_takes_an_empty_folder(tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    with benchmark_folder(out) as staging:
        (staging / RESULTS_JSON).write_text("{}")
    assert (out / RESULTS_JSON).is_file()


def test_benchmark_folder_refuses_a_folder_that_is_not_an_earlier_benchmark_even_with_overwrite(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(OutputDirError, match=r"--output-dir .*mine is not empty and holds no earlier benchmark"):
            with benchmark_folder(out, overwrite=overwrite):
                pytest.fail("the block must not run")
    assert contents(out) == {"notes.txt": b"mine"}
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputDirError, match="is a file"):
        with benchmark_folder(tmp_path / "file"):
            pytest.fail("the block must not run")


def test_benchmark_folder_replaces_an_earlier_benchmark_only_when_asked_and_only_once_finished(tmp_path):
    out = earlier_benchmark(tmp_path / "bench")
    before = contents(out)
    with pytest.raises(OutputDirError, match=rf"holds an earlier benchmark \({RESULTS_JSON}\); pass --overwrite"):
        with benchmark_folder(out):
            pytest.fail("the block must not run")
    with pytest.raises(RuntimeError):
        with benchmark_folder(out, overwrite=True) as staging:
            (staging / "runs").mkdir()
            raise RuntimeError("refused after the first run")
    assert contents(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["bench"]

    with benchmark_folder(out, overwrite=True) as staging:
        (staging / RESULTS_JSON).write_text('{"earlier": false}')
    assert contents(out) == {RESULTS_JSON: b'{"earlier": false}'}


def test_benchmark_folder_refuses_to_replace_a_folder_holding_an_input(tmp_path):
    out = earlier_benchmark(tmp_path / "bench")
    inputs = out / "inputs.txt"
    inputs.write_text("a good film\n")
    before = contents(out)
    with pytest.raises(OutputDirError, match=rf"--predict {inputs} lies inside it"):
        with benchmark_folder(out, overwrite=True, inputs={"RUN_DIR": tmp_path / "run", "--predict": inputs}):
            pytest.fail("the block must not run")
    assert contents(out) == before


def test_benchmark_folder_refuses_a_folder_inside_the_data_folder(tmp_path):
    # The Trainer reference wrote its run into the data folder before bertpipe's own run refused it.
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "a", "label": 0}\n')
    config = load_config(None, [], lambda name: TaskOptions, base={"task": "classification", "output_dir": str(tmp_path / "run"),
                                                                  "data": {"path": str(data)}})
    with pytest.raises(OutputDirError, match=r"--output-dir .*bench lies inside data.path"):
        with benchmark_folder(data / "bench", config=config):
            pytest.fail("the block must not run")
    assert [path.name for path in data.iterdir()] == ["train.jsonl"]


def test_benchmark_folder_refuses_the_current_directory_even_empty(tmp_path, monkeypatch):
    # Swapped in by renaming: the shell's current folder was renamed aside and deleted under it.
    out = tmp_path / "here"
    out.mkdir()
    monkeypatch.chdir(out)
    for folder in (".", out):
        with pytest.raises(OutputDirError, match="holds the current directory"):
            with benchmark_folder(folder):
                pytest.fail("the block must not run")
    assert out.is_dir() and sorted(tmp_path.iterdir()) == [out]

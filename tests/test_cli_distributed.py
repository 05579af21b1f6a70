"""Real multi-process (gloo) runs on CPU through ``accelerate launch --multi_gpu``: two processes on one
machine, and two Accelerate "machines" of one process each (``--num_machines 2 --machine_rank 0|1``)
meeting at 127.0.0.1, which must train exactly what the one-machine run trains; and for NER, QA, translation and
MLM, a two-process run whose final evaluation is what one process evaluates on the saved model."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO_ROOT, classification_config, cli_env

# scripts/train.py, plus a record of the process group each process ran in (written after training, from
# Accelerate's PartialState and the variables torchrun sets per node); with ``probe``, LATE_COLLECTIVE_PROBE too.
def recording_train_script(probe: bool = False) -> str:
    return f"""
import json, os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
{LATE_COLLECTIVE_PROBE if probe else ""}
from tasks.cli import main
code = main(["train", *sys.argv[1:]])
{LATE_COLLECTIVE_RECORD if probe else ""}
from accelerate.state import PartialState
state = PartialState()
record = {{"process_index": state.process_index, "local_process_index": state.local_process_index,
          "num_processes": state.num_processes, "backend": state.backend, "node_rank": int(os.environ["GROUP_RANK"]),
          "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"])}}
with open(os.path.join(os.environ["RANKS_DIR"], f"rank-{{state.process_index}}.json"), "w") as handle:
    json.dump(record, handle)
sys.exit(code)
"""


# scripts/train.py, recording the process group each process was started in before anything can fail, with a
# mistyped key on every rank (FAILING_RANK=all) or on one rank alone.
FAILING_TRAIN_SCRIPT = f"""
import json, os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from tasks.cli import main
with open(os.path.join(os.environ["RANKS_DIR"], f"rank-{{os.environ['RANK']}}.json"), "w") as handle:
    json.dump({{"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}}, handle)
bad_input = {{"typo": ["trian.max_steps=3"], "missing data": ["data.files.train=/nonexistent/train.jsonl"],
             "other data": [f"data.files.train={{os.environ['OTHER_TRAIN']}}"]}}[os.environ["BAD_INPUT"]]
sys.exit(main(["train", *sys.argv[1:], *(bad_input if os.environ["FAILING_RANK"] in ("all", os.environ["RANK"]) else [])]))
"""

# With STOP_AT_STEP set, a SIGTERM delivered to rank 1 alone as that optimizer step ends (a node-local signal: the
# other process must still stop at the same step, or the two would wait for each other forever). For the scripts below.
SIGNAL_TO_RANK_1 = """
if os.environ.get("STOP_AT_STEP"):
    from pipelines.preemption import StopSignals
    agreed, calls = StopSignals.agreed, []
    def agreed_after_a_signal_to_rank_1(self):
        calls.append(None)
        if os.environ["RANK"] == "1" and len(calls) == int(os.environ["STOP_AT_STEP"]):
            os.kill(os.getpid(), signal.SIGTERM)
        return agreed(self)
    StopSignals.agreed = agreed_after_a_signal_to_rank_1
"""

# scripts/train.py, with rank 1 alone measuring that padding changes the model's outputs (as a change right at
# the tolerance could, rounding differently per process), and each rank's eval batch size recorded. The signal
# test's resume runs it (evaluated one example per batch, the resumed run must still end as the uninterrupted one).
PROBE_DISAGREEING_TRAIN_SCRIPT = f"""
import json, os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import pipelines.batching as batching
batching.padding_change = lambda *args, **kwargs: 1.0 if os.environ["RANK"] == "1" else 0.0
chosen = batching.exact_eval_batch_size
def recording_exact_eval_batch_size(*args, **kwargs):
    size = chosen(*args, **kwargs)
    with open(os.path.join(os.environ["RANKS_DIR"], f"rank-{{os.environ['RANK']}}.json"), "w") as handle:
        json.dump({{"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]), "eval_batch_size": size}}, handle)
    return size
batching.exact_eval_batch_size = recording_exact_eval_batch_size
from tasks.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
"""

# Leaves the run's last collective in flight as rank 0 ends the run (rank 1 joins it 4 s late), with a thread on
# rank 0 ticking every 5 ms: a tick that waits for seconds means the GIL was held meanwhile. LATE_COLLECTIVE_RECORD
# then writes gil-RANK.json: the world size, the longest wait between ticks, and the gloo worker threads left after
# the run. The probe runs after everything is written, so it rides on runs that check other things.
LATE_COLLECTIVE_PROBE = """
import threading, time
import torch, torch.distributed as dist
from accelerate import Accelerator
end_training, ticks, world = Accelerator.end_training, [], []
def tick():
    while True:
        ticks.append(time.perf_counter())
        time.sleep(0.005)
def end_training_with_a_collective_in_flight(self):
    world.append(dist.get_world_size())
    gathered = [torch.empty(4) for _ in range(2)]
    if dist.get_rank() == 1:
        time.sleep(4)
        dist.all_gather(gathered, torch.ones(4))
    else:
        dist.all_gather(gathered, torch.ones(4), async_op=True)
        threading.Thread(target=tick, daemon=True).start()
    end_training(self)
Accelerator.end_training = end_training_with_a_collective_in_flight
"""
LATE_COLLECTIVE_RECORD = """
ended = time.perf_counter()
def gloo_threads():
    names = []
    for thread in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{thread}/comm") as handle:
            names.append(handle.read().strip())
    return names.count("pt_gloo_runloop")
waits = [later - earlier for earlier, later in zip(ticks, ticks[1:] + [ended])]
with open(os.path.join(os.environ["RANKS_DIR"], f"gil-{os.environ['RANK']}.json"), "w") as handle:
    json.dump({"world_size": world[0] if world else None, "longest_wait": max(waits, default=None), "gloo_threads": gloo_threads()}, handle)
"""


def signalled_train_script(probe: bool = False) -> str:
    """scripts/train.py, with SIGNAL_TO_RANK_1; with ``probe``, LATE_COLLECTIVE_PROBE too."""
    return f"""
import json, os, signal, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
{SIGNAL_TO_RANK_1}
{LATE_COLLECTIVE_PROBE if probe else ""}
from tasks.cli import main
code = main(["train", *sys.argv[1:]])
{LATE_COLLECTIVE_RECORD if probe else ""}
sys.exit(code)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(script: Path, config: Path, ranks: Path, *machine_args: str, overrides: tuple[str, ...] = (), **env: str) -> subprocess.Popen:
    ranks.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no",
         *machine_args, str(script), str(config), *overrides],
        cwd=REPO_ROOT, env=launch_env(RANKS_DIR=str(ranks), **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def launch_env(**extra: str) -> dict[str, str]:
    # PYTHONFAULTHANDLER: a process that hangs can be made to print every thread's stack (see `ended`).
    return cli_env(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", **extra)


def ended(process: subprocess.Popen, timeout: int = 600) -> str:
    """The launched run's stderr once it has ended. A run still going after ``timeout`` (processes waiting
    for each other's collectives) fails the test with every process's Python stack, then is killed."""
    import psutil

    try:
        return process.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        workers = psutil.Process(process.pid).children(recursive=True)
        native = native_stacks(workers)
        for worker in workers:
            worker.send_signal(signal.SIGABRT)  # faulthandler prints the stacks, then the process ends
        psutil.wait_procs(workers, timeout=10)
        process.kill()
        stderr = process.communicate()[1]
        pytest.fail(f"the launched run did not end within {timeout} s; its processes' stacks:\n{stderr[-12000:]}{native}")


def native_stacks(workers) -> str:
    """Each process's C stack as well (py-spy, a dev dependency): a process stuck in C code (a collective, an
    object's destructor) shows no Python frame below the call that entered it."""
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if spy is None:
        return ""
    dumps = []
    for worker in workers:
        try:
            dump = subprocess.run([spy, "dump", "--native", "--pid", str(worker.pid)], capture_output=True, text=True, timeout=60)
            dumps.append(dump.stdout[-6000:] + dump.stderr[-1000:])
        except subprocess.TimeoutExpired:
            dumps.append(f"py-spy dump of {worker.pid} did not end within 60 s")
    return "\n\nnative stacks (py-spy dump --native):\n" + "\n".join(dumps)



def test_cli_distributed_a_launched_run_that_hangs_fails_with_each_processs_python_and_c_stack():
    """What a hung two-process test reports: the launcher's children are stopped after ``timeout`` with their
    stacks in the failure, not a bare timeout (a process stuck in C shows only the Python call that entered it)."""
    sleeper = "import time\ndef wait_for_a_peer_that_never_comes():\n    time.sleep(600)\nwait_for_a_peer_that_never_comes()\n"
    launcher = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper!r}])"],
                                env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(pytest.fail.Exception) as failed:
        ended(launcher, timeout=3)
    report = str(failed.value)
    assert "did not end within 3 s" in report and "in wait_for_a_peer_that_never_comes" in report, report
    if shutil.which("py-spy", path=str(Path(sys.executable).parent)):
        assert "native stacks" in report and "time_sleep" in report, report

def finish(process: subprocess.Popen) -> None:
    stderr = ended(process)
    assert process.returncode == 0, stderr[-4000:]


def ranks_of(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("rank-*.json"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert, sentiment_files) -> dict[str, Path]:
    """The same config (fp32 pinned: weights are compared) on one machine x 2 processes and 2 machines x 1."""
    tmp_path = tmp_path_factory.mktemp("ddp")
    script, probed_script = tmp_path / "train_and_record.py", tmp_path / "train_record_and_probe.py"
    script.write_text(recording_train_script())
    probed_script.write_text(recording_train_script(probe=True))
    train = dict(num_epochs=2, eval_steps=6, mixed_precision="no", torch_num_threads=1)
    one = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="one_machine", **train)
    process = launch(probed_script, one, tmp_path / "one_machine_ranks", "--num_processes", "2", "--num_machines", "1",
                     "--main_process_port", str(free_port()))
    stderr = ended(process, timeout=180)  # the deadlock the probe looks for never ends
    assert process.returncode == 0, stderr[-4000:]
    two = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="two_machines", **train)
    port = str(free_port())
    machines = [
        launch(script, two, tmp_path / "two_machines_ranks", "--num_processes", "2", "--num_machines", "2", "--machine_rank", str(rank),
               "--main_process_ip", "127.0.0.1", "--main_process_port", port)
        for rank in (0, 1)
    ]
    for machine in machines:
        finish(machine)
    return {"one": tmp_path / "one_machine", "two": tmp_path / "two_machines",
            "one_ranks": tmp_path / "one_machine_ranks", "two_ranks": tmp_path / "two_machines_ranks"}


def test_cli_two_process_run_counts_every_eval_example_once(runs):
    metrics = json.loads((runs["one"] / "metrics.json").read_text())
    assert metrics["num_processes"] == 2
    assert metrics["eval_samples"] == 37  # odd: a duplicated last batch would make it 38
    # 96 examples, batch 8 per process: 6 batches per process per epoch, 2 epochs.
    assert metrics["global_step"] == 12
    assert metrics["train_samples"] == 192
    assert [(r["process_index"], r["node_rank"], r["local_world_size"]) for r in ranks_of(runs["one_ranks"])] == [(0, 0, 2), (1, 0, 2)]


def test_cli_two_processes_evaluate_and_predict_what_one_process_does(runs, sentiment_files, tmp_path):
    """`accelerate launch ... -m tasks.cli evaluate|predict`: every example forwarded on one of two processes and
    gathered once, the file written once (by the main process), and the same scores and predictions as one process."""
    from tests.conftest import run_cli

    run, validation = runs["one"], sentiment_files["validation"]

    def launched(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no",
             "--num_processes", "2", "--num_machines", "1", "--main_process_port", str(free_port()), "-m", "tasks.cli", *command],
            cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=600,
        )

    evaluated = launched("evaluate", str(run), "train.eval_batch_size=3")
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    two = json.loads((run / "eval_validation.json").read_text())
    predicted = launched("predict", str(run), "--input", str(validation), "--output", str(tmp_path / "two.jsonl"))
    assert predicted.returncode == 0, predicted.stderr[-4000:]
    assert predicted.stdout.count("wrote 37 predictions") == 1, predicted.stdout  # the main process's report alone
    run_cli("evaluate", str(run))
    one = json.loads((run / "eval_validation.json").read_text())
    run_cli("predict", str(run), "--input", str(validation), "--output", str(tmp_path / "one.jsonl"))

    assert (two["num_processes"], one["num_processes"]) == (2, 1)
    assert two["eval_samples"] == one["eval_samples"] == 37
    for key in ("eval_accuracy", "eval_f1", "eval_matthews_correlation"):
        assert two[key] == pytest.approx(one[key], rel=1e-6), key
    rows = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert [row["text"] for row in rows] == [row["text"] for row in expected] and len(rows) == 37
    assert [row["label"] for row in rows] == [row["label"] for row in expected]
    assert [row["score"] for row in rows] == pytest.approx([row["score"] for row in expected], abs=1e-5)


def test_cli_two_machines_train_what_one_machine_with_two_processes_trains(runs):
    from safetensors.torch import load_file

    ranks = ranks_of(runs["two_ranks"])
    assert [(r["process_index"], r["local_process_index"], r["node_rank"], r["local_world_size"]) for r in ranks] == [
        (0, 0, 0, 1), (1, 0, 1, 1)
    ]
    assert all(r["num_processes"] == 2 and r["backend"] == "gloo" for r in ranks)
    one, two = (json.loads((runs[name] / "metrics.json").read_text()) for name in ("one", "two"))
    assert two["num_processes"] == 2 and two["global_step"] == one["global_step"] == 12
    for key in ("eval_accuracy", "eval_f1_macro", "eval_samples", "train_samples", "train_loss"):
        assert two[key] == pytest.approx(one[key], rel=1e-6), key
    weights_one, weights_two = (load_file(runs[name] / "model.safetensors") for name in ("one", "two"))
    assert weights_one.keys() == weights_two.keys()
    for name, tensor in weights_one.items():
        assert (weights_two[name] - tensor).abs().max().item() <= 1e-6, name


def test_cli_two_process_run_stopped_by_a_signal_to_one_process_resumes_to_the_uninterrupted_weights(
    runs, tmp_path, tiny_bert, sentiment_files
):
    """A SIGTERM to one process stops both at the same step with one complete checkpoint; one process refuses to
    resume it, changing nothing, and two processes resume it to the uninterrupted run's weights.

    The resume also checks that both processes evaluate one example per batch when either alone sees padding
    change the model's outputs (as a change right at the tolerance could, rounding differently per process):
    processes that chose different eval batch sizes would wait for each other's collectives forever."""
    from safetensors.torch import load_file

    from tests.conftest import run_cli

    script = tmp_path / "train_signalled.py"
    script.write_text(signalled_train_script(probe=True))
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="stopped", num_epochs=2, eval_steps=6,
                                   mixed_precision="no", torch_num_threads=1)
    process = launch(script, config, tmp_path / "ranks", "--num_processes", "2", "--num_machines", "1",
                     "--main_process_port", str(free_port()), STOP_AT_STEP="4")
    stderr = ended(process, timeout=180)  # the deadlock the probe looks for never ends
    assert process.returncode != 0
    checkpoint = tmp_path / "stopped" / "checkpoints" / "step-00000004"
    assert stderr.count(f"bertpipe train: stopped by SIGTERM at step 4 of 12; checkpoint {checkpoint} is complete") == 1, stderr[-4000:]
    assert [path.name for path in checkpoint.parent.iterdir()] == [checkpoint.name]
    assert not (tmp_path / "stopped" / "metrics.json").exists()
    # Stopped, rank 1 records after its delay, and the launcher ends it first once rank 0 has exited non-zero.
    assert_group_ended_without_holding_the_gil(probes_of(tmp_path / "ranks")[:1])

    # One process may not resume it: the step counters count per-process batches, so one process skipped half the
    # data already trained on, re-planned the run and ended at step 18 of a 12-step run, with exit status 0.
    before = {path: path.read_bytes() for path in sorted((tmp_path / "stopped").rglob("*")) if path.is_file()}
    refused = run_cli("train", str(config), "train.resume_from_checkpoint=latest", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"checkpoint {checkpoint} was written by a run of 2 processes, and this run has 1" in refused.stderr
    assert "--num_processes 2" in refused.stderr
    assert {path: path.read_bytes() for path in sorted((tmp_path / "stopped").rglob("*")) if path.is_file()} == before

    probed_script = tmp_path / "train_probe_disagreeing.py"
    probed_script.write_text(PROBE_DISAGREEING_TRAIN_SCRIPT)
    resuming = launch(probed_script, config, tmp_path / "resumed_ranks", "--num_processes", "2", "--num_machines", "1",
                      "--main_process_port", str(free_port()), overrides=("train.resume_from_checkpoint=latest",))
    stderr = ended(resuming, timeout=300)  # processes that disagree on the eval batch size wait for each other for ever
    assert resuming.returncode == 0, stderr[-4000:]
    assert [(r["rank"], r["world_size"], r["eval_batch_size"]) for r in ranks_of(tmp_path / "resumed_ranks")] == [(0, 2, 1), (1, 2, 1)]
    resumed, uninterrupted = (json.loads((run / "metrics.json").read_text()) for run in (tmp_path / "stopped", runs["one"]))
    assert resumed["num_processes"] == 2 and resumed["global_step"] == uninterrupted["global_step"] == 12
    assert resumed["eval_samples"] == uninterrupted["eval_samples"] == 37
    for key in ("eval_accuracy", "train_samples", "train_loss"):
        assert resumed[key] == pytest.approx(uninterrupted[key], rel=1e-6), key
    weights, expected = (load_file(run / "model.safetensors") for run in (tmp_path / "stopped", runs["one"]))
    for name, tensor in expected.items():
        assert (weights[name] - tensor).abs().max().item() <= 1e-6, name


@pytest.mark.parametrize("bad_input, failing_rank", [
    ("typo", "all"), ("typo", "1"), ("missing data", "0"), ("missing data", "1"), ("other data", "1"),
])
def test_cli_two_process_bad_input_is_reported_once(tmp_path, tiny_bert, sentiment_files, bad_input, failing_rank):
    """Every process of a launched run meets the same bad input: one message, not one per process. A process
    whose error is its own alone (rank 1 here, while rank 0 waits for it to join) still reports it. Data missing
    on one machine alone is met after the group formed: the other process, waiting in a collective for the one
    that stopped, printed a gloo traceback ("Connection closed by peer") beside the message. A machine holding
    another copy of the data (a row with a third label) ended in DDP's raw shape-check traceback."""
    script = tmp_path / "train_with_bad_input.py"
    script.write_text(FAILING_TRAIN_SCRIPT)
    other_train = tmp_path / "other_train.jsonl"
    other_train.write_text(sentiment_files["train"].read_text() + json.dumps({"sentence": "it was fine", "label": "neutral"}) + "\n")
    config = classification_config(tmp_path, tiny_bert, sentiment_files, mixed_precision="no", torch_num_threads=1)
    process = launch(script, config, tmp_path / "ranks", "--num_processes", "2", "--num_machines", "1",
                     "--main_process_port", str(free_port()), FAILING_RANK=failing_rank, BAD_INPUT=bad_input,
                     OTHER_TRAIN=str(other_train))
    stderr = ended(process, timeout=300)
    assert sorted((r["rank"], r["world_size"]) for r in ranks_of(tmp_path / "ranks")) == [(0, 2), (1, 2)]
    assert stderr.count("bertpipe train: error:") == 1, stderr[-4000:]
    # The launcher's own report (ChildFailedError) has a traceback of its own; a process's would be prefixed by its rank.
    assert not re.search(r"\[rank\d\]: Traceback", stderr) and "RuntimeError" not in stderr, stderr[-4000:]
    expected = {"typo": "unknown key 'trian' in the command line",
                "missing data": "data.files.train: file /nonexistent/train.jsonl does not exist",
                "other data": f"the 2 processes of this run did not read the same training data (data.files.train: {sentiment_files['train']})"}[bad_input]
    assert expected in stderr, stderr[-4000:]
    # accelerate's launcher ends with its own report and status; it names the process's exit status 2.
    assert process.returncode != 0 and "exitcode  : 2" in stderr, stderr[-4000:]


# scripts/train.py with rank 1's own file of each checkpoint (its random states) refused by a full disk.
CHECKPOINT_FULL_ON_RANK_1_SCRIPT = f"""
import errno, os, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
import torch
if os.environ["RANK"] == "1":
    save = torch.save
    def full_disk_for_rank_1(obj, f, *args, **kwargs):
        if "random_states" in str(f):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return save(obj, f, *args, **kwargs)
    torch.save = full_disk_for_rank_1
from tasks.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
"""


def test_cli_two_process_checkpoint_failing_in_one_process_is_reported_once_by_that_process(tmp_path, tiny_bert, sentiment_files):
    """Process 0, waiting for process 1 at the checkpoint, wrapped the collective's failure as its own checkpoint's
    ("could not be written (RuntimeError: ... Connection closed by peer ...)"): two errors, the second false."""
    script = tmp_path / "train_with_a_full_disk_on_rank_1.py"
    script.write_text(CHECKPOINT_FULL_ON_RANK_1_SCRIPT)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, mixed_precision="no", torch_num_threads=1,
                                   max_steps=6, save_steps=3)
    process = launch(script, config, tmp_path / "ranks", "--num_processes", "2", "--num_machines", "1",
                     "--main_process_port", str(free_port()))
    stderr = ended(process, timeout=300)
    assert process.returncode != 0
    assert stderr.count("bertpipe train: error:") == 1, stderr[-4000:]
    assert "random_states_1.pkl" in stderr and "No space left on device" in stderr, stderr[-4000:]
    assert "Connection closed by peer" not in stderr and not re.search(r"\[rank\d\]: Traceback", stderr), stderr[-4000:]
    assert not list((tmp_path / "run" / "checkpoints").glob("*.partial")), "half a checkpoint was left behind"


def probes_of(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("gil-*.json"))]


def assert_group_ended_without_holding_the_gil(probes: list[dict]) -> None:
    """A two-process run hung after writing everything, about once in thirty: DDP's Reducer held the process
    group's last reference, and freeing it joined gloo's workers with the GIL held while a worker, freeing
    the last collective's tensors, waited for the GIL. The run now ends its group itself, GIL released:
    with a collective still in flight at the end (LATE_COLLECTIVE_PROBE), rank 0 keeps running Python while
    it waits for it. A run that stops on a signal ends the same way (its group was left to the interpreter's
    exit before). Checked on the fixture's finished run and on the run stopped by a signal."""
    assert probes and [probe["world_size"] for probe in probes] == [2] * len(probes), probes
    assert [probe["gloo_threads"] for probe in probes] == [0] * len(probes)  # the group ended inside the run, not at exit
    # Held for the 4 s the in-flight collective took, the GIL would stop the ticks that long (or for ever).
    assert probes[0]["longest_wait"] < 2.0, probes[0]


def test_cli_two_process_run_ends_its_process_group_without_holding_the_gil(runs):
    assert_group_ended_without_holding_the_gil(probes_of(runs["one_ranks"]))


def task_config(task: str, folder: Path) -> tuple[Path, Path | None]:
    """A tiny run of ``task`` whose eval split stresses gathering (odd counts, eval batches of 3), and the
    file its final predictions go to (None: the task writes none)."""
    from tests.conftest import build_tiny_bert, write_config, write_jsonl

    if task == "ner":
        from tests.test_cli_ner import ner_sentences, toy_ner_model, write_conll

        model = toy_ner_model(folder)
        train = write_conll(folder / "train.txt", ner_sentences(160, seed=1))
        # Every third sentence is longer than max_seq_length: its windows may land on both processes.
        validation = write_jsonl(folder / "validation.jsonl",
                                 [{"tokens": w, "ner_tags": t} for w, t in ner_sentences(23, seed=2, long_every=3)])
        config = write_config(folder / "ner.yaml", f"""task: ner
output_dir: {folder / 'run'}
seed: 3
model: {{name_or_path: {model}}}
data: {{files: {{train: {train}, validation: {validation}}}, max_seq_length: 24}}
train: {{num_epochs: 5, batch_size: 8, eval_batch_size: 3, learning_rate: 3.0e-3, logging_steps: 4}}
ner: {{stride: 8}}
""")
        return config, folder / "run" / "eval_predictions.conll"
    if task == "qa":
        from tests.test_cli_qa import NAMES, qa_config, synthetic_squad

        model = build_tiny_bert(folder / "tiny", vocab_words=NAMES * 5)
        data = {"train": folder / "train.json", "validation": folder / "dev.json"}
        data["train"].write_text(json.dumps(synthetic_squad(60, seed=1, unanswerable=0.3)))
        # 13 questions, most of several windows, some unanswerable (v2: the null scores are gathered too).
        data["validation"].write_text(json.dumps(synthetic_squad(13, seed=2, unanswerable=0.3)))
        return qa_config(folder, model, data, v2=True, num_epochs=8, batch_size=8, eval_batch_size=3), folder / "run" / "predictions.json"
    if task == "translation":
        from tests.tasks.translation_data import copy_rows
        from tests.test_cli_translation import translation_config

        files = {"train": write_jsonl(folder / "train.jsonl", copy_rows(120, seed=1)),
                 "validation": write_jsonl(folder / "validation.jsonl", copy_rows(11, seed=2))}
        return translation_config(folder, build_tiny_bert(folder / "tiny"), files), folder / "run" / "generations.jsonl"
    from tests.test_cli_mlm import corpus_file, pretrain_config

    return pretrain_config(folder, corpus_file(folder)), None


TASK_RUN_OVERRIDES = {
    "ner": [], "qa": [],
    "translation": ["train.num_epochs=8", "train.eval_batch_size=3"],
    "mlm": ["train.num_epochs=1", "train.eval_batch_size=3", "train.eval_steps=null"],
}


@pytest.mark.parametrize("task", ["ner", "qa", "translation", "mlm"])
def test_cli_two_process_final_evaluation_is_what_one_process_evaluates(tmp_path, task):
    """The final evaluation of a two-process run (every eval feature forwarded on one of the processes, padded
    across them, gathered without the repeated samples) scores exactly what ``bertpipe evaluate`` scores in one
    process on the saved model, and its predictions file holds every eval example once."""
    from tests.conftest import run_cli

    config, predictions_file = task_config(task, tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no",
         "--num_processes", "2", "--num_machines", "1", "--main_process_port", str(free_port()), str(REPO_ROOT / "scripts" / "train.py"),
         str(config), "train.mixed_precision=no", "train.torch_num_threads=1", *TASK_RUN_OVERRIDES[task]],
        cwd=REPO_ROOT, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    finish(process)
    run = tmp_path / "run"
    trained = json.loads((run / "metrics.json").read_text())
    run_cli("evaluate", str(run))
    evaluated = json.loads((run / "eval_validation.json").read_text())
    assert trained["num_processes"] == 2 and evaluated["num_processes"] == 1
    compared = sorted(key for key in trained if key.startswith("eval_") and key != "eval_runtime")
    assert len(compared) >= 3, compared
    for key in compared:
        assert evaluated[key] == pytest.approx(trained[key], rel=1e-6), key

    samples = trained["eval_samples"]
    if task == "ner":
        assert trained["eval_f1"] > 0  # entities are predicted, so entity precision and recall are compared
        blocks = [block for block in predictions_file.read_text().split("\n\n") if block.strip()]
        validation = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
        assert [[line.split()[0] for line in block.splitlines()] for block in blocks] == [row["tokens"] for row in validation]
    elif task == "qa":
        predictions = json.loads(predictions_file.read_text())
        assert sorted(predictions) == sorted(f"s2-{index}" for index in range(samples)) and samples == 13
        assert set(json.loads((run / "null_odds.json").read_text())) == set(predictions)
    elif task == "translation":
        rows = [json.loads(line) for line in predictions_file.read_text().splitlines()]
        validation = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
        assert [row["source"] for row in rows] == [row["de"] for row in validation] and samples == 11


def test_cli_two_processes_train_what_one_process_trains_on_their_joint_batches(tmp_path):
    """NER (the loss is a mean over labelled tokens) on 2 processes x 8 sentences per batch trains the weights
    one process trains on batches of those 16: each process's mean loss is weighted by its labelled tokens
    over the whole update's. Averaging the two processes' means instead weighs the tokens of the batch with
    fewer labelled tokens more. (240 = 15 x 16: with a shorter last batch, Accelerate fills the second
    process's batch with examples from the epoch's start, which one process never trains on.)"""
    from safetensors.torch import load_file

    from tests.conftest import run_cli
    from tests.test_cli_ner import toy_ner_config, toy_ner_model

    config = toy_ner_config(tmp_path, toy_ner_model(tmp_path))
    # max_seq_length 64: no sentence is windowed, so the 240 sentences are the 240 features.
    exact = ["model.dropout=0", "train.group_by_length=false", "train.num_epochs=1", "train.mixed_precision=no",
             "train.torch_num_threads=1", "data.max_seq_length=64", "train.eval_steps=null"]
    run_cli("train", str(config), f"output_dir={tmp_path / 'one'}", "train.batch_size=16", *exact)
    process = subprocess.Popen(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no",
         "--num_processes", "2", "--num_machines", "1", "--main_process_port", str(free_port()), str(REPO_ROOT / "scripts" / "train.py"),
         str(config), f"output_dir={tmp_path / 'two'}", "train.batch_size=8", *exact],
        cwd=REPO_ROOT, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    finish(process)
    one, two = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("one", "two"))
    assert (one["num_processes"], two["num_processes"]) == (1, 2)
    assert one["global_step"] == two["global_step"] == 15 and one["train_samples"] == two["train_samples"] == 240
    weights_one, weights_two = (load_file(tmp_path / name / "model.safetensors") for name in ("one", "two"))
    for key, tensor in weights_one.items():
        torch.testing.assert_close(weights_two[key], tensor, atol=1e-4, rtol=0, msg=key)


# scripts/train.py, rank 1 sending SIGTERM to the launcher (its parent) as STOP_AT_STEP ends: the launcher passes it on
# to every process and waits out its grace period.
SIGNAL_TO_LAUNCHER_SCRIPT = signalled_train_script().replace("os.kill(os.getpid(), signal.SIGTERM)", "os.kill(os.getppid(), signal.SIGTERM)")


def test_cli_two_process_run_stopped_through_the_launcher_says_so_once(tmp_path, tiny_bert, sentiment_files):
    # Each process printed the stop line: rank 1's came 5 s after rank 0's, since the launcher, stopping on a signal of
    # its own, did not end it first as it does after an error.
    assert "os.getppid()" in SIGNAL_TO_LAUNCHER_SCRIPT
    script = tmp_path / "train_launcher_signalled.py"
    script.write_text(SIGNAL_TO_LAUNCHER_SCRIPT)
    config = classification_config(tmp_path, tiny_bert, sentiment_files, run_name="stopped", num_epochs=2, eval_steps=None,
                                   mixed_precision="no", torch_num_threads=1)
    process = launch(script, config, tmp_path / "ranks", "--num_processes", "2", "--num_machines", "1",
                     "--main_process_port", str(free_port()), STOP_AT_STEP="3")
    stderr = ended(process)
    assert process.returncode != 0
    assert stderr.count("bertpipe train: stopped by SIGTERM at step") == 1, stderr[-4000:]
    # The launcher's signal reaches the processes a step or so after it was sent: the checkpoint named is the one written.
    step = int(re.search(r"stopped by SIGTERM at step (\d+) of", stderr).group(1))
    assert [path.name for path in (tmp_path / "stopped" / "checkpoints").iterdir()] == [f"step-{step:08d}"]

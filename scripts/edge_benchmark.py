"""Teacher vs distilled student, torch vs ONNX fp32 vs ONNX int8: accuracy, size, latency, throughput, memory.

In:  a finished teacher run and a distilled student run of a classification or NER task (e.g. SST-2:
     ``bertpipe train configs/classification/sst2.yaml output_dir=runs/edge/teacher`` and
     ``bertpipe distill runs/edge/teacher configs/classification/sst2.yaml output_dir=runs/edge/student distill.num_layers=3``;
     CoNLL-2003 the same with ``configs/ner/conll2003.yaml``).
Out: ``OUT/edge_benchmark.json`` and ``.md`` with one row per model form:

     teacher torch fp32 · teacher ONNX fp32 · teacher ONNX int8 · student torch fp32 · student ONNX int8

     and columns: accuracy (NER: entity F1) on the full eval split (``bertpipe evaluate`` on the run
     or export directory, the same task code for both), size on disk of the weights file, batch-1
     latency p50/p95 over ``--sentences`` single eval sentences (tokenise, forward, labels read off
     the logits; after a warm-up), batch-32 throughput over the eval split, and the peak RSS of the
     timing process; timings are medians over ``--rounds`` rounds (see :func:`phase_time`).

Each measurement runs in a fresh process, so that peak RSS is the model's own. The timing process
loads only what a deployment would: the fast tokenizer (``tokenizers``) and torch + transformers for
the torch rows, or onnxruntime alone for the ONNX rows (no torch import). Threads: torch's and
onnxruntime's defaults (one per physical core).

Phases (each can run alone; keep each under the CPU lock):
    python scripts/edge_benchmark.py export   --teacher T --student S --out OUT   # the three exports
    python scripts/edge_benchmark.py evaluate --teacher T --student S --out OUT   # accuracy of the five rows
    python scripts/edge_benchmark.py time     --teacher T --student S --out OUT   # latency, throughput, RSS (--rounds 1 --add: one more round)
    python scripts/edge_benchmark.py report   --teacher T --student S --out OUT   # the table
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCH = 32
# task -> (the eval metric in eval_validation.json, its column name)
METRIC = {"classification": ("eval_accuracy", "accuracy"), "ner": ("eval_f1", "entity F1")}


def rows(teacher: Path, student: Path, out: Path) -> list[dict]:
    exports = out / "exports"
    return [
        {"name": "teacher torch fp32", "kind": "torch", "dir": teacher},
        {"name": "teacher ONNX fp32", "kind": "onnx", "dir": exports / "teacher-fp32"},
        {"name": "teacher ONNX int8", "kind": "onnx", "dir": exports / "teacher-int8"},
        {"name": "student torch fp32", "kind": "torch", "dir": student},
        {"name": "student ONNX int8", "kind": "onnx", "dir": exports / "student-int8"},
    ]


def bertpipe(*args: str) -> None:
    command = [sys.executable, "-m", "tasks.cli", *map(str, args)]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=REPO_ROOT, check=True)


def phase_export(teacher: Path, student: Path, out: Path) -> None:
    exports = out / "exports"
    # Parity on the whole eval split: the fp32 target is identical labels on every example.
    bertpipe("export", teacher, "--out", exports / "teacher-fp32", "--parity-samples", "100000", "--overwrite")
    bertpipe("export", teacher, "--out", exports / "teacher-int8", "--quantize", "int8", "--parity-samples", "100000", "--overwrite")
    bertpipe("export", student, "--out", exports / "student-int8", "--quantize", "int8", "--parity-samples", "100000", "--overwrite")


def phase_evaluate(teacher: Path, student: Path, out: Path) -> None:
    for row in rows(teacher, student, out):
        # fp32 for the torch rows too: a run trained with mixed_precision auto would evaluate in bf16 here.
        bertpipe("evaluate", row["dir"], "train.mixed_precision='no'")


def run_task(run_dir: Path) -> str:
    import yaml

    task = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))["task"]
    if task not in METRIC:
        raise SystemExit(f"edge_benchmark: {run_dir} is a {task!r} run; the benchmark covers {sorted(METRIC)}")
    return task


def eval_sentences(run_dir: Path) -> list:
    """The eval split's inputs (texts; NER: word lists), read through the task's own loader, so the
    same rows ``bertpipe evaluate`` scores."""
    from pipelines.config_loading import load_config
    from pipelines.outputs import load_saved_config
    from tasks import get_task

    config = load_config(None, [], lambda name: get_task(name).Options, base=load_saved_config(run_dir))
    task = get_task(config.task)(config)
    if config.task == "ner":  # the tag set comes from the run, as when evaluating it
        id2label = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["id2label"]
        task.label_names = [id2label[str(index)] for index in range(len(id2label))]
        return list(task.load(include_train=False)[config.data.eval_split]["tokens"])
    examples = task.load(include_train=False)[config.data.eval_split]
    return list(examples[config.data.text_column or "text"])


def make_predictor(kind: str, task: str, folder: Path, max_length: int):
    """``(predict, weights_size_bytes)``: ``predict(inputs)`` is one call of the deployed model as a user
    waits for it: tokenise, forward, and read the labels off the logits (classification: the argmax's
    name; NER: the tag of each word's first piece). Every row uses this; only ``forward`` differs."""
    import numpy as np
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=max_length)
    pad_id = tokenizer.token_to_id("[PAD]") or 0
    tokenizer.enable_padding(pad_id=pad_id, pad_token="[PAD]")
    id2label = json.loads((folder / "config.json").read_text(encoding="utf-8"))["id2label"]
    names = [id2label[str(index)] for index in range(len(id2label))]

    def encode(inputs: list):
        encoded = tokenizer.encode_batch(inputs, is_pretokenized=task == "ner")
        arrays = {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
        }
        return arrays, encoded

    def labels(logits: np.ndarray, encoded) -> list:
        best = logits.argmax(-1)
        if task == "classification":
            return [names[index] for index in best]
        sentences_tags = []
        for row, encoding in zip(best, encoded):
            tags, previous = [], None
            for position, word in enumerate(encoding.word_ids):
                if word is not None and word != previous:
                    tags.append(names[row[position]])
                previous = word
            sentences_tags.append(tags)
        return sentences_tags

    if kind == "onnx":
        import onnxruntime as ort

        # The session options of bertpipe's own OnnxModel (pipelines/onnx_model.py), which this process
        # does not import: it would bring torch into the ONNX rows' memory.
        options = ort.SessionOptions()
        options.enable_mem_pattern = False
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        input_names = [node.name for node in session.get_inputs()]

        def forward(batch):
            return session.run(None, {name: batch[name] for name in input_names})[0]

        size = (folder / "model.onnx").stat().st_size
    else:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

        auto_class = AutoModelForTokenClassification if task == "ner" else AutoModelForSequenceClassification
        model = auto_class.from_pretrained(folder).eval()

        def forward(batch):
            with torch.inference_mode():
                return model(**{name: torch.from_numpy(value) for name, value in batch.items()}).logits.numpy()

        size = sum(path.stat().st_size for path in folder.glob("model*.safetensors"))

    def predict(inputs: list) -> list:
        arrays, encoded = encode(inputs)
        return labels(forward(arrays), encoded)

    predict.tokenizer = tokenizer
    return predict, size


def measure(kind: str, task: str, folder: Path, sentences_file: Path, count: int, max_length: int) -> dict:
    """Runs in its own process: batch-1 latency, batch-32 throughput, peak RSS of ``make_predictor``'s calls."""
    import numpy as np

    from pipelines.process_memory import peak_rss_mb  # torch-free: an ONNX row's peak holds no torch

    sentences = json.loads(sentences_file.read_text(encoding="utf-8"))
    predict, size = make_predictor(kind, task, folder, max_length)
    single = sentences[:count]
    for sentence in single[:20]:  # warm-up: allocator, kernels, ORT's first-run graph work
        predict([sentence])
    latencies = []
    for sentence in single:
        started = time.perf_counter()
        predict([sentence])
        latencies.append((time.perf_counter() - started) * 1000)
    predict(sentences[:BATCH])
    started = time.perf_counter()
    for start in range(0, len(sentences), BATCH):
        predict(sentences[start : start + BATCH])
    throughput = len(sentences) / (time.perf_counter() - started)
    # Read before the count below: encoding the whole split at once is the harness's bookkeeping, not a
    # deployment's (it added ~44 MB to the peak on CoNLL-2003).
    peak_rss = peak_rss_mb()
    truncated = sum(len(e.overflowing) > 0 for e in predict.tokenizer.encode_batch(sentences, is_pretokenized=task == "ner"))
    return {
        "size_mb": size / 2**20,
        "latency_p50_ms": float(np.percentile(latencies, 50)),
        "latency_p95_ms": float(np.percentile(latencies, 95)),
        "throughput_b32_per_s": throughput,
        "peak_rss_mb": peak_rss,
        "inputs_truncated": truncated,
    }


def phase_time(teacher: Path, student: Path, out: Path, count: int, rounds: int, add: bool = False) -> None:
    """``rounds`` rounds; in each, every row is measured once in a fresh process, in alternating order.

    On a shared machine the speed of the CPU drifts over minutes; timing the rows one after another
    once let that drift decide ratios between rows (a 1.6× student in one run, 1.9× in the next).
    Rounds spread each row's measurements over the whole timing window, and the report takes each
    row's median over rounds. ``add`` appends rounds to an earlier ``timings.json`` (so that rounds
    can run as separate, shorter commands).
    """
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    task = run_task(teacher)
    sentences_file = out / "eval_sentences.json"
    if not sentences_file.exists():
        sentences_file.write_text(json.dumps(eval_sentences(teacher)), encoding="utf-8")
    max_length = yaml.safe_load((teacher / "config.yaml").read_text(encoding="utf-8"))["data"]["max_seq_length"]
    measured: dict[str, list[dict]] = {row["name"]: [] for row in rows(teacher, student, out)}
    if add and (out / "timings.json").exists():
        earlier = json.loads((out / "timings.json").read_text(encoding="utf-8"))
        if earlier["task"] != task or set(earlier["measured"]) != set(measured):
            raise SystemExit(f"edge_benchmark: {out / 'timings.json'} holds other rows; run without --add")
        measured = earlier["measured"]
    done = len(next(iter(measured.values())))
    for round_index in range(done, done + rounds):
        ordered = rows(teacher, student, out)
        for row in ordered if round_index % 2 == 0 else reversed(ordered):
            result = subprocess.run(
                [sys.executable, __file__, "_measure", row["kind"], task, str(row["dir"]), str(sentences_file), str(count), str(max_length)],
                cwd=REPO_ROOT, check=True, capture_output=True, text=True,
            )
            measured[row["name"]].append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"round {round_index + 1}/{done + rounds}", row["name"], measured[row["name"]][-1], flush=True)
        # after every round, so an interrupted timing keeps what it measured
        (out / "timings.json").write_text(json.dumps({"task": task, "rounds": round_index + 1, "measured": measured}, indent=2) + "\n", encoding="utf-8")


def summarise(measurements: list[dict]) -> dict:
    """Median over rounds of every timing; the largest peak RSS (memory does not drift with load)."""
    import statistics

    summary = {key: statistics.median(m[key] for m in measurements) for key in measurements[0]}
    summary["peak_rss_mb"] = max(m["peak_rss_mb"] for m in measurements)
    p50s = [m["latency_p50_ms"] for m in measurements]
    summary["latency_p50_ms_range"] = [min(p50s), max(p50s)]
    return summary


def phase_report(teacher: Path, student: Path, out: Path) -> None:
    timings = json.loads((out / "timings.json").read_text(encoding="utf-8"))
    task = timings["task"]
    metric, metric_name = METRIC[task]
    table = []
    teacher_torch = None
    for row in rows(teacher, student, out):
        evaluated = json.loads((row["dir"] / "eval_validation.json").read_text(encoding="utf-8"))
        timing = summarise(timings["measured"][row["name"]])
        entry = {"row": row["name"], metric_name: evaluated[metric], "eval_samples": evaluated["eval_samples"], **timing}
        export_file = row["dir"] / "export.json"
        if export_file.exists():
            parity = json.loads(export_file.read_text(encoding="utf-8"))["parity"]
            entry["parity"] = parity.get("int8", parity["fp32"])
        teacher_torch = teacher_torch or entry
        entry["speedup_b1"] = teacher_torch["latency_p50_ms"] / entry["latency_p50_ms"]
        entry["speedup_b32"] = entry["throughput_b32_per_s"] / teacher_torch["throughput_b32_per_s"]
        entry["smaller"] = teacher_torch["size_mb"] / entry["size_mb"]
        table.append(entry)
    unit = "sentences" if task == "classification" else "windows (all tags equal)"
    lines = [
        f"| model | {metric_name} | size (MB) | × smaller | batch-1 p50 (ms) | p95 (ms) | × faster (p50) | batch-32 (sent/s) | "
        f"× faster (b32) | peak RSS (MB) | export vs its torch fp32 model: max abs Δ logit / {unit} agreeing |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in table:
        parity = e.get("parity")
        agree = f"{parity['max_abs_diff']:.2e} / {parity['features_agreeing']}/{parity['features_compared']}" if parity else "—"
        lines.append(
            f"| {e['row']} | {100 * e[metric_name]:.2f} | {e['size_mb']:.1f} | {e['smaller']:.2f} | {e['latency_p50_ms']:.2f} | "
            f"{e['latency_p95_ms']:.2f} | {e['speedup_b1']:.2f} | {e['throughput_b32_per_s']:.0f} | {e['speedup_b32']:.2f} | "
            f"{e['peak_rss_mb']:.0f} | {agree} |"
        )
    markdown = "\n".join(lines) + "\n"
    (out / "edge_benchmark.md").write_text(markdown, encoding="utf-8")
    (out / "edge_benchmark.json").write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    print(markdown)


def main() -> None:
    sys.path.insert(0, str(REPO_ROOT))
    if len(sys.argv) > 1 and sys.argv[1] == "_measure":
        kind, task, folder, sentences_file, count, max_length = sys.argv[2:8]
        print(json.dumps(measure(kind, task, Path(folder), Path(sentences_file), int(count), int(max_length))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["export", "evaluate", "time", "report", "all"])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--student", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=500, help="single sentences timed at batch 1 (default 500)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds, each row once per round; the report takes medians (default 3)")
    parser.add_argument("--add", action="store_true", help="time: add the rounds to OUT/timings.json instead of starting afresh")
    args = parser.parse_args()
    for phase in (["export", "evaluate", "time", "report"] if args.phase == "all" else [args.phase]):
        if phase == "export":
            phase_export(args.teacher, args.student, args.out)
        elif phase == "evaluate":
            phase_evaluate(args.teacher, args.student, args.out)
        elif phase == "time":
            phase_time(args.teacher, args.student, args.out, args.sentences, args.rounds, args.add)
        else:
            phase_report(args.teacher, args.student, args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    from pipelines.errors import run_script

    run_script("edge_benchmark.py", main)

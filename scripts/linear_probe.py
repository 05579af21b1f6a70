"""Linear probe: how much of a label a frozen encoder carries, read off by logistic regression.

In:  encoders (run directories, Hub ids resolved through BERTPIPE_MIRROR, or ``random:MODEL`` for a fresh
     initialisation of MODEL's config with MODEL's tokenizer), a labelled text dataset (a Hub id, or local
     ``--train-file``/``--eval-file`` in any format bertpipe reads), its text and label columns.
Out: a line per encoder with the eval accuracy of a logistic regression on the last layer's [CLS]
     vector and on the mean of the last layer over real tokens; ``--json FILE`` writes the same rows.

Fine-tuning mixes what pretraining stored with what the task teaches in its updates; a probe of the
frozen encoder measures only the first. docs/mlm.md uses it to ask whether a weakly pretrained BERT
carries anything a random one does not:

    python scripts/linear_probe.py random:runs/wikitext2_mlm runs/wikitext2_mlm \\
        sentence-transformers/all-MiniLM-L6-v2 --train-samples 2000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from transformers import AutoConfig, AutoModel, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402  (registers bertpipe's own BERT with the Auto classes)
from pipelines.config import DataConfig  # noqa: E402
from pipelines.data import load_raw, require_columns  # noqa: E402
from pipelines.hub import resolve_model  # noqa: E402

RANDOM_PREFIX = "random:"


def load_encoder(spec: str, seed: int) -> tuple[torch.nn.Module, object]:
    """``spec`` is a model path/id, or ``random:`` + one whose config and tokenizer a fresh model takes."""
    source = resolve_model(spec.removeprefix(RANDOM_PREFIX))
    tokenizer = AutoTokenizer.from_pretrained(source)
    if spec.startswith(RANDOM_PREFIX):
        torch.manual_seed(seed)
        encoder = AutoModel.from_config(AutoConfig.from_pretrained(source))
    else:
        encoder = AutoModel.from_pretrained(source)
    return encoder.eval(), tokenizer


@torch.no_grad()
def sentence_features(encoder, tokenizer, texts: list[str], *, max_length: int, batch_size: int = 64) -> dict[str, np.ndarray]:
    """The last layer's [CLS] vector and its mean over real (unpadded) tokens, one row per text."""
    cls, mean = [], []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        cls.append(hidden[:, 0])
        mean.append((hidden * mask).sum(1) / mask.sum(1))
    return {"cls": torch.cat(cls).float().numpy(), "mean": torch.cat(mean).float().numpy()}


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, eval_x: np.ndarray, eval_y: np.ndarray, *, c: float) -> float:
    # Standardising first makes one C fit encoders whose feature scales differ by orders of magnitude.
    classifier = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=5000))
    classifier.fit(train_x, train_y)
    return float(classifier.score(eval_x, eval_y))


def probe(encoder, tokenizer, train: dict, evaluation: dict, *, max_length: int, c: float) -> dict[str, float]:
    train_features = sentence_features(encoder, tokenizer, train["texts"], max_length=max_length)
    eval_features = sentence_features(encoder, tokenizer, evaluation["texts"], max_length=max_length)
    return {
        kind: probe_accuracy(train_features[kind], train["labels"], eval_features[kind], evaluation["labels"], c=c)
        for kind in ("cls", "mean")
    }


def load_split_texts(arguments: argparse.Namespace) -> tuple[dict, dict]:
    if arguments.train_file:
        data = DataConfig(files={"train": arguments.train_file, "validation": arguments.eval_file})
    else:
        data = DataConfig(path=arguments.data, name=arguments.data_name)
    raw = load_raw(data)
    splits = []
    for split, limit in (("train", arguments.train_samples), (arguments.eval_split, arguments.eval_samples)):
        if split not in raw:
            raise SystemExit(f"error: the data has no split {split!r}; it has {sorted(raw)}")
        dataset = raw[split]
        require_columns(dataset, [arguments.text_column, arguments.label_column], split)
        if limit is not None:
            dataset = dataset.select(range(min(limit, len(dataset))))
        splits.append({"texts": list(dataset[arguments.text_column]), "labels": np.asarray(dataset[arguments.label_column])})
    if len(set(splits[0]["labels"].tolist())) < 2:
        raise SystemExit("error: the probe's training examples hold a single label; raise --train-samples")
    return splits[0], splits[1]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("encoders", nargs="+", help="model paths or Hub ids; random:MODEL for a fresh init of MODEL's shape")
    parser.add_argument("--data", default="stanfordnlp/sst2", help="Hub dataset id (resolved through BERTPIPE_MIRROR)")
    parser.add_argument("--data-name", default=None, help="dataset config name, e.g. mrpc")
    parser.add_argument("--train-file", help="local training file instead of --data")
    parser.add_argument("--eval-file", help="local evaluation file (needed with --train-file)")
    parser.add_argument("--eval-split", default="validation")
    parser.add_argument("--text-column", default="sentence")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--train-samples", type=int, default=2000, help="the first N training examples")
    parser.add_argument("--eval-samples", type=int, default=None, help="the first N evaluation examples (default all)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--c", type=float, default=0.1, help="inverse L2 strength of the logistic regression")
    parser.add_argument("--seed", type=int, default=42, help="seed of random: initialisations")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    arguments = parser.parse_args(argv)
    if arguments.eval_file and not arguments.train_file:
        parser.error("--eval-file needs --train-file")
    if arguments.train_file and not arguments.eval_file:
        # It scored the probe on the rows it was fitted on, and called that eval accuracy.
        parser.error("--train-file needs --eval-file: a probe scored on the examples it was fitted on measures nothing")
    if arguments.threads:
        torch.set_num_threads(arguments.threads)

    train, evaluation = load_split_texts(arguments)
    rows = []
    print(f"{'encoder':48s} {'[CLS]':>7s} {'mean':>7s}   ({len(train['texts'])} train / {len(evaluation['texts'])} eval examples)")
    for spec in arguments.encoders:
        encoder, tokenizer = load_encoder(spec, arguments.seed)
        accuracy = probe(encoder, tokenizer, train, evaluation, max_length=arguments.max_length, c=arguments.c)
        rows.append({"encoder": spec, "cls_accuracy": accuracy["cls"], "mean_accuracy": accuracy["mean"]})
        print(f"{spec:48s} {accuracy['cls']:7.3f} {accuracy['mean']:7.3f}", flush=True)
        if arguments.json:  # after each encoder: one that fails to load keeps the probes before it
            arguments.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return rows


if __name__ == "__main__":
    from pipelines.errors import run_script

    run_script("linear_probe.py", main)

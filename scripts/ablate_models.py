"""Ablation of bertpipe's own BERT on masked-LM pretraining (issue 8): same budget, one change at a time.

In:  the from-scratch MLM config (configs/pretrain/wikitext2_mlm.yaml by default), a step budget and
     an output folder; BERTPIPE_MIRROR is not needed (WikiText-2 is a local file under ../shared).
Out: OUT/ablation.md (a table of validation perplexity, masked-token accuracy and train tokens/s per
     variant) and OUT/ablation.png (the same as bars), plus each run's directory under OUT/runs/.

Variants: the baseline (dot score, LayerNorm, learned positions, post-norm) and, one at a time,
bilinear and additive scores, BatchNorm, sinusoidal positions (as added to BERT-scale token embeddings,
and with the token embeddings scaled by √d as in the Transformer paper) and pre-norm. Runs go one after another,
each in its own process, so their tokens/s are comparable on an otherwise idle machine.

    python scripts/ablate_models.py --max-steps 40 --out docs/ablation

On a 2-core machine two single-thread lanes finish sooner than one two-thread lane (a 4-layer model
scales poorly across threads), and the tokens/s stay comparable when every variant ran the same way:

    python scripts/ablate_models.py --threads 1 --only additive --out OUT &
    python scripts/ablate_models.py --threads 1 --skip additive --out OUT; wait
    python scripts/ablate_models.py --report-only --out OUT   # the table from every finished run in OUT

`--set KEY=VALUE` changes the shared configuration (a smaller model, shorter blocks) for every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, dict[str, str]] = {
    "baseline (dot, LayerNorm, learned, post-norm)": {},
    "bilinear score": {"attention_score": "bilinear"},
    "additive score": {"attention_score": "additive"},
    "BatchNorm": {"norm": "batch"},
    "sinusoidal positions": {"position_embedding": "sinusoidal"},
    "sinusoidal ×√d (token embeddings scaled, as in the paper)": {"position_embedding": "sinusoidal", "scale_embedding": "true"},
    "pre-norm": {"norm_placement": "pre"},
}


def run_dir_of(name: str, out: Path) -> Path:
    return out / "runs" / re.sub(r"[^A-Za-z0-9]+", "_", name.split(" (")[0]).strip("_")


def settings_file_of(name: str, out: Path) -> Path:
    """Beside the run, not in it: the script's settings for that run, which the report states (a --report-only
    call has none of its own to state)."""
    return run_dir_of(name, out).with_suffix(".settings.json")


def run_settings(args: argparse.Namespace) -> dict:
    return {"config": str(args.config), "max_steps": args.max_steps, "batch_size": args.batch_size, "seed": args.seed,
            "threads": args.threads, "set": list(args.set)}


def read_row(name: str, out: Path) -> dict:
    metrics = json.loads((run_dir_of(name, out) / "metrics.json").read_text(encoding="utf-8"))
    return {"variant": name, **{k: metrics[k] for k in ("eval_perplexity", "eval_accuracy", "train_tokens_per_second")}}


def settings_of_finished_runs(names: list[str], out: Path) -> dict:
    """The settings every finished run in ``out`` was made with; a table of runs made otherwise is refused (their
    perplexities and tokens/s are not comparable)."""
    found = {}
    for name in names:
        path = settings_file_of(name, out)
        if not path.is_file():
            raise SystemExit(f"{run_dir_of(name, out)} has no {path.name} (a run made before the script recorded its "
                             "settings): run that variant again")
        found[name] = json.loads(path.read_text(encoding="utf-8"))
    if not found:
        raise SystemExit(f"no finished run in {out / 'runs'}: nothing to tabulate")
    distinct = {json.dumps(settings, sort_keys=True) for settings in found.values()}
    if len(distinct) > 1:
        listed = "; ".join(f"{name}: {settings}" for name, settings in found.items())
        raise SystemExit(f"the runs in {out / 'runs'} were made with different settings, so one table would compare "
                         f"unlike runs: {listed}")
    return next(iter(found.values()))


def selected_variants(only: list[str], skip: list[str]) -> list[str]:
    """Variant names matching any ``only`` word (all when empty) and no ``skip`` word."""
    chosen = [name for name in VARIANTS if not only or any(word in name for word in only)]
    chosen = [name for name in chosen if not any(word in name for word in skip)]
    if not chosen:
        raise SystemExit(f"no variant matches --only {only} --skip {skip}; variants: {list(VARIANTS)}")
    return chosen


def variant_overrides(name: str, changes: dict[str, str], out: Path, args: argparse.Namespace) -> list[str]:
    """The command line of a variant's run: the script's settings, then ``--set``, then the variant's own keys, a
    later one of the same key replacing an earlier one (`bertpipe train` refuses a key given twice)."""
    layered = [
        "model.model_type=bertpipe_bert", f"output_dir={run_dir_of(name, out)}", "overwrite=true", f"seed={args.seed}",
        f"train.max_steps={args.max_steps}", f"train.batch_size={args.batch_size}", "train.eval_steps=null",
        f"train.warmup_steps={max(1, args.max_steps // 10)}",
        # Shared changes first: a whole `model.architecture={...}` must not replace the variant's key.
        *args.set,
        *(f"model.architecture.{key}={value}" for key, value in changes.items()),
        *([f"train.torch_num_threads={args.threads}"] if args.threads else []),
    ]
    by_key: dict[str, str] = {}
    for override in layered:
        key = override.split("=", 1)[0].strip()
        by_key.pop(key, None)
        by_key[key] = override
    return list(by_key.values())


def run_variant(config: str, name: str, changes: dict[str, str], out: Path, args: argparse.Namespace) -> dict:
    overrides = variant_overrides(name, changes, out, args)
    settings_file_of(name, out).unlink(missing_ok=True)  # a run replaced is described again only once it finished
    subprocess.run(
        [sys.executable, "-m", "tasks.cli", "train", config, *overrides], cwd=REPO_ROOT, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.DEVNULL,
    )
    settings_file_of(name, out).write_text(json.dumps(run_settings(args), indent=2) + "\n", encoding="utf-8")
    return read_row(name, out)


def write_report(rows: list[dict], out: Path, settings: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = Path(settings["config"])
    shown = config.relative_to(REPO_ROOT) if config.is_relative_to(REPO_ROOT) else config
    lines = [
        f"Budget: {settings['max_steps']} updates × {settings['batch_size']} packed blocks, seed {settings['seed']}, "
        f"config `{shown}` with `model.model_type=bertpipe_bert`"
        + "".join(f", `{override}`" for override in settings["set"])
        + (f", {settings['threads']} torch thread(s) per run." if settings["threads"] else "."),
        "",
        "| variant | validation perplexity | masked-token accuracy | train tokens/s |",
        "| --- | --- | --- | --- |",
        *(f"| {r['variant']} | {r['eval_perplexity']:.1f} | {r['eval_accuracy']:.3f} | {r['train_tokens_per_second']:.0f} |" for r in rows),
    ]
    (out / "ablation.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    names = [r["variant"].split(" (")[0] for r in rows]
    perplexity = left.barh(names, [r["eval_perplexity"] for r in rows])
    left.bar_label(perplexity, fmt="%.0f", padding=3)
    left.set(title="validation perplexity (lower is better)")
    speed = right.barh(names, [r["train_tokens_per_second"] for r in rows], color="tab:orange")
    right.bar_label(speed, fmt="%.0f", padding=3)
    right.set(title="train tokens/s")
    for axis in (left, right):
        axis.margins(x=0.15)  # room for the value labels
    figure.tight_layout()
    figure.savefig(out / "ablation.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/pretrain/wikitext2_mlm.yaml")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "ablation")
    parser.add_argument("--threads", type=int, default=None, help="train.torch_num_threads for every run")
    parser.add_argument("--only", nargs="*", default=[], help="run only variants whose name contains a word")
    parser.add_argument("--skip", nargs="*", default=[], help="leave out variants whose name contains a word")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs in --out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every variant, e.g. data.max_seq_length=64")
    args = parser.parse_args()
    # Runs start in the repository (their commands import it); paths given from elsewhere are the caller's, and a
    # relative --out wrote the runs under the repository while the table was read from the caller's folder.
    args.out = args.out.resolve()
    given = Path(args.config)
    args.config = str(given.resolve() if given.exists() else (REPO_ROOT / given).resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        finished = [name for name in VARIANTS if (run_dir_of(name, args.out) / "metrics.json").exists()]
        settings = settings_of_finished_runs(finished, args.out)
        rows = [read_row(name, args.out) for name in finished]
    else:
        rows = []
        for name in selected_variants(args.only, args.skip):
            rows.append(run_variant(args.config, name, VARIANTS[name], args.out, args))
            print(json.dumps(rows[-1]), flush=True)
        settings = run_settings(args)
    write_report(rows, args.out, settings)
    print((args.out / "ablation.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pipelines.errors import run_script

    run_script("ablate_models.py", main)

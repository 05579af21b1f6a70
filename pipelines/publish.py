"""Publishing a finished run to the Hugging Face Hub.

In:  a finished run directory (``metrics.json`` present), its resolved config, its task (for the
     model card), a repo id and the push flags. The token comes from ``HF_TOKEN`` or the user's
     ``hf auth login`` through huggingface_hub itself: bertpipe never reads, passes or writes it.
Out: the staged folder -- the publishable files of the run (model or adapter weights and configs,
     tokenizer, ``metrics.json``, eval results, the resolved ``config.yaml``, training curves) and a
     ``README.md`` model card rebuilt for the repo id -- uploaded with ``HfApi.create_repo`` +
     ``upload_folder``, or, with ``dry_run``, written to ``out`` and listed. Checkpoints, optimizer
     states, ``best_model/``, tracking logs and the step log stay behind. The run directory is only
     read. No token, no network or a Hub error -> one :class:`PublishError` (the CLI's exit 2).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.adapters import MERGED_DIR, adapter_base_model, is_adapter_dir
from pipelines.atomic_writes import replacing_folder
from pipelines.card import build_model_card, is_local_path, saved_model_config
from pipelines.config import RunConfig
from pipelines.hub import hub_reachable
from pipelines.outputs import METRICS_FILE

if TYPE_CHECKING:
    from pipelines.task import Task

logger = logging.getLogger(__name__)

# Top-level files of a run that make up a model repository.
PUBLISH_PATTERNS = [
    "*.safetensors", "config.json", "generation_config.json", "adapter_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
    "vocab.txt", "vocab.json", "merges.txt", "*.model", "source.spm", "target.spm",
    "metrics.json", "eval_*.json", "config.yaml", "training_curves.png", "predictions.json",
]
# Never published, even if a pattern above matched (defence in depth).
IGNORE_PATTERNS = ["checkpoints/*", "best_model/*", f"{MERGED_DIR}/*", "runs/*", "wandb/*", "mlruns/*", "*.tmp",
                   "*.partial/*", "optimizer*", "scheduler*", "rng_state*", "log.jsonl", "README.md"]
# From the run directory when publishing merged/ (the weights come from merged/).
_RUN_FILES_WITH_MERGED = ["metrics.json", "eval_*.json", "config.yaml", "training_curves.png", "predictions.json"]


class PublishError(RuntimeError):
    """A run that cannot be published, or a push that failed; the message says which and why."""


def publishable_files(folder: Path, allow: list[str]) -> list[str]:
    """Top-level file names of ``folder`` matching ``allow`` and none of :data:`IGNORE_PATTERNS`."""
    from huggingface_hub.utils import filter_repo_objects

    names = sorted(path.name for path in folder.iterdir() if path.is_file())
    return list(filter_repo_objects(names, allow_patterns=allow, ignore_patterns=IGNORE_PATTERNS))


def stage_run(run_dir: str | Path, config: RunConfig, task: Task, out_dir: str | Path, sources: list[tuple[Path, list[str]]],
              *, repo_id: str, merged: bool = False, revision: str | None = None) -> list[str]:
    """Copy what would be uploaded from ``sources`` (checked by :func:`_publishable_sources`) into the empty
    folder ``out_dir``, plus a card for ``repo_id`` (its code loading ``revision``, the branch pushed to); returns
    the file names."""
    out_dir = Path(out_dir)
    staged: list[str] = []
    for folder, allow in sources:
        for name in publishable_files(folder, allow):
            shutil.copy2(folder / name, out_dir / name)
            staged.append(name)
    adapter = is_adapter_dir(run_dir) and not merged
    card = build_model_card(config, task, json.loads((Path(run_dir) / METRICS_FILE).read_text(encoding="utf-8")), model_name=repo_id, adapter=adapter,
                            saved_config=saved_model_config(run_dir), revision=revision)
    card.save(out_dir / "README.md")
    return sorted([*staged, "README.md"])


def _publishable_sources(run_dir: Path, merged: bool) -> list[tuple[Path, list[str]]]:
    """(folder, file patterns) to publish from a finished run; refuses a run that is not one or whose weights do not load."""
    if not (run_dir / METRICS_FILE).is_file():
        raise PublishError(f"{run_dir} is not a finished bertpipe run (no {METRICS_FILE}); train it first")
    sources: list[tuple[Path, list[str]]]
    if merged:
        merged_dir = run_dir / MERGED_DIR
        if not (merged_dir / "config.json").is_file():
            raise PublishError(f"{merged_dir} does not exist; run `bertpipe merge {run_dir}` first")
        sources = [(merged_dir, [p for p in PUBLISH_PATTERNS if p not in _RUN_FILES_WITH_MERGED]), (run_dir, _RUN_FILES_WITH_MERGED)]
    else:
        sources = [(run_dir, PUBLISH_PATTERNS)]
    for folder, allow in sources:
        for name in publishable_files(folder, allow):
            if name.endswith(".safetensors"):
                _check_weights(folder / name)
    return sources


def _stage_dry_run(run_dir: Path, config: RunConfig, task: Task, out: Path, *, repo_id: str, merged: bool,
                   revision: str | None) -> list[str]:
    """Stage into ``--out`` (new or empty) beside it and rename it in: a full disk or Ctrl-C mid-copy left a
    half-filled ``--out``, which the rerun then refused as not empty."""
    sources = _publishable_sources(run_dir, merged)  # a run that cannot be published is named before --out is looked at
    if out.exists() and not out.is_dir():
        raise PublishError(f"--out {out} is a file, not a folder; choose a new folder")
    if out.exists() and any(out.iterdir()):
        raise PublishError(f"--out {out} is not empty; choose a new folder so nothing stale is uploaded")
    with replacing_folder(out, label="--out") as staging:
        return stage_run(run_dir, config, task, staging, sources, repo_id=repo_id, merged=merged, revision=revision)


def _warn_of_an_adapter_on_a_local_base(run_dir: Path, merged: bool) -> None:
    """An adapter records its base; one on a folder of this machine loads nowhere else (the card's code names that
    folder), so say so where the upload is decided. Not refused: the base may be published, or shared, by other means."""
    if merged or not is_adapter_dir(run_dir) or not (run_dir / METRICS_FILE).is_file():
        return
    base = adapter_base_model(run_dir)
    if is_local_path(base):
        logger.warning(
            "%s is an adapter on the local base model %s, which the Hub does not have: whoever loads it from the Hub needs "
            "that base too. Publish the full model with --merged, or train the adapter on a Hub id", run_dir, base,
        )


def _check_weights(path: Path) -> None:
    """Refuse weights that do not load (a truncated or overwritten file): uploaded, they were a broken model
    on the Hub that only its users found out about. Reads the header and checks the size it promises."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise PublishError(f"{path} does not load ({error}); nothing was published. Retrain or resume the run first") from error


def _check_can_push() -> None:
    from huggingface_hub import get_token

    if get_token() is None:
        raise PublishError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (the config never holds it)")
    if not hub_reachable("models"):  # HF_DATASETS_OFFLINE says nothing about pushing a model
        raise PublishError(
            "the Hugging Face Hub cannot be reached (no network, HF_HUB_OFFLINE=1, or HF_ENDPOINT is down); "
            "nothing was uploaded. Retry later with `bertpipe publish`, or use --dry-run --out DIR to inspect the files"
        )


def publish_run(
    run_dir: str | Path, config: RunConfig, task: Task, *, repo_id: str | None, private: bool = True,
    revision: str | None = None, commit_message: str | None = None, dry_run: bool = False, out: str | Path | None = None,
    merged: bool = False,
) -> dict:
    """Stage and upload (or, with ``dry_run``, only stage into ``out``); returns what was done."""
    if not repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise PublishError(f"repo id {repo_id!r} is not of the form OWNER/NAME (set --repo-id or hub.repo_id)")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        # The Hub's own rule, so a dry run that passes is one the push will not reject after staging.
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise PublishError(f"repo id {repo_id!r} (--repo-id or hub.repo_id) is not a valid Hub repo id: {error}") from None
    if out is not None and not dry_run:
        # Ignored, it turned a look at the files into an upload.
        raise PublishError(f"--out {out} writes the files instead of uploading them, with --dry-run only; add --dry-run, or drop --out to upload")
    _warn_of_an_adapter_on_a_local_base(Path(run_dir), merged)
    if dry_run:
        if out is None:
            raise PublishError("--dry-run needs --out DIR to write the folder that would be uploaded")
        files = _stage_dry_run(Path(run_dir), config, task, Path(out), repo_id=repo_id, merged=merged, revision=revision)
        return {"repo_id": repo_id, "dry_run": True, "folder": str(out), "files": files}

    _check_can_push()
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    message = commit_message or f"Upload {Path(run_dir).resolve().name} trained with bertpipe"
    with tempfile.TemporaryDirectory(prefix="bertpipe-publish-") as staging:
        files = stage_run(run_dir, config, task, staging, _publishable_sources(Path(run_dir), merged), repo_id=repo_id, merged=merged,
                          revision=revision)
        try:
            url = api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo_id, folder_path=staging, repo_type="model", revision=revision, commit_message=message
            )
        except (HfHubHTTPError, httpx2.HTTPError, OSError, ValueError) as error:  # ValueError: card metadata rejected
            raise PublishError(f"pushing {run_dir} to {repo_id} failed: {type(error).__name__}: {error}") from error
    return {"repo_id": repo_id, "dry_run": False, "url": str(url), "commit": getattr(commit, "oid", None), "files": files}

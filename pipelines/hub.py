"""Hub id resolution: local path, then the ``BERTPIPE_MIRROR`` copy, then the Hub itself.

In:  a model/tokenizer id (``sentence-transformers/all-MiniLM-L6-v2``), a dataset id
     (``stanfordnlp/sst2``) or a local folder.
Out: what to hand to ``from_pretrained`` / ``load_dataset``: the folder when one exists, else the
     Hub id. When the Hub cannot be reached and no copy exists, one :class:`HubUnavailableError`
     names the id and the variable at once, instead of the Hub client's retry loop.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pipelines.errors import UserError

MIRROR_VARIABLE = "BERTPIPE_MIRROR"


class HubUnavailableError(UserError, RuntimeError):
    """A Hub id that has no local or mirror copy while the Hub cannot be reached."""


def mirror_root() -> Path | None:
    root = os.environ.get(MIRROR_VARIABLE)
    return Path(root).expanduser() if root else None


def _offline_by_setting() -> bool:
    return any(os.environ.get(name, "").lower() in {"1", "true", "yes"} for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout_seconds: float = 3.0) -> bool:
    """One quick TCP connect to the Hub endpoint; cached for the life of the process."""
    if _offline_by_setting():
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds):
            return True
    except OSError:
        return False


def resolve(repo_id: str, kind: Literal["models", "datasets"]) -> str:
    """Local folder if ``repo_id`` is one, else its mirror copy, else the Hub id (if reachable)."""
    if Path(repo_id).expanduser().exists():
        return str(Path(repo_id).expanduser())
    root = mirror_root()
    if root is not None:
        copy = root / kind / repo_id
        if copy.is_dir():
            return str(copy)
    if not hub_reachable():
        where = f"{MIRROR_VARIABLE}={root}" if root is not None else f"{MIRROR_VARIABLE} is not set"
        raise HubUnavailableError(
            f"{kind[:-1]} {repo_id!r} is not a local path, has no mirror copy ({where}; looked for "
            f"{(root or Path('$' + MIRROR_VARIABLE)) / kind / repo_id}) and the Hugging Face Hub cannot be reached. "
            f"Point {MIRROR_VARIABLE} at a mirror holding {kind}/{repo_id}, or pass a local path."
        )
    return repo_id


def resolve_model(repo_id: str) -> str:
    return resolve(repo_id, "models")


def resolve_dataset(repo_id: str) -> str:
    return resolve(repo_id, "datasets")

"""Hub id resolution: local path, then the ``BERTPIPE_MIRROR`` copy, then the Hub itself.

In:  a model/tokenizer id (``sentence-transformers/all-MiniLM-L6-v2``), a dataset id
     (``stanfordnlp/sst2``) or a local folder.
Out: what to hand to ``from_pretrained`` / ``load_dataset``: the folder when one exists, else the
     Hub id. When the Hub cannot be reached and no copy exists, one :class:`HubUnavailableError`
     names the id and the variable at once, instead of the Hub client's retry loop.

:func:`hub_reachable` is the one reachability check (``bertpipe publish`` asks it too).
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


def _is_true(value: str | None) -> bool:
    return (value or "").upper() in {"1", "ON", "YES", "TRUE"}


def offline_by_setting(kind: Literal["models", "datasets"]) -> bool:
    """The switch of the library that would connect: huggingface_hub's ``HF_HUB_OFFLINE`` (or
    ``TRANSFORMERS_OFFLINE``) for models and for pushing a model; for datasets, ``HF_DATASETS_OFFLINE``
    where it is set (it overrides the Hub's switch, as in ``datasets.config``)."""
    if kind == "datasets" and os.environ.get("HF_DATASETS_OFFLINE") is not None:
        return _is_true(os.environ["HF_DATASETS_OFFLINE"])
    # As huggingface_hub.constants reads them: a set HF_HUB_OFFLINE (even "0") wins over TRANSFORMERS_OFFLINE.
    return _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))


@functools.lru_cache(maxsize=4)
def hub_reachable(kind: Literal["models", "datasets"] = "models", timeout_seconds: float = 3.0) -> bool:
    """Not switched off for ``kind`` and one quick TCP connect to ``HF_ENDPOINT`` answers, so an absent
    network fails at once instead of in the client's retry loop; cached for the life of the process."""
    if offline_by_setting(kind):
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
    if not hub_reachable(kind):
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

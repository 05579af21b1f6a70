"""Session fixtures of the family matrix: each family's tiny checkpoint is built once per test process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.families.builders import build_family


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory):
    """``family_checkpoint("roberta")`` -> the folder of that family's tiny checkpoint (built on first use)."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family in ("marian", "m2m100"):
            pytest.importorskip("sentencepiece", reason=f"{family}'s tokenizer exists only as a sentencepiece tokenizer")
        if family not in built:
            built[family] = build_family(family, tmp_path_factory.mktemp(f"family-{family}"))
        return built[family]

    return get

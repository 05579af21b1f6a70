from __future__ import annotations

import time

import pytest

from pipelines import hub


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.hub_reachable.cache_clear()
    yield
    hub.hub_reachable.cache_clear()


def test_hub_mirror_copy_wins_over_the_hub(tmp_path, monkeypatch):
    (tmp_path / "models" / "org" / "model").mkdir(parents=True)
    (tmp_path / "datasets" / "org" / "data").mkdir(parents=True)
    monkeypatch.setenv("BERTPIPE_MIRROR", str(tmp_path))
    assert hub.resolve_model("org/model") == str(tmp_path / "models" / "org" / "model")
    assert hub.resolve_dataset("org/data") == str(tmp_path / "datasets" / "org" / "data")


def test_hub_local_path_is_used_as_is(tmp_path, monkeypatch):
    monkeypatch.delenv("BERTPIPE_MIRROR", raising=False)
    assert hub.resolve_model(str(tmp_path)) == str(tmp_path)


def test_hub_offline_without_copy_fails_at_once_naming_id_and_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTPIPE_MIRROR", str(tmp_path))
    started = time.perf_counter()
    with pytest.raises(hub.HubUnavailableError) as error:
        hub.resolve_model("org/absent-model")
    assert time.perf_counter() - started < 1.0
    assert "org/absent-model" in str(error.value) and "BERTPIPE_MIRROR" in str(error.value)


def test_hub_unset_mirror_is_named_in_the_error(monkeypatch):
    monkeypatch.delenv("BERTPIPE_MIRROR", raising=False)
    with pytest.raises(hub.HubUnavailableError, match="BERTPIPE_MIRROR is not set"):
        hub.resolve_dataset("org/absent-data")

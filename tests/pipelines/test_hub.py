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


@pytest.fixture
def listening_endpoint(monkeypatch):
    """HF_ENDPOINT at a local socket that accepts connections (the reachability check only connects)."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    yield
    server.close()


def test_hub_reachability_reads_the_switch_of_the_library_that_would_connect(monkeypatch, listening_endpoint):
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert hub.hub_reachable("models") and hub.hub_reachable("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # datasets' switch: says nothing about models or pushing
    hub.hub_reachable.cache_clear()
    assert hub.hub_reachable("models") and not hub.hub_reachable("datasets")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    hub.hub_reachable.cache_clear()
    assert not hub.hub_reachable("models")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a set HF_HUB_OFFLINE wins, as in huggingface_hub
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    hub.hub_reachable.cache_clear()
    assert hub.hub_reachable("models") and hub.hub_reachable("datasets")


def test_hub_publish_asks_the_same_check(monkeypatch, listening_endpoint):
    from pipelines.publish import PublishError, _check_can_push

    monkeypatch.setenv("HF_TOKEN", "hf_test_token_never_sent")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # set in this suite's environment; pushing must not care
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    _check_can_push()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.hub_reachable.cache_clear()
    with pytest.raises(PublishError, match="cannot be reached"):
        _check_can_push()
    hub.hub_reachable.cache_clear()
    assert not hub.hub_reachable("models")  # the answer publish got is the answer model resolution gets


@pytest.mark.parametrize("repo_id", ["someone/my model", "someone/tiny--lora", "someone/name.", "some one/tiny"])
def test_hub_publish_dry_run_rejects_a_repo_id_the_hub_would_reject(tmp_path, repo_id):
    from pipelines.publish import PublishError, publish_run

    out = tmp_path / "out"
    # A dry run must fail where the push would: before anything is staged, naming the id.
    with pytest.raises(PublishError, match="repo id") as error:
        publish_run(tmp_path / "run", None, None, repo_id=repo_id, dry_run=True, out=out)
    assert repr(repo_id) in str(error.value)
    assert not out.exists()

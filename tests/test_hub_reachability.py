"""A Hub id that is neither cached nor reachable is refused in seconds, not after the ~50 s of
retries ``from_pretrained`` spends offline (eva_runtime.hub)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from eva_runtime.hub import unreachable

MODEL = "eva-test/not-a-cached-model"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path


def test_not_cached_and_unreachable_is_refused_at_once(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    started = time.perf_counter()
    why = unreachable(MODEL)
    assert time.perf_counter() - started < 2.0
    assert why is not None and why.startswith("not in the local Hugging Face cache")
    assert f"http://127.0.0.1:{port} cannot be reached" in why


def test_an_endpoint_that_takes_the_connection_and_never_answers_is_refused(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HF_ENDPOINT at a dead mirror: from_pretrained would wait on it for good.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        started = time.perf_counter()
        why = unreachable(MODEL)
    assert time.perf_counter() - started < 3.0 + 2.0
    assert why == f"not in the local Hugging Face cache, and {endpoint} did not answer in 3 s"


def test_a_hub_that_answers_or_a_cached_model_passes(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.openai_server import OpenAICompatibleServer

    # Any answer, an error status included (here a 404 for an unknown path): the Hub answers,
    # and the libraries say what is wrong themselves.
    with OpenAICompatibleServer(lambda *a: "") as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.base_url.removesuffix("/v1"))
        assert unreachable(MODEL) is None
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    # The Hub's cache layout: models--org--name/{refs/main, snapshots/<revision>/config.json}.
    repo = empty_cache / "models--eva-test--not-a-cached-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert unreachable(MODEL) is None
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # cached: offline changes nothing
    assert unreachable(MODEL) is None
    # Not cached, offline: eva's line, not transformers' paragraph.
    assert unreachable("eva-test/other") == (
        "not in the local Hugging Face cache, and HF_HUB_OFFLINE is set"
    )

"""Shared fixtures: a real temporary Prefect API for the whole session, tiny run configs."""

from __future__ import annotations

import os

# Before prefect is imported anywhere: the ephemeral API needs more than 20 s on 2 cores.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """One intra-op thread for the whole suite: its models are tiny, and with two threads on
    a shared 2-core machine every step spins (up to 20x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An untrained tiny GPT-2 policy, saved with save_pretrained (solvers only read it)."""
    from eva_world.tiny_lm import (
        TinyModelConfig,
        build_char_tokenizer,
        build_tiny_model,
        save_checkpoint,
    )

    path = tmp_path_factory.mktemp("policy")
    tok = build_char_tokenizer("0123456789+-=:abcdefghij")
    save_checkpoint(build_tiny_model(TinyModelConfig(), tok, seed=0), tok, str(path))
    return str(path)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory):
    """One real Prefect API server for the suite, on a database of its own: eva's temporary
    server (Prefect's app; SQLite writes begin IMMEDIATE, see flows/prefect_server.py)."""
    from eva_runtime.prefect_server import temporary_server

    database = tmp_path_factory.mktemp("prefect") / "prefect.db"
    with temporary_server(database_url=f"sqlite+aiosqlite:///{database}", say=False):
        yield


@pytest.fixture
def local_s3() -> Any:
    """A real S3 server on localhost (moto) with an empty bucket ``eva-bucket``; yields the
    ``storage_options`` that reach it."""
    moto = pytest.importorskip("moto.server")
    import httpx
    import s3fs

    server = moto.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        # moto keeps its buckets in the process, across servers: start each test empty.
        httpx.post(f"{endpoint}/moto-api/reset", trust_env=False).raise_for_status()
        opts = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": endpoint}}
        s3fs.S3FileSystem(**opts, skip_instance_cache=True).mkdir("eva-bucket")
        yield opts
    finally:
        server.stop()


def world(factory: str, **options: Any) -> dict[str, Any]:
    """A built-in world component, as a config names it."""
    return {"kind": "python", "factory": f"eva_world.{factory}", "options": options}


def world_prompts(distribution: str, size: int) -> dict[str, Any]:
    """A prompts/heldout section drawing ``size`` prompts of a world distribution."""
    return {"source": world("components:WorldPrompts", distribution=distribution, size=size)}


def world_sft(steps: int = 40, batch_size: int = 32, examples: int = 2000) -> dict[str, Any]:
    """A bootstrap section training the world's theta_0 for a few seconds."""
    options = {"sft": {"steps": steps, "batch_size": batch_size}, "sft_examples": examples}
    return {"builder": world("bootstrap:WorldSFT", **options)}


def tiny_run_config(root: str, run: str = "t", **overrides: Any) -> dict[str, Any]:
    """A run on the built-in world small enough for a test: a few dozen prompts, a few seconds
    of SFT, the world's components named as configs/world.yaml names them."""
    gen = {"max_new_tokens": 10, "batch_size": 256}
    cfg: dict[str, Any] = {
        "run": run,
        "root": root,
        "seed": 0,
        "torch_threads": 1,
        "iterations": 1,
        "prompts": world_prompts("seed", 24),
        "heldout": world_prompts("heldout", 24),
        "bootstrap": world_sft(),
        "annotate": {"reward": world("components:WorldVerifier")},
        "evolve": {"evolver": world("components:WorldRewriter")},
        "complexity": {"judge": world("components:WorldDifficulty")},
        "generate": {"n": 4, "backend": gen},
        # 40 SFT steps solve almost nothing exactly: train on best-vs-worst pairs regardless.
        "pairs": {"min_chosen_reward": None},
        "evaluate": {"generation": {**gen, "temperature": 0.0}},
        "train": {
            "solver": {
                "kind": "dpo",
                "learning_rate": 1e-3,
                "effective_batch_size": 8,
                "num_train_epochs": 1,
                "max_length": 64,
            }
        },
    }
    for key, value in overrides.items():
        cfg[key] = value
    return cfg

"""Stages as Ray jobs on a real local cluster of two CPU workers, started and stopped here:
the same bytes as in this process, failures in one line with no artifact, nothing left running.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from eva_core.schema import seed_records
from eva_runtime.ray_local import LocalRayCluster
from eva_world import world
from eva_world.tiny_lm import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_checkpoint,
)
from tasks.annotate import AnnotateConfig, annotate
from tasks.backends.generate.openai import derive_seed
from tasks.backends.generate.vllm import VLLMGeneration
from tasks.backends.python import PythonComponent
from tasks.backends.ray_job import (
    JobSpec,
    fan_out,
    vllm_processor_kwargs,
    vllm_requests,
    vllm_response,
)
from tasks.content_hashes import hash_directory
from tasks.context import RunContext
from tasks.generate import GenerateConfig, generate
from tasks.stage import StageError
from tasks.store import Ref
from tests.conftest import all_cores

BACKEND = {"max_new_tokens": 10, "batch_size": 16}
VERIFIER = PythonComponent(factory="eva_world.components:WorldVerifier")
STAGES = ("generate", "annotate")


@pytest.fixture(scope="module")
def cluster():
    with all_cores(), LocalRayCluster(num_cpus=2) as running:  # tests/conftest.py
        yield running
    assert not [p.pid for p in running.processes if _alive(p)], "the cluster left processes"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _inputs(
    root: Path, run: str, runs: str | None = None, opts: dict | None = None
) -> tuple[RunContext, Ref, Ref]:
    """A run (under ``runs``, default ``root``) with 40 world prompts in iter_1, and an untrained
    tiny policy in ``root`` (varied, wrong answers, so the rewards vary)."""
    policy = root / "policy"
    if not policy.exists():
        tok = build_char_tokenizer(world.ALPHABET)
        save_checkpoint(build_tiny_model(TinyModelConfig(), tok, seed=0), tok, str(policy))
    ctx = RunContext(root=runs or str(root), run=run, seed=3, storage_options=opts or {})
    texts = world.sample_prompts(world.SEED_DISTRIBUTION, 40, seed=0)
    table = seed_records(texts, [world.category_of(p) for p in texts])
    uri, digest, _ = ctx.store().write_table(1, "prompts", table)
    prompts = Ref("prompts", 1, uri, digest, table.num_rows)
    model = Ref("policy", 0, "", hash_directory(str(policy)), 0, model_uri=str(policy))
    return ctx, prompts, model


@contextlib.contextmanager
def _unused_port() -> Iterator[int]:
    """A localhost port that is bound (so nothing else takes it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _files(root: Path, run: str) -> list[str]:
    return sorted(os.listdir(root / run / "iter_1"))


@pytest.mark.usefixtures("prefect_api")
def test_rollouts_and_rewards_through_the_cluster_are_byte_identical(cluster, tmp_path: Path):
    ray = {"address": cluster.address, "workers": 2, "rows_per_task": 8, "poll_s": 0.5}
    local, prompts, policy = _inputs(tmp_path, "local")
    rollouts = generate(
        local, 1, GenerateConfig(n=4, backend=BACKEND), prompts=prompts, policy=policy
    )
    annotate(local, 1, AnnotateConfig(reward=VERIFIER), rollouts=rollouts)

    run, prompts, policy = _inputs(tmp_path, "ray")
    # A job that fails (no prompt fits 64 new tokens in the policy's 64 positions) fails the
    # stage in one line that names the workers' error, and leaves no artifact, not even staging.
    one = {**ray, "workers": 1}  # one worker is enough to fail, and starts sooner
    too_long = GenerateConfig(n=4, backend={**BACKEND, "max_new_tokens": 64}, ray=one)
    with pytest.raises(StageError) as failed:
        generate(run, 1, too_long, prompts=prompts, policy=policy)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("generate: Ray job eva-ray-iter_1-generate")
    assert re.search(
        r"failed: ConfigError: generate\.backend\.max_new_tokens: prompt row \d+ has \d+ "
        r"tokens; .* 64 positions",
        message,
    )
    assert _files(tmp_path, "ray") == ["prompts.parquet"]

    # The rerun goes through; its rollouts, then its rewards, are the in-process bytes.
    config = GenerateConfig(n=4, backend=BACKEND, ray=ray)
    rollouts = generate(run, 1, config, prompts=prompts, policy=policy)
    annotate(run, 1, AnnotateConfig(reward=VERIFIER, ray=ray), rollouts=rollouts)
    for name in ("generate.parquet", "annotate.parquet"):
        ours, theirs = (tmp_path / r / "iter_1" / name for r in ("ray", "local"))
        assert ours.read_bytes() == theirs.read_bytes(), name
    # Not a vacuous comparison: sampled responses and rewards vary.
    rewards = pq.read_table(tmp_path / "ray" / "iter_1" / "annotate.parquet").to_pylist()
    assert len({r for row in rewards for r in row["responses"]}) > 100
    assert len({r for row in rewards for r in row["rewards"]}) > 3
    manifest = run.store().read_manifest(1, "generate")
    assert manifest["stats"]["ray_workers"] == 2 and manifest["stats"]["responses"] == 160
    assert manifest["stats"]["ray_job"].startswith("eva-ray-iter_1-generate-")
    assert not [f for f in _files(tmp_path, "ray") if ".tmp-" in f]
    # A finished stage is cached like any other: no second job.
    again = generate.task(
        run, 1, config, "generate", {"prompts": prompts, "policy": policy}, return_state=True
    )
    assert again.name == "Cached"


@pytest.mark.usefixtures("prefect_api")
def test_an_unreachable_cluster_fails_the_stage_at_once_in_one_line(tmp_path: Path):
    with _unused_port() as port:
        ray = {"address": f"http://127.0.0.1:{port}", "connect_timeout_s": 5}
        run, prompts, policy = _inputs(tmp_path, "r")
        with pytest.raises(StageError) as failed:
            generate(run, 1, GenerateConfig(ray=ray), prompts=prompts, policy=policy)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"generate: Ray cluster at http://127.0.0.1:{port} is unreachable")
    assert _files(tmp_path, "r") == ["prompts.parquet"]


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="not a Jobs API address"):
        GenerateConfig.model_validate({"ray": {"address": "ray://head:10001"}})
    with pytest.raises(ValidationError, match="run the transformers or vllm backend, not 'openai'"):
        GenerateConfig.model_validate(
            {"backend": {"kind": "openai", "llm": {"model": "m"}}, "ray": {"address": "http://h"}}
        )


def test_a_vllm_stage_becomes_ray_data_llm_engine_replicas():
    # The GPU path, checked as far as a machine without vLLM can: the processor config a vllm
    # stage asks for, and the requests that reproduce the in-process vLLM backend's seeds.
    from ray.data.llm import vLLMEngineProcessorConfig

    backend = VLLMGeneration(tensor_parallel_size=2, max_tokens=512, enforce_eager=True)
    spec = JobSpec(
        task="generate", root="s3://b/runs", run="r", input="iter_1/prompts.parquet",
        output="iter_1/x", backend=backend.model_dump(mode="json"), n=3, seed=7, workers=4,
        rows_per_task=64,
    )  # fmt: skip
    kwargs = vllm_processor_kwargs(backend, spec, "s3://b/runs/r/iter_0/model", use_chat=True)
    config = vLLMEngineProcessorConfig(**kwargs)
    assert config.model_source == "s3://b/runs/r/iter_0/model"
    assert config.engine_kwargs["tensor_parallel_size"] == 2  # GPUs per engine replica
    assert config.engine_kwargs["enforce_eager"] is True and config.engine_kwargs["seed"] == 0
    assert config.concurrency == (4, 4) and config.batch_size == 64  # replicas, requests a call
    assert config.chat_template_stage is True
    assert vllm_processor_kwargs(backend, spec, "m", use_chat=False)["chat_template_stage"] is False

    requests = vllm_requests({"row": 5, "prompt": "1+2="}, backend, spec)
    params = [r["sampling_params"] for r in requests]
    # In-process, prompt 5's n=3 request has seed derive_seed(7, 5); vLLM seeds its sample j
    # with that + j: here each sample is its own request, seeded the same way.
    assert [p["seed"] for p in params] == [derive_seed(7, 5) + j for j in range(3)]
    assert {(p["n"], p["temperature"], p["top_p"], p["max_tokens"]) for p in params} == {
        (1, 0.7, 0.9, 512)
    }
    assert [(r["row"], r["sample"], r["copies"]) for r in requests] == [(5, j, 1) for j in range(3)]
    assert requests[0]["messages"] == [{"role": "user", "content": "1+2="}]

    greedy = VLLMGeneration(temperature=0.0)
    (request,) = vllm_requests({"row": 2, "prompt": "x"}, greedy, spec)
    assert request["copies"] == 3 and request["sampling_params"]["temperature"] == 0.0
    # Ray Data LLM's rows carry no finish reason: one that used all of max_tokens was cut.
    generated = [
        {"row": 2, "sample": 0, "copies": 3, "generated_text": "a", "num_generated_tokens": 7},
        {"row": 5, "sample": 1, "copies": 1, "generated_text": "b", "num_generated_tokens": 8},
    ]
    done = pa.Table.from_pylist([vllm_response(r, max_tokens=8) for r in generated])
    out = fan_out(done)
    assert out.to_pylist() == [
        {"row": 2, "sample": 0, "response": "a", "finished": True},
        {"row": 2, "sample": 1, "response": "a", "finished": True},
        {"row": 2, "sample": 2, "response": "a", "finished": True},
        {"row": 5, "sample": 1, "response": "b", "finished": False},
    ]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_an_s3_run_root_through_the_cluster(cluster, tmp_path: Path, local_s3):
    # The job reads its input from, and writes its staging output to, a run root on S3 (a
    # local S3 server here) with the run's storage_options; the stage removes the staging.
    opts = local_s3
    ray = {"address": cluster.address, "workers": 2, "rows_per_task": 8, "poll_s": 0.5}
    tables = {}
    for name, where in (("local", None), ("ray", ray)):
        run, prompts, policy = _inputs(tmp_path, name, "s3://eva-bucket/runs", opts)
        config = GenerateConfig(n=2, backend=BACKEND, ray=where)
        rollouts = generate(run, 1, config, prompts=prompts, policy=policy)
        annotate(run, 1, AnnotateConfig(reward=VERIFIER, ray=where), rollouts=rollouts)
        store = run.store()
        tables[name] = [store.read_table(f"iter_1/{s}.parquet") for s in STAGES]
        store.fs.invalidate_cache()
        assert not [p for p in store.fs.ls(f"eva-bucket/runs/{name}/iter_1") if ".tmp" in p]
    assert all(a.equals(b) for a, b in zip(tables["ray"], tables["local"], strict=True))

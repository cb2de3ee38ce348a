"""Shared fixtures: a real temporary Prefect API for the whole session, tiny run configs."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

# Before prefect is imported anywhere: the ephemeral API needs more than 20 s on 2 cores.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
# Each test process (each xdist worker) its own Prefect home: the temporary servers that `eva`
# starts in the tests' subprocesses keep their database there, never the user's ~/.prefect, and
# two workers' servers never migrate one SQLite file at once. Removed when the process ends.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="eva-tests-prefect-")
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.openai_server import OpenAICompatibleServer

atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)

# On pytest-xdist's workers, each worker and every process it starts (eva's commands, their
# Prefect servers, CTranslate2's engines, Ray) on cores of its own: torch and CTranslate2 size
# their thread pools by the cores a process may use, so two workers' models never share a core,
# where each one's threads spin waiting for the other's (a step of the real model up to 10x
# slower). Measured on 2 cores: the end-to-end tier in 890 s instead of 1096 s.
_WORKER, _WORKERS = (
    os.environ.get("PYTEST_XDIST_WORKER"),
    os.environ.get("PYTEST_XDIST_WORKER_COUNT"),
)
_ALL_CORES = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
if _WORKER and _WORKERS and _ALL_CORES:
    _cores = sorted(_ALL_CORES)
    _share = len(_cores) // int(_WORKERS)
    if _share:
        _k = int(_WORKER.removeprefix("gw"))
        os.sched_setaffinity(0, _cores[_k * _share : (_k + 1) * _share])


@contextlib.contextmanager
def all_cores() -> Iterator[None]:
    """Every core for the processes started inside (and the threads that start them): for many
    processes of one thread each (a Ray cluster's workers, launches side by side), which spin
    against nobody and would queue on a pinned worker's one core."""
    if not _ALL_CORES:
        yield
        return
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _ALL_CORES)
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned)


# One cache of converted models for the whole suite, xdist's workers included (they inherit it
# from the process that starts them, which removes it at the end): SmolLM2's conversions (its
# GGUF file into a Hugging Face folder, then into CTranslate2's format) run once, not once per
# test module that reads the real model. Its folders are built under a lock
# (eva_runtime.folder_cache), so two workers never build one at once.
if "EVA_TESTS_MODEL_CACHE" not in os.environ:
    os.environ["EVA_TESTS_MODEL_CACHE"] = tempfile.mkdtemp(prefix="eva-tests-models-")
    atexit.register(shutil.rmtree, os.environ["EVA_TESTS_MODEL_CACHE"], ignore_errors=True)


# The end-to-end tests: a run through a flow, the CLI or a recipe, a served deployment or work
# pool, a Prefect server, a Ray cluster, an accelerate launch, a side install, a training loop
# over several segments; seconds to minutes each, most of the default suite's time. Marked
# ``e2e`` here, in one list (a module with None: all of its tests), so that ``make test-fast``
# (-m "not slow and not e2e") runs everything else in under 3 minutes, and ``make ci`` runs
# these after it.
# tests/test_tiers.py checks that every name here is a test.
E2E: dict[str, tuple[str, ...] | None] = {
    "test_run_e2e.py": None,
    "test_creator_install.py": None,
    "test_work_pool.py": None,
    "test_bench.py": ("test_costs_quick_measures_a_run_its_cached_rerun_and_rollouts",),
    "test_bench_harness.py": None,  # a tiny study run, killed and resumed
    "test_bench_commands.py": ("test_engines_side_by_side_on_the_real_model",),
    "test_bench_arms.py": (
        "test_fresh_arm_trains_on_a_new_disjoint_seed_split",
        "test_no_arm_ever_trains_on_a_held_out_prompt",
    ),
    "test_deployment.py": (
        "test_each_trigger_of_the_served_deployment_advances_the_run",
        "test_eva_run_reports_to_a_local_server_that_is_already_running",
        "test_the_probe_finds_a_prefect_api_and_nothing_else",
    ),
    "test_k8s_work_pool.py": ("test_the_pool_runs_flow_runs_as_gpu_jobs",),
    "test_prefect_server.py": (
        "test_eva_prefect_server_is_a_lasting_server_with_the_same_change",
        "test_the_temporary_server_stops_with_the_command_even_when_it_is_killed",
        "test_a_server_that_cannot_start_fails_in_one_message_with_its_log",
        "test_a_prefect_home_whose_folder_is_missing_is_one_line_naming_it",
        "test_subflows_opened_after_tasks_are_never_answered_503",
    ),
    "test_ray_cluster.py": (
        "test_rollouts_and_rewards_through_the_cluster_are_byte_identical",
        "test_an_s3_run_root_through_the_cluster",
    ),
    "test_online.py": (  # the module's online run, and what reads it
        "test_segments_walk_through_the_paper_phases",
        "test_informativeness_comes_from_the_trainers_rewards_and_children_inherit_it",
        "test_each_segment_changes_the_weights_and_is_evaluated",
        "test_online_run_publishes_its_summary_and_charts",
        "test_rerun_is_cached_and_show_prints_the_segments",
        "test_kill_9_mid_segment_resumes_to_the_same_buffer_and_prompts",
        "test_grpo_and_online_dpo_train_on_the_buffer_too",
    ),
    "test_corrupt_artifacts.py": (  # the module's run, and what reads it
        "test_an_unreadable_manifest_is_redone_alone_and_shown_in_one_line",
        "test_a_manifest_missing_its_key_is_redone_alone",
        "test_a_truncated_table_is_redone_alone_and_shown_in_one_line",
    ),
    "test_own_model.py": None,  # `eva run` in a process of its own, each test
    "test_real_model.py": None,  # SmolLM2 from its wheel: converted, sampled, a run
    "test_bench_real_model.py": ("test_the_device_script_runs_here_at_a_tiny_size_and_resumes",),
    "test_judge_e2e.py": None,  # `eva run` with an LLM judge and a reference model, served here
    "test_online_loop.py": ("test_evolution_overlaps_training_with_lag_and_costs_are_counted",),
    "test_online_skip_tied.py": ("test_a_resumed_segment_skips_exactly_as_an_uninterrupted_one",),
    "test_math_rlvr.py": (  # the GRPO recipe, run
        "test_recipe_trains_on_the_creators_prompts_on_cpu",
        "test_recipe_takes_chat_prompts_and_a_users_evolver",
        "test_recipe_resumes_from_its_last_checkpoint_as_an_uninterrupted_run",
    ),
    "test_edge_refusals.py": (
        "test_online_with_an_all_nan_reward_fails_the_segment_and_keeps_no_policy",
        "test_a_dead_prefect_api_is_one_line_naming_it",  # eva in processes of its own
        "test_the_smallest_temperature_draws_greedys_prompts_in_a_run",
        "test_a_data_files_folder_rewritten_with_its_mtimes_kept_yields_the_new_rows",
    ),
    "test_backend_served_generate.py": ("test_a_run_starts_one_server_per_checkpoint",),
    "test_backend_launch.py": (
        "test_stage_trains_through_accelerate_launch",
        "test_a_failing_launch_raises_with_its_last_lines",
        "test_a_sigkill_of_eva_leaves_no_training_behind",
    ),
    "test_multinode.py": ("test_two_machines_train_together",),
    "test_adapter_verl.py": ("test_v1_replay_buffer_observes_sampled_groups",),  # a side install
    "test_run_lock.py": ("test_a_paused_holder_taken_over_stops_before_its_next_write",),
    "test_run_folder.py": (  # `eva` on a copied, renamed or moved run, in processes of its own
        "test_a_copied_renamed_or_moved_run_is_the_folder_it_is_in",
        "test_a_forced_rerun_records_the_hash_of_the_input_it_read",
    ),
    "test_exit_status.py": ("test_twenty_launches_that_read_a_run_on_s3_all_exit_0",),
    "test_terminal.py": (
        "test_a_run_shows_no_library_bars_and_ends_with_what_to_do_next",
        "test_a_failing_stage_ends_the_command_with_one_line_and_its_traceback_in_the_run",
        "test_ctrl_c_ends_the_command_with_one_line_and_keeps_the_finished_stages",
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end runs in processes of their own (tests/conftest.py lists them); "
        "make test-fast leaves them out",
    )


# make runs the suite on two pytest-xdist workers (--dist loadgroup), one module's tests on one
# worker (its module fixtures built once). Modules that touch the same machine-wide state share a
# group, so they never run at once: Ray's ~/.ray/auth_token, which ray.init writes and which
# turns on token auth for every later `ray start`.
SHARED: dict[str, str] = {"test_adapter_verl.py": "ray", "test_ray_cluster.py": "ray"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker, and before xdist reads groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = E2E.get(item.path.name, ())
        if names is None or getattr(item, "originalname", item.name) in names:
            item.add_marker(pytest.mark.e2e)
        item.add_marker(pytest.mark.xdist_group(SHARED.get(item.path.name, item.path.name)))


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
    server (Prefect's app; SQLite writes begin IMMEDIATE, see eva_runtime/prefect_server.py)."""
    from eva_runtime.prefect_server import temporary_server

    database = tmp_path_factory.mktemp("prefect") / "prefect.db"
    with temporary_server(database_url=f"sqlite+aiosqlite:///{database}"):
        yield


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random 2-layer Llama with a real (fast, character-level) tokenizer and no chat
    template, on disk (the GPU tests' checkpoint for vLLM)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eva_world.tiny_lm import build_char_tokenizer

    path = tmp_path_factory.mktemp("llama")
    tok = build_char_tokenizer("0123456789+-=:abcdefghij ")
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=1,  # head_dim 64: supported by every vLLM attention backend
        num_key_value_heads=1, max_position_embeddings=128,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture
def serve_defaults() -> dict[str, Any]:
    """The options ``serve`` starts a server with unless a call gives its own; a test module
    overrides this fixture for defaults of its own (its ``respond``)."""
    return {}


@pytest.fixture
def serve(
    serve_defaults: dict[str, Any],
) -> Iterator[Callable[..., OpenAICompatibleServer]]:
    """Start real OpenAI-compatible servers on localhost (``tests.support.openai_server``) for
    one test, each stopped after it: ``serve(*script, **options)``, ``script`` the ``Step`` each
    request gets in turn, ``options`` the server's (``respond``, ``fail``, ``delay``, ...)."""
    from tests.support.openai_server import OpenAICompatibleServer

    servers: list[OpenAICompatibleServer] = []

    def start(*script: Any, **options: Any) -> OpenAICompatibleServer:
        server = OpenAICompatibleServer(script=script, **{**serve_defaults, **options})
        servers.append(server.__enter__())
        return server

    yield start
    for server in servers:
        server.__exit__()


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

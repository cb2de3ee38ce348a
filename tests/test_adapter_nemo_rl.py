"""eva's creator inside NeMo-RL's async GRPO trainer (``eva_adapters.nemo_rl``), driven through
NeMo-RL's own classes in the order its SingleController calls them.

NeMo-RL is not on the package registry (``nemo-rl`` there is a 0.0.0 placeholder): its package
is vendored unchanged at one commit in ``../shared/vendor/nemo-rl`` (or ``EVA_NEMO_RL_SRC`` names
another source root; ``tests/framework_checkout.py``) and put on ``sys.path``; the light packages
its data and data-plane modules import that eva's environment lacks go to a side folder
(``tests/side_env.py``; tensordict at verl's test pin, which NeMo-RL's code here runs on).
Without the source every test here fails, saying where it looked; the commit that ran is in each
test's id and printed (``pytest -s``).

NeMo-RL pins ``transformers<5.9`` and its policy package asserts ``<5.12`` on import; eva runs
5.2x. Everything these tests drive imports regardless, but for two things: the package
``nemo_rl.algorithms.async_utils`` whose ``__init__`` imports the whole GRPO trainer (its
modules are imported without that ``__init__``), and the three functions
``record_to_train_batch`` imports lazily from ``nemo_rl.algorithms.grpo`` and
``nemo_rl.experience.rollouts`` (loaded from those files at the same commit, as written there).

Real, NeMo-RL's own: ``load_response_dataset`` (the dotted ``dataset_name``), ``RawDataset``
and its default processor, ``AllTaskProcessedDataset``, the ``StatefulDataLoader`` with
``rl_collate_fn`` as ``setup_single_controller`` builds it, ``PromptGroupRecord`` /
``Completion``, ``TQReplayBuffer.reserve`` / ``commit`` (``record_to_train_batch``,
``pack_payload``) on ``NoOpDataPlaneClient`` (NeMo-RL's in-memory DataPlane), ``create_sampler``
from the pydantic ``SamplerConfig`` (``async_rl.sampler``), and the sampler calls in the order
of ``_rollout_pump`` (``admit`` per batch, ``reserve``/``commit`` per prompt) and
``_train_pump`` (``evict``, then ``select``, then the rows read and cleared).
Simulated, because they need an inference server and GPUs: generation and the environment's
reward. Each completion is built as ``AsyncRolloutImpl._run_single_rollout`` builds it (the
prompt's message log, an assistant turn with its generation logprobs, the environment's turn)
with a made-up reward: a prompt marked "split" gets 0/1/0/1, one marked "same" 1 everywhere.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, cast

import pytest

from tests import framework_checkout

SIDE = (
    "tensordict==0.10.0", "pyvers==0.1.0", "torchdata==0.11.0", "soundfile==0.14.0",
    "absl-py==2.5.1",
)  # fmt: skip
N = 4  # grpo.num_generations_per_prompt
STEP = 4  # grpo.num_prompts_per_step
PARTITION = "rollout_data"
SAMPLER = "eva_adapters.nemo_rl:EvaSampler"
ROOT = Path(__file__).resolve().parents[1]
DATASET = "eva_adapters.nemo_rl.EvaPromptDataset"
# torchdata 0.11's StatefulDataLoader calls a torch function torch deprecated since.
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def rewrite(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
    """The test rewriter (``data.train.eva.rewriter``): n deterministic variants per parent."""
    return [[f"{p['prompt']} Variant {j + 1}." for j in range(n)] for p in parents]


def rewards_for(text: str) -> list[float]:
    return [float(j % 2) for j in range(N)] if "split" in text else [1.0] * N


# --- NeMo-RL --------------------------------------------------------------------------------


# Every test's id names the commit it runs ([nemo_rl-<commit>], or [nemo_rl-absent]).
COMMIT = framework_checkout.describe("nemo_rl")


@pytest.fixture(scope="session", params=[COMMIT], ids=[f"nemo_rl-{COMMIT}"])
def nemo(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    with framework_checkout.activated(
        request, "nemo_rl", SIDE, "NeMo-RL's data modules need"
    ) as found:
        yield from nemo_rl_modules(found)


def nemo_rl_modules(found: framework_checkout.Checkout) -> Iterator[SimpleNamespace]:
    """NeMo-RL's classes and functions these tests drive, from the activated checkout; the two
    modules built from single functions leave ``sys.modules`` afterwards."""
    src = found.root / "nemo_rl"
    saved = {m: sys.modules.get(m) for m in
             ("nemo_rl.algorithms.grpo", "nemo_rl.experience.rollouts")}  # fmt: skip
    import nemo_rl.algorithms
    import torch

    if "nemo_rl.algorithms.async_utils" not in sys.modules:
        package = types.ModuleType("nemo_rl.algorithms.async_utils")
        package.__path__ = [str(src / "algorithms" / "async_utils")]
        sys.modules[package.__name__] = package
        nemo_rl.algorithms.async_utils = package  # type: ignore[attr-defined]
    sentinel = framework_checkout.load_functions(
        "nemo_rl.models.generation.interfaces", src / "models/generation/interfaces.py",
        ["ROUTED_EXPERTS_MISSING_ROUTE_SENTINEL"], {},
    ).ROUTED_EXPERTS_MISSING_ROUTE_SENTINEL  # fmt: skip
    rollouts = framework_checkout.load_functions(
        "nemo_rl.experience.rollouts", src / "experience/rollouts.py",
        ["_find_routed_experts_template", "backfill_missing_routed_experts"],
        {"torch": torch, "Optional": Optional, "Sequence": list,
         "ROUTED_EXPERTS_MISSING_ROUTE_SENTINEL": sentinel},
    )  # fmt: skip
    grpo = framework_checkout.load_functions(
        "nemo_rl.algorithms.grpo", src / "algorithms/grpo.py",
        ["extract_initial_prompt_messages", "add_grpo_token_loss_masks_and_generation_logprobs"],
        {"torch": torch, "cast": cast,
         "backfill_missing_routed_experts": rollouts.backfill_missing_routed_experts},
    )  # fmt: skip
    sys.modules["nemo_rl.experience.rollouts"] = rollouts
    sys.modules["nemo_rl.algorithms.grpo"] = grpo
    from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer
    from nemo_rl.algorithms.async_utils.staleness_sampler import (
        PromptGroupSampler,
        ReadyFirstSampler,
        SamplerConfig,
        create_sampler,
    )
    from nemo_rl.data.collate_fn import rl_collate_fn
    from nemo_rl.data.datasets import AllTaskProcessedDataset
    from nemo_rl.data.datasets.response_datasets import load_response_dataset
    from nemo_rl.data_plane.adapters.noop import NoOpDataPlaneClient
    from nemo_rl.experience.interfaces import Completion, PromptGroupRecord
    from pydantic import TypeAdapter
    from torchdata.stateful_dataloader import StatefulDataLoader

    from eva_adapters.nemo_rl_shared import shared

    yield SimpleNamespace(
        commit=found.commit, torch=torch, shared=shared, TQReplayBuffer=TQReplayBuffer,
        PromptGroupSampler=PromptGroupSampler, ReadyFirstSampler=ReadyFirstSampler,
        sampler_config=TypeAdapter(SamplerConfig).validate_python,
        create_sampler=create_sampler, rl_collate_fn=rl_collate_fn,
        AllTaskProcessedDataset=AllTaskProcessedDataset,
        load_response_dataset=load_response_dataset, NoOpDataPlaneClient=NoOpDataPlaneClient,
        Completion=Completion, PromptGroupRecord=PromptGroupRecord,
        StatefulDataLoader=StatefulDataLoader,
    )  # fmt: skip
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from tests.support.tiny_models import build_tokenizer

    return build_tokenizer(["Question 1: split. Variant 2.", "same ok correct"])


def seeds_file(path: Path, kinds: list[str]) -> str:
    rows = [{"input": f"Question {i}: {kind}.", "output": str(i)} for i, kind in enumerate(kinds)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class Run:
    """One SingleController's pieces, built as ``setup_single_controller`` and the actor's
    ``__init__`` build them, and its two pumps, one call at a time."""

    def __init__(self, nemo: SimpleNamespace, tokenizer: Any, prompts: str, *,
                 eva: dict[str, Any], sampler: dict[str, Any], name: str = "eva"):  # fmt: skip
        self.nemo, self.tok = nemo, tokenizer
        cfg = {"dataset_name": DATASET, "data_path": prompts, "num_prompts_per_step": STEP,
               "eva": eva, "eva_name": name}  # fmt: skip
        data = nemo.load_response_dataset(cfg)  # setup_response_data
        self.data = data
        dataset = nemo.AllTaskProcessedDataset(
            data.dataset, tokenizer, None, {data.task_name: (data.task_spec, data.processor)},
            max_seq_length=256,
        )  # fmt: skip
        self.loader = nemo.StatefulDataLoader(
            dataset, batch_size=STEP, shuffle=True, collate_fn=nemo.rl_collate_fn,
            drop_last=True, num_workers=0,
        )  # fmt: skip
        self.batches: Iterator[Any] | None = None  # the pump iterates after the actor starts
        self.dp = nemo.NoOpDataPlaneClient()
        self.dp.register_partition(partition_id=PARTITION, fields=[], num_samples=10_000,
                                   consumer_tasks=["train"])  # fmt: skip
        pad = tokenizer.pad_token_id
        self.buffer = nemo.TQReplayBuffer(
            self.dp, PARTITION, pad_value_dict={"token_ids": pad, "input_ids": pad}
        )
        config = nemo.sampler_config({"name": "custom", "target": SAMPLER, "eva_name": name,
                                      **sampler})  # fmt: skip
        self.sampler = nemo.create_sampler(self.buffer, config)
        self.sampler.set_dispatch_index(0)
        self.version = 0
        self.state = nemo.shared(name)

    def rollout(self, prompt: dict[str, Any]) -> Any:
        """A prompt group as ``AsyncRolloutImpl.run_rollout`` returns it."""
        text = prompt["message_log"][-1]["content"]
        completions = []
        for reward in rewards_for(text):
            log = copy.deepcopy(prompt["message_log"])
            torch = self.nemo.torch
            ids = torch.tensor(self.tok("ok", add_special_tokens=False)["input_ids"])
            log.append({"role": "assistant", "content": "ok", "token_ids": ids,
                        "generation_logprobs": torch.full((len(ids),), -0.5)})  # fmt: skip
            obs = "correct" if reward else "wrong"
            log.append({"role": "environment", "content": obs, "token_ids": torch.tensor(
                self.tok(obs, add_special_tokens=False)["input_ids"])})  # fmt: skip
            completions.append(self.nemo.Completion(
                message_log=log, env_extras=prompt["extra_env_info"], truncated=False,
                reward=reward))  # fmt: skip
        return self.nemo.PromptGroupRecord(
            prompt_idx=prompt["idx"], prompt=prompt["message_log"],
            extra_env_info=prompt["extra_env_info"], metadata={"task_name": prompt["task_name"]},
            completions=completions, rollout_metrics={},
        )  # fmt: skip

    async def dispatch(self) -> list[str]:
        """``_rollout_pump`` for one dataloader batch (a new epoch, a new pass of the
        dataloader, when one ends); returns the prompts' texts."""
        batch = next(self.batches, None) if self.batches is not None else None
        if batch is None:
            self.batches = iter(self.loader)
            batch = next(self.batches)
        target = await self.sampler.admit(trainer_version_fn=lambda: self.version)
        texts = []
        for i in range(batch.size):
            prompt = {k: v[i] for k, v in batch.items()}
            group = self.buffer.reserve(weight_version=self.version, target_step=target)
            await self.buffer.commit(group, self.rollout(prompt),
                                     start_weight_version=self.version,
                                     end_weight_version=self.version)  # fmt: skip
            texts.append(prompt["message_log"][-1]["content"])
        return texts

    async def train_step(self) -> list[list[float]]:
        """``_train_pump`` for one step: evict, select, read the chosen groups' rewards (as the
        advantage stage does) and clear them; returns those rewards, group by group."""
        await self.sampler.evict(current_train_weight=self.version)
        meta, count = await self.sampler.select(
            current_train_weight=self.version, min_prompt_groups=min(32, STEP),
            max_prompt_groups=STEP,
        )  # fmt: skip
        assert meta is not None and count == STEP
        rows = self.dp.get_samples(meta.sample_ids, PARTITION, ["total_reward"])["total_reward"]
        self.dp.clear_samples(meta.sample_ids, PARTITION)
        self.version += 1
        return [rows[i : i + N].tolist() for i in range(0, len(rows), N)]


def spy(state: Any) -> tuple[list[list[tuple[str, list[float]]]], dict[str, str]]:
    """Every group list the creator observes, and the text of every prompt it draws."""
    observed: list[list[tuple[str, list[float]]]] = []
    texts: dict[str, str] = {}
    real_observe, real_draw = state.creator.observe, state.creator.draw

    def observe(groups: Any) -> Any:
        groups = [(pid, list(r)) for pid, r in groups]
        observed.append(groups)
        return real_observe(groups)

    def draw(k: int) -> Any:
        records = real_draw(k)
        texts.update((r["prompt_id"], r["prompt"]) for r in records)
        return records

    state.creator.observe, state.creator.draw = observe, draw
    return observed, texts


EVA = {"rewriter": f"{__name__}:rewrite", "size": 4, "n_new": 2, "top_fraction": 0.5}
KINDS = ["split", "split", "same", "split", "split", "same", "split", "split"]


# --- the tests ------------------------------------------------------------------------------


def test_the_sampler_loads_as_async_rl_sampler_and_keeps_nemo_rls_staleness(
    nemo: SimpleNamespace, tokenizer: Any, tmp_path: Path
) -> None:
    prompts = seeds_file(tmp_path / "p.jsonl", KINDS)
    run = Run(nemo, tokenizer, prompts, eva=EVA,
              sampler={"staleness": "ready_first", "max_staleness_versions": 1})  # fmt: skip
    sampler = run.sampler
    assert isinstance(sampler, nemo.PromptGroupSampler)
    builtin = nemo.ReadyFirstSampler(run.buffer, max_staleness_versions=1)
    assert sampler.required_buffer_capacity(STEP) == builtin.required_buffer_capacity(STEP) == 8
    assert sampler.is_on_policy is builtin.is_on_policy is False

    async def admissions() -> None:
        # ready_first with one version of lookahead: two batches at trainer version 0, then wait.
        assert await sampler.admit(trainer_version_fn=lambda: 0) is None
        assert await sampler.admit(trainer_version_fn=lambda: 0) is None
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(sampler.admit(trainer_version_fn=lambda: 0), timeout=0.05)

    asyncio.run(admissions())
    for policy in ("in_order", "weight_fifo"):
        with pytest.raises(ValueError, match="whole dispatch"):
            nemo.create_sampler(run.buffer, nemo.sampler_config(
                {"name": "custom", "target": SAMPLER, "staleness": policy}))  # fmt: skip


def test_groups_reach_the_creator_and_children_of_informative_prompts_are_dispatched(
    nemo: SimpleNamespace, tokenizer: Any, tmp_path: Path
) -> None:
    prompts = seeds_file(tmp_path / "p.jsonl", KINDS)
    run = Run(nemo, tokenizer, prompts, eva=EVA,
              sampler={"staleness": "ready_first", "max_staleness_versions": 1})  # fmt: skip
    observed, texts = spy(run.state)

    async def steps() -> tuple[list[str], list[str], list[list[float]], int, list[str]]:
        first = await run.dispatch()  # admitted at version 0
        second = await run.dispatch()  # one version of lookahead
        trained = await run.train_step()
        out = len(run.state.creator.outstanding)  # drawn, not observed yet
        third = await run.dispatch()  # after the creator has seen both batches
        return first, second, trained, out, third

    first, second, trained, out, third = asyncio.run(steps())
    assert all("Variant" not in t for t in first + second)  # warm-up: the seeds
    # The train pump saw 8 ready groups and took the 4 most informative: split ones.
    assert all(r == [0.0, 1.0, 0.0, 1.0] for r in trained)
    # Every finished group reached the creator once, in creator batches of one step, with the
    # rewards its own rollouts got.
    assert [len(batch) for batch in observed] == [STEP, STEP]
    for pid, rewards in (g for batch in observed for g in batch):
        assert rewards == rewards_for(texts[pid])
    assert run.state.unmatched == 0 and out == 0
    # D is spent and B is full: the next batch the dataloader yields is children of split
    # prompts, the highest-priority ones.
    assert len(third) == STEP
    for text in third:
        assert "split" in text and "Variant" in text
    assert run.state.creator.stats.children == 8


def test_eviction_observes_a_stale_group_before_dropping_it(
    nemo: SimpleNamespace, tokenizer: Any, tmp_path: Path
) -> None:
    prompts = seeds_file(tmp_path / "p.jsonl", KINDS)
    run = Run(nemo, tokenizer, prompts, eva=EVA,
              sampler={"staleness": "windowed", "max_staleness_versions": 0})  # fmt: skip
    observed, _ = spy(run.state)

    async def steps() -> int:
        await run.dispatch()  # generated at weight version 0
        run.version = 2  # the trainer moved on: weight 0 is outside the window
        return await run.sampler.evict(current_train_weight=run.version)

    assert asyncio.run(steps()) == STEP
    assert len(run.buffer) == 0
    assert [len(batch) for batch in observed] == [STEP]


def test_the_state_file_resumes_with_the_same_next_batch(
    nemo: SimpleNamespace, tokenizer: Any, tmp_path: Path
) -> None:
    prompts = seeds_file(tmp_path / "p.jsonl", KINDS)
    path = tmp_path / "eva.json"
    eva = {**EVA, "state_path": str(path)}
    sampler = {"staleness": "ready_first", "max_staleness_versions": 1}
    run = Run(nemo, tokenizer, prompts, eva=eva, sampler=sampler)

    async def steps() -> list[str]:
        await run.dispatch()
        await run.dispatch()
        await run.train_step()  # observes both batches: the state file is written
        return await run.dispatch()

    assert not path.exists()
    uninterrupted = asyncio.run(steps())
    state = json.loads(path.read_text())
    assert state["observations"] == 2 and state["nemo_rl"]["keys"] == []
    resumed = Run(nemo, tokenizer, prompts, eva=eva, sampler=sampler, name="resumed")
    assert resumed.state.creator.observations == 2
    assert asyncio.run(resumed.dispatch()) == uninterrupted


def test_the_creator_travels_with_the_dataloader_into_the_controller(
    nemo: SimpleNamespace, tokenizer: Any, tmp_path: Path
) -> None:
    """``setup_single_controller`` builds the dataloader on the driver and Ray ships it to the
    SingleController actor, which builds the sampler: the sampler must find the copy that
    arrived, not the driver's."""
    import ray.cloudpickle

    prompts = seeds_file(tmp_path / "p.jsonl", KINDS)
    run = Run(nemo, tokenizer, prompts, eva=EVA, sampler={}, name="shipped")
    driver = run.state
    shipped = ray.cloudpickle.loads(ray.cloudpickle.dumps(run.loader))  # into the actor
    arrived = nemo.shared("shipped")
    assert arrived is not driver and arrived is shipped.dataset.dataset.state
    run.loader = shipped
    run.sampler = nemo.create_sampler(run.buffer, nemo.sampler_config(
        {"name": "custom", "target": SAMPLER, "eva_name": "shipped"}))  # fmt: skip
    run.sampler.set_dispatch_index(0)
    observed, _ = spy(arrived)

    async def steps() -> None:
        await run.dispatch()
        await run.train_step()

    asyncio.run(steps())
    assert [len(batch) for batch in observed] == [STEP]
    assert driver.creator.stats.observed == 0 and arrived.creator.stats.observed == STEP


def test_the_one_private_method_eva_uses_is_the_vendored_commits(nemo: SimpleNamespace) -> None:
    """NeMo-RL hands a sampler its replay buffer only, and the buffer has no public read of a
    group's fields: eva's sampler reads rewards and prompt ids through ``_call_dp``, the one
    private name of NeMo-RL that eva's adapters use (checked in their source below). This fails
    the day NeMo-RL changes it, before any run does."""
    import ast
    import inspect

    from nemo_rl.data_plane.interfaces import DataPlaneClient

    used = set()
    for module in ("nemo_rl", "nemo_rl_sampler", "nemo_rl_shared"):
        tree = ast.parse((ROOT / "eva_adapters" / f"{module}.py").read_text())
        for node in ast.walk(tree):
            own = (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and (node.value.id in ("self", "cls", "state"))
            )
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not own:
                used.add(node.attr)
    assert {name for name in used if not name.endswith("__")} == {"_call_dp"}
    call = nemo.TQReplayBuffer._call_dp
    assert inspect.iscoroutinefunction(call)
    assert list(inspect.signature(call).parameters) == ["self", "method_name", "kwargs"]
    assert list(inspect.signature(DataPlaneClient.get_samples).parameters) == [
        "self", "sample_ids", "partition_id", "select_fields",
    ]  # fmt: skip

    async def read() -> Any:  # through a real buffer and NeMo-RL's in-memory data plane
        dp = nemo.NoOpDataPlaneClient()
        dp.register_partition(partition_id=PARTITION, fields=[], num_samples=4,
                              consumer_tasks=["train"])  # fmt: skip
        buffer = nemo.TQReplayBuffer(dp, PARTITION, pad_value_dict={})
        from tensordict import TensorDict

        rewards = TensorDict({"total_reward": nemo.torch.tensor([[1.0], [0.0]])}, batch_size=[2])
        await buffer._call_dp(
            "put_samples", sample_ids=["a", "b"], partition_id=PARTITION, fields=rewards,
        )  # fmt: skip
        return await buffer._call_dp(
            "get_samples", sample_ids=["b"], partition_id=PARTITION,
            select_fields=["total_reward"],
        )  # fmt: skip

    assert asyncio.run(read())["total_reward"].tolist() == [[0.0]]

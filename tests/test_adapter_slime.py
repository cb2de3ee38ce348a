"""eva's creator inside slime (``eva_adapters.slime``), driven through slime's own rollout code.

slime is not on the package registry: its packages are vendored unchanged at one commit in
``../shared/vendor/slime`` (or ``EVA_SLIME_SRC`` names another source root;
``tests/framework_checkout.py``) and put on ``sys.path``, with ``pylatexenc`` (its reward hub's
one import eva's environment lacks) in a side folder (``tests/side_env.py``). Without the source
every test here fails, saying where it looked; the commit that ran is in each test's id and
printed (``pytest -s``).

Real, slime's own: ``Sample``, the ``DataSource`` base, ``load_function`` building the data
source from ``--data-source-path`` as ``RolloutManager.__init__`` does, slime's default rollout
function (``sglang_rollout.generate_rollout``) called through ``call_rollout_fn`` as
``RolloutManager.generate`` calls it, with its ``GenerateState``, over-sampling loop, dynamic
sampling filter (``check_reward_nonzero_std``), abort (over HTTP, to a stub router that lists no
engines), partial-rollout return through ``add_samples``, the all-samples hook, reward dispatch
(``rm_hub.async_rm`` to ``--custom-rm-path``), the manager's rollout-id check and flattening,
``save``/``load`` as the manager and ``create_training_models`` call them, and slime's own
``Dataset`` / ``RolloutDataSource`` to compare the samples with.
Simulated, because they need an SGLang server and GPUs: generation (``--custom-generate-
function-path``, slime's hook for custom generation, writes each response) and the reward
(``--custom-rm-path``): a prompt marked "split" gets rewards 0/1 by sample index, one marked
"same" gets 1 for every response.
Built by hand: ``args``, because ``slime.utils.arguments`` imports sglang and wandb; the
namespace below holds slime's defaults for the options these paths read.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import framework_checkout

SIDE = ("pylatexenc==2.11",)  # slime.rollout.rm_hub's import
N = 4  # --n-samples-per-prompt
ME = __name__  # where slime's load_function finds this module's hooks


def rewrite(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
    """The test rewriter (``eva_creator.rewriter``): n deterministic variants of each parent."""
    return [[f"{p['prompt']} Variant {j + 1}." for j in range(n)] for p in parents]


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """``--custom-generate-function-path``: the policy's response. A prompt marked "slow"
    takes 1 s (still running when the step has its groups), one marked "split" 0.05 s (so the
    tied groups finish first, and the over-sampling test knows which groups finish)."""
    await asyncio.sleep(1.0 if "slow" in sample.prompt else 0.05 if "split" in sample.prompt else 0)
    sample.response = "ok"
    sample.response_length = 1
    sample.tokens = [*range(len(sample.prompt.split())), 0]
    sample.status = type(sample).Status.COMPLETED
    return sample


def expected_reward(prompt: str, index: int) -> float:
    return float(index % 2) if "split" in prompt else 1.0


async def reward(args: Any, sample: Any, **kwargs: Any) -> float:
    """``--custom-rm-path``."""
    return expected_reward(sample.prompt, sample.index)


FINISHED: list[int] = []  # groups each rollout step finished (what the all-samples hook saw)


def observe_and_count(args: Any, all_samples: list[Any], data_source: Any) -> None:
    """A user's ``--rollout-all-samples-process-path`` that calls eva's."""
    from eva_adapters.slime import observe_all_samples

    FINISHED.append(len(all_samples))
    observe_all_samples(args, all_samples, data_source)


# --- slime, its router stub, a tokenizer ----------------------------------------------------


# Every test's id names the commit it runs ([slime-<commit>], or [slime-absent]).
COMMIT = framework_checkout.describe("slime")


@pytest.fixture(scope="session", params=[COMMIT], ids=[f"slime-{COMMIT}"])
def slime(request: pytest.FixtureRequest) -> Iterator[SimpleNamespace]:
    with framework_checkout.activated(request, "slime", SIDE, "slime's reward hub needs") as found:
        from slime.observability.rollout_data_utils import validate_rollout_id_annotated
        from slime.rollout import data_source, sglang_rollout
        from slime.rollout.base_types import call_rollout_fn
        from slime.utils import http_utils
        from slime.utils.data import Dataset
        from slime.utils.misc import load_function
        from slime.utils.types import Sample

        yield SimpleNamespace(
            commit=found.commit, Sample=Sample, DataSource=data_source.DataSource,
            RolloutDataSource=data_source.RolloutDataSource, Dataset=Dataset,
            sglang_rollout=sglang_rollout, call_rollout_fn=call_rollout_fn,
            load_function=load_function, validate=validate_rollout_id_annotated,
            http_utils=http_utils,
        )  # fmt: skip


class _Router(BaseHTTPRequestHandler):
    """The SGLang router as ``abort`` sees it: no engines to abort."""

    def do_GET(self) -> None:
        body = json.dumps({"workers": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="session")
def router() -> Iterator[tuple[str, int]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Router)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.support.tiny_models import build_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(["Question 1: split. Variant 2.", "same slow ok"]).save_pretrained(path)
    return str(path)


def seeds_file(path: Path, kinds: list[str]) -> str:
    rows = [{"input": f"Question {i}: {kind}.", "label": str(i), "meta": {"source_name": "toy"}}
            for i, kind in enumerate(kinds)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make_args(slime: SimpleNamespace, router: tuple[str, int], tokenizer: str, prompts: str,
              **overrides: Any) -> argparse.Namespace:  # fmt: skip
    """slime's args for these paths: its defaults (``slime/utils/arguments.py``, sglang's
    ``--sglang-server-concurrency`` aside) and the eva setup of the module doc."""
    args = argparse.Namespace(
        # data (add_data_arguments)
        rollout_global_dataset=True, prompt_data=prompts, input_key="input", label_key="label",
        metadata_key="meta", tool_key="tools", multimodal_keys=None, apply_chat_template=False,
        apply_chat_template_kwargs={}, rollout_batch_size=4, n_samples_per_prompt=N,
        data_source_path="eva_adapters.slime.EvaDataSource", save=None, load=None,
        dump_details=None,
        # rollout (add_rollout_arguments)
        hf_checkpoint=tokenizer, rollout_function_path="slime.rollout.sglang_rollout."
        "generate_rollout", rollout_seed=42, rollout_shuffle=False, rollout_temperature=1.0,
        rollout_top_p=1.0, rollout_top_k=-1, rollout_max_response_len=16,
        rollout_max_prompt_len=None, rollout_stop=None, rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False, over_sampling_batch_size=None,
        dynamic_sampling_filter_path=None, partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False, custom_generate_function_path=f"{ME}.generate",
        rollout_sample_hook_path=[], buffer_filter_path=None,
        # reward model (add_reward_model_arguments)
        rm_type=None, reward_key=None, group_rm=False, custom_rm_path=f"{ME}.reward",
        # rollout buffer (add_rollout_buffer_arguments)
        rollout_sample_filter_path=None, rollout_all_samples_process_path=f"{ME}.observe_and_count",
        # the router and engines (sglang's arguments, the cluster's)
        sglang_router_ip=router[0], sglang_router_port=router[1], sglang_server_concurrency=64,
        sglang_dp_size=None, rollout_num_engines=1, use_distributed_post=False, ci_test=False,
        # --custom-config-path eva.yaml
        eva_creator={"rewriter": f"{ME}:rewrite", "size": 4, "n_new": 2, "top_fraction": 0.5},
    )  # fmt: skip
    for key, value in overrides.items():
        setattr(args, key, value)
    if args.over_sampling_batch_size is None:  # as slime's argument validation sets it
        args.over_sampling_batch_size = args.rollout_batch_size
    return args


def start(slime: SimpleNamespace, args: argparse.Namespace) -> Any:
    """The data source as the rollout manager makes it, then ``load`` as
    ``create_training_models`` calls it (``start_rollout_id - 1``, -1 on a fresh start)."""
    slime.http_utils.init_http_client(args)
    slime.sglang_rollout.GenerateState.clear_instances()  # a singleton over the first args
    source = slime.load_function(args.data_source_path)(args)
    assert isinstance(source, slime.DataSource)
    source.load(-1 if args.load is None else args.start_rollout_id - 1)
    return source


def rollout(slime: SimpleNamespace, args: argparse.Namespace, source: Any, rid: int) -> list[Any]:
    """One ``RolloutManager.generate`` up to the samples: the rollout function through
    ``call_rollout_fn``, the rollout-id check, the flattening."""
    out = slime.call_rollout_fn(
        slime.load_function(args.rollout_function_path), args, rid, source, evaluation=False
    )
    data = out.samples
    slime.validate(data)
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    return data


def spy_observe(source: Any) -> list[list[tuple[str, list[float]]]]:
    """Every group list ``creator.observe`` receives (it still runs)."""
    seen: list[list[tuple[str, list[float]]]] = []
    real = source.creator.observe

    def observe(groups: Any) -> Any:
        groups = [(pid, list(rewards)) for pid, rewards in groups]
        seen.append(groups)
        return real(groups)

    source.creator.observe = observe
    return seen


def groups_of(samples: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for s in samples:
        out.setdefault(s.group_index, []).append(s)
    return out


# --- the tests ------------------------------------------------------------------------------


def test_seed_rows_become_the_samples_slimes_own_data_source_makes(
    slime: SimpleNamespace, router: tuple[str, int], tokenizer_dir: str, tmp_path: Path
) -> None:
    kinds = ["split", "same", "split", "same", "split", "same"]
    args = make_args(slime, router, tokenizer_dir, seeds_file(tmp_path / "p.jsonl", kinds),
                     apply_chat_template=True, rollout_batch_size=3)  # fmt: skip
    ours = start(slime, args)
    theirs = slime.RolloutDataSource(args)  # slime's: its Dataset over the same file
    assert len(ours) == len(theirs) == 6
    mine = ours.get_samples(3) + ours.get_samples(3)
    slimes = theirs.get_samples(3) + theirs.get_samples(3)
    for got in (mine, slimes):
        assert [len(g) for g in got] == [N] * 6
        assert [s.group_index for g in got for s in g] == [i // N for i in range(6 * N)]
        assert [s.index for g in got for s in g] == list(range(6 * N))
        assert all(isinstance(s, slime.Sample) for g in got for s in g)

    def view(groups: list[list[Any]]) -> list[tuple[str, str, dict[str, Any]]]:
        return sorted((s.prompt, s.label, {k: v for k, v in s.metadata.items() if k != "eva"})
                      for g in groups for s in g)  # fmt: skip

    # One pass over D: the same prompts (chat template applied), labels and metadata as slime's.
    assert view(mine) == view(slimes)
    assert "<|im_start|>user" in mine[0][0].prompt
    assert {g[0].metadata["eva"]["depth"] for g in mine} == {0}


def test_rewards_reach_the_creator_by_group_and_children_of_split_prompts_come_next(
    slime: SimpleNamespace, router: tuple[str, int], tokenizer_dir: str, tmp_path: Path
) -> None:
    kinds = ["split", "split", "same", "split", "split", "same", "split", "split"]
    args = make_args(slime, router, tokenizer_dir, seeds_file(tmp_path / "p.jsonl", kinds))
    source = start(slime, args)
    seen = spy_observe(source)
    FINISHED.clear()

    first = rollout(slime, args, source, 0)
    assert len(first) == 4 * N
    groups = groups_of(first)
    assert len(seen) == 1 and len(seen[0]) == 4 == FINISHED[0]
    by_prompt = {g[0].metadata["eva"]["prompt_id"]: g for g in groups.values()}
    for pid, rewards in seen[0]:  # each group's rewards, in its own samples' order
        group = by_prompt[pid]
        assert rewards == [expected_reward(s.prompt, s.index) for s in group]
        assert [s.reward for s in group] == rewards
    split = {pid for pid, g in by_prompt.items() if "split" in g[0].prompt}
    assert len(split) >= 2  # 6 of 8 seeds are split: at least 2 of any 4
    assert source.creator.outstanding == {}

    second = rollout(slime, args, source, 1)
    children = [g[0] for g in groups_of(second).values() if g[0].metadata["eva"]["from_buffer"]]
    # The buffer filled (2 parents x 2 children = size 4): mix-up draws half from it, and the
    # children of split prompts are the ones with priority.
    assert len(children) == 2
    for child in children:
        parent = child.metadata["eva"]["parent_id"]
        assert parent in split
        assert child.prompt.startswith(by_prompt[parent][0].prompt + " Variant")
        assert child.metadata["eva"]["depth"] == 1 and child.label is None
    assert len(seen) == 2 and source.creator.stats.observed == 8


def test_dropped_and_filtered_groups(
    slime: SimpleNamespace, router: tuple[str, int], tokenizer_dir: str, tmp_path: Path
) -> None:
    """Over-sampling with DAPO's filter: tied groups are filtered out of training but observed;
    groups still running when the step is full are let go, or with --partial-rollout come back
    through add_samples and are observed in the step that finishes them."""
    kinds = ["split", "same", "split slow", "same", "split", "same slow", "same", "same"]
    prompts = seeds_file(tmp_path / "p.jsonl", kinds)
    dapo = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    common = dict(
        rollout_batch_size=2, over_sampling_batch_size=8, dynamic_sampling_filter_path=dapo
    )
    for partial in (False, True):
        args = make_args(slime, router, tokenizer_dir, prompts, partial_rollout=partial, **common)
        source = start(slime, args)
        seen = spy_observe(source)
        FINISHED.clear()
        data = rollout(slime, args, source, 0)
        kept = groups_of(data)
        assert len(kept) == 2 and all("split" in g[0].prompt for g in kept.values())
        # All 6 fast groups finished and were observed, the 4 tied ones the filter dropped
        # included; the 2 slow ones were still running.
        assert FINISHED == [6] and len(seen[0]) == 6
        assert sum(r == [1.0] * N for _, r in seen[0]) == 4
        assert source.creator.stats.observed == 6
        slow = set(source.creator.outstanding)
        if not partial:
            assert slow == set() and source.buffer == []
            continue
        assert len(slow) == 2 and len(source.buffer) == 2
        assert {g[0].metadata["eva"]["prompt_id"] for g in source.buffer} == slow
        rollout(slime, args, source, 1)
        # Step 1 starts with the two finished slow groups and observes them under their ids.
        assert slow <= {pid for pid, _ in seen[1]}
        # What is out now is what slime gave back unfinished this step, nothing else.
        back = sorted(g[0].metadata["eva"]["prompt_id"] for g in source.buffer)
        assert back == sorted(p for p, drawn in source.creator.outstanding.items() for _ in drawn)


def test_save_and_load_resume_with_the_same_draws(
    slime: SimpleNamespace, router: tuple[str, int], tokenizer_dir: str, tmp_path: Path
) -> None:
    kinds = ["split", "split", "same", "split", "split", "same", "split", "split"]
    prompts = seeds_file(tmp_path / "p.jsonl", kinds)
    save = str(tmp_path / "ckpt")
    args = make_args(slime, router, tokenizer_dir, prompts, save=save)
    source = start(slime, args)
    for rid in (0, 1):
        rollout(slime, args, source, rid)
    source.save(1)  # RolloutManager.save, at the checkpoint after rollout 1
    assert (Path(save) / "rollout" / "eva_creator_1.json").is_file()
    uninterrupted = rollout(slime, args, source, 2)

    resumed_args = make_args(slime, router, tokenizer_dir, prompts, load=save,
                             start_rollout_id=2)  # fmt: skip
    resumed = start(slime, resumed_args)
    assert resumed.creator.observations == 2
    again = rollout(slime, resumed_args, resumed, 2)

    def view(samples: list[Any]) -> list[tuple[Any, ...]]:
        return [(s.group_index, s.index, s.prompt, s.label, s.reward, s.metadata["eva"])
                for s in samples]  # fmt: skip

    assert view(again) == view(uninterrupted)
    assert any(s.metadata["eva"]["from_buffer"] for s in again)  # children, from the state
    assert resumed.creator.state()["buffer"] == source.creator.state()["buffer"]

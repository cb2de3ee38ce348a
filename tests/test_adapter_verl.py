"""eva's creator inside verl 0.9 (``eva_adapters.verl``, ``eva_adapters.verl_v1``), driven
through verl's own classes.

verl 0.9.1 pins ``transformers<5.11`` (eva runs 5.2x), so it cannot join eva's environment;
the session fixture installs it ``--no-deps`` with the few light packages its dataset, protocol
and trainer modules import into a side folder (``tests/side_env.py``, cached under
``.pytest_cache``) that runs on eva's own torch, transformers and numpy. Where that install
fails (no package registry) every test here skips, saying why.

Real, verl's own: the config (``legacy_data.yaml`` / ``ppo_trainer.yaml`` from the wheel), the
dataset class lookup and build (``create_rl_dataset``), the sampler (``create_rl_sampler``), the
``StatefulDataLoader`` with ``collate_fn`` as the trainers build it, ``DataProto``, the trainer's
``_get_gen_batch``, ``repeat``/``union``/``reorder``, the agent loop's ``_postprocess`` (which
lays out rollouts and their ``rm_scores``), ``extract_reward``, the dataloader checkpoint
round trip, and for V1 a real TransferQueue on a local Ray with verl's ``ReplayBuffer.sample``.
Simulated, because it needs an inference server and GPUs: generation itself (each rollout's
response tokens and its reward score are made up here, deterministically) and, for the
colocated reward model, the reward model's forward pass.
"""

from __future__ import annotations

import copy
import os
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests import side_env

VERL = "0.9.1"
# verl --no-deps plus what its dataset, protocol, trainer and replay-buffer modules import and
# eva's environment lacks. hydra-core 1.3 (and omegaconf 2.3) need the ANTLR 4.9 runtime, which
# eva's 4.13 (math-verify's) would shadow: hydra 1.4rc and omegaconf 2.4.1rc vendor their own.
SIDE = (
    f"verl=={VERL}", "tensordict==0.10.0", "pyvers==0.1.0", "torchdata==0.11.0",
    "codetiming==1.4.0", "hydra-core==1.4.0rc3", "omegaconf==2.4.1rc1", "pylatexenc==2.11",
    "peft==0.21.2", "transferqueue==0.1.11", "msgspec==0.22.0", "pyzmq==27.3.0",
)  # fmt: skip
N = 2  # actor_rollout_ref.rollout.n
BATCH = 4  # data.train_batch_size
SEEDS = 8


def rewrite(parents: list[dict[str, Any]], n: int, seed: int) -> list[list[str]]:
    """The test rewriter (``data.eva.rewriter``): n deterministic variants of each parent."""
    return [[f"{p['prompt']} Then add {j + 1}." for j in range(n)] for p in parents]


def reward(text: str, rollout: int) -> float:
    """The simulated reward of a prompt's ``rollout``-th response: split for texts of odd
    length (informative), tied for the rest."""
    return float(rollout % 2) if len(text) % 2 else 1.0


@pytest.fixture(scope="session")
def verl(request: pytest.FixtureRequest) -> Any:
    """verl 0.9, imported from this environment or from the side folder."""
    target = None
    try:
        import verl as found
    except ImportError:
        cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
        root = Path(cache.mkdir("side-env") if cache else tempfile.gettempdir()) / "verl"
        try:
            target = side_env.install(SIDE, root)
        except RuntimeError as exc:
            pytest.skip(f"verl {VERL} cannot be installed into a side folder: {exc}")
        side_env.activate(target)
        try:
            import verl as found
        except ImportError as exc:
            pytest.skip(f"verl {VERL} was installed but does not import: {exc}")
    if not found.__version__.startswith("0.9."):
        pytest.skip(f"these tests target verl 0.9.x; this environment has {found.__version__}")
    where = "a side folder" if target is not None else "this environment"
    line = f"verl {found.__version__} ({where}: {Path(found.__file__).parent})"
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:  # the run's output says which verl ran
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n{Path(__file__).name}: {line}")
    print(line)
    yield found
    if target is not None:
        side_env.deactivate(target)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny character tokenizer with a chat template, saved as a model's would be."""
    from eva_world.tiny_lm import build_char_tokenizer

    tok = build_char_tokenizer("0123456789+-=?. abcdefghijklmnopqrstuvwxyzWAT")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    path = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(path)
    return str(path)


def _row(i: int, split: str) -> dict[str, Any]:
    return {
        "data_source": "toy",
        "prompt": [
            {"role": "system", "content": "Answer."},
            {"role": "user", "content": f"What is {i}+{i * 3}?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(4 * i)},
        "extra_info": {"index": i, "split": split},
    }


@pytest.fixture
def data_cfg(verl: Any, tmp_path: Path) -> Any:
    """verl's own data config (``legacy_data.yaml``) with the recipe's eva keys, as
    ``infra/verl/grpo-eva-0.9.yaml`` sets them, on a toy parquet."""
    import pandas as pd
    from omegaconf import OmegaConf

    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    pd.DataFrame([_row(i, "train") for i in range(SEEDS)]).to_parquet(train)
    pd.DataFrame([_row(100 + i, "test") for i in range(2)]).to_parquet(val)
    stock = Path(verl.__file__).parent / "trainer" / "config" / "data" / "legacy_data.yaml"
    recipe = OmegaConf.load(Path(__file__).parents[1] / "infra" / "verl" / "grpo-eva-0.9.yaml")
    cfg = OmegaConf.merge(OmegaConf.load(stock), recipe.data)
    cfg.train_files, cfg.val_files = str(train), str(val)
    cfg.train_batch_size, cfg.max_prompt_length = BATCH, 64
    cfg.filter_overlong_prompts = True  # RLHFDataset tokenizes each prompt to filter
    cfg.cache_dir = str(tmp_path / "cache")
    cfg.eva.rewriter = "tests.test_adapter_verl:rewrite"
    cfg.eva.size, cfg.eva.n_new, cfg.eva.max_chars = 4, 2, 200
    cfg.eva.state_path = str(tmp_path / "ckpt" / "eva-state.json")
    return cfg


def build(verl: Any, cfg: Any, tokenizer_dir: str, train: bool = True) -> tuple[Any, Any]:
    """A dataset and its DataLoader as ``RayPPOTrainer`` builds them (``main_ppo_v0`` /
    ``ray_trainer.py`` l. 396-425): the training loader, or the validation one."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.tokenizer import hf_tokenizer

    files = cfg.train_files if train else cfg.val_files
    dataset = create_rl_dataset(
        files, cfg, hf_tokenizer(tokenizer_dir), None, is_train=train,
        max_samples=cfg.get("train_max_samples", -1),
    )  # fmt: skip
    if not train:
        return dataset, StatefulDataLoader(
            dataset=dataset,
            batch_size=cfg.val_batch_size or len(dataset),
            num_workers=cfg["dataloader_num_workers"],
            shuffle=cfg.get("validation_shuffle", True),
            drop_last=False,
            collate_fn=collate_fn,
        )
    loader = StatefulDataLoader(
        dataset=dataset,
        batch_size=cfg.get("gen_batch_size") or cfg.train_batch_size,
        num_workers=cfg["dataloader_num_workers"],
        drop_last=True,
        collate_fn=collate_fn,
        sampler=create_rl_sampler(cfg, dataset),
    )
    return dataset, loader


def _rollouts(tokenizer: Any, batch: Any, streamed: bool) -> Any:
    """``AgentLoopManager.generate_sequences`` on the repeated batch: the responses and
    their scores are made up (no inference server on CPU); the padding to fixed lengths is the
    agent loop's; verl's own ``AgentLoopWorker._postprocess`` lays out the output, with the
    reward loop handles set (streamed reward) or not (colocated reward model)."""
    import torch
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopMetrics,
        AgentLoopWorker,
        _InternalAgentLoopOutput,
    )

    prompt_len, response_len, pad = 64, 8, tokenizer.pad_token_id
    outputs, uids = [], list(batch.non_tensor_batch["uid"])
    for i, chat in enumerate(batch.non_tensor_batch["raw_prompt"]):
        text, rollout = chat[-1]["content"], uids[:i].count(uids[i])
        ids = tokenizer.apply_chat_template(list(chat), add_generation_prompt=True, tokenize=False)
        ids = tokenizer(ids, add_special_tokens=False)["input_ids"][-prompt_len:]
        answer = tokenizer(str(rollout), add_special_tokens=False)["input_ids"]
        p = torch.tensor([[pad] * (prompt_len - len(ids)) + ids])
        r = torch.tensor([answer + [pad] * (response_len - len(answer))])
        pm = torch.tensor([[0] * (prompt_len - len(ids)) + [1] * len(ids)])
        rm = torch.tensor([[1] * len(answer) + [0] * (response_len - len(answer))])
        mask = torch.cat([pm, rm], dim=1)
        outputs.append(
            _InternalAgentLoopOutput(
                prompt_ids=p,
                response_ids=r,
                input_ids=torch.cat([p, r], dim=1),
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                response_mask=rm,
                attention_mask=mask,
                num_turns=2,
                metrics=AgentLoopMetrics(),
                reward_score=reward(text, rollout) if streamed else None,
                extra_fields={"reward_extra_info": {"acc": 0.0}} if streamed else {},
            )
        )
    worker = SimpleNamespace(reward_loop_worker_handles=["reward-loop"] if streamed else None)
    return AgentLoopWorker._postprocess(worker, outputs, batch.non_tensor_batch)


def legacy_step(batch_dict: dict[str, Any], tokenizer: Any, streamed: bool = True) -> Any:
    """One step of ``RayPPOTrainer.fit`` (verl 0.9.1 ``ray_trainer.py`` l. 1466-1635) up to
    the batch it hands ``train_dataset.on_batch_end``; rollouts from ``_rollouts``."""
    import torch
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.reward import extract_reward

    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array(
        [str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object
    )
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # uses nothing of the trainer
    gen_batch_output = gen_batch.repeat(repeat_times=N, interleave=True)
    gen_batch_output = _rollouts(tokenizer, gen_batch_output, streamed)
    batch = batch.repeat(repeat_times=N, interleave=True)
    batch = batch.union(gen_batch_output)
    # balance_batch reorders the rollouts (trainer.balance_batch, on by default)
    batch.reorder(torch.randperm(len(batch), generator=torch.Generator().manual_seed(0)))
    if not streamed:  # colocated reward model: _compute_reward_colocate's output, simulated
        scores = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32)
        uids = list(batch.non_tensor_batch["uid"])
        for i, chat in enumerate(batch.non_tensor_batch["raw_prompt"]):
            scores[i, 0] = reward(chat[-1]["content"], uids[:i].count(uids[i]))
        batch = batch.union(DataProto.from_dict(tensors={"rm_scores": scores}))
    reward_tensor, _ = extract_reward(batch)
    batch.batch["token_level_scores"] = reward_tensor
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    return batch


def legacy_fit(loader: Any, start: int, total: int):
    """``RayPPOTrainer.fit``'s loops: epochs from ``global_steps // len(loader)``, each over
    the dataloader; yields (step, batch_dict) up to step ``total``."""
    step = start
    for _epoch in range(step // len(loader), 10**6):
        for batch_dict in loader:
            step += 1
            yield step, batch_dict
            if step >= total:
                return


def _ids(batch_dict: dict[str, Any]) -> list[str]:
    return [e["eva_prompt_id"] for e in batch_dict["extra_info"]]


# --- the dataset ---------------------------------------------------------------------------


def test_verl_builds_the_eva_dataset_and_the_validation_set_stays_plain(
    verl: Any, data_cfg: Any, tokenizer_dir: str
) -> None:
    from verl.utils.dataset.rl_dataset import get_dataset_class

    from eva_adapters.verl import EvaDataset

    assert get_dataset_class(data_cfg) is EvaDataset
    train, loader = build(verl, data_cfg, tokenizer_dir)
    assert isinstance(train, EvaDataset) and train.creator is not None
    assert len(train) == SEEDS and len(loader) == SEEDS // BATCH
    val, val_loader = build(verl, data_cfg, tokenizer_dir, train=False)
    assert isinstance(val, EvaDataset) and val.creator is None
    rows = next(iter(val_loader))
    assert [e["index"] for e in rows["extra_info"]] == [100, 101]  # verl's rows, untouched

    bad = copy.deepcopy(data_cfg)
    bad.dataloader_num_workers = 8  # verl's default: each worker would hold its own creator
    with pytest.raises(ValueError, match="dataloader_num_workers=0"):
        build(verl, bad, tokenizer_dir)
    same = copy.deepcopy(data_cfg)
    same.val_files = same.train_files
    with pytest.raises(ValueError, match="validate on a copy"):
        build(verl, same, tokenizer_dir)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("eva.ratio_evol", 2.0, "data.eva.ratio_evol must be a number in [0, 1], got 2.0"),
        ("eva.ratio_evol", -1, "data.eva.ratio_evol must be a number in [0, 1], got -1"),
        ("eva.metric", "a_maxx", "data.eva.metric must be one of a_min, a_avg, a_dis, var, "),
        ("eva.rewriter", "my_pkg.nope:rewrite",
         "data.eva.rewriter cannot be imported (No module named 'my_pkg'), got "),
        ("eva.inherit", "data_source", "data.eva.inherit must be a list of column names"),
        ("eva.sizee", 3, "data.eva.sizee is not an eva creator option"),
        ("prompt_key", "question",
         "data.prompt_key 'question' is not a column of ["),
    ],
)  # fmt: skip
def test_options_are_refused_when_verl_builds_the_dataset_naming_their_key(
    verl: Any, data_cfg: Any, tokenizer_dir: str, key: str, value: Any, says: str
) -> None:
    from omegaconf import OmegaConf

    OmegaConf.update(data_cfg, key, value, force_add=True)
    with pytest.raises(ValueError) as refused:
        build(verl, data_cfg, tokenizer_dir)  # before any rollout: when verl builds the set
    message = str(refused.value)
    assert message.startswith(says) and "\n" not in message, message


def test_the_recipe_resumes_exactly_by_default(verl: Any, tokenizer_dir: str, tmp_path: Path):
    """The recipe's ``data.eva.state_path`` is a file in verl's checkpoint folder, so the legacy
    trainer resumes exactly without a key of the user's (V1 never needs it)."""
    import pandas as pd
    from omegaconf import OmegaConf

    config = Path(verl.__file__).parent / "trainer" / "config"
    recipe = OmegaConf.load(Path(__file__).parents[1] / "infra" / "verl" / "grpo-eva-0.9.yaml")
    full = OmegaConf.merge(
        OmegaConf.load(config / "_generated_ppo_trainer.yaml"),
        {"data": OmegaConf.load(config / "data" / "legacy_data.yaml")}, recipe,
    )  # fmt: skip
    full.trainer.default_local_dir = str(tmp_path / "ckpt")
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    pd.DataFrame([_row(i, "train") for i in range(SEEDS)]).to_parquet(train)
    pd.DataFrame([_row(100, "test")]).to_parquet(val)
    full.data.train_files, full.data.val_files = str(train), str(val)
    full.data.train_batch_size, full.data.cache_dir = BATCH, str(tmp_path / "cache")
    full.data.eva.rewriter = "tests.test_adapter_verl:rewrite"
    dataset, _ = build(verl, full.data, tokenizer_dir)
    assert dataset.state_path == str(tmp_path / "ckpt" / "eva-state.json")


def test_a_repeated_question_is_drawn_once_and_its_row_never(
    verl: Any, data_cfg: Any, tokenizer_dir: str, tmp_path: Path
) -> None:
    import pandas as pd

    rows = [_row(i, "train") for i in range(SEEDS)]
    rows[5]["prompt"][-1]["content"] = "WHAT is 1+3?"  # row 1's question, up to case
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    dataset, loader = build(verl, data_cfg, tokenizer_dir)
    assert dataset.creator.stats.duplicate_seeds == 1
    served = [e["index"] for d in loader for e in d["extra_info"]]  # 8 prompts: D is 7
    assert len(served) == SEEDS and set(served) == {0, 1, 2, 3, 4, 6, 7}
    data_cfg.eva.duplicates = "refuse"
    with pytest.raises(ValueError, match="duplicates row 1"):
        build(verl, data_cfg, tokenizer_dir)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed-reward", "reward-model"])
def test_legacy_steps_observe_and_children_are_drawn_next(
    verl: Any, data_cfg: Any, tokenizer_dir: str, streamed: bool
) -> None:
    from verl.utils.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tokenizer_dir)
    dataset, loader = build(verl, data_cfg, tokenizer_dir)
    drawn: list[dict[str, Any]] = []
    for step, batch_dict in legacy_fit(loader, 0, 3):
        drawn.append(batch_dict)
        batch = legacy_step(batch_dict, tok, streamed)
        # What verl hands on_batch_end: uids and extra_info always, index only without a
        # streamed reward (AgentLoopWorker._postprocess); eva needs only the first two.
        assert {"uid", "extra_info"} <= set(batch.non_tensor_batch)
        assert ("index" in batch.non_tensor_batch) is (not streamed)
        dataset.on_batch_end(batch=batch)
        assert dataset.creator.stats.observed == BATCH * step
    creator = dataset.creator
    # Step 1: 2 of its 4 seeds split their rewards; the top half (2 parents) got 2 children
    # each, filling B (size 4): step 2 mixes 2 children with 2 seeds.
    assert creator.stats.children >= 4
    kids = [
        (e, chat, ds, rm)
        for d in drawn[1:]
        for e, chat, ds, rm in zip(
            d["extra_info"], d["raw_prompt"], d["data_source"], d["reward_model"], strict=True
        )
        if e["eva_depth"] >= 1
    ]
    assert len(kids) >= 2
    for extra, chat, data_source, reward_model in kids:
        assert chat[0] == {"role": "system", "content": "Answer."}  # the seed's chat
        assert chat[-1]["content"].endswith("Then add 1.") or "Then add 2." in chat[-1]["content"]
        assert extra["eva_from_buffer"] and extra["eva_parent_id"]
        assert data_source == "toy" and reward_model is None  # inherit: data_source, ability
    assert all(len(set(_ids(d))) == BATCH for d in drawn)


@pytest.mark.parametrize("lag", [0, 1], ids=["lag0", "lag1"])
@pytest.mark.parametrize("at", [2, 3], ids=["epoch-boundary", "mid-epoch"])
def test_resume_from_verls_checkpoint_draws_the_same_next_prompts(
    verl: Any, data_cfg: Any, tokenizer_dir: str, tmp_path: Path, at: int, lag: int
) -> None:
    """The legacy trainer checkpoints inside step ``at`` (``train_dataloader.state_dict()``
    into ``data.pt``) before ``on_batch_end``; on resume it restores the dataloader unless
    the step ends an epoch (``_load_checkpoint``, ray_trainer.py l. 1103-1116)."""
    import torch
    from verl.utils.tokenizer import hf_tokenizer

    tok, total = hf_tokenizer(tokenizer_dir), 6
    data_cfg.eva.evolve_lag = lag  # 1: the rewriter in a thread, children a step later
    data_cfg.eva.state_path = str(tmp_path / "whole" / "eva-state.json")
    _, loader = build(verl, data_cfg, tokenizer_dir)
    dataset = loader.dataset
    whole = []
    for _, batch_dict in legacy_fit(loader, 0, total):
        whole.append(_ids(batch_dict))
        dataset.on_batch_end(batch=legacy_step(batch_dict, tok))

    data_cfg.eva.state_path = str(tmp_path / "ckpt" / "eva-state.json")
    dataset, loader = build(verl, data_cfg, tokenizer_dir)
    for step, batch_dict in legacy_fit(loader, 0, at):
        batch = legacy_step(batch_dict, tok)
        if step == at:  # _save_checkpoint, then on_batch_end (l. 1711-1712, 1818-1820)
            torch.save(loader.state_dict(), tmp_path / "data.pt")
        dataset.on_batch_end(batch=batch)  # then the run stops: a crash after step `at`

    _, resumed = build(verl, data_cfg, tokenizer_dir)  # a new process: the same build
    if at % len(resumed) != 0:
        resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False))
    after = []
    for _, batch_dict in legacy_fit(resumed, at, total):
        after.append(_ids(batch_dict))
        resumed.dataset.on_batch_end(batch=legacy_step(batch_dict, tok))
    assert after == whole[at:]


def test_without_state_path_the_checkpoint_still_resumes_mid_epoch(
    verl: Any, data_cfg: Any, tokenizer_dir: str, tmp_path: Path
) -> None:
    """verl's data.pt alone: the creator as it was when the checkpointed step was drawn, its
    prompts still outstanding (verl saved before their rewards came); they are not observed
    again, and the run goes on drawing from where it was."""
    import torch
    from verl.utils.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tokenizer_dir)
    data_cfg.eva.state_path = None
    dataset, loader = build(verl, data_cfg, tokenizer_dir)
    for step, batch_dict in legacy_fit(loader, 0, 3):
        batch = legacy_step(batch_dict, tok)
        if step == 3:
            torch.save(loader.state_dict(), tmp_path / "data.pt")
        dataset.on_batch_end(batch=batch)
    _, resumed = build(verl, data_cfg, tokenizer_dir)
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False))
    batch_dict = next(iter(resumed))
    creator = resumed.dataset.creator
    # Step 3's prompts (restored, unobserved) and step 4's (just drawn) are outstanding.
    assert creator.observations == 2
    assert sum(len(drawn) for drawn in creator.outstanding.values()) == 2 * BATCH
    resumed.dataset.on_batch_end(batch=legacy_step(batch_dict, tok))
    assert creator.observations == 3


def test_the_recipe_names_verls_keys(verl: Any) -> None:
    """Every key the recipe sets outside ``data.eva`` exists in verl's own trainer config."""
    from omegaconf import OmegaConf

    config = Path(verl.__file__).parent / "trainer" / "config"
    stock = OmegaConf.merge(
        OmegaConf.load(config / "_generated_ppo_trainer.yaml"),
        {"data": OmegaConf.load(config / "data" / "legacy_data.yaml")},
    )
    recipe = OmegaConf.load(Path(__file__).parents[1] / "infra" / "verl" / "grpo-eva-0.9.yaml")

    def keys(node: Any, prefix: str = "") -> list[str]:
        out = []
        for k, v in node.items():
            path = f"{prefix}{k}"
            out += keys(v, path + ".") if OmegaConf.is_dict(v) and k != "eva" else [path]
        return out

    for key in keys(recipe):
        if key.startswith("data.eva"):
            continue
        assert OmegaConf.select(stock, key, default="<missing>") != "<missing>", key


# --- V1 trainer: the replay buffer over a real TransferQueue -------------------------------


@pytest.fixture
def transfer_queue(verl: Any) -> Any:
    ray = pytest.importorskip("ray", reason="the V1 trainer's TransferQueue runs on Ray")
    tq = pytest.importorskip("transfer_queue")
    from omegaconf import OmegaConf

    if ray.is_initialized():
        pytest.skip("Ray is already running in this process (another test's cluster)")
    # Ray's workers start fresh interpreters: they find the side folder by PYTHONPATH.
    where = str(Path(verl.__file__).parents[1])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [where]
    # ray.init writes ~/.ray/auth_token when there is none, and a token there turns on token
    # auth for every later `ray start` on the machine (tests/test_ray_cluster.py's cluster
    # then refuses eva's readiness check): a token this fixture made goes with it.
    # ray.init also sets RAY_AUTH_MODE=token in this process's environment, which later
    # `ray start` children inherit: the environment is restored too.
    token = Path.home() / ".ray" / "auth_token"
    had_token, environ = token.exists(), dict(os.environ)
    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
    )  # fmt: skip
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
        tq.close()
    finally:
        ray.shutdown()
        if not had_token:
            token.unlink(missing_ok=True)
        os.environ.clear()
        os.environ.update(environ)


def _v1_rollouts(tq: Any, batch: Any, step: int) -> None:
    """``PPOTrainer._submit_batch_to_rollout`` and ``AgentLoopWorkerTQ``'s puts (verl 0.9.1
    ``trainer_base.py`` l. 1496-1512, ``agent_loop_tq.py`` l. 107-148, 182-227): each prompt's
    key, then per session a trajectory with the prompt's fields and ``rm_scores``, then the
    prompt marked finished. Responses and scores are made up, as in ``_rollouts``."""
    import torch
    from tensordict import NonTensorData, NonTensorStack
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    uids = list(batch["uid"])
    tags = [{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    for i, uid in enumerate(uids):
        prompt = {}
        for k, v in batch.items():
            if isinstance(v, torch.Tensor):
                prompt[k] = v[i]
            elif isinstance(v, NonTensorStack):
                prompt[k] = v[i].data
            elif isinstance(v, NonTensorData):
                prompt[k] = v.data
        text = prompt["raw_prompt"][-1]["content"]
        keys, fields, ttags = [], [], []
        for session in range(N):
            output = AgentLoopOutput(
                prompt_ids=[1, 2], response_ids=[5, 6, 7], response_mask=[1, 1, 1],
                reward_score=reward(text, session), metrics=AgentLoopMetrics(),
            )  # fmt: skip
            keys.append(f"{uid}_{session}_0")
            fields.append({**output.as_dict(), **prompt, "session_id": session})
            ttags.append({"status": "success", "global_steps": step, "seq_len": 5})
        tq.kv_batch_put(
            keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=ttags
        )
        tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})


def _within(seconds: float, fn: Any, **kwargs: Any) -> Any:
    """``fn(**kwargs)``, failing the test if it has not returned in ``seconds`` (the replay
    buffer polls until enough groups are finished: a missed put would hang it)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, **kwargs).result(timeout=seconds)
    finally:
        pool.shutdown(wait=False)


def test_v1_replay_buffer_observes_sampled_groups(
    verl: Any, data_cfg: Any, tokenizer_dir: str, transfer_queue: Any
) -> None:
    import verl.utils.tensordict_utils as tu
    from omegaconf import OmegaConf
    from verl.utils.import_utils import load_extern_object

    from eva_adapters.verl_v1 import EvaReplayBuffer

    tq = transfer_queue
    config = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    trainer = OmegaConf.merge(
        OmegaConf.load(config).trainer,
        OmegaConf.load(Path(__file__).parents[1] / "infra" / "verl" / "grpo-eva-0.9.yaml").trainer,
    )
    sampler = trainer.v1.sampler
    # PPOTrainer._build_replay_buffer for a custom sampler (trainer_base.py l. 146-163, 185).
    cls = load_extern_object(sampler.custom_sampler.path, sampler.custom_sampler.name)
    assert cls is EvaReplayBuffer
    buffer = cls(
        trainer_mode=trainer.v1.trainer_mode,
        trainer_config=trainer.v1.get(trainer.v1.trainer_mode, {}),
        max_off_policy_threshold=sampler.max_off_policy_threshold,
        max_off_policy_strategy=sampler.max_off_policy_strategy,
        sampler_kwargs=sampler.sampler_kwargs,
        refill_fn=None,
    )
    buffer.poll_interval = 0.05
    dataset, loader = build(verl, data_cfg, tokenizer_dir)
    it = iter(loader)
    drawn = []
    for step in (1, 2):
        # PPOTrainer._fetch_one_gen_batch / _next_train_batch (l. 1466-1494)
        batch_dict = next(it)
        drawn.append(_ids(batch_dict))
        batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in range(BATCH)], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", step)
        _v1_rollouts(tq, batch, step)
        sampled, metrics = _within(60, buffer.sample, global_steps=step, partition_id="train",
                                   batch_size=BATCH)  # fmt: skip
        assert len(sampled.keys) == BATCH * N
        assert metrics["eva/groups"] == BATCH
        tq.kv_clear(keys=sampled.keys, partition_id="train")
    assert dataset.creator.observations == 2 and dataset.creator.stats.children >= 4
    third = next(iter(loader))
    assert any(e["eva_depth"] >= 1 for e in third["extra_info"])

"""Every solver objective on a tiny GPT-2: real TRL trainers, losses checked against hand-computed
formulas from per-sequence log-probs (computed here without TRL), and a real training step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import TypeAdapter, ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.backends.protocols import Solver
from tasks.backends.train import SolverBackend
from tasks.backends.train.dpo import DPOSolverConfig, batch_layout
from tasks.backends.train.objectives import (
    DPONLLSolverConfig,
    ORPOSolverConfig,
    SimPOSolverConfig,
    SPPOSolverConfig,
)
from tasks.backends.train.trl_solver import build_trainer, truncate_prompts
from tasks.train import TrainConfig

PROMPTS = [f"{a}+{b}=" for a in range(4) for b in range(3)]  # 12 pairs
X, Y = "abc", "ghij"  # every pair prefers X over Y
FAST = {"learning_rate": 1e-3, "num_train_epochs": 1, "warmup_ratio": 0.0}
# Chosen lengths differ (1, 1, 2, 4 tokens + eos) so per-token and per-sequence means differ.
PAIRS = [("1+2=", "3", "12"), ("4+4=", "8", "44"), ("10+3=", "31", "7"), ("5+0=", "5abc", "ab")]
# compute_loss is called outside the solver's warning filter in these tests.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing:FutureWarning",
    "ignore:.*importing from 'trl.experimental'",
)

ALL = {
    "dpo": DPOSolverConfig,
    "simpo": SimPOSolverConfig,
    "orpo": ORPOSolverConfig,
    "sppo": SPPOSolverConfig,
    "dpo_nll": DPONLLSolverConfig,
}


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _token_logps(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def _completion_logps(model, tok, prompt: str, completion: str, bos: bool) -> torch.Tensor:
    """Per-token log-probs of ``completion + eos`` after ``prompt`` (after ``bos + prompt``
    for CPO/ORPO, which prepend the BOS token)."""
    prefix = ([tok.bos_token_id] if bos else []) + _ids(tok, prompt)
    return _token_logps(model, prefix + _ids(tok, completion) + [tok.eos_token_id])[
        len(prefix) - 1 :
    ]


def _perturbed_trainer(config, policy_dir: str, tmp_path: Path):
    prompts, chosen, rejected = (list(col) for col in zip(*PAIRS, strict=True))
    config = config.model_copy(update={"effective_batch_size": len(PAIRS)})
    trainer = build_trainer(config, policy_dir, prompts, chosen, rejected, str(tmp_path), 0)
    # Move the policy away from the reference/initialisation so the loss is not trivial.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    trainer.model.eval()
    batch = next(iter(trainer.get_train_dataloader()))  # all four pairs
    with torch.no_grad():
        loss = float(trainer.compute_loss(trainer.model, batch))
    return trainer, batch, loss


# The paper's appendix-A solver table, as eva resolves it: lr, scheduler, warmup, epochs,
# effective batch, max length, max prompt length, optimizer, then each objective's own knobs.
# DPO + NLL is not in the paper (the world's solver): it shares DPO's schedule.
PAPER = {
    "dpo": (5e-7, "cosine", 0.1, 2, 8, 2048, 1024, "adamw_torch", {"beta": 0.05}),
    "simpo": (8e-7, "cosine", 0.1, 1, 32, 2048, 1024, "adamw_torch", {"beta": 10.0, "gamma": 5.0}),
    "orpo": (5e-7, "cosine", 0.1, 1, 8, 2048, 1024, "adamw_torch", {"lambda_or": 0.5}),
    "sppo": (5e-7, "linear", 0.1, 6, 8, 1024, 512, "rmsprop", {"beta": 0.001}),
    "dpo_nll": (5e-7, "cosine", 0.1, 2, 8, 2048, 1024, "adamw_torch", {"beta": 0.05}),
}
SCHEDULE = (
    "learning_rate", "lr_scheduler_type", "warmup_ratio", "num_train_epochs",
    "effective_batch_size", "max_length", "max_prompt_length", "optim",
)  # fmt: skip


@pytest.mark.parametrize("kind", list(PAPER))
def test_every_solver_defaults_to_the_papers_table(kind: str):
    cfg = ALL[kind]()
    *schedule, own = PAPER[kind]
    assert tuple(getattr(cfg, f) for f in SCHEDULE) == tuple(schedule)
    assert {k: getattr(cfg, k) for k in own} == own
    assert cfg.per_device_train_batch_size is None  # derived from the effective batch
    assert isinstance(cfg.load(), Solver)
    # The DPO-family variants hand the same schedule to the DPO trainer they build.
    if hasattr(cfg, "to_dpo"):
        dpo = cfg.to_dpo()
        assert tuple(getattr(dpo, f) for f in SCHEDULE) == tuple(schedule)


def test_losses_and_kinds_dispatch():
    sppo = SPPOSolverConfig()
    assert sppo.to_dpo().loss_type == ["sppo_hard"]
    nll = DPONLLSolverConfig(nll_alpha=0.3, max_length=99).to_dpo()
    assert (nll.loss_type, nll.loss_weights, nll.beta, nll.max_length) == (
        ["sigmoid", "sft"],
        [1.0, 0.3],
        0.05,
        99,
    )
    adapter = TypeAdapter(SolverBackend)
    for kind, cls in ALL.items():
        assert type(adapter.validate_python({"kind": kind})) is cls
        assert adapter.validate_python(cls().model_dump()) == cls()
    # kind is required: a section without it does not silently become DPO.
    with pytest.raises(ValidationError, match="Unable to extract tag using discriminator 'kind'"):
        adapter.validate_python({"learning_rate": 1e-3})
    assert TrainConfig.model_validate({"solver": {"kind": "orpo"}}).solver == ORPOSolverConfig()
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        adapter.validate_python({"kind": "ppo"})
    with pytest.raises(ValidationError, match="lambda_or"):
        adapter.validate_python({"kind": "orpo", "lambda_or": 0})
    with pytest.raises(ValidationError, match="Extra inputs"):
        adapter.validate_python({"kind": "simpo", "loss_type": ["sigmoid"]})


def test_the_effective_batch_is_split_into_device_batch_and_accumulation(
    policy_dir: str, tmp_path: Path
):
    # (effective, per-device, processes) -> (per-device, accumulation), worked by hand.
    assert batch_layout(8, None, 1) == (8, 1)
    assert batch_layout(64, None, 8) == (8, 1)  # the paper's 8 GPUs x 8
    assert batch_layout(64, 2, 8) == (2, 4)  # 2 per device x 4 accumulation x 8 GPUs
    assert batch_layout(32, 4, 1) == (4, 8)
    with pytest.raises(ValueError, match="effective_batch_size 8 cannot be split evenly over 3"):
        batch_layout(8, None, 3)  # 8 pairs cannot split over 3 GPUs
    with pytest.raises(ValueError, match="not a multiple of per-device batch 3 x 2 processes"):
        batch_layout(8, 3, 2)
    # Refused at the edge, before anything runs, with the launcher's process count.
    with pytest.raises(ValidationError, match="effective_batch_size 8 cannot be split evenly"):
        TrainConfig(launcher="accelerate", num_processes=3, solver={"kind": "dpo"})
    assert TrainConfig(num_processes=3, solver={"kind": "dpo"}).processes == 1  # in-process
    # The trainer gets the derived layout: 12 pairs, 6 per step as 3 x 2 accumulation.
    config = DPOSolverConfig(**FAST, effective_batch_size=6, per_device_train_batch_size=3)
    trainer = build_trainer(config, policy_dir, PROMPTS, [X] * 12, [Y] * 12, str(tmp_path), 0)
    args = trainer.args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (3, 2)
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.parametrize("kind", list(ALL))
def test_a_training_run_moves_every_weight_towards_chosen(
    kind: str, policy_dir: str, tmp_path: Path
):
    out = tmp_path / "out"
    rows = (
        ALL[kind](**FAST, effective_batch_size=6)
        .load()
        .train(policy_dir, PROMPTS, [X] * 12, [Y] * 12, str(out), seed=0)
    )
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    assert not (out / "training_args.bin").exists()
    before = AutoModelForCausalLM.from_pretrained(policy_dir)
    after = AutoModelForCausalLM.from_pretrained(str(out))
    b, a = before.state_dict(), after.state_dict()
    assert all(not torch.equal(b[k], a[k]) for k in b), kind
    tok = AutoTokenizer.from_pretrained(str(out))

    def margin(model) -> float:
        with torch.no_grad():
            return sum(
                float(
                    _completion_logps(model, tok, p, X, False).sum()
                    - _completion_logps(model, tok, p, Y, False).sum()
                )
                for p in PROMPTS
            )

    assert margin(after) > margin(before), kind  # log p(X) - log p(Y) rose


def test_simpo_loss_matches_hand_computation(policy_dir: str, tmp_path: Path):
    beta, gamma = 10.0, 5.0
    trainer, batch, trl_loss = _perturbed_trainer(SimPOSolverConfig(), policy_dir, tmp_path)
    tok, model = trainer.processing_class, trainer.model
    # CPO feeds [bos] + prompt + completion + eos (bos = <eos> for this tokenizer).
    first = [tok.bos_token_id, *_ids(tok, "1+2="), *_ids(tok, "3"), tok.eos_token_id]
    assert batch["chosen_input_ids"][0, : len(first)].tolist() == first
    with torch.no_grad():
        losses = [
            -F.logsigmoid(
                beta
                * (
                    _completion_logps(model, tok, p, c, True).mean()
                    - _completion_logps(model, tok, p, r, True).mean()
                )
                - gamma
            )
            for p, c, r in PAIRS
        ]
    assert trl_loss == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)


def test_orpo_loss_matches_hand_computation(policy_dir: str, tmp_path: Path):
    lam = 0.5
    trainer, _, trl_loss = _perturbed_trainer(ORPOSolverConfig(), policy_dir, tmp_path)
    tok, model = trainer.processing_class, trainer.model
    token_nll, odds = [], []
    with torch.no_grad():
        for p, c, r in PAIRS:
            a_c = _completion_logps(model, tok, p, c, True).mean()
            a_r = _completion_logps(model, tok, p, r, True).mean()
            log_odds = (a_c - a_r) - (torch.log1p(-a_c.exp()) - torch.log1p(-a_r.exp()))
            odds.append(F.logsigmoid(log_odds))
            # TRL's NLL covers the chosen sequence's prompt tokens too, averaged per token.
            full = [tok.bos_token_id, *_ids(tok, p), *_ids(tok, c), tok.eos_token_id]
            token_nll.append(-_token_logps(model, full))
    by_hand = torch.cat(token_nll).mean() - lam * torch.stack(odds).mean()
    assert trl_loss == pytest.approx(float(by_hand), rel=1e-5)


def _logratio(policy, ref, tok, prompt: str, completion: str) -> torch.Tensor:
    return (
        _completion_logps(policy, tok, prompt, completion, False).sum()
        - _completion_logps(ref, tok, prompt, completion, False).sum()
    )


def test_sppo_hard_loss_matches_hand_computation(policy_dir: str, tmp_path: Path):
    beta = 0.5  # targets +-1/(2 beta) = +-1: the log-ratios visibly matter at this scale
    trainer, _, trl_loss = _perturbed_trainer(SPPOSolverConfig(beta=beta), policy_dir, tmp_path)
    tok, model = trainer.processing_class, trainer.model
    ref = AutoModelForCausalLM.from_pretrained(policy_dir)
    with torch.no_grad():
        losses = [
            (_logratio(model, ref, tok, p, c) - 0.5 / beta) ** 2
            + (_logratio(model, ref, tok, p, r) + 0.5 / beta) ** 2
            for p, c, r in PAIRS
        ]
    assert trl_loss == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)


def test_dpo_nll_loss_matches_hand_computation(policy_dir: str, tmp_path: Path):
    beta, alpha = 0.3, 0.7
    config = DPONLLSolverConfig(beta=beta, nll_alpha=alpha)
    trainer, _, trl_loss = _perturbed_trainer(config, policy_dir, tmp_path)
    tok, model = trainer.processing_class, trainer.model
    ref = AutoModelForCausalLM.from_pretrained(policy_dir)
    with torch.no_grad():
        dpo = torch.stack(
            [
                -F.logsigmoid(
                    beta * (_logratio(model, ref, tok, p, c) - _logratio(model, ref, tok, p, r))
                )
                for p, c, r in PAIRS
            ]
        ).mean()
        chosen = [-_completion_logps(model, tok, p, c, False) for p, c, _ in PAIRS]
    per_token = torch.cat(chosen).mean()  # TRL: one mean over all chosen tokens of the batch
    per_sequence = torch.stack([c.mean() for c in chosen]).mean()
    assert trl_loss == pytest.approx(float(dpo + alpha * per_token), rel=1e-5)
    assert abs(float(per_token - per_sequence)) > 1e-3  # the two normalisations differ here


def test_prompts_are_cut_to_their_last_tokens(policy_dir: str, tmp_path: Path):
    tok = AutoTokenizer.from_pretrained(policy_dir)
    assert truncate_prompts(tok, ["123+456=", "1+2="], 4) == (["456=", "1+2="], 1)
    config = DPOSolverConfig(max_prompt_length=3, effective_batch_size=2)
    trainer = build_trainer(
        config, policy_dir, ["123+4=", "1="], ["5", "5"], ["6", "6"], str(tmp_path), 0
    )
    assert trainer.train_dataset["prompt_ids"] == [_ids(tok, "+4="), _ids(tok, "1=")]
    # A prompt cap above the (position-table-limited) max_length still leaves a response token.
    long = "1+" * 40 + "1="  # 82 tokens; the tiny model has 64 positions
    config = SimPOSolverConfig(max_prompt_length=1000)
    trainer = build_trainer(config, policy_dir, [long], ["5"], ["6"], str(tmp_path), 0)
    assert len(trainer.train_dataset["prompt_input_ids"][0]) == 64  # bos + last 63 tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_dpo_step_on_gpu(policy_dir: str, tmp_path: Path):
    rows = (
        DPOSolverConfig(**FAST, effective_batch_size=6, bf16=True, device="auto")
        .load()
        .train(policy_dir, PROMPTS, [X] * 12, [Y] * 12, str(tmp_path / "out"), seed=0)
    )
    assert all(math.isfinite(r["loss"]) for r in rows)
    before = AutoModelForCausalLM.from_pretrained(policy_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_no_pairs_with_on_no_pairs_fail_stops_the_stage_naming_the_setting(tmp_path: Path):
    from types import SimpleNamespace

    import pyarrow as pa

    from tasks.stage import StageError
    from tasks.train import train

    ctx = SimpleNamespace(model_dir=lambda name: str(tmp_path))
    empty = pa.table({"prompt": pa.array([], pa.string()), "chosen": pa.array([], pa.string()),
                      "rejected": pa.array([], pa.string())})  # fmt: skip
    with pytest.raises(StageError, match="no preference pairs to train on") as e:
        train.fn(ctx, TrainConfig(on_no_pairs="fail"), pairs=empty)
    assert e.value.field == "train.on_no_pairs" and "keep_policy" in (e.value.hint or "")

"""The TRL DPO solver on a tiny GPT-2: real DPOTrainer, real from_pretrained / save_pretrained."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from tasks.backends.protocols import Solver
from tasks.backends.train.dpo import DPOSolverConfig
from tasks.backends.train.trl_solver import build_trainer

PROMPTS = [f"{a}+{b}=" for a in range(6) for b in range(6)]
X, Y = "abc", "ghij"  # every pair prefers X over Y
# Big steps, so a handful of them visibly move a randomly initialised model.
FAST = {"learning_rate": 1e-3, "beta": 0.1, "num_train_epochs": 1, "warmup_ratio": 0.0}


def _seq_logp(model, tok, prompt: str, completion: str) -> torch.Tensor:
    """Sum of log p(completion + eos | prompt), computed without TRL."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    c = [*tok(completion, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    ids = torch.tensor([p + c])
    logits = model(input_ids=ids).logits[0, :-1].float()
    logps = logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    return logps[len(p) - 1 :].sum()


def _margin(model_dir: str) -> float:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    with torch.no_grad():
        return sum(
            float(_seq_logp(model, tok, p, X) - _seq_logp(model, tok, p, Y)) for p in PROMPTS
        ) / len(PROMPTS)


def _weights(model_dir: str) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(model_dir).state_dict()


def test_config_defaults_are_the_papers_and_validate():
    cfg = DPOSolverConfig()
    assert (cfg.beta, cfg.learning_rate, cfg.num_train_epochs) == (0.05, 5e-7, 2)
    assert (cfg.lr_scheduler_type, cfg.warmup_ratio, cfg.loss_type) == ("cosine", 0.1, ["sigmoid"])
    assert isinstance(cfg.load(), Solver)
    with pytest.raises(ValidationError, match="loss_weights"):
        DPOSolverConfig(loss_type=["sigmoid", "sft"], loss_weights=[1.0])
    with pytest.raises(ValidationError):
        DPOSolverConfig(warmup_ratio=1.0)


def test_training_prefers_chosen_and_saves_a_loadable_checkpoint(
    policy_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    out = tmp_path / "out"
    seen: list[float] = []
    rows = (
        DPOSolverConfig(**FAST, effective_batch_size=6)
        .load()
        .train(policy_dir, PROMPTS, [X] * 36, [Y] * 36, str(out), seed=0, progress=seen.append)
    )
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))

    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # 36 pairs / 6 per step, 1 epoch
    # Step 1's loss is computed before any update, when policy == reference: -log sigmoid(0).
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert rows[0]["rewards/margins"] == 0.0
    assert rows[-1]["loss"] < 0.5 and rows[-1]["rewards/accuracies"] == 1.0
    assert {"rewards/chosen", "rewards/rejected", "learning_rate", "logps/chosen"} <= set(rows[0])
    assert seen == sorted(seen) and seen[-1] == 1.0

    before, after = _weights(policy_dir), _weights(str(out))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert set(changed) == set(before)  # every tensor moved
    assert _margin(str(out)) > _margin(policy_dir) + 5.0  # log p(X) - log p(Y) rose clearly


def test_same_seed_gives_identical_weights(policy_dir: str, tmp_path: Path):
    solver = DPOSolverConfig(**FAST, effective_batch_size=4).load()
    chosen = [X if i % 2 else Y for i in range(36)]  # mixed pairs: batch order matters
    rejected = [Y if i % 2 else X for i in range(36)]
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        solver.train(policy_dir, PROMPTS, chosen, rejected, str(tmp_path / name), seed=seed)
    a, b, c = (_weights(str(tmp_path / n)) for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


# compute_loss is called outside TRLSolver.train's warning filter here.
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_trainer_loss_matches_dpo_computed_by_hand(policy_dir: str, tmp_path: Path):
    pairs = [("1+2=", "3", "12"), ("4+4=", "8", "44"), ("10+3=", "31", "7"), ("5+0=", "5", "ab")]
    prompts, chosen, rejected = (list(col) for col in zip(*pairs, strict=True))
    beta = 0.3
    config = DPOSolverConfig(beta=beta, effective_batch_size=len(pairs))
    trainer = build_trainer(config, policy_dir, prompts, chosen, rejected, str(tmp_path), 0)
    # Move the policy away from the reference so the loss is not trivially log 2.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    batch = next(iter(trainer.get_train_dataloader()))  # all four pairs, in sampler order
    with torch.no_grad():
        trl_loss = float(trainer.compute_loss(trainer.model, batch))

    ref = AutoModelForCausalLM.from_pretrained(policy_dir)
    tok = AutoTokenizer.from_pretrained(policy_dir)
    trainer.model.eval()
    losses = []
    with torch.no_grad():
        for prompt, c, r in pairs:
            policy = trainer.model
            chosen_ratio = _seq_logp(policy, tok, prompt, c) - _seq_logp(ref, tok, prompt, c)
            rejected_ratio = _seq_logp(policy, tok, prompt, r) - _seq_logp(ref, tok, prompt, r)
            losses.append(-F.logsigmoid(beta * (chosen_ratio - rejected_ratio)))
    by_hand = float(torch.stack(losses).mean())
    assert abs(by_hand - math.log(2)) > 0.05  # the perturbation made the check meaningful
    assert trl_loss == pytest.approx(by_hand, abs=1e-5)


def test_rejects_empty_or_ragged_pairs(policy_dir: str, tmp_path: Path):
    solver = DPOSolverConfig().load()
    with pytest.raises(ValueError, match="no preference pairs to train on"):
        solver.train(policy_dir, [], [], [], str(tmp_path / "x"), seed=0)
    with pytest.raises(ValueError, match="lengths differ"):
        solver.train(policy_dir, ["1+1="], ["2", "3"], ["4"], str(tmp_path / "x"), seed=0)
    assert not (tmp_path / "x").exists()

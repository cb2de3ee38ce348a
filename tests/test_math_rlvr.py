"""Math RLVR: the math-verify verifier, its TRL reward with majority-vote labels, and the GRPO
recipe (infra/trl/grpo_math.py) run end to end on a tiny Qwen2 built here."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from eva_runtime.errors import EvaError

PROJECT = Path(__file__).resolve().parents[1]
needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None,
    reason="math-verify is not installed (pip install -e '.[math]')",
)


@needs_math_verify
@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        (r"so the answer is \boxed{1/2}", "0.5", 1.0),
        (r"\boxed{\frac{1}{2}}", "1/2", 1.0),
        ("x = 3", "3", 1.0),
        ("12 + 3 = 15", "15", 1.0),  # the final number
        (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),  # a reference in bare LaTeX
        (r"\boxed{2} no, wait: \boxed{5}", "5", 1.0),  # the last box, not the set {2, 5}
        (r"\boxed{2} no, wait: \boxed{5}", "2", 0.0),
        ("The answer is 4", "3", 0.0),
        ("-4", "4", 0.0),
        ("banana", "3", 0.0),
        ("", "3", 0.0),
        (r"\boxed{", "3", 0.0),  # an unclosed box
        ("3", "", 0.0),  # no reference: nothing to agree with
        (None, "3", 0.0),
    ],
)
def test_verify(response: str, answer: str, expected: float) -> None:
    from tasks.backends.reward.math_verify import verify

    assert verify(response, answer) == expected


@needs_math_verify
def test_extract_is_one_string_per_value() -> None:
    from tasks.backends.reward.math_verify import extract

    assert {extract(r) for r in (r"\boxed{1/2}", "0.5", r"so \boxed{\frac{1}{2}}")} == {
        r"\frac{1}{2}"
    }
    assert extract("1/3") == extract(r"\boxed{\frac13}") == r"\frac{1}{3}"
    assert extract("x = 3") == "3"
    assert extract("banana") == ""


@needs_math_verify
def test_grpo_reward_labels_unanswered_prompts_by_majority() -> None:
    from tasks.backends.reward.math_verify import grpo_reward

    # Groups interleaved on purpose: they are found by prompt text, not by position.
    batch = [
        ("A", "0.5", r"\boxed{1/2}"),
        ("B", None, r"\boxed{7}"),
        ("C", "", "1"),
        ("A", "0.5", "0.6"),
        ("B", None, "so 7.0"),
        ("C", "", "2"),
        ("B", None, "7"),
        ("C", "", "3"),
        ("B", None, "8"),
        ("C", "", "banana"),
        ("D", None, r"\boxed{1/2}"),
        ("D", None, "0.5"),
        ("E", "", "5"),
        ("E", "", "5"),
        ("E", "", "6"),
        ("E", "", "banana"),
    ]
    prompts, answers, completions = (list(c) for c in zip(*batch, strict=True))
    got = grpo_reward(prompts, completions, answers, extra_column=[0] * len(batch))
    by_prompt: dict[str, list[float | None]] = {}
    for p, r in zip(prompts, got, strict=True):
        by_prompt.setdefault(p, []).append(r)
    assert by_prompt == {
        "A": [1.0, 0.0],  # known answer
        "B": [1.0, 1.0, 1.0, 0.0],  # 7 has 3 of 4 votes (7.0 counts as 7)
        "C": [None] * 4,  # 1, 2, 3: a tie, no label
        "D": [1.0, 1.0],  # 1/2 and 0.5 vote together
        "E": [1.0, 1.0, 0.0, 0.0],  # 5 has 2 of 4: exactly the 0.5 threshold
    }
    strict = grpo_reward(prompts, completions, answers, vote_threshold=0.75)
    assert [r for p, r in zip(prompts, strict, strict=True) if p == "E"] == [None] * 4
    assert [r for p, r in zip(prompts, strict, strict=True) if p == "B"] == [1.0, 1.0, 1.0, 0.0]


def test_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.backends.reward.math_verify import verify

    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails as if not installed
    with pytest.raises(EvaError) as info:
        verify("3", "3")
    assert info.value.line() == (
        "math_verify: the math verifier needs the math-verify package "
        "(pip install -e '.[math]' (math-verify==0.9.0))"
    )


def _recipe():
    spec = importlib.util.spec_from_file_location("grpo_math", PROJECT / "infra/trl/grpo_math.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_math_verify
def test_default_evolver_changes_one_number() -> None:
    assert _recipe().change_a_number(["What is 3 + 4?", "no numbers"]) == [
        ["What is 3 + 5?", "What is 5 + 4?", "What is 3 + 7?", "What is 7 + 4?"],
        [],
    ]


@needs_math_verify
def test_recipe_records_what_the_creator_reads() -> None:
    import numpy as np

    from eva_core.informativeness import informativeness

    recipe = _recipe()
    reward = recipe.RecordedReward(vote_threshold=0.5)
    prompts = ["P1"] * 4 + ["P2"] * 4 + ["P3"] * 4
    completions = ["3", "4", "3", "x"] + ["5"] * 4 + ["1", "2", "1", "2"]
    answers = ["3"] * 4 + [""] * 8
    assert reward(prompts, completions, answers) == [1.0, 0.0, 1.0, 0.0] + [1.0] * 4 + [None] * 4
    # One group of three has a learning signal: P2's labelled answers all agree, P3 is a tie.
    assert (reward.groups, reward.groups_with_signal) == (3, 1)
    matrix = recipe.reward_rows(reward.rewards, ["P1", "P2", "P3", "never drawn"])
    assert matrix.shape == (4, 4) and np.isnan(matrix[2:]).all()
    got = informativeness(matrix, "a_avg")  # max - mean
    assert got[:2].tolist() == [0.5, 0.0] and np.isnan(got[2:]).all()


@needs_math_verify
def test_recipe_runs_two_rounds_on_cpu(tmp_path: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.support.tiny_models import build_tokenizer

    rows = [
        {"prompt": f"What is {a} + {b}? Put the answer in \\boxed{{}}.", "answer": str(a + b)}
        for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (8, 3)]
    ]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = build_tokenizer([r["prompt"] + " \\boxed{12} 0123456789" for r in rows], 300)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")

    out = tmp_path / "out"
    log = _recipe().main(
        [
            *("--model", str(tmp_path / "policy"), "--prompts", str(data), "--out", str(out)),
            *("--rounds", "2", "--steps-per-round", "2", "--num-generations", "4"),
            *("--prompts-per-step", "2", "--max-completion-length", "8"),
            *("--learning-rate", "1e-3"),
        ]
    )

    assert [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()] == log
    first, second = log
    # Round 1: the seeds, all answered; 2 steps x 2 prompts = 4 groups of 4 completions.
    assert (first["prompts"], first["children"], first["groups"]) == (8, 0, 4)
    assert 0.0 <= first["reward_mean"] <= 1.0 and 0.0 <= first["signal_share"] <= 1.0
    # The creator drew 25% of the 4 prompts GRPO scored and wrote its 4 children; 80% of 8
    # would be 6 children, so the 2 missing are seeds too.
    assert first["parents"] == 1 and first["evolved"] == 4
    assert (first["next_evolved"], first["next_original"]) == (4, 4)
    seeds = [json.loads(x) for x in (out / "round_1" / "prompts.jsonl").read_text().splitlines()]
    nxt = [json.loads(x) for x in (out / "round_2" / "prompts.jsonl").read_text().splitlines()]
    kids = [r for r in nxt if r["source"] == "evolved"]
    assert len(kids) == 4 and all(r["answer"] is None for r in kids)
    assert {r["parent_id"] for r in kids} <= {r["prompt_id"] for r in seeds}
    # Round 2: the children had no answer; each drawn one was labelled or dropped.
    assert second["children"] == 4 and second["groups"] == 4
    assert (
        second["children_labelled"] + second["children_dropped"] + second["children_not_drawn"] == 4
    )
    assert "parents" not in second  # no creator after the last round
    assert (out / "model" / "config.json").exists()
    assert (out / "model" / "tokenizer.json").exists()
    assert all(math.isfinite(v) for v in (first["reward_mean"], second["signal_share"]))

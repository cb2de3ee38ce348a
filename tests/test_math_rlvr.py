"""Math RLVR: the math-verify verifier, its TRL reward with majority-vote labels, and the GRPO
recipe (infra/trl/grpo_math.py) run end to end on a tiny Qwen2 built here."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from typing import Any

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
def test_recipe_refuses_a_bad_prompt_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = _recipe()
    cases = {
        "missing.jsonl": None,  # not written
        "field.jsonl": '{"question": "1+1?", "answer": "2"}\n',
        "json.jsonl": '{"prompt": "1+1?"}\n{"prompt": \n',
        "twice.jsonl": '{"prompt": "1+1?"}\n{"prompt": " 1+1? "}\n',
        "empty.jsonl": "\n",
    }
    expected = {
        "missing.jsonl": "cannot read",
        "field.jsonl": "line 1: no text 'prompt' field (it has ['answer', 'question'])",
        "json.jsonl": "line 2: not JSON",
        "twice.jsonl": "row 1: prompt duplicates row 0 after normalization",
        "empty.jsonl": "holds no prompts",
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        argv = ["--model", "unused", "--prompts", str(path), "--out", str(tmp_path / "o")]
        with pytest.raises(SystemExit) as exit_:
            recipe.main(argv)
        assert exit_.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert "error: --prompts: " in line, line  # argparse: "<prog>: error: ..."
        assert expected[name] in line, line
    assert not (tmp_path / "o").exists()  # refused before anything was written


@needs_math_verify
def test_each_step_logs_what_the_creator_read(tmp_path: Path) -> None:
    from eva_adapters.trl import Draw
    from eva_core.creator import Creator, Observation

    recipe = _recipe()
    creator = Creator([{"prompt": "P1", "answer": "3"}, {"prompt": "P2", "answer": None}])
    log = recipe.StepLog(str(tmp_path / "steps.jsonl"), creator)
    records = [{"answer": "3", "depth": 0}, {"answer": None, "depth": 1},
               {"answer": None, "depth": 1}]  # fmt: skip
    nan = float("nan")
    rewards = [[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [nan] * 4]  # known, voted, no label
    log(Draw(7, records, "mixup"), rewards, Observation(["a", "b", "c"], [0.5, 0.0, nan], [0]))
    (row,) = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert row == log.rows[0] == {
        "step": 7, "phase": "mixup", "prompts": 3, "reward_mean_known": 0.5,
        "reward_mean_voted": 1.0, "signal_share": 1 / 3, "children_trained": 2,
        "children_unlabelled": 1, "parents": 1, "children_joined": 0, "buffer": 0,
    }  # fmt: skip


def _tiny_policy(path: Path, texts: list[str]) -> None:
    """A 2-layer Qwen2 whose every next-token distribution is the same: mostly "7" and " ",
    some end-of-text, a little "8". Its embeddings are all one vector, so every position's
    hidden state is the same, and its output head maps that state to these logits. Its
    completions ("7 77  7") end in a number, right for the prompts whose answer is 7, and their
    majority votes can label a child: a random policy would score 0 everywhere and leave the
    creator, the votes and GRPO's update nothing to do."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.support.tiny_models import build_tokenizer

    tok = build_tokenizer(texts, 300)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        hidden = model.model(input_ids=torch.tensor([[5, 9, 30, 7]])).last_hidden_state[0]
        assert torch.allclose(hidden[0], hidden[-1], atol=1e-5)
        h = hidden[-1]
        model.lm_head.weight.zero_()  # every other token: logit 0
        for token, logit in {"7": 8.4, "Ġ": 9.1, tok.eos_token: 7.1, "8": 5.7}.items():
            model.lm_head.weight[tok.convert_tokens_to_ids(token)] = logit * h / h.dot(h)
    model.save_pretrained(path)
    tok.save_pretrained(path)


@needs_math_verify
def test_recipe_trains_on_the_creators_prompts_on_cpu(tmp_path: Path) -> None:
    rows = [
        {"prompt": f"What is {a} + {b}? Put the answer in \\boxed{{}}.", "answer": str(a + b)}
        for a, b in [(1, 6), (3, 4), (5, 2), (7, 1), (2, 6), (4, 4), (6, 1), (8, 0)]
    ]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _tiny_policy(tmp_path / "policy", [r["prompt"] + " 0123456789" for r in rows])

    out = tmp_path / "out"
    log = _recipe().main(
        [
            *("--model", str(tmp_path / "policy"), "--prompts", str(data), "--out", str(out)),
            *("--steps", "4", "--num-generations", "4", "--prompts-per-step", "4"),
            *("--max-completion-length", "8", "--learning-rate", "1e-3", "--buffer-size", "8"),
        ]
    )

    assert [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()] == log
    assert [r["step"] for r in log] == [0, 1, 2, 3] and all(r["prompts"] == 4 for r in log)
    first, second = log[0], log[1]
    # Step 0: seeds, all answered: some completions right and some wrong, so some groups teach;
    # the top half (2 of 4) are evolved into 4 children each, which join B.
    assert first["phase"] == "warmup" and first["children_trained"] == 0
    assert 0.0 < first["reward_mean_known"] < 1.0 and 0.0 < first["signal_share"] <= 1.0
    assert first["reward_mean_voted"] is None  # no child yet: nothing labelled by a vote
    assert (first["parents"], first["children_joined"], first["buffer"]) == (2, 8, 8)
    # Step 1 was fetched before step 0 ended (the loader fetches one batch ahead): seeds too.
    # The 8 seeds are then spent, so every later prompt comes from B (bootstrap): children
    # without answers, which majority votes label (or leave unlabelled).
    assert [r["phase"] for r in log] == ["warmup", "warmup", "bootstrap", "bootstrap"]
    assert [r["children_trained"] for r in log] == [0, 0, 4, 4]
    assert log[2]["reward_mean_known"] is None and log[2]["reward_mean_voted"] is not None
    assert second["parents"] == 2
    assert (out / "model" / "config.json").exists()
    assert (out / "model" / "tokenizer.json").exists()


def one_child(prompts: list[str]) -> list[str]:
    """A user's rewriter as --evolver names it: one child (a string) per parent."""
    return [p + " Then double it." for p in prompts]


@needs_math_verify
def test_recipe_takes_chat_prompts_and_a_users_evolver(tmp_path: Path) -> None:
    rows = [{"prompt": f"What is {a} + 3?", "answer": str(a + 3)} for a in (1, 2, 3, 4)]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _tiny_policy(tmp_path / "policy", [r["prompt"] + " Then double it. 0123456789" for r in rows])

    out = tmp_path / "out"
    first, second = _recipe().main(
        [
            *("--model", str(tmp_path / "policy"), "--prompts", str(data), "--out", str(out)),
            *("--steps", "2", "--num-generations", "2", "--prompts-per-step", "2"),
            *("--max-completion-length", "4", "--chat", "--buffer-size", "2"),
            *("--evolver", "tests.test_math_rlvr:one_child"),
        ]
    )
    # 2 prompts scored, the top one evolved into its one child, which fills B (size 2 after
    # the second step): the user's children, a string each, joined.
    assert (first["parents"], first["children_joined"]) == (1, 1)
    assert (second["parents"], second["children_joined"], second["buffer"]) == (1, 1, 2)


def raises(prompts: list[str]) -> list[str]:
    raise RuntimeError("the rewriter's endpoint is down")


def an_int(prompts: list[str]) -> int:
    return 3


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--top-fraction", "1.5"], "--top-fraction must be in (0, 1]"),
        (["--ratio-evolved", "2"], "--ratio-evolved must be in [0, 1]"),
        (["--vote-threshold", "0"], "--vote-threshold must be in (0, 1]"),
        (["--prompts-per-step", "0"], "--prompts-per-step must be >= 1"),
        (["--evolver", "no_such_module_xyz:f"], "--evolver: cannot import module"),
        (["--out", "FILE"], "is a file; give a folder"),
    ],
)
def test_recipe_arguments_are_checked_before_anything_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    data = tmp_path / "math.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
    (tmp_path / "FILE").write_text("")
    extra = [str(tmp_path / "FILE") if a == "FILE" else a for a in extra]
    argv = ["--model", str(tmp_path / "nowhere"), "--prompts", str(data),
            "--out", str(tmp_path / "out"), *extra]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        _recipe().main(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before the model is even loaded


@needs_math_verify
@pytest.mark.parametrize(
    ("evolver", "says"),
    [
        ("raises", "raised RuntimeError: the rewriter's endpoint is down"),
        ("an_int", "returned int"),
    ],
)
def test_a_failing_rewriter_ends_the_run_in_one_line_with_the_policy_saved(
    tmp_path: Path, evolver: str, says: str
) -> None:
    rows = [{"prompt": f"What is {a} + 3?", "answer": str(a + 3)} for a in (1, 2, 3, 4)]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _tiny_policy(tmp_path / "policy", [r["prompt"] + " 0123456789" for r in rows])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        _recipe().main(
            [
                *("--model", str(tmp_path / "policy"), "--prompts", str(data), "--out", str(out)),
                *("--steps", "2", "--num-generations", "2", "--prompts-per-step", "4"),
                *("--max-completion-length", "4", "--evolver", f"tests.test_math_rlvr:{evolver}"),
            ]
        )
    message = str(exited.value.code)
    assert message.startswith(f"grpo_math: --evolver tests.test_math_rlvr:{evolver}: {says}")
    assert "\n" not in message and "step 1's policy is saved" in message
    assert (out / "model" / "config.json").exists()  # step 1's training was not lost


@needs_math_verify
def test_recipe_resumes_from_its_last_checkpoint_as_an_uninterrupted_run(tmp_path: Path) -> None:
    rows = [{"prompt": f"What is {a} + 3?", "answer": str(a + 3)} for a in range(1, 9)]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _tiny_policy(tmp_path / "policy", [r["prompt"] + " 0123456789" for r in rows])

    def run(out: Path, *extra: str) -> list[dict[str, Any]]:
        return _recipe().main(
            [
                *("--model", str(tmp_path / "policy"), "--prompts", str(data), "--out", str(out)),
                *("--steps", "4", "--num-generations", "2", "--prompts-per-step", "2"),
                *("--max-completion-length", "4", "--save-steps", "2", "--buffer-size", "4"),
                *extra,
            ]
        )

    whole = run(tmp_path / "whole")
    cut = tmp_path / "cut"
    run(cut)
    shutil.rmtree(cut / "trainer" / "checkpoint-4")  # as if it had been killed after step 2
    rest = run(cut, "--resume")
    assert [r["step"] for r in rest] == [2, 3] and rest == whole[2:]
    logged = [json.loads(x) for x in (cut / "steps.jsonl").read_text().splitlines()]
    assert logged[-2:] == whole[2:]

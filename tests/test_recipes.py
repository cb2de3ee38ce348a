"""The paper recipes in configs/ load and validate without any weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import ConfigError, load_config

RECIPES = sorted((Path(__file__).parent.parent / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path: Path) -> None:
    cfg = load_config(str(path))
    # The paper's creator settings, whatever the solver.
    assert cfg.generate.n == 6 and cfg.score.metric == "a_min"
    assert cfg.sample.fraction == 0.25 and cfg.evolve.num_evolutions == 4
    assert cfg.mix.ratio_evolved == 0.8 and cfg.prompts.limit == 10_000
    assert cfg.annotate.reward.kind == "sequence_classifier"


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("dpo", "dpo", {"beta": 0.05, "learning_rate": 5e-7, "num_train_epochs": 2}),
        ("simpo", "simpo", {"beta": 10.0, "learning_rate": 8e-7}),
        ("orpo", "orpo", {}),
        ("sppo", "sppo", {"beta": 0.001}),
    ],
)
def test_solver_recipes_carry_the_paper_defaults(name: str, kind: str, expected: dict) -> None:
    cfg = load_config(str(Path(__file__).parent.parent / "configs" / "paper" / f"{name}.yaml"))
    solver = cfg.train.solver
    assert solver.kind == kind and cfg.run == f"gemma2-9b-armorm-{name}"
    for field, value in expected.items():
        assert getattr(solver, field) == value, field


def test_extends_cycle_and_missing_file_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(str(tmp_path / "a.yaml"))
    with pytest.raises(ConfigError, match="no file at"):
        load_config(str(tmp_path / "missing.yaml"))
    (tmp_path / "c.yaml").write_text("extends: d.yaml\nsample: {fraction: 0.5}\n")
    (tmp_path / "d.yaml").write_text("sample: {method: greedy}\nseed: 3\n")
    cfg = load_config(str(tmp_path / "c.yaml"))
    assert (cfg.sample.fraction, cfg.sample.method, cfg.seed) == (0.5, "greedy", 3)

"""The paper recipes in configs/ load and validate without any weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import ConfigError, OnlineRunConfig, load_config
from flows.config import RunConfig as RunConfigModel
from tasks.backends.train.dpo import batch_layout

CONFIGS = Path(__file__).parent.parent / "configs"
RECIPES = sorted(p for p in (CONFIGS / "paper").glob("*.yaml") if not p.name.startswith("online"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path: Path) -> None:
    cfg = load_config(str(path))
    # The paper's creator settings, whatever the solver.
    assert cfg.generate.n == 6 and cfg.score.metric == "a_min"
    assert cfg.sample.fraction == 0.25 and cfg.evolve.num_evolutions == 4
    assert cfg.mix.ratio_evolved == 0.8 and cfg.prompts.limit == 10_000
    assert cfg.annotate.reward.kind == "sequence_classifier"
    # The API evolver names its key's variable; the served policy's client needs none.
    evolver = cfg.evolve.evolver
    assert evolver.kind == "distilabel" and evolver.temperature == 0.88
    assert evolver.llm.api_key_env == "OPENAI_API_KEY" and evolver.llm.model == "gpt-4o-mini"
    backend = cfg.generate.backend
    assert backend.kind == "served" and backend.client.llm.concurrency == 64
    assert backend.client.llm.api_key_env is None


def test_online_recipe_carries_the_papers_online_settings() -> None:
    cfg = load_config(str(CONFIGS / "paper" / "online-rloo.yaml"), None, OnlineRunConfig)
    buffer, solver = cfg.online.buffer, cfg.online.solver
    assert (buffer.size, buffer.ratio_evol, buffer.top_fraction) == (3200, 0.5, 0.5)
    assert (buffer.n_new, buffer.n_new_bootstrap, buffer.metric) == (4, 2, "a_avg")
    assert solver.kind == "rloo" and solver.use_vllm and solver.vllm_mode == "server"
    assert cfg.online.budget == 1.0 and cfg.prompts.limit == 10_000
    assert cfg.online.reward.kind == "sequence_classifier"
    assert cfg.online.evolver.kind == "distilabel"
    assert cfg.online.evolver.llm.api_key_env == "OPENAI_API_KEY"
    assert cfg.bootstrap.init_checkpoint == "google/gemma-2-9b-it"


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("dpo", "dpo", {"beta": 0.05, "learning_rate": 5e-7, "num_train_epochs": 2}),
        ("simpo", "simpo", {"beta": 10.0, "learning_rate": 8e-7, "effective_batch_size": 32}),
        ("orpo", "orpo", {"lambda_or": 0.5, "num_train_epochs": 1}),
        ("sppo", "sppo", {"beta": 0.001, "num_train_epochs": 6, "max_length": 1024}),
    ],
)
def test_solver_recipes_carry_the_paper_defaults(name: str, kind: str, expected: dict) -> None:
    cfg = load_config(str(Path(__file__).parent.parent / "configs" / "paper" / f"{name}.yaml"))
    solver = cfg.train.solver
    assert solver.kind == kind and cfg.run == f"gemma2-9b-armorm-{name}"
    for field, value in expected.items():
        assert getattr(solver, field) == value, field
    # base.yaml trains on 8 GPUs: the paper's effective batch is split over them.
    assert cfg.train.processes == 8
    assert batch_layout(solver.effective_batch_size, None, 8) == (
        solver.effective_batch_size // 8,
        1,
    )


def test_the_world_config_is_a_file_and_defaults_elsewhere_are_the_papers(tmp_path: Path):
    demo = load_config(None)  # no --config: configs/world.yaml
    assert demo == load_config(str(CONFIGS / "world.yaml"))
    solver = demo.train.solver
    assert (solver.kind, solver.learning_rate, solver.effective_batch_size) == ("dpo_nll", 2e-4, 32)
    assert (solver.beta, solver.max_length, demo.pairs.min_chosen_reward) == (0.1, 64, 1.0)
    assert demo.generate.backend.max_new_tokens == 10
    assert demo.prompts.source is not None and demo.prompts.source.options["size"] == 3000
    # One rule: a file that names a section without extending the world gets the paper's
    # defaults there; one that extends it keeps the world's, exactly like --set does.
    (tmp_path / "own.yaml").write_text("train: {launcher: accelerate}\n")
    own = load_config(str(tmp_path / "own.yaml")).train.solver
    assert (own.kind, own.learning_rate, own.effective_batch_size, own.beta) == (
        "dpo", 5e-7, 8, 0.05
    )  # fmt: skip
    world = CONFIGS / "world.yaml"
    (tmp_path / "ext.yaml").write_text(f"extends: {world}\ntrain: {{launcher: accelerate}}\n")
    assert load_config(str(tmp_path / "ext.yaml")).train.solver == solver
    assert load_config(None, ["train.launcher=accelerate"]).train.solver == solver
    online = load_config(None, None, OnlineRunConfig)
    assert online == load_config(str(CONFIGS / "world-online.yaml"), None, OnlineRunConfig)
    assert (online.online.solver.learning_rate, online.online.buffer.size) == (1e-4, 320)
    assert OnlineRunConfig().online.buffer.size == 3200  # the paper's, without the world file


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


def test_extends_with_another_backend_kind_starts_that_section_afresh(tmp_path: Path) -> None:
    # Regression: a file extending the world that swapped the transformers backend for `served`
    # was merged key by key and refused (`max_new_tokens: not a field`); --set already did this.
    served = load_config(str(CONFIGS / "world-served.yaml"))
    backend = served.generate.backend
    assert backend.kind == "served" and backend.client.endpoint == "completions"
    assert backend.client.max_tokens == 10 and served.evaluate.generation.client.temperature == 0.0
    world_solver = load_config(None).train.solver  # the rest is the world's, raw text kept
    assert served.train.solver == world_solver.model_copy(update={"chat_template": "never"})
    (tmp_path / "same.yaml").write_text(
        f"extends: {CONFIGS / 'world.yaml'}\ngenerate: {{backend: {{kind: transformers, "
        "batch_size: 64}}\n"
    )
    same = load_config(str(tmp_path / "same.yaml")).generate.backend
    assert (same.batch_size, same.max_new_tokens) == (64, 10)  # same kind: still merged


def test_set_changes_one_field_of_the_config_that_would_run(tmp_path: Path) -> None:
    # Regression: `--set train.solver.learning_rate=...` used to rebuild the solver from the
    # paper's defaults (lr 5e-7, batch 8, beta 0.05), silently dropping the demo's settings.
    demo = load_config(None).train.solver
    cfg = load_config(None, ["train.solver.learning_rate=1e-3"])
    assert cfg.train.solver.learning_rate == 1e-3
    assert cfg.train.solver.effective_batch_size == demo.effective_batch_size == 32
    assert cfg.train.solver.beta == demo.beta == 0.1
    # On top of a file, the file's sections are what gets changed.
    paper_dpo = Path(__file__).parent.parent / "configs" / "paper" / "dpo.yaml"
    (tmp_path / "r.yaml").write_text(f"extends: {paper_dpo}\n")
    cfg = load_config(str(tmp_path / "r.yaml"), ["train.solver.beta=0.2"])
    assert (cfg.train.solver.beta, cfg.train.solver.learning_rate) == (0.2, 5e-7)
    # A new backend kind starts from that kind's own defaults.
    cfg = load_config(None, ["generate.backend.kind=openai", "generate.backend.llm.model=m"])
    assert cfg.generate.backend.kind == "openai" and cfg.generate.backend.llm.model == "m"
    assert cfg.generate.backend.max_tokens == 1024  # openai's own cap: world's 10 was another key
    # ... but the fields the new kind has too keep their values: the recipe's greedy evaluation
    # and its cap stay when its engine changes (they were reset to 0.7 and 256, without a word).
    switched = ["evaluate.generation.kind=transformers", "generate.backend.kind=transformers"]
    cfg = load_config("configs/smollm2-if.yaml", switched)
    assert (cfg.evaluate.generation.temperature, cfg.evaluate.generation.max_new_tokens) == (0, 192)
    assert cfg.generate.backend.max_new_tokens == 192 and cfg.generate.backend.temperature == 0.7
    assert cfg.generate.backend.batch_size == 64  # transformers' own: CTranslate2 has no such key
    # An optional section that is off (ray: null) opens with its own defaults.
    cfg = load_config(None, ["generate.ray.address=http://127.0.0.1:8265"])
    assert cfg.generate.ray is not None and cfg.generate.ray.address == "http://127.0.0.1:8265"
    assert cfg.generate.ray.workers == 2 and cfg.annotate.ray is None
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["seed.x=1"])


def test_eva_config_prints_what_a_recipe_and_its_overrides_resolve_to(capsys) -> None:
    import yaml

    from flows.cli import main

    recipe = str(Path(__file__).parent.parent / "configs" / "paper" / "simpo.yaml")
    assert main(["config", "--config", recipe, "--set", "train.solver.gamma=2.5"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["solver"]["kind"] == "simpo"
    assert shown["train"]["solver"]["gamma"] == 2.5 and shown["iterations"] == 3
    assert main(["config", "--online", "--set", "online.budget=2"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["online"]["budget"] == 2.0
    assert main(["config", "--set", "sample.fraction=3"]) == 2


def test_run_names_stay_text_and_long_values_are_cut(tmp_path: Path) -> None:
    from flows.cli import _parser
    from flows.commands import load

    args = _parser().parse_args(["run", "--run", "2024", "--root", str(tmp_path)])
    assert load(args, RunConfigModel).run == "2024"  # not the integer 2024
    with pytest.raises(ConfigError) as err:
        load_config(None, ["train.solver={kind: dpo, beta: -1}"])
    assert str(err.value).startswith("train.solver.beta: Input should be greater than 0")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["prompts=" + "x" * 500])
    assert len(str(err.value)) < 200


def test_the_default_root_is_absolute_and_checked_from_a_relative_one(tmp_path, monkeypatch):
    # Regression: the default root "runs" was never made absolute, and the write probe walked
    # up from "runs" to "" forever: `eva run` with no --root hung before starting.
    from flows.inputs import check_root

    monkeypatch.chdir(tmp_path)
    assert load_config(None).root == str(tmp_path / "runs")
    check_root("runs", {})  # returns: "runs" does not exist yet, its parent is writable
    assert not (tmp_path / "runs").exists()


def test_a_config_given_as_data_resolves_extends_from_the_project_root() -> None:
    # A deployment's parameter or a Python call: no file to be relative to, so the project root.
    from flows.config import validate_config

    data = {"extends": "configs/world.yaml", "run": "x", "iterations": 1}
    cfg = validate_config(data)
    assert cfg.run == "x" and cfg.iterations == 1
    assert cfg.train == load_config(None).train  # the world's solver, layered
    online = validate_config({"extends": "configs/world-online.yaml"}, OnlineRunConfig)
    assert online.online == load_config(None, None, OnlineRunConfig).online
    with pytest.raises(ConfigError, match="extends: no file at"):
        validate_config({"extends": "configs/nope.yaml"})

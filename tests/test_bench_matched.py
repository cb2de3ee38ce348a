"""bench.matched: the budget arithmetic, the pair yield read from manifests, and the claim's
verdicts and tables, on hand-made manifests and results (the arms themselves run in
``python -m bench.matched``)."""

from __future__ import annotations

from typing import Any

import pytest

import bench.method as method
from bench.matched import (
    budget,
    check_budget,
    creator_guess,
    fresh_topup,
    pair_yield,
    parent_fraction,
    run_seed,
    solver_size,
    within_budget,
)
from bench.matched_report import cumulative, matched_table, verdicts, write_matched_report
from eva_runtime.errors import EvaError
from tests.conftest import tiny_run_config


def test_budget_arithmetic_at_the_benchmark_size() -> None:
    g = budget(2000, 6)
    assert g == 24_000  # a creator pass over X_{t-1} and a solver pass over X_t
    assert fresh_topup(g, 2000, 6) == 2.0  # fresh draws 4,000 new prompts: twice the split
    with pytest.raises(EvaError, match="outside"):
        fresh_topup(budget(3000, 6), 2000, 6)  # 3x the split: beyond the stream's window
    # What the creator spends before the solver samples, by mode and iteration.
    assert creator_guess("fresh", 3, 2000, 6) == 12_000
    assert creator_guess("previous", 1, 2000, 6) == 12_000  # no solver readings in its run yet
    assert creator_guess("previous", 2, 2000, 6) == 0
    assert creator_guess("predicted", 2, 4000, 6) == 0
    assert solver_size(g, 12_000, 6) == 2000
    assert solver_size(g, 0, 6) == 4000
    assert solver_size(g, 600, 6) == 3900  # a probe of 100 prompts x 6 comes out of G
    with pytest.raises(EvaError, match="no solver prompts"):
        solver_size(g, g, 6)
    # 4,000 children from X_{t-1} of 2,000 at 4 each: half of it are parents.
    assert parent_fraction(4000, 2000, 4) == 0.5
    assert parent_fraction(2000, 2000, 4) == 0.25  # bench.method's eva
    assert parent_fraction(9000, 2000, 4) == 1.0
    assert within_budget(24_240, g) and within_budget(23_760, g)
    assert not within_budget(24_241, g) and not within_budget(23_759, g)


class Store:
    """Manifests by (iteration, artifact), as RunStore.read_manifest returns them."""

    def __init__(self, manifests: dict[tuple[int, str], dict[str, Any]]):
        self.manifests = manifests

    def read_manifest(self, t: int, artifact: str) -> dict[str, Any] | None:
        return self.manifests.get((t, artifact))


def _pairs(pairs: int, low: int, tied: int, unscored: int, dropped: int) -> dict[str, Any]:
    prompts = pairs + dropped + low + tied + unscored
    return {"stats": {"prompts": prompts, "pairs": pairs, "skipped_low_chosen": low,
                      "skipped_tied": tied, "skipped_unscored": unscored,
                      "dropped_over_budget": dropped}}  # fmt: skip


def test_pair_yield_accounts_for_every_generated_response() -> None:
    store = Store({
        (1, "creator_generate"): {"stats": {"responses": 12_000}},
        (1, "generate"): {"stats": {"responses": 12_000}},
        (1, "pairs"): _pairs(pairs=320, low=700, tied=780, unscored=20, dropped=180),
        (2, "generate"): {"stats": {"responses": 24_000}},  # no creator pass
        (2, "pairs"): _pairs(pairs=900, low=1500, tied=1590, unscored=10, dropped=0),
    })  # fmt: skip
    one = pair_yield(store, 1)
    assert one["responses"] == 24_000 and one["creator_responses"] == 12_000
    assert one["in_pairs"] == 640
    assert one["paper_pairs"] == 320 + 180 + 700  # best vs worst, any correctness, uncapped
    solver_prompts = sum(one[k] for k in ("pairs", "dropped_over_budget", "skipped_low_chosen",
                                         "skipped_tied", "skipped_unscored"))  # fmt: skip
    assert one["creator_responses"] + 6 * solver_prompts == one["responses"]
    two = pair_yield(store, 2)
    assert (two["responses"], two["creator_responses"], two["paper_pairs"]) == (24_000, 0, 2400)
    check_budget("eva", [one, two], 24_000)
    with pytest.raises(EvaError, match="eva, iteration 2: 24000 responses, not G = 23000"):
        check_budget("eva", [{"responses": 23_100}, two], 23_000)


def _seed(fresh: list[float], eva: list[float], previous: list[float]) -> dict[str, Any]:
    def arm(scores: list[float]) -> dict[str, Any]:
        rows = [{"score": s, "responses": 24_000, "prompts": 4000, "pairs": 600,
                 "creator_responses": 0, "in_pairs": 1200, "skipped_low_chosen": 1500,
                 "skipped_tied": 1890, "skipped_unscored": 10, "dropped_over_budget": 0,
                 "paper_pairs": 2100} for s in scores]  # fmt: skip
        return {"iterations": rows}

    return {"theta_1": {"score": 0.48}, "budget": 24_000, "fresh": arm(fresh), "eva": arm(eva),
            "eva-previous": arm(previous)}  # fmt: skip


RESULTS = {
    "0": _seed([0.49, 0.49], [0.60, 0.70], [0.50, 0.48]),
    "1": _seed([0.48, 0.47], [0.62, 0.72], [0.47, 0.50]),
    "2": _seed([0.50, 0.49], [0.61, 0.69], [0.49, 0.49]),
}


def test_the_claim_is_judged_per_eva_arm_and_iteration() -> None:
    got = {(arm, t): (verdict, margin) for arm, t, _, verdict, margin in verdicts(RESULTS)}
    # eva - fresh at iteration 1: +0.11, +0.14, +0.11: mean 0.12, sd 0.01732 -> margin 0.0854.
    assert got[("eva", 1)] == ("**held**", "+0.085")
    # eva-previous - fresh at iteration 2: -0.01, +0.03, 0.00: mean 0.0067, sd 0.0208.
    assert got[("eva-previous", 2)] == ("not held", "-0.035")
    assert len(got) == 4  # eva-predicted did not run: no row for it
    assert cumulative(RESULTS, "eva", 2) == [48_000] * 3
    table = "\n".join(matched_table(RESULTS))
    # eva - fresh at iteration 2: +0.21, +0.25, +0.20: mean 0.22, sd 0.0265.
    row = "| eva | 2 | 48,000 | 4,000 | 600 ± 0 | 0.703 ± 0.015 | +0.220 ± 0.026 (3 of 3 > 0) |"
    assert row in table


def test_report_writes_tables_and_the_plot(tmp_path: Any) -> None:
    md = write_matched_report(RESULTS, {"0": RESULTS["0"]}, str(tmp_path), "m", 60.0, True, "c")
    assert (tmp_path / "m.md").read_text() == md
    assert (tmp_path / "m.png").stat().st_size > 1000
    # The pair yield: 1,200 of 24,000 responses in pairs.
    assert "| fresh | 1 | 24,000 | 0 | 1,200 | 600 | 1,500 | 1,890 | 10 | 0 | 2,100 | 5.0% |" in md
    assert "Pair yield of `bench.method`'s arms" in md


@pytest.mark.usefixtures("prefect_api")
def test_arms_generate_the_budget_every_iteration_on_a_tiny_world(tmp_path, monkeypatch) -> None:
    """Real runs: 24 seed prompts, N = 4, so G = 192 a iteration. fresh draws 48 new prompts;
    eva-previous's and eva-predicted's creators sample X_0 at iteration 1 (96) beside 24 solver
    prompts, and their solvers alone spend G at iteration 2 (48 prompts)."""

    def tiny_base(root: str, seed: int, quick: bool, overrides: list[str]) -> dict:
        cfg = tiny_run_config(root, seed=seed)
        cfg.pop("run")
        cfg["pairs"] = {"max_pairs": 4}  # the base run's cap (bench.method's K, shrunk)
        return cfg

    monkeypatch.setattr(method, "base_config", tiny_base)
    monkeypatch.setattr(method, "PAIR_BUDGET", 4)
    result = run_seed(str(tmp_path), 0, True, None, ["fresh", "eva-previous", "eva-predicted"])
    assert result["budget"] == 192
    fresh, previous = result["fresh"]["iterations"], result["eva-previous"]["iterations"]
    predicted = result["eva-predicted"]["iterations"]
    assert [r["responses"] for r in fresh] == [192, 192]
    assert [r["prompts"] for r in fresh] == [48, 48]
    assert [(r["creator_responses"], r["prompts"]) for r in previous] == [(96, 24), (0, 48)]
    assert [r["responses"] for r in previous] == [192, 192]
    # predicted: no creator pass once its run has a solver step's readings.
    assert [(r["creator_responses"], r["prompts"]) for r in predicted] == [(96, 24), (0, 48)]
    for r in fresh + previous + predicted:  # every pair trained: no cap in the matched arms
        assert r["dropped_over_budget"] == 0
        assert r["creator_responses"] + 4 * r["prompts"] == r["responses"]

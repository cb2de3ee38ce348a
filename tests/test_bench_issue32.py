"""Issue 32's summaries against hand-computed statistics: the selection sweep's gain over
uniform (with each rule's temperature) and the full runs' paired comparisons."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import headline, selection


def _setting(score: float, rho: float) -> dict[str, Any]:
    return {"score": score, "rho": rho, "responses": 16000}


def test_selection_gain_over_uniform_and_the_rules_temperature() -> None:
    # gains 0.02, 0.03, 0.01, 0.02, 0.02: mean 0.02, sd sqrt(0.0002 / 4) = 0.007071,
    # t = 0.02 / (0.007071 / sqrt 5) = 6.32 > 2.776: matters.
    gains = (0.02, 0.03, 0.01, 0.02, 0.02)
    results = {
        str(s): {"4/uniform": _setting(0.5, 0.2), "4/a_min-t4": _setting(0.5 + g, 0.3)}
        for s, g in enumerate(gains)
    }
    rows = {r["selection"]: r for r in selection.summarize(results)}
    hot = rows["a_min-t4"]
    assert hot["temperature"] == 4.0 and hot["metric"] == "a_min" and hot["n"] == 4
    assert hot["gain_over_uniform"] == pytest.approx(0.02)
    assert hot["gain_sd"] == pytest.approx(0.0071, abs=1e-4)
    assert hot["t"] == 6.32 and hot["verdict"] == "matters"
    assert rows["uniform"]["temperature"] == "inf" and rows["uniform"]["verdict"] is None
    # Four seeds are too few for a verdict.
    del results["4"]
    assert {r["selection"]: r for r in selection.summarize(results)}["a_min-t4"]["verdict"] is None


def _arm(scores: list[float], skills: list[float]) -> dict[str, Any]:
    return {
        "iterations": [{"score": a, "seed_skill": b} for a, b in zip(scores, skills, strict=True)]
    }


def test_headline_compares_every_pair_at_every_iteration() -> None:
    # eva - fresh at iteration 1 over three seeds: 0.1, 0.15, 0.2 (mean 0.15, sd 0.05,
    # t = 0.15 / (0.05 / sqrt 3) = 5.2; 0.15 - 2 x 0.05 = +0.050 > 0: held). Seed skill:
    # -0.01, -0.02, -0.03 (mean -0.02, sd 0.01, t -3.46).
    results = {}
    for s, (gain, cost) in enumerate(((0.1, 0.01), (0.15, 0.02), (0.2, 0.03))):
        flat = _arm([0.4] * 3, [0.7] * 3)
        results[str(s)] = {
            "fresh": flat,
            "eva": _arm([0.4 + gain, 0.5, 0.5], [0.7 - cost, 0.7, 0.7]),
            "target": flat,
            "metric-uniform": flat,
            "random-evolution": flat,
        }
    rows = headline.summarize(results)
    assert len(rows) == len(headline.COMPARISONS) * headline.ITERATIONS
    first = rows[0]
    assert (first["comparison"], first["iteration"], first["seeds"]) == ("eva - fresh", 1, 3)
    assert first["score"] == pytest.approx(0.15) and first["score_sd"] == pytest.approx(0.05)
    assert first["score_t"] == 5.2 and first["score_positive"] == 3
    assert (first["verdict"], first["margin"]) == ("held", "+0.050")
    assert first["seed_skill"] == pytest.approx(-0.02) and first["seed_skill_t"] == -3.46
    # The same gain at iteration 2 in every seed: sd 0, so no t; the 2-sd rule holds it.
    second = rows[1]
    assert second["score"] == pytest.approx(0.1) and second["score_t"] is None
    assert second["verdict"] == "held"
    assert math.isclose(second["score_sd"], 0.0, abs_tol=1e-12)

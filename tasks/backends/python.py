"""A component of your own, named by import path: how eva plugs in code it does not ship.

Every role (reward, evolver, complexity judge, solver, a prompt source, a policy builder) accepts
``{kind: python, factory: "package.module:name", options: {...}}``: ``factory(**options)``
builds an object that satisfies the role's protocol (``tasks.backends.protocols``). The
built-in demo world plugs in this way (``configs/world.yaml`` names ``eva_world.components``),
so the method never imports it.

A factory may declare

* ``version``: an int bumped when its output can change; it keys the stages that use it. Code
  that declares none is keyed by the text of its module and of the modules of your project it
  imports (``tasks.keys``), so editing either reruns what calls it;
* ``libraries``: the packages it computes with, whose versions key those stages too;
* ``check_prompts(prompts)`` on the object it builds: raise ``ValueError`` naming the first
  prompt it cannot handle; ``eva run`` calls it on prompt files before anything runs.

``eva run`` builds every such component once before the run starts, so options it refuses fail
in seconds: keep construction cheap and load weights or clients when first used. Each field that
takes a component declares what it must build (``Builds``: a solver's ``train``, a reward's
``score``, ...), and a factory that raises, or returns an object without those methods (None
included), is refused there in one line naming the field's ``factory``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def resolve(path: str, what: str = "name") -> Any:
    """The object an import path ``"package.module:name"`` names (``name`` may be dotted);
    ``what`` names it in the error."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'package.module:{what}', got {path!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Builds:
    """What the object a field's component builds must have, declared on the field:
    ``solver: Annotated[SolverBackend, Builds("a solver", ("train",))]``. The edge
    (``flows.inputs``) builds a component of yours once before the run and checks it."""

    role: str  # what the object is, for messages: "a solver"
    methods: tuple[str, ...]  # what the stages call on it

    def lacks(self, built: Any) -> str | None:
        """Why ``built`` cannot serve as this role (it is None, or lacks a method), else None."""
        if built is None:
            return "returned None"
        missing = [m for m in self.methods if not callable(getattr(built, m, None))]
        if missing:
            shown = ", ".join(f"{m}()" for m in missing)
            return f"built a {type(built).__name__}, which has no {shown}"
        return None

    def wants(self) -> str:
        return f"{self.role}: an object with {', '.join(f'{m}()' for m in self.methods)}"


class PythonComponent(BaseModel):
    """Build a component with ``factory(**options)`` (a class or a function)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: ClassVar[int] = 1  # the wrapper's own; the factory's version keys stages apart

    kind: Literal["python"] = "python"
    factory: str = Field(
        description='Import path "package.module:name" of a class or function that builds the '
        "component, checked when the config is read."
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the factory."
    )

    @field_validator("factory")
    @classmethod
    def _importable(cls, value: str) -> str:
        if not callable(resolve(value)):
            raise ValueError(f"{value!r} is not a class or function")
        return value

    def load(self) -> Any:
        return resolve(self.factory)(**self.options)

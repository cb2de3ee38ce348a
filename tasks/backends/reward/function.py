"""Any Python function as a reward: verifiers, exact-match checkers, rule-based scores.

``function`` is an import path ``"package.module:name"`` (``name`` may be dotted, e.g.
``"pkg.mod:Class.method"``), checked when the config is validated, so a typo fails before a
run starts rather than hours in. The function is either pointwise,
``f(prompt, response, **kwargs) -> float``, or with ``batched: true``,
``f(prompts, responses, **kwargs) -> list[list[float]]`` shaped like ``responses``.

Failures: a pointwise function that raises on one response gives that response NaN (the
stage counts NaN as "unscored"); it is counted in ``stats()["failures"]`` (since load, over
every call) and a warning names the first error: one bad response should not kill a stage of
thousands. If *every* response fails, the function is broken rather than the data, and the call
raises. A return of ``None`` is NaN too (TRL's convention for "cannot score"), but not a
failure. A batched function that raises fails the call: its results cannot be attributed to
single responses. A function that calls ``sys.exit`` fails the call too, whichever kind: it is
the user's code asking to stop, not a bad response. Every failure of the call is a
``RewardFunctionError``, one line naming the function (field ``annotate.reward``), never a
traceback or the exit status of the user's ``sys.exit``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from eva_runtime.errors import EvaError, first_line
from tasks.backends.protocols import Progress, no_progress
from tasks.backends.python import resolve

log = logging.getLogger(__name__)


def resolve_function(path: str) -> Callable[..., Any]:
    """Import ``"package.module:name"`` and return the callable it names."""
    obj = resolve(path, "function")
    if not callable(obj):
        raise ValueError(f"{path!r} is a {type(obj).__name__}, not a callable")
    return obj


class RewardFunctionError(EvaError, RuntimeError, ValueError):
    """The reward function failed the whole call (see the module docstring)."""


EXIT_HINT = "a reward returns a number (None or NaN: cannot score); it must not exit"


def _exited(function: str, exc: SystemExit, what: str = "reward function") -> RewardFunctionError:
    return RewardFunctionError(
        f"{what} {function} called sys.exit({exc.code!r})", field="annotate.reward", hint=EXIT_HINT
    )


def _as_reward(value: Any) -> float:
    # bool is an int: True/False become 1.0/0.0, which is what a pass/fail verifier means.
    return math.nan if value is None else float(value)


class GuardedCalls:
    """A user's function called once per response. A raise is that response's NaN, counted
    (one bad response must not sink the stage); ``sys.exit`` is an error at once. ``check``
    then fails the call if every response raised and warns if some did."""

    def __init__(self, fn: Callable[..., Any], name: str, what: str = "reward function"):
        self.fn, self.name, self.what = fn, name, what
        self.calls, self.failures = 0, 0
        self.first_error: Exception | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        self.calls += 1
        try:
            return _as_reward(self.fn(*args, **kwargs))
        except SystemExit as exc:  # not a bad response: the code asked the process to end
            raise _exited(self.name, exc, self.what) from None
        except Exception as exc:
            self.failures += 1
            self.first_error = self.first_error or exc
            return math.nan

    def check(self) -> None:
        error = self.first_error
        if error is None:
            return
        if self.failures == self.calls:
            raise RewardFunctionError(
                f"{self.what} {self.name} raised on all {self.calls} responses; first error: "
                f"{type(error).__name__}: {first_line(error, with_type=False)}",
                field="annotate.reward",
            ) from error
        log.warning(
            "%s %s raised on %d of %d responses (scored NaN); first error: %r",
            self.what,
            self.name,
            self.failures,
            self.calls,
            error,
        )


class CallableReward(BaseModel):
    """Score responses with a Python function named by its import path."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ()

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["callable"] = "callable"
    function: str = Field(description='Import path "package.module:function".')
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments passed on every call."
    )
    batched: bool = Field(
        default=False,
        description="Call once with all prompts and responses instead of once per response.",
    )

    @field_validator("function")
    @classmethod
    def _importable(cls, value: str) -> str:
        resolve_function(value)
        return value

    def load(self) -> CallableScorer:
        return CallableScorer(resolve_function(self.function), self)


class CallableScorer:
    """A loaded function that satisfies the ``RewardModel`` protocol."""

    def __init__(self, fn: Callable[..., Any], config: CallableReward):
        self.fn = fn
        self.config = config
        self._counts: Counter[str] = Counter(failures=0)

    def stats(self) -> dict[str, int]:
        """Responses the function failed on, since load (``ReportsStats``)."""
        return dict(self._counts)

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[Sequence[str]],
        progress: Progress = no_progress,
    ) -> list[list[float]]:
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} response lists")
        if self.config.batched:
            batched = self._batched(prompts, responses)
            progress(1.0)
            return batched
        call = GuardedCalls(self.fn, self.config.function)
        out: list[list[float]] = []
        for i, (prompt, rs) in enumerate(zip(prompts, responses, strict=True)):
            out.append([call(prompt, response, **self.config.kwargs) for response in rs])
            progress((i + 1) / len(prompts))
        self._counts.update(failures=call.failures)
        call.check()
        return out

    def _batched(
        self, prompts: Sequence[str], responses: Sequence[Sequence[str]]
    ) -> list[list[float]]:
        name = self.config.function
        try:
            result = self.fn(list(prompts), [list(rs) for rs in responses], **self.config.kwargs)
        except SystemExit as exc:
            raise _exited(name, exc) from None
        except Exception as exc:
            raise RewardFunctionError(
                f"batched reward function {name} raised {first_line(exc)}",
                field="annotate.reward",
            ) from exc
        shape = [len(rs) for rs in responses]
        try:
            got = [len(r) for r in result]
        except TypeError:  # not a list of lists
            got = None
        if got != shape:
            raise RewardFunctionError(
                f"batched reward function {name} returned a result shaped {got}, expected one "
                f"list per prompt shaped {shape}",
                field="annotate.reward",
            )
        try:
            return [[_as_reward(v) for v in row] for row in result]
        except (TypeError, ValueError) as exc:
            raise RewardFunctionError(
                f"batched reward function {name} returned a value that is no number: "
                f"{first_line(exc)}",
                field="annotate.reward",
            ) from exc

"""The one error base: what eva tells a user when something cannot go on.

Every error eva raises for a user to act on is an ``EvaError``: a message, the ``field`` it is
about (a config key such as ``prompts.path``, a stage such as ``evolve of iter_1``, a command
option such as ``--run``) and, where there is one, a ``hint`` saying what to do. The CLI prints
any of them as one line, ``eva: error: <field>: <message> (<hint>)``, and exits 2; the full
text (a server's log tail, a launch's last lines) stays in ``str(exc)`` for logs and tests.

Each subclass also derives from the builtin its callers have always caught (``ValueError`` for
bad input, ``RuntimeError`` for a failure at run time), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import re

# A value echoed in an error line (a path, a run name) is cut to this many characters.
ECHOED = 240


class EvaError(Exception):
    """A failure a user can act on, said in one line."""

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message, self.field, self.hint = message, field, hint

    def __str__(self) -> str:
        head = f"{self.field}: " if self.field and not self.message.startswith(self.field) else ""
        tail = f" ({self.hint})" if self.hint else ""
        return f"{head}{self.message}{tail}"

    def line(self) -> str:
        """The error as the CLI prints it: its first line, the hint kept."""
        lines = str(self).strip().splitlines() or [type(self).__name__]
        first = lines[0]
        if self.hint and len(lines) > 1 and not first.endswith(f"({self.hint})"):
            first += f" ({self.hint})"
        return shorten_words(first)


class ConfigError(EvaError, ValueError):
    """A config, an option or an input file that cannot work: found before anything runs where
    it can be, else by the stage or backend that meets it (a checkpoint without the chat
    template its config asks for, a reward model with several labels)."""


class StageError(EvaError, RuntimeError):
    """A stage cannot run as asked (bad input columns, an unfinished upstream) or its backend
    failed beyond what it may (too many unscored prompts, an evolver that returned nothing)."""


def first_line(exc: BaseException, with_type: bool = True) -> str:
    """An exception as one line: its first line of text (prefixed by its type, unless
    ``with_type`` is False), or its type when it has no text."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    return f"{type(exc).__name__}: {lines[0]}" if with_type else lines[0]


def shorten(text: str, keep: int = ECHOED) -> str:
    """``text``, or where it is longer than ``keep`` characters its start and end around how
    many were left out: a 100,000-character path in an error line stays one readable line."""
    if len(text) <= keep:
        return text
    head, tail = keep * 2 // 3, keep // 6
    return f"{text[:head]}...[{len(text) - head - tail} characters]...{text[-tail:]}"


def shorten_words(line: str, keep: int = ECHOED) -> str:
    """Every run of non-blank characters longer than ``keep`` in ``line``, shortened."""
    return re.sub(rf"\S{{{keep + 1},}}", lambda m: shorten(m.group(), keep), line)


def raised_by_ctrl_c(exc: BaseException) -> bool:
    """An error raised while a Ctrl-C was being handled. Prefect's task engine, interrupted
    while it creates a task run, reports the crash of a run it has not set and raises
    ``ValueError('Task run is not set')`` in the KeyboardInterrupt's place (prefect 3.8,
    ``TaskRunEngine.initialize_run``): the command was interrupted all the same."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False

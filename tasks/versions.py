"""The check that keeps declared versions honest: ``python -m tasks.versions [--write]``.

Cache keys follow declared versions, never code text (``tasks.keys``), so a change to what a
stage or a component computes must come with a version bump, or finished runs would reuse
artifacts the new code would not make. This module fingerprints that code and compares it with
``tasks/versions.lock.json``:

* a stage: its module, and the ``eva_core`` and ``tasks`` modules it imports (the method's
  arithmetic, a prompt file reader), but not the stage framework (``tasks.stage`` and the
  modules beside it, ``tasks.context``, ``tasks.keys`` and the config walk it keys with
  (``tasks.config_tree``), ``tasks.plan``, ``tasks.store``, ``tasks.run_paths``,
  ``tasks.content_hashes``: ``FRAMEWORK``) nor the components it selects, which are versioned
  on their own;
* a component (a backend config class, a class of the world that configs name): its module
  and the component and method modules it imports, ``eva_core``, ``tasks.backends`` and
  ``eva_world`` (not ``eva_runtime`` as a whole: how bytes travel does not change what they
  say);
* and, in every fingerprint, the code outside those modules that decides what is written
  (``OUTPUT_CODE``): the seed derivations (``eva_runtime.seeds``: a stage's seed, which the
  framework hands every stage, and an LLM request's), and, where the fingerprinted code imports
  the LLM client, the few client functions that decide what an answer becomes (a failed
  request's ``""``, a null content's ``""``, the order of the choices, the request's body);
  not the client's retries, breaker, threads or logs.

A fingerprint is the code's syntax tree without docstrings: comments, formatting and
docstrings never count. The check reads the code and imports none of it (``tasks.source``,
``tasks.code_index``), so it never loads torch, TRL or vLLM. When a fingerprint
changed, ``python -m tasks.versions`` (and the test suite) fails naming the entry and the
functions whose code changed since it was recorded (the lock keeps a short hash of each
function its fingerprints cover, so its diff shows them too), and what to do: bump its
``version`` if what it writes can change, then ``python -m tasks.versions --write``; if it
cannot (a rename, a log line, a refactor), ``--write`` alone records the new code, visibly, in
the lock file's diff.

A launch runs the cheap half of the check (``edited_stages``): the stages its config calls
whose code, or whose selected components' code, differs from the lock while the version is
the one recorded. Their finished artifacts are reused as they are; the launch says so in one
line (``flows.launch``).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tasks import code_index, source
from tasks.source import code_of

__all__ = ["code_of"]  # the syntax-tree form a fingerprint reads (tests compare with it)

LOCK = Path(__file__).with_name("versions.lock.json")
# Where stages and components live: the method's stages and backends, the world, the bench arms.
PACKAGES = ("tasks", "eva_world")
MODULES = ("bench.arms", "bench.arm_runs")
# What a fingerprint may include besides the module itself, and what it never includes.
STAGE_CLOSURE = ("eva_core", "tasks")
COMPONENT_CLOSURE = ("eva_core", "tasks.backends", "eva_world")
FRAMEWORK = (
    "tasks.stage",
    "tasks.stage_log",
    "tasks.provenance",
    "tasks.context",
    "tasks.keys",
    "tasks.config_tree",
    "tasks.plan",
    "tasks.store",
    "tasks.run_paths",
    "tasks.content_hashes",
    "tasks.versions",
    "tasks.source",
    "tasks.code_index",
)
SKIP = ("tasks.versions",)  # not stage or component code
# Code outside a fingerprint's modules that decides what a stage writes, as module -> the
# functions of it that do ((): the whole module). ``eva_runtime.seeds`` is in every fingerprint
# (every stage gets its seed from it); the others are in the fingerprints whose modules import
# them (directly or through another entry here), by function: what a request's answer becomes,
# not how it travels. A function that moves or is renamed fails the check until this follows.
SEEDS = "eva_runtime.seeds"
OUTPUT_CODE: dict[str, tuple[str, ...]] = {
    SEEDS: (),
    "eva_runtime.llm_client": (
        "LLMClient.answers",  # a failed request answers "" (a configuration error raises)
        "LLMClient.chat_reply",  # the request's body
        "LLMClient.completion_reply",
        "LLMClient._reply",  # the choices in index order, a null content as ""
    ),
    "eva_runtime.distilabel_llm": (
        "ClientLLM.generate",  # the sampling a distilabel task asks for
        "ClientLLM._one",  # a request's seed, a failed request's ""
        "ClientLLM._empty",
    ),
}


def declared() -> dict[str, tuple[int, str]]:
    """Every stage and component: name -> (declared version, code fingerprint)."""
    return {name: (version, code) for name, (version, code, _) in _entries().items()}


def _entries() -> dict[str, tuple[int, str, dict[str, tuple[str, ...]]]]:
    """Every stage and component: name -> (version, fingerprint, the code it covers: module ->
    the functions of it that count, () for all), read from the source, nothing imported."""
    out = {}
    for module in code_index.modules(PACKAGES, MODULES, SKIP):
        for item in code_index.declared_in(module):
            if item.kind == "stage":
                name, covered = f"stage:{item.name}@{module}", _stage_parts(module)
            else:
                name, covered = f"component:{module}:{item.name}", _component_parts(module)
            out[name] = (item.version, _fingerprint(covered), covered)
    return dict(sorted(out.items()))


def stage_code(module: str) -> str:
    """The fingerprint of the stages defined in ``module``."""
    return _fingerprint(_stage_parts(module))


def component_code(module: str) -> str:
    """The fingerprint of the components defined in ``module`` (or ``module:Class``)."""
    return _fingerprint(_component_parts(module.partition(":")[0]))


def _stage_parts(module: str) -> dict[str, tuple[str, ...]]:
    return _covered(module, STAGE_CLOSURE, (*FRAMEWORK, "tasks.backends"))


def _component_parts(module: str) -> dict[str, tuple[str, ...]]:
    return _covered(module, COMPONENT_CLOSURE, FRAMEWORK)


# What `check` says after each stale entry: the command that records an edit that cannot change
# what the code writes (a rename, a message, a refactor).
RECORD = "python -m tasks.versions --write"


def check() -> list[str]:
    """What is stale or undeclared, one line each (empty when everything matches the lock). A
    stale entry names the functions whose code differs from the recorded code."""
    lock = _lock()
    try:
        entries = _entries()
    except OutputCodeMissing as exc:
        return [str(exc)]
    problems = []
    for name, (version, code, covered) in entries.items():
        recorded = lock.get(name)
        if version < 0:
            problems.append(f"{name}: declares no version (add `version = 1`)")
        elif recorded is None:
            problems.append(f"{name}: not in {LOCK.name}")
        elif recorded["code"] != code and recorded["version"] == version:
            changed = changed_code(lock, covered)
            where = f" ({', '.join(changed)})" if changed else ""
            problems.append(
                f"{name}: its code changed but its version is still {version}{where}: bump it "
                f"if what it writes can change; if it cannot, record it: {RECORD}"
            )
        elif recorded["version"] != version:
            problems.append(f"{name}: version {version} is not recorded (lock: {recorded})")
    gone = {k for k in lock if not k.startswith(MODULE)} - set(entries)
    problems += [f"{name}: in {LOCK.name} but gone" for name in sorted(gone)]
    return problems


def changed_code(lock: dict[str, Any], covered: dict[str, tuple[str, ...]]) -> list[str]:
    """``module:qualname`` of each function, class or module's other code in ``covered`` whose
    code is not the recorded code (a module the lock does not hold: ``module (new)``)."""
    out = []
    for module, functions in sorted(covered.items()):
        recorded = lock.get(MODULE + module)
        if recorded is None:
            out.append(f"{module} (new)")
            continue
        now = _definitions(module, functions)
        if functions:
            recorded = {k: v for k, v in recorded.items() if k in functions}
        out += [f"{module}:{q}" for q in sorted({*now, *recorded}) if now.get(q) != recorded.get(q)]
    return out


def edited_stages(config: BaseModel) -> dict[str, list[str]]:
    """The stages ``config`` calls whose code, or the code of a component it selects for them,
    is not the code recorded for their version: stage name -> what changed (``score``'s own
    code, or a component as ``module:Class``). Cheap enough for every launch: it looks only at
    the stages already imported (a launch imports those it calls) and the components the config
    selects, reads their source and imports nothing. A version that differs from the recorded
    one is no edit here: it changes the keys, so nothing old is reused."""
    from tasks.keys import components

    lock = _lock()
    out: dict[str, list[str]] = {}
    for stage, configs in _called_stages(config):
        key, module = _stage_key(stage), stage.fn.__module__
        changed = ["its code"] if _edited(lock, key, stage.version, stage_code(module)) else []
        for sub in configs:
            for _, obj in components(sub):
                if not isinstance(obj, type):
                    continue  # a user's function: keyed by its own source (tasks.keys)
                where = f"{obj.__module__}:{obj.__qualname__}"
                key, version = f"component:{where}", getattr(obj, "version", None)
                if where not in changed and _edited(lock, key, version, component_code(where)):
                    changed.append(where)
        if changed:
            out[stage.name] = changed
    return out


def edited_line(edited: dict[str, list[str]], finished: set[str]) -> str | None:
    """The launch's one line on ``edited_stages`` that have ``finished`` artifacts (None when
    none has: nothing made by older code is reused)."""
    reused = sorted(set(edited) & finished)
    if not reused:
        return None
    what = "; ".join(f"{name}: {', '.join(edited[name])}" for name in reused)
    return (
        f"code edited without a version bump ({what}): this launch reuses the finished "
        f"artifacts of {', '.join(reused)} as they are (keys follow versions, not code); bump "
        f"the version if the edit changes what they write, else record it: {RECORD}"
    )


def _edited(lock: dict[str, Any], key: str, version: Any, code: str) -> bool:
    """The code differs from what the lock records for the same version. What the lock does
    not know (a user's class, keyed by its own source) is no edit here."""
    recorded = lock.get(key)
    return recorded is not None and recorded["version"] == version and recorded["code"] != code


def _called_stages(config: BaseModel) -> Iterator[tuple[Any, list[BaseModel]]]:
    """The imported stages whose config ``config`` holds (a field or a property of it, as
    ``RunConfig.evaluation``), each with those sub-configs."""
    from tasks.stage import Stage

    # One level, not a walk (tasks.config_tree): a stage is called with a section of the run,
    # or one a property derives, which the tree does not hold.
    names = [*type(config).model_fields]
    names += [n for n, v in vars(type(config)).items() if isinstance(v, property)]
    subs = [v for v in (getattr(config, n) for n in names) if isinstance(v, BaseModel)]
    seen: set[int] = set()
    for name in sorted(sys.modules):
        module = sys.modules[name]
        if not _under(name, (*PACKAGES, *MODULES)) or _under(name, SKIP) or module is None:
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, Stage) and id(obj) not in seen and obj.fn.__module__ == name:
                seen.add(id(obj))
                wanted = _config_class(obj)
                found = [s for s in subs if wanted is not None and isinstance(s, wanted)]
                if found:
                    yield obj, found


def _config_class(stage: Any) -> type | None:
    """The class of the config a stage function takes (its second parameter)."""
    try:
        params = list(inspect.signature(stage.fn, eval_str=True).parameters.values())
    except Exception:  # an annotation that does not resolve: the stage is not matched
        return None
    annotation = params[1].annotation if len(params) > 1 else None
    return annotation if isinstance(annotation, type) else None


def _stage_key(stage: Any) -> str:
    return f"stage:{stage.name}@{stage.fn.__module__}"


# The lock holds, beside each entry's version and fingerprint, the code each fingerprint
# covers, module by module, function by function (``module:<name>``: qualified name -> a
# short hash): what `check` names when a fingerprint changed, and what the lock's diff shows.
MODULE = "module:"


def _lock() -> dict[str, Any]:
    return json.loads(LOCK.read_text()) if LOCK.exists() else {}


def write() -> None:
    entries = _entries()
    lock: dict[str, Any] = {k: {"version": v, "code": c} for k, (v, c, _) in entries.items()}
    covered: dict[str, set[str] | None] = {}  # None: the whole module
    for _, _, parts in entries.values():
        for module, named in parts.items():
            if not named or covered.get(module, set()) is None:
                covered[module] = None
            else:
                covered[module] = {*(covered.get(module) or set()), *named}
    for module, functions in covered.items():
        lock[MODULE + module] = _definitions(module, tuple(sorted(functions or ())))
    LOCK.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")


def fingerprint(module: str, within: tuple[str, ...], outside: tuple[str, ...] = ()) -> str:
    """The code of ``module`` and of the modules it imports under ``within`` (and not under
    ``outside``), with the code that decides outputs from elsewhere (``OUTPUT_CODE``),
    docstrings and comments left out."""
    return _fingerprint(_covered(module, within, outside))


def _covered(
    module: str, within: tuple[str, ...], outside: tuple[str, ...]
) -> dict[str, tuple[str, ...]]:
    """What a fingerprint of ``module`` covers, in the order it hashes them: the modules of the
    closure of its imports (each ``()``: all of it), then the ``OUTPUT_CODE`` they import that
    is not among them (module -> the functions that count, ``()`` for all)."""
    modules = _closure(module, within, outside)
    covered: dict[str, tuple[str, ...]] = dict.fromkeys(sorted(modules), ())
    for name, functions in sorted(_output_code(modules).items()):
        covered.setdefault(name, functions)
    return covered


def _fingerprint(covered: dict[str, tuple[str, ...]]) -> str:
    h = hashlib.sha256()
    for name, functions in covered.items():
        h.update(name.encode())
        if not functions:
            h.update(source.tree(name).encode())
        for qualname in functions:
            h.update(qualname.encode())
            h.update(_function(name, qualname).encode())
    return h.hexdigest()[:16]


def _definitions(module: str, functions: tuple[str, ...]) -> dict[str, str]:
    """The short hash of each function of ``module`` that counts (``()``: each of them)."""
    if not functions:
        return dict(source.definitions(module))
    return {q: source.short_hash(_function(module, q)) for q in functions}


class OutputCodeMissing(LookupError):
    """A function ``OUTPUT_CODE`` names is no longer where it says."""


def _output_code(modules: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """The ``OUTPUT_CODE`` entries that apply to a fingerprint of ``modules``: the seeds, and
    those imported by the modules or by another entry that applies."""
    found = {SEEDS}
    todo = [*modules, SEEDS]
    while todo:
        for name in source.imports(todo.pop()):
            if name in OUTPUT_CODE and name not in found:
                found.add(name)
                todo.append(name)
    return {name: OUTPUT_CODE[name] for name in found}


@cache
def _closure(module: str, within: tuple[str, ...], outside: tuple[str, ...]) -> frozenset[str]:
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [f for f in source.imports(name) if _under(f, within) and not _under(f, outside)]
    return frozenset(seen)


def _function(module: str, qualname: str) -> str:
    try:
        return source.definition(module, qualname)
    except LookupError as exc:
        raise OutputCodeMissing(
            f"{exc}: update OUTPUT_CODE in tasks/versions.py to name the code that decides "
            "what is written"
        ) from None


def clear_caches() -> None:
    """Forget what was read (tests that hand the check edited code call it)."""
    source.clear_caches()
    code_index.clear_caches()
    _closure.cache_clear()


_under = source.under


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tasks.versions", description=__doc__)
    p.add_argument("--write", action="store_true", help="record the current versions")
    args = p.parse_args(argv)
    if args.write:
        try:
            write()
        except OutputCodeMissing as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"wrote {LOCK}")
        return 0
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

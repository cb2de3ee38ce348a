"""The ``eva`` commands that read and change nothing: ``eva show`` (a run's summary, or one
artifact's manifest and rows) and ``eva config`` (the config a recipe and its overrides amount
to). As in ``flows.commands``, heavy imports happen inside the handlers.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from eva_runtime.errors import ConfigError, EvaError
from flows.commands import check_run_name

if TYPE_CHECKING:
    import pyarrow as pa

    from tasks.store import RunStore


def show(args: argparse.Namespace) -> int:
    check_run_name(args.run)  # before the imports that take seconds
    from flows.config import OnlineRunConfig
    from flows.runs import check_iteration, close_match, is_online, seed_count, stored_config
    from flows.summary import iteration_summary, online_summary, summary_table
    from tasks.store import RunStore

    config = stored_config(args.root, args.run, args.storage_options)
    store = RunStore(config.root, config.run, config.storage_options)
    check_iteration(config, args.iteration)
    if args.stage is None and args.iteration is not None:
        print(iteration_artifacts(store, config, args.iteration))
        return 0
    if args.stage is None:
        if isinstance(config, OnlineRunConfig):
            segments = config.online.segments(seed_count(config))
            rows = online_summary(store, config, segments)
        else:
            rows = iteration_summary(store, config)
        print(summary_table(rows))
        return 0
    manifest = store.read_manifest(args.iteration, args.stage)
    if manifest is None:
        step = "segment" if is_online(config) else "iteration"
        where = "setup" if args.iteration is None else f"{step} {args.iteration}"
        here = store.artifacts(args.iteration)
        later = [i for i in store.iterations() if args.stage in store.artifacts(i)]
        if args.iteration is None and later:
            hint = f"it is made in every {step}: add --iteration N (e.g. --iteration {later[0]})"
        elif near := close_match(args.stage, here):
            hint = f"did you mean {near}?"
        else:
            hint = f"{where} has {', '.join(here) or 'no artifacts'}"
        raise ConfigError(
            f"--stage {args.stage}: no such artifact in {where} of {args.run}", hint=hint
        )
    print(
        json.dumps(
            {k: manifest[k] for k in ("uri", "rows", "seconds", "stats", "content_hash")},
            indent=2,
            default=str,
        )
    )
    table = store.read_table(manifest["uri"]).slice(0, args.rows)
    for row in with_parents(store, manifest, table):
        print(json.dumps(shorten(row, args.chars), default=str))
    return 0


def iteration_artifacts(store: RunStore, config: Any, iteration: int) -> str:
    """What an iteration (online: segment) holds, in the order its flow writes it: each
    artifact's rows and seconds."""
    from flows.commands import stage_artifacts
    from flows.runs import is_online

    step = "segment" if is_online(config) else "iteration"
    written = store.artifacts(iteration)
    order = stage_artifacts(iteration, is_online(config))
    names = [a for a in order if a in written] + sorted(set(written) - set(order))
    if not names:
        return f"{step} {iteration} of {config.run}: nothing written yet"
    lines = [f"{step} {iteration} of {config.run}: add --stage NAME for an artifact's rows"]
    for name in names:
        manifest = store.read_manifest(iteration, name) or {}
        rows, seconds = manifest.get("rows", "-"), manifest.get("seconds", "-")
        lines.append(f"  {name:<18} {rows:>8} rows  {seconds:>8} s")
    return "\n".join(lines)


def with_parents(store: RunStore, manifest: dict[str, Any], table: pa.Table) -> list[dict]:
    """The rows of ``table``, each that has a ``parent_id`` with its parent's text beside its
    own (``parent_prompt``, after ``prompt``): the only way to judge an evolution is to read the
    two together. Parents are looked up in the stage's own inputs (evolve's subset, mix's
    X_{t-1}); one found in none of them is left out, not guessed."""
    rows = table.to_pylist()
    wanted = {row.get("parent_id") for row in rows} - {None}
    texts: dict[str, str] = {}
    for ref in manifest.get("inputs", {}).values() if wanted else ():
        try:
            parents = store.read_table(ref["uri"])
        except (EvaError, KeyError, TypeError):  # an input gone or damaged: rows without it
            continue
        if {"prompt_id", "prompt"} <= set(parents.column_names):
            ids = parents.column("prompt_id").to_pylist()
            for pid, text in zip(ids, parents.column("prompt").to_pylist(), strict=True):
                if pid in wanted:
                    texts.setdefault(pid, text)
    return [_with_parent(row, texts.get(row.get("parent_id"))) for row in rows]


def _with_parent(row: dict[str, Any], parent: str | None) -> dict[str, Any]:
    if parent is None or "parent_prompt" in row:
        return row
    out: dict[str, Any] = {}
    for key, value in row.items():
        out[key] = value
        if key == "prompt":
            out["parent_prompt"] = parent
    out.setdefault("parent_prompt", parent)
    return out


def shorten(value: Any, chars: int) -> Any:
    """``value`` with each text cut to ``chars`` characters and each list to the items that fit
    in about as many, saying what was cut: a row then stays one line of valid JSON whatever
    its cells hold (cutting the line itself broke the JSON). ``chars`` 0 keeps everything."""
    if not chars:
        return value
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}... (+{len(value) - chars} chars)"
    if isinstance(value, dict):
        return {key: shorten(item, chars) for key, item in value.items()}
    if isinstance(value, list | tuple):
        kept: list[Any] = []
        size = 0
        for i, item in enumerate(value):
            item = shorten(item, chars)
            size += len(json.dumps(item, default=str))
            if kept and size > chars:
                kept.append(f"... (+{len(value) - i} more)")
                break
            kept.append(item)
        return kept
    return value


def config(args: argparse.Namespace) -> int:
    """What a recipe and its overrides amount to, before any GPU hour is spent on them."""
    import yaml

    from flows.config import OnlineRunConfig, RunConfig, load_config

    model = OnlineRunConfig if args.online else RunConfig
    resolved = load_config(args.config, list(args.set), model)
    if args.explain:
        from flows.explain import explain

        print("\n".join(explain(resolved)))
        return 0
    print(yaml.safe_dump(resolved.model_dump(mode="json"), sort_keys=False))
    return 0

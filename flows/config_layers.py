"""How a config is layered before it is validated (``flows.config``): a YAML/JSON file, the
file its ``extends:`` names under it, and ``--set key=value`` overrides on top.

All of it works on plain dicts, before any model sees them: a file may extend a base that alone
would not validate, and a section's ``kind`` swapped by a layer replaces that section whole (the
old kind's fields would not validate against the new one). Every mistake is a ``ConfigError``
naming the file, line or override it came from.
"""

from __future__ import annotations

import os
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from eva_runtime.errors import ConfigError
from tasks.config_tree import NotASection, open_section


def read_config_file(path: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A YAML/JSON config as a dict; ``extends: base.yaml`` (relative to the file) is read
    first and deep-merged under it, so recipes share one base."""
    path = os.path.abspath(path)
    if path in _seen:
        raise ConfigError(f"{path}: extends itself (through {' -> '.join(_seen)})")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except FileNotFoundError:
        named_by = f"{_seen[-1]}: extends" if _seen else "--config"
        raise ConfigError(f"{named_by}: no file at {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"--config: {path} is a directory, not a YAML/JSON file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}:{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return resolve_extends(data, os.path.dirname(path), (*_seen, path))


def resolve_extends(
    data: dict[str, Any], base_dir: str, _seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``data`` deep-merged over the file its ``extends:`` names (relative to ``base_dir``),
    recursively; ``data`` itself when it extends nothing. A deployment's inline config layers
    on a file this way too."""
    data = dict(data)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base.strip():
        where = _seen[-1] if _seen else "config"
        raise ConfigError(f"{where}: extends: expected a file name (got {base!r})")
    return deep_merge(read_config_file(os.path.join(base_dir, base), _seen), data)


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``: mappings merge key by key, anything else replaces.

    A mapping whose ``kind`` differs from the base's replaces it whole, as ``--set`` does: the
    old kind's fields would not validate against the new one (``extends`` a config, then swap
    a backend).

    Its own recursion, not ``tasks.config_tree.walk``: it merges two trees, the walk visits one.
    """
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            swapped = "kind" in value and "kind" in old and value["kind"] != old["kind"]
            out[key] = value if swapped else deep_merge(old, value)
        else:
            out[key] = value
    return out


def apply_overrides(
    data: dict[str, Any], overrides: list[str], model: type[BaseModel] | None = None
) -> dict[str, Any]:
    """``data`` with each ``a.b.c=value`` override set in place (values parsed as YAML).

    Setting a backend's ``kind`` to a new value starts that section from the new kind's own
    defaults, but for the fields the new kind has too, which keep their values where ``model``
    (the config's model) says which they are: ``--set evaluate.generation.kind=transformers``
    on a CTranslate2 evaluation keeps its greedy temperature and its length cap, where
    starting afresh would sample at 0.7 with another cap, without a word.
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. sample.fraction=0.5")
        parts = key.split(".")
        try:
            node = open_section(data, parts[:-1])
        except NotASection as exc:
            raise ConfigError(f"--set {item!r}: {exc}") from None
        if not raw.strip():
            raise ConfigError(f"--set {item!r}: empty value (write {key}=null to unset it)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "not a YAML value"
            raise ConfigError(f"--set {item!r}: {problem}") from None
        if parts[-1] == "kind" and node.get("kind") != value:
            shared = kind_fields(model, parts[:-1], value) if model is not None else set()
            kept = {k: v for k, v in node.items() if k in shared and k != "kind"}
            node.clear()
            node.update(kept)
        node[parts[-1]] = value
    return data


def kind_fields(model: type[BaseModel], path: list[str], kind: Any) -> set[str]:
    """The fields of the component of ``kind`` that the section at ``path`` of ``model`` may
    hold (a union of configs told apart by ``kind``); none where ``path`` is not such a
    section."""
    members: list[type[BaseModel]] = [model]
    for part in path:
        fields = members[0].model_fields if len(members) == 1 else {}
        if part not in fields:
            return set()
        members = _models(fields[part].annotation)
    for member in members:
        tag = member.model_fields.get("kind")
        if tag is not None and tag.default == kind:
            return set(member.model_fields)
    return set()


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation admits (through ``Annotated``, unions, ``Optional``)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return [m for arg in get_args(annotation) for m in _models(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []

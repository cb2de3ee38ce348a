"""A config read aloud: ``eva config --explain`` (every field of the config that would run, its
value and its description) and the close matches a mistyped key gets ("did you mean
sample.fraction?"). Both read the pydantic models the config is validated by, so the text is the
``Field(description=...)`` each model already carries: one source for help and validation. The
first walks the validated config (``tasks.config_tree.walk``); the second follows a dotted key
through the models' classes, unions included, since the data it is asked about failed to
validate and has no model to walk."""

from __future__ import annotations

import difflib
import inspect
import json
import typing
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel

from tasks.config_tree import get_path, walk


def explain(config: BaseModel) -> Iterator[str]:
    """``key: value  # description`` for every field of ``config``, sections first-level order,
    nested sections as dotted keys (what ``--set`` takes); a list or a dict is one value."""
    for node in walk(config, descend=lambda node: isinstance(node.value, BaseModel)):
        if node.field is None:
            continue  # the config itself
        about = f"  # {node.field.description}" if node.field.description else ""
        if isinstance(node.value, BaseModel):
            yield f"{node.path}:{about}"
            continue
        shown = json.dumps(node.value, default=str)
        if len(shown) > 70:
            shown = shown[:67] + "..."
        yield f"{node.path}: {shown}{about}"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions and Annotated)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _model_for(annotation: Any, node: Any) -> type[BaseModel] | None:
    """The model a section is validated as: the only one, or the union member whose ``kind``
    default is the section's ``kind``."""
    models = _models_in(annotation)
    if len(models) == 1:
        return models[0]
    kind = node.get("kind") if isinstance(node, dict) else None
    for model in models:
        field = model.model_fields.get("kind")
        if field is not None and field.default == kind:
            return model
    return None


def fields_at(model: type[BaseModel], data: Any, path: list[str]) -> list[str]:
    """The field names of the section at ``path`` (dotted keys as --set takes them) of ``data``
    validated as ``model``; [] where the section is free-form (options) or unknown."""
    current: type[BaseModel] | None = model
    node = data
    for part in path:
        if isinstance(node, list) and part.isdigit():  # an item of a list of sections
            node = get_path(node, [int(part)])
            continue
        if current is None or part not in current.model_fields:
            return []
        node = get_path(node, [part])
        current = _model_for(current.model_fields[part].annotation, node)
    return list(current.model_fields) if current is not None else []


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The choice a typo most likely meant ("evolv" -> "evolve"), if one is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def close_field(model: type[BaseModel], data: Any, key: str) -> str | None:
    """The field a mistyped dotted ``key`` most likely meant (its full dotted name), if any."""
    *parent, word = key.split(".")
    near = close_match(word, fields_at(model, data, parent))
    return ".".join([*parent, near]) if near else None

"""The config tree: one walk over a validated config, and one dotted path into a plain one.

Whatever looks through a config does it here. ``walk`` visits a validated config (a pydantic
model, its nested models, and the lists and dicts that hold them): the cache key finds the
components a config selects and the fields it leaves out (``tasks.keys``), the checks at the
edge find API keys, devices and Python components (``flows.machine_checks``,
``flows.inputs``), and ``eva config --explain`` reads every field aloud (``flows.explain``).
``get_path`` and ``open_section`` read and write plain dicts by the dotted keys ``--set``
takes: a config before it is validated (``flows.config_layers``), and the dump a cache key is
made of.

It lives in ``tasks`` because the cache key needs it, and ``tasks`` never imports ``flows``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

Key = str | int  # a field's or a dict's key, or a list's index


@dataclass(frozen=True)
class Node:
    """One value of a config tree, where it is, and the field of a model that holds it."""

    keys: tuple[Key, ...]  # from the root: field names, dict keys, list indices
    value: Any
    owner: BaseModel | None = None  # the model whose field it is (None: the root, an item)
    field: FieldInfo | None = None  # that field's declaration (description, default, extra)

    @property
    def path(self) -> str:
        """Its dotted key, as ``--set`` takes it and errors name it (the root: "")."""
        return ".".join(str(k) for k in self.keys)


def walk(config: Any, descend: Callable[[Node], bool] | None = None) -> Iterator[Node]:
    """Every value of ``config``, itself first, then depth first in declaration order: each
    model's fields, each list or tuple item, each dict value. Where ``descend(node)`` is false
    the node is visited but what it holds is not (``explain`` reads a list as one value; a key
    skips what a field it leaves out holds)."""
    return _walk(Node((), config), descend)


def _walk(node: Node, descend: Callable[[Node], bool] | None) -> Iterator[Node]:
    yield node
    if descend is not None and not descend(node):
        return
    value, keys = node.value, node.keys
    if isinstance(value, BaseModel):
        for name, field in type(value).model_fields.items():
            yield from _walk(Node((*keys, name), getattr(value, name), value, field), descend)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _walk(Node((*keys, index), item), descend)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(Node((*keys, key), item), descend)


def get_path(data: Any, path: str | Sequence[Key], default: Any = None) -> Any:
    """The value at ``path`` (a dotted key, or its steps; "" or () is ``data``) of plain dicts
    and lists (a dict's key, a list's index), or ``default`` where a step is not there."""
    steps = (path.split(".") if path else []) if isinstance(path, str) else path
    node = data
    for key in steps:
        found = key in node if isinstance(node, dict) else _is_index(node, key)
        if not found:
            return default
        node = node[key]
    return node


def _is_index(node: Any, key: Key) -> bool:
    return isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)


class NotASection(LookupError):
    """A step of a dotted key holds a value, not a section."""

    def __init__(self, step: Key) -> None:
        super().__init__(f"{step} is not a section")


def open_section(data: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The dict at ``keys`` of ``data``, made where it is missing or null (an optional section
    that is off, ``ray: null``, opens): where a value set under it goes. ``NotASection`` where
    a step holds anything else."""
    node = data
    for key in keys:
        if node.get(key) is None:
            node[key] = {}
        node = node[key]
        if not isinstance(node, dict):
            raise NotASection(key)
    return node

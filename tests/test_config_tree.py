"""The one walk over a config and the one dotted path into a plain one (tasks/config_tree.py),
and the cache key's dump built on the walk where a config holds models in lists and dicts."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from tasks.config_tree import NotASection, get_path, open_section, walk
from tasks.keys import UNLESS_DEFAULT, keyed_config


class Leaf(BaseModel):
    a: int = Field(default=1, description="a number")
    late: int = Field(default=0, json_schema_extra=UNLESS_DEFAULT)
    hidden: int = Field(default=3, exclude=True)

    def extra_key(self) -> dict[str, Any]:
        return {"points_at": self.a * 10}


class Section(BaseModel):
    leaf: Leaf = Field(default_factory=Leaf)
    leaves: list[Leaf] = Field(default_factory=list)
    named: dict[str, Leaf] = Field(default_factory=dict)
    off: Leaf | None = Field(default=None, json_schema_extra=UNLESS_DEFAULT)
    options: dict[str, Any] = Field(default_factory=dict)


def test_the_walk_visits_every_value_depth_first_with_its_dotted_key_and_field() -> None:
    config = Section(leaves=[Leaf(a=2)], named={"x": Leaf()}, options={"device": "cuda"})
    nodes = list(walk(config))
    assert [n.path for n in nodes[:5]] == ["", "leaf", "leaf.a", "leaf.late", "leaf.hidden"]
    paths = [n.path for n in nodes]
    assert {"leaves.0.a", "named.x.a", "off", "options.device"} <= set(paths)
    a = next(n for n in nodes if n.path == "leaves.0.a")
    assert a.value == 2 and isinstance(a.owner, Leaf) and a.field.description == "a number"
    item = next(n for n in nodes if n.path == "leaves.0")
    assert item.owner is None and item.field is None  # a list's item is no model's field
    assert next(n for n in nodes if n.path == "options.device").owner is None


def test_descend_false_visits_a_node_but_not_what_it_holds() -> None:
    config = Section(leaves=[Leaf()])
    models_only = [n.path for n in walk(config, descend=lambda n: isinstance(n.value, BaseModel))]
    assert "leaves" in models_only and "leaves.0" not in models_only
    assert "leaf.a" in models_only


def test_the_key_drops_default_late_fields_and_adds_extra_key_inside_lists_and_dicts() -> None:
    config = Section(leaves=[Leaf(), Leaf(a=2, late=5)], named={"x": Leaf(a=3)}, off=Leaf())
    assert keyed_config(config) == {
        "leaf": {"a": 1, "points_at": 10},
        "leaves": [{"a": 1, "points_at": 10}, {"a": 2, "late": 5, "points_at": 20}],
        "named": {"x": {"a": 3, "points_at": 30}},
        "off": {"a": 1, "points_at": 10},  # set: in the key, though its own late field is not
        "options": {},
    }
    assert "off" not in keyed_config(Section())


def test_get_path_reads_plain_dicts_and_lists_and_misses_quietly() -> None:
    data = {"a": {"b": [{"c": 1}], "n": None}}
    assert get_path(data, "a.b") == [{"c": 1}]
    assert get_path(data, ["a", "b", 0, "c"]) == 1
    assert get_path(data, "") is data
    assert get_path(data, "a.n") is None and get_path(data, "a.n.x", "gone") == "gone"
    assert get_path(data, ["a", "b", 1]) is None


def test_open_section_opens_missing_and_null_sections_and_refuses_a_value() -> None:
    data: dict[str, Any] = {"ray": None, "sample": {"fraction": 0.5}}
    open_section(data, ["ray"])["address"] = "auto"
    open_section(data, ["train", "solver"])["beta"] = 0.1
    assert data == {
        "ray": {"address": "auto"},
        "sample": {"fraction": 0.5},
        "train": {"solver": {"beta": 0.1}},
    }
    with pytest.raises(NotASection, match="fraction is not a section"):
        open_section(data, ["sample", "fraction"])

"""The two run configs share one base, and what they share is defined once; the keys of the
default solver step are what they were before ``report_to`` existed."""

from __future__ import annotations

import hashlib
import json

from flows.config import OnlineRunConfig, RunConfig, _RunBase
from tasks.train import TrainConfig

# Where online eva's run differs from the base it shares (redeclared in OnlineRunConfig).
ONLINE_OWN = {"run", "prompts"}


def test_the_shared_fields_are_defined_once() -> None:
    shared = set(RunConfig.model_fields) & set(OnlineRunConfig.model_fields)
    assert shared == set(_RunBase.model_fields) | {"evaluate"}
    for name, base in _RunBase.model_fields.items():
        # repr: default, description, validators; FieldInfo has no equality of its own.
        assert repr(RunConfig.model_fields[name]) == repr(base), name
        online = OnlineRunConfig.model_fields[name]
        if name not in ONLINE_OWN:
            assert repr(online) == repr(base), name
        else:  # same type and validation, its own default or description
            assert (online.annotation, online.metadata) == (base.annotation, base.metadata)
    assert RunConfig().run == "demo" and OnlineRunConfig().run == "online"
    assert RunConfig().root == OnlineRunConfig().root  # made absolute in both


def test_both_validate_the_shared_fields_alike() -> None:
    for model in (RunConfig, OnlineRunConfig):
        # seed -1: numpy's generators refuse it, the online buffer's a segment in.
        for bad in ({"torch_threads": 0}, {"run": "a/b"}, {"nope": 1}, {"seed": -1}):
            try:
                model.model_validate(bad)
            except ValueError:
                continue
            raise AssertionError(f"{model.__name__} accepted {bad}")


def test_field_order_does_not_reach_a_key_or_a_stored_config() -> None:
    """Keys hash sorted JSON (tasks/keys.py) and config.json is read as a mapping: a config
    recorded with its fields in another order is the same config."""
    config = RunConfig(run="r", iterations=3)
    recorded = config.model_dump(mode="json")
    assert RunConfig.model_validate(dict(reversed(recorded.items()))) == config
    online = OnlineRunConfig(run="o")
    recorded = online.model_dump(mode="json")
    assert OnlineRunConfig.model_validate(dict(reversed(recorded.items()))) == online


def test_the_default_solver_steps_config_is_keyed_as_before_report_to() -> None:
    """``report_to`` is left out of the key at its default: the train stage's key of a run
    that reports nowhere is the one it had before the field existed (pinned from then)."""
    from tasks.keys import keyed_config

    dumped = json.dumps(keyed_config(TrainConfig()), sort_keys=True)
    assert "report_to" not in dumped
    digest = hashlib.sha256(dumped.encode()).hexdigest()
    assert digest == "7360512f0ddae1a7381658ef901a4ae17c3ea39bb598d75ca230fcb50a9daa48"

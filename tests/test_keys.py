"""What a cache key sees beyond a stage's version: a user's code and the modules of theirs it
imports, a Hub checkpoint's commit, and config fields added after runs were keyed."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from tasks.context import RunContext
from tasks.keys import UNLESS_DEFAULT, keyed_config, user_modules, version_of

# -- a user's code and the modules it imports ---------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project: a reward in a package that imports a helper of theirs (absolute and
    relative, one inside a function), the standard library and numpy; and a module no one
    imports."""
    root = tmp_path / "proj"
    (root / "rewards").mkdir(parents=True)
    (root / "rewards" / "__init__.py").write_text("")
    (root / "rewards" / "helpers.py").write_text("def norm(s):\n    return s.strip()\n")
    (root / "rewards" / "extract.py").write_text("def last(s):\n    return s.split()[-1]\n")
    (root / "rewards" / "score.py").write_text(
        "import json\nimport numpy\n\nfrom rewards.helpers import norm\n\n\n"
        "def score(prompt, response):\n    from .extract import last\n\n"
        "    return float(last(norm(response)) == '4')\n"
    )
    (root / "unrelated.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m == "rewards" or m.startswith("rewards.")]:
        del sys.modules[name]


def _annotate_key(tmp_path: Path, function: str) -> str:
    from tasks.annotate import AnnotateConfig, annotate

    config = AnnotateConfig.model_validate({"reward": {"kind": "callable", "function": function}})
    run = RunContext(root=str(tmp_path), run="r", seed=0)
    return annotate.cache_key(run, 1, config, "annotate", {})


def test_editing_a_helper_the_reward_imports_changes_the_key(project: Path, tmp_path) -> None:
    from rewards.score import score

    found = [name for name, _ in user_modules(score.__module__, Path(score.__code__.co_filename))]
    # Its own module first, then the user's modules it imports; never json or numpy.
    assert found == ["rewards.score", "rewards.extract", "rewards.helpers"]
    key = _annotate_key(tmp_path, "rewards.score:score")
    (project / "unrelated.py").write_text("X = 2\n")
    assert _annotate_key(tmp_path, "rewards.score:score") == key
    (project / "rewards" / "helpers.py").write_text("def norm(s):\n    return s.lower()\n")
    edited = _annotate_key(tmp_path, "rewards.score:score")
    assert edited != key
    (project / "rewards" / "extract.py").write_text("def last(s):\n    return s[-1:]\n")
    assert _annotate_key(tmp_path, "rewards.score:score") != edited  # imported in a function


def test_a_module_that_imports_none_of_the_users_keeps_its_key(project: Path) -> None:
    """Following imports changes nothing for a reward alone in its module: its part of the key
    is the hash of its text, as before, so the keys of runs that use one hold."""
    (project / "alone.py").write_text(
        "import os\n\n\ndef score(prompt, response):\n    return 1.0\n"
    )
    import alone

    text = (project / "alone.py").read_text()
    assert version_of(alone.score) == "source:" + hashlib.sha256(text.encode()).hexdigest()[:16]
    del sys.modules["alone"]


# -- a Hub checkpoint, by the commit the local cache holds --------------------------------------


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, offline (nothing can be downloaded here)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _download(cache: Path, model_id: str, commit: str) -> None:
    """What huggingface_hub leaves after downloading ``model_id`` at ``commit``
    (file_download.py: ``models--{org}--{name}/refs/main`` holds the commit,
    ``snapshots/{commit}/`` the files)."""
    repo = cache / ("models--" + model_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")


def test_a_hub_checkpoint_is_keyed_by_the_commit_its_cache_holds(hub_cache: Path) -> None:
    from eva_runtime.hub import cached_revision, record_revision
    from tasks.bootstrap import BootstrapConfig, _checkpoint_key
    from tasks.content_hashes import checkpoint_hash, hub_ref

    model = "eva-test/policy"
    config = BootstrapConfig(init_checkpoint=model)
    # Not cached: keyed by its id alone, as before commits were keyed.
    assert cached_revision(model) is None and record_revision(model) is None  # offline
    uncached = _checkpoint_key(config)
    assert uncached == {"checkpoint": hashlib.sha256(f"hub:{model}".encode()).hexdigest()}
    _download(hub_cache, model, "a" * 40)
    assert cached_revision(model) == record_revision(model) == "a" * 40
    first = _checkpoint_key(config)
    assert first != uncached
    assert checkpoint_hash(hub_ref(model)) == first["checkpoint"]  # theta_0's content hash
    # A newer download moves refs/main: the key follows.
    _download(hub_cache, model, "b" * 40)
    assert _checkpoint_key(config) not in (first, uncached)
    _download(hub_cache, model, "a" * 40)
    assert _checkpoint_key(config) == first
    # Another model's download changes nothing.
    _download(hub_cache, "eva-test/other", "c" * 40)
    assert _checkpoint_key(config) == first


def test_bootstrap_records_the_commit_it_hands_on(hub_cache, tmp_path, monkeypatch) -> None:
    """Bootstrap fetches the config of a Hub checkpoint the cache lacks, so theta_0's content
    hash names the commit from the run's first launch (a later launch, with the model
    downloaded, would otherwise see a new theta_0 and rerun everything after it)."""
    import huggingface_hub
    from huggingface_hub import constants

    from tasks.bootstrap import BootstrapConfig, bootstrap

    model = "eva-test/policy"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    fetched: list[str] = []

    def download(repo_id: str, filename: str, **_: Any) -> str:
        fetched.append(f"{repo_id}/{filename}")
        _download(hub_cache, repo_id, "d" * 40)
        return str(hub_cache)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    out = bootstrap.fn(None, BootstrapConfig(init_checkpoint=model), heldout=None)
    assert out.external_model == f"hub:{model}" and fetched == [f"{model}/config.json"]
    bootstrap.fn(None, BootstrapConfig(init_checkpoint=model), heldout=None)
    assert len(fetched) == 1  # cached now: nothing fetched again


# -- config fields added after runs were keyed ----------------------------------------------------


class Before(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str = "x"
    size: int = 3


class After(Before):
    """``Before`` with a field added the one way: keyed only when set."""

    judge: dict[str, Any] | None = Field(default=None, json_schema_extra=UNLESS_DEFAULT)
    lag: int = Field(default=2, json_schema_extra={"key": "unless default"})


def test_a_field_added_at_its_default_keeps_the_key() -> None:
    assert keyed_config(After()) == keyed_config(Before()) == {"kind": "x", "size": 3}
    assert keyed_config(After(lag=3)) == {"kind": "x", "size": 3, "lag": 3}
    assert keyed_config(After(judge={"m": 1}))["judge"] == {"m": 1}
    # Nested in lists and dicts, as a config holds its components.

    class Holder(BaseModel):
        items: list[After] = []
        named: dict[str, After] = {}

    held = Holder(items=[After(), After(lag=1)], named={"a": After()})
    assert keyed_config(held) == {
        "items": [{"kind": "x", "size": 3}, {"kind": "x", "size": 3, "lag": 1}],
        "named": {"a": {"kind": "x", "size": 3}},
    }
    # Dumps keep the field: only the key leaves it out.
    assert After().model_dump()["lag"] == 2


def test_a_misspelt_key_rule_is_refused() -> None:
    class Typo(BaseModel):
        lag: int = Field(default=2, json_schema_extra={"key": "unless-default"})

    with pytest.raises(TypeError, match=r"Typo\.lag: json_schema_extra"):
        keyed_config(Typo())


def test_the_fields_that_kept_old_keys_are_keyed_only_when_set() -> None:
    from eva_runtime.llm_config import LLMClientConfig
    from tasks.online import OnlineConfig
    from tasks.online_loop import BufferConfig

    assert "skip_tied" not in keyed_config(BufferConfig())
    assert keyed_config(BufferConfig(skip_tied=True))["skip_tied"] is True
    llm = LLMClientConfig(base_url="http://127.0.0.1:1/v1", model="m")
    assert "breaker_failures" not in keyed_config(llm)
    assert keyed_config(llm.model_copy(update={"breaker_failures": 5}))["breaker_failures"] == 5
    online = set(keyed_config(OnlineConfig.model_construct()))
    assert not {"max_unscored_share", "fail_on_no_signal"} & online


# -- what a component config points at ----------------------------------------------------------


def test_the_verifiable_rewards_answers_key_it_without_touching_the_config(tmp_path) -> None:
    from tasks.backends.reward.verifiable import VerifiableReward

    answers = tmp_path / "a.jsonl"
    answers.write_text(json.dumps({"prompt": "1+2=", "answer": "3"}) + "\n")
    reward = VerifiableReward(function="eva_world.components:match", answers=str(answers))
    key = keyed_config(reward)
    assert key["answers_sha256"] == hashlib.sha256(answers.read_bytes()).hexdigest()
    assert "answers_sha256" not in reward.model_dump()  # the config holds what it was given
    answers.write_text(json.dumps({"prompt": "1+2=", "answer": "4"}) + "\n")
    assert keyed_config(reward) != key
    # A config a run folder recorded before (with the hash in it) still reads.
    recorded = {**reward.model_dump(mode="json"), "answers_sha256": "stale"}
    assert VerifiableReward.model_validate(recorded) == reward
    none = VerifiableReward(function="eva_world.components:match")
    assert keyed_config(none)["answers_sha256"] is None

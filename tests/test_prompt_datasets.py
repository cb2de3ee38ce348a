"""Prompts from where users keep them: Hugging Face datasets (saved folders and an offline Hub
cache), ``hf://`` URLs, multi-turn rows, and the rows a run drops (tasks.prompt_datasets,
tasks.prompt_rows). Nothing here reaches the network."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from eva_runtime.errors import ConfigError
from tasks.context import RunContext, StageContext
from tasks.prompts import PromptsConfig, load_prompts, read_prompt_set

DATA = Path(__file__).parent / "data"
MT_BENCH = [
    json.loads(line) for line in (DATA / "mt_bench_questions.jsonl").read_text().splitlines()
]
ARENA = [
    json.loads(line)
    for line in (DATA / "arena_hard_v0.1_questions_20.jsonl").read_text().splitlines()
]


def _save(path: Path, columns: dict, split: str | None = None) -> str:
    from datasets import Dataset, DatasetDict

    dataset = Dataset.from_dict(columns)
    (DatasetDict({split: dataset}) if split else dataset).save_to_disk(str(path))
    return str(path)


def _mt_bench_columns() -> dict:
    return {
        "question_id": [r["question_id"] for r in MT_BENCH],
        "category": [r["category"] for r in MT_BENCH],
        "turns": [r["turns"] for r in MT_BENCH],
    }


def _prompts(config: PromptsConfig) -> list[str]:
    return read_prompt_set(config).table.column("prompt").to_pylist()


def test_a_saved_dataset_gives_first_turns_or_joined_turns(tmp_path) -> None:
    folder = _save(tmp_path / "mt", _mt_bench_columns())
    first = PromptsConfig(dataset=folder, prompt_column="turns")
    assert _prompts(first) == [r["turns"][0] for r in MT_BENCH]
    table = read_prompt_set(first).table
    assert table.column("category").to_pylist()[:2] == ["writing", "writing"]
    joined = _prompts(first.model_copy(update={"multi_turn": "join"}))
    assert joined[0] == (
        "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
        "cultural experiences and must-see attractions.\n\nRewrite your previous response. "
        "Start every sentence with the letter A."
    )
    assert joined == [f"{r['turns'][0]}\n\n{r['turns'][1]}" for r in MT_BENCH]
    assert _prompts(first.model_copy(update={"limit": 3})) == [r["turns"][0] for r in MT_BENCH[:3]]


def test_a_dataset_dict_picks_its_split_and_names_what_is_missing(tmp_path) -> None:
    from datasets import Dataset, DatasetDict

    folder = str(tmp_path / "dd")
    DatasetDict(
        {
            "train_prefs": Dataset.from_dict({"prompt": ["a?", "b?"]}),
            "test_prefs": Dataset.from_dict({"prompt": ["c?"]}),
        }
    ).save_to_disk(folder)
    assert _prompts(PromptsConfig(dataset=folder, split="test_prefs")) == ["c?"]
    with pytest.raises(ValueError, match=r"dd: no split 'train' \(splits: train_prefs, test_"):
        read_prompt_set(PromptsConfig(dataset=folder))
    with pytest.raises(ValueError, match=r"no column 'instruction' \(columns: prompt\)"):
        read_prompt_set(
            PromptsConfig(dataset=folder, split="train_prefs", prompt_column="instruction")
        )


def test_a_folder_of_data_files_is_read_by_load_dataset(tmp_path, monkeypatch) -> None:
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "a?"}\n{"prompt": "b?"}\n')
    (folder / "test.jsonl").write_text('{"prompt": "c?"}\n')
    assert _prompts(PromptsConfig(dataset=str(folder))) == ["a?", "b?"]
    assert _prompts(PromptsConfig(dataset=str(folder), split="test")) == ["c?"]
    run = RunContext(root=str(tmp_path / "runs"), run="t", seed=0)
    config = PromptsConfig(dataset=str(folder))
    before = load_prompts.cache_key(run, None, config, "prompts", {})
    (folder / "train.jsonl").write_text('{"prompt": "a?"}\n{"prompt": "d?"}\n')  # edited
    assert load_prompts.cache_key(run, None, config, "prompts", {}) != before
    assert _prompts(config) == ["a?", "d?"]


def test_a_dataset_keys_the_stage_by_its_fingerprint(tmp_path) -> None:
    run = RunContext(root=str(tmp_path / "runs"), run="t", seed=0)
    folder = tmp_path / "ds"
    _save(folder, {"prompt": ["a?", "b?"]})
    config = PromptsConfig(dataset=str(folder))

    def key() -> str:
        return load_prompts.cache_key(run, None, config, "prompts", {})

    first = key()
    assert key() == first  # read again: the same stage
    import shutil

    shutil.rmtree(folder)
    _save(folder, {"prompt": ["a?", "c?"]})  # the same folder, other rows
    assert key() != first
    # A file is still keyed by its bytes, as before datasets were possible.
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a?"}\n')
    import hashlib

    from tasks.prompts import _file_key

    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert _file_key(PromptsConfig(path=str(path))) == {"file_sha256": expected}


def test_a_folder_changed_in_place_is_seen_whatever_its_fingerprint_says(
    tmp_path, monkeypatch
) -> None:
    # datasets' own fingerprint misses both of these: save_to_disk's state.json is kept when
    # its data file is rewritten in place, and a folder of data files is fingerprinted by
    # modification times. The stage is keyed by the folder's bytes instead.
    import os
    import shutil

    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    run = RunContext(root=str(tmp_path / "runs"), run="t", seed=0)
    saved, other = tmp_path / "saved", tmp_path / "other"
    _save(saved, {"prompt": ["a?", "b?"]})
    _save(other, {"prompt": ["a?", "c?"]})
    config = PromptsConfig(dataset=str(saved))
    before = load_prompts.cache_key(run, None, config, "prompts", {})
    (arrow,) = [f for f in os.listdir(saved) if f.endswith(".arrow")]
    state = (saved / "state.json").read_text()
    shutil.copy(other / arrow, saved / arrow)  # the rows change, state.json does not
    assert (saved / "state.json").read_text() == state
    assert load_prompts.cache_key(run, None, config, "prompts", {}) != before
    assert _prompts(config) == ["a?", "c?"]
    files = tmp_path / "files"
    files.mkdir()
    data = files / "train.jsonl"
    data.write_text('{"prompt": "a?"}\n')
    config = PromptsConfig(dataset=str(files))
    before = load_prompts.cache_key(run, None, config, "prompts", {})
    assert _prompts(config) == ["a?"]  # read once: load_dataset has it in its cache now
    stamp = os.stat(data)
    data.write_text('{"prompt": "z?"}\n')  # same size, and its times put back
    os.utime(data, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert load_prompts.cache_key(run, None, config, "prompts", {}) != before
    assert _prompts(config) == ["z?"]  # the rows of the bytes the new key names
    assert load_prompts.cache_key(run, None, config, "prompts", {}) == (
        load_prompts.cache_key(run, None, config, "prompts", {})
    )  # read again unchanged: the same key


def _hub_cache(
    cache: Path, repo_id: str, revision: str, rows: list[dict], split: str = "train"
) -> None:
    """Write ``rows`` into a Hugging Face datasets cache as ``repo_id`` at ``revision``: the
    folder load_dataset reads offline (datasets' ``cache`` module). Made with a packaged
    builder whose repo id is set after construction (its constructor insists that data files
    come from the Hub), i.e. with datasets' internals: a datasets upgrade may need this helper
    changed, never eva."""
    from datasets.packaged_modules.json.json import Json

    source = cache.parent / f"{repo_id.replace('/', '_')}-{revision}.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    builder = Json(
        cache_dir=str(cache),
        dataset_name=repo_id.split("/")[1],
        config_name="default",
        config_id="default",
        hash=revision,
        data_files={split: str(source)},
    )
    builder.repo_id = repo_id
    builder._cache_dir = builder._build_cache_dir()
    builder.download_and_prepare()


def test_a_hub_dataset_is_read_from_the_cache_offline(tmp_path, monkeypatch) -> None:
    """Arena-Hard as the Hub holds it (lmarena-ai/arena-hard-auto-v0.1: ``turns`` of
    ``{"content": ...}``, a ``cluster`` per row), read offline from the cache; a newer revision
    in the cache is another fingerprint, so another stage key."""
    import datasets.config

    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    repo = "lmarena-ai/arena-hard-auto-v0.1"
    hub_rows = [
        {"question_id": r["uid"], "cluster": r["cluster"], "turns": [{"content": r["prompt"]}]}
        for r in ARENA
    ]
    _hub_cache(cache, repo, "0" * 16, hub_rows)
    config = PromptsConfig(dataset=repo, prompt_column="turns", category_column="cluster")
    table = read_prompt_set(config).table
    assert table.column("prompt").to_pylist() == [r["prompt"] for r in ARENA]
    assert table.column("category").to_pylist() == [r["cluster"] for r in ARENA]
    run = RunContext(root=str(tmp_path / "runs"), run="t", seed=0)
    before = load_prompts.cache_key(run, None, config, "heldout", {})
    assert load_prompts.cache_key(run, None, config, "heldout", {}) == before
    _hub_cache(cache, repo, "f" * 16, hub_rows[:10])  # a newer revision, now in the cache
    assert len(_prompts(config)) == 10
    assert load_prompts.cache_key(run, None, config, "heldout", {}) != before
    with pytest.raises(
        ValueError, match=r'^lmarena-ai/arena-hard-auto-v0\.1: Unknown split "nope"'
    ):
        read_prompt_set(config.model_copy(update={"split": "nope"}))
    with pytest.raises(ValueError, match=r"^org/absent: cannot be loaded"):
        read_prompt_set(PromptsConfig(dataset="org/absent"))


def _arena_on_the_hub() -> list[dict]:
    """The sample's rows in the shape lmarena-ai/arena-hard-auto-v0.1 has on the Hub (its
    card: question_id, category, cluster, turns as a list of {content})."""
    return [
        {
            "question_id": r["uid"],
            "category": r["category"],
            "cluster": r["cluster"],
            "turns": [{"content": r["prompt"]}],
        }
        for r in ARENA
    ]


@pytest.mark.parametrize(("recipe", "online"), [("dpo.yaml", False), ("online-rloo.yaml", True)])
def test_the_paper_recipes_read_their_prompts_from_the_hub_cache(
    tmp_path, monkeypatch, recipe, online
) -> None:
    """configs/paper names its prompt sets as Hub datasets, not files beside the checkout; read
    here from an offline cache holding them in the shapes their cards give (UltraFeedback
    binarized: a `prompt` column in split train_prefs; Arena-Hard v0.1: `turns`, `cluster`)."""
    import datasets.config

    from flows.config import CONFIG_DIR, OnlineRunConfig, RunConfig, load_config

    cache = tmp_path / "hf" / "datasets"
    cache.mkdir(parents=True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    feedback = ["Explain DNS.", "", "explain  dns.", "Write a haiku."]
    rows = [{"prompt": p, "prompt_id": str(i), "score_chosen": 8.0} for i, p in enumerate(feedback)]
    _hub_cache(cache, "HuggingFaceH4/ultrafeedback_binarized", "1" * 16, rows, "train_prefs")
    _hub_cache(cache, "lmarena-ai/arena-hard-auto-v0.1", "2" * 16, _arena_on_the_hub())
    path = f"{CONFIG_DIR}/paper/{recipe}"
    config: RunConfig | OnlineRunConfig = (
        load_config(path, [], OnlineRunConfig) if online else load_config(path, [])
    )
    assert config.prompts.limit == 10000 and config.prompts.path is None
    seeds = read_prompt_set(config.prompts)
    assert seeds.table.column("prompt").to_pylist() == ["Explain DNS.", "Write a haiku."]
    assert seeds.dropped == {"empty": 1, "not_text": 0, "too_long": 0, "duplicate": 1}
    heldout = read_prompt_set(config.heldout).table
    assert heldout.column("prompt").to_pylist() == [r["prompt"] for r in ARENA]
    assert heldout.column("category").to_pylist()[0] == "ABC Sequence Puzzles & Groups"


def _ctx(tmp_path: Path, artifact: str = "prompts") -> StageContext:
    run = RunContext(root=str(tmp_path / "runs"), run="t", seed=0)
    return StageContext(run, None, artifact, 0, {}, str(tmp_path), run.store(), lambda _: None)


def test_invalid_rows_are_an_error_or_dropped_and_counted(tmp_path, caplog) -> None:
    rows = ["Fine?", "", "x" * 30, "  FINE? ", "Last?", "Third?", "Never read?"]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": r}) + "\n" for r in rows))
    strict = PromptsConfig(path=str(path), max_chars=20)
    with pytest.raises(ValueError, match=r"p\.jsonl: row 1: prompt is empty$"):
        read_prompt_set(strict)
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt": "ok?"}\n' + json.dumps({"prompt": "x" * 30}) + "\n")
    with pytest.raises(
        ValueError, match=r"row 1: prompt has 30 characters, more than max_chars=20"
    ):
        read_prompt_set(PromptsConfig(path=str(long), max_chars=20))
    lenient = strict.model_copy(update={"drop_invalid": True, "limit": 3})
    with caplog.at_level(logging.INFO, logger="eva.prompts"):
        out = load_prompts.fn(_ctx(tmp_path), lenient)
    assert out.table.column("prompt").to_pylist() == ["Fine?", "Last?", "Third?"]
    assert out.stats["prompts"] == 3
    assert out.stats["dropped"] == {"empty": 1, "not_text": 0, "too_long": 1, "duplicate": 1}
    assert out.table.schema.metadata is None  # the counts never reach the artifact
    line = f"prompts: {path}: kept 3 of 6 rows read; dropped 1 empty, 1 too_long, 1 duplicate"
    assert line in caplog.text
    # A column that is not text, and a turn without content; nothing left is an error, counted.
    numbers = tmp_path / "n.jsonl"
    numbers.write_text('{"prompt": 5}\n{"prompt": 6}\n')
    with pytest.raises(ValueError, match=r"no prompts left of 2 rows \(dropped: 2 not_text\)$"):
        read_prompt_set(PromptsConfig(path=str(numbers), drop_invalid=True))
    # One number among text prompts: dropped and counted (Arrow's reader refused the file).
    mixed = tmp_path / "m.jsonl"
    mixed.write_text('{"prompt": "a?"}\n{"prompt": 5, "category": "x"}\n\n{"prompt": "b?"}\n')
    kept = read_prompt_set(PromptsConfig(path=str(mixed), drop_invalid=True))
    assert kept.table.column("prompt").to_pylist() == ["a?", "b?"] and kept.dropped["not_text"] == 1
    with pytest.raises(ValueError, match=r"m\.jsonl: row 1: prompt is not text \(got int 5\)$"):
        read_prompt_set(PromptsConfig(path=str(mixed)))
    array = tmp_path / "m.json"
    array.write_text('[{"prompt": "a?"}, {"prompt": 5.5}, {"other": 1}]')
    kept = read_prompt_set(PromptsConfig(path=str(array), drop_invalid=True))
    assert kept.dropped == {"empty": 1, "not_text": 1, "too_long": 0, "duplicate": 0}
    broken = tmp_path / "b.jsonl"
    broken.write_text('{"prompt": "a?"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"b\.jsonl: cannot be read as jsonl: line 2: Expecting"):
        read_prompt_set(PromptsConfig(path=str(broken)))
    turns = tmp_path / "t.jsonl"
    turns.write_text('{"turns": [{"text": "hi"}]}\n')
    with pytest.raises(
        ValueError, match=r"row 0: prompt is not text \(got dict \{'text': 'hi'\}\)"
    ):
        read_prompt_set(PromptsConfig(path=str(turns), prompt_column="turns"))


def test_a_source_has_no_dropped_stat(tmp_path) -> None:
    from tests.conftest import world

    source = PromptsConfig.model_validate({"source": world("components:WorldPrompts"), "limit": 4})
    out = load_prompts.fn(_ctx(tmp_path), source)
    assert out.stats["prompts"] == 4 and "dropped" not in out.stats


def test_the_stage_names_the_config_key_of_a_file_it_cannot_use(tmp_path) -> None:
    # The readers name the file and row; the stage adds the key, as the edge does.
    from tasks.prompts import load_heldout

    bad = tmp_path / "held.jsonl"
    bad.write_text('{"question": "a?"}\n')
    seeds = load_prompts.fn(_ctx(tmp_path), PromptsConfig(path=str(_rows(tmp_path)))).table
    with pytest.raises(
        ConfigError, match=r"held\.jsonl: no column 'prompt' \(columns: question\)"
    ) as e:
        load_heldout.fn(_ctx(tmp_path, "heldout"), PromptsConfig(path=str(bad)), seeds)
    assert e.value.field == "heldout.path" and e.value.line().startswith("heldout.path: ")
    with pytest.raises(ConfigError, match="no file at") as e:
        load_prompts.fn(_ctx(tmp_path), PromptsConfig(path=str(tmp_path / "gone.jsonl")))
    assert e.value.field == "prompts.path"


def _rows(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "One?"}\n{"prompt": "Two?"}\n')
    return path


def test_chat_messages_keep_the_users_turns(tmp_path) -> None:
    chat = [
        {"role": "user", "content": "Plan a trip."},
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "Kyoto."},
    ]
    folder = _save(tmp_path / "chat", {"messages": [chat]})
    config = PromptsConfig(dataset=folder, prompt_column="messages")
    assert _prompts(config) == ["Plan a trip."]
    assert _prompts(config.model_copy(update={"multi_turn": "join"})) == ["Plan a trip.\n\nKyoto."]


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        (
            {"path": "p.jsonl", "dataset": "org/name"},
            "prompts: both path (p.jsonl) and dataset (org/name) are set; keep one",
        ),
        ({"dataset": "data/prompts.jsonl"}, "prompts.dataset: 'data/prompts.jsonl' is a file"),
        ({"dataset": "not a name"}, "prompts.dataset: 'not a name' is neither a folder nor"),
        ({"path": "p.jsonl", "multi_turn": "chat"}, "prompts.multi_turn: Input should be 'first'"),
    ],
)
def test_a_config_that_cannot_name_its_prompts_is_one_line(prompts, message) -> None:
    from flows.config import validate_config

    with pytest.raises(ConfigError) as err:
        validate_config({"prompts": prompts})
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_edge_reads_a_dataset_before_the_run_writes(tmp_path) -> None:
    from flows.config import load_config
    from flows.inputs import check_inputs

    folder = _save(tmp_path / "mt", _mt_bench_columns())
    root = tmp_path / "runs"
    config = load_config(None, [f"root={root}", f"prompts.dataset={folder}"])
    with pytest.raises(ConfigError, match=r"^prompts\.dataset: .*no column 'prompt' \(columns"):
        check_inputs(config)
    assert not root.exists()


def test_hf_urls_are_routed_to_the_hub_filesystem(monkeypatch) -> None:
    """``hf://datasets/...`` reaches huggingface_hub's HfFileSystem through fsspec; with the Hub
    offline the read fails in one line naming the URL (no network: the read itself is not run
    here)."""
    import fsspec
    import huggingface_hub.constants
    from huggingface_hub import HfFileSystem

    url = "hf://datasets/lmarena-ai/arena-hard-auto-v0.1/data/train-00000-of-00001.parquet"
    fs, path = fsspec.core.url_to_fs(url)
    assert isinstance(fs, HfFileSystem)
    assert path == "datasets/lmarena-ai/arena-hard-auto-v0.1/data/train-00000-of-00001.parquet"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=rf"^{url}: cannot be read \(OfflineModeIsEnabled: "):
        read_prompt_set(PromptsConfig(path=url, prompt_column="turns"))


def test_a_folder_at_a_url_is_keyed_by_its_bytes(local_s3) -> None:
    import fsspec

    from tasks.prompt_datasets import dataset_key

    fs = fsspec.filesystem("s3", **local_s3)
    fs.pipe({"eva-bucket/ds/state.json": b"{}", "eva-bucket/ds/data-00000.arrow": b"rows-1"})

    def key() -> dict[str, str]:
        return dataset_key("s3://eva-bucket/ds", config_name=None, split="train",
                           storage_options=local_s3)  # fmt: skip

    first = key()
    assert list(first) == ["dataset_sha256"] and key() == first
    fs.pipe({"eva-bucket/ds/data-00000.arrow": b"rows-2"})
    assert key() != first


def test_what_load_dataset_would_ignore_without_a_word_is_refused(tmp_path) -> None:
    saved = tmp_path / "saved"
    _save(saved, {"prompt": ["a?", "b?"]})
    with pytest.raises(ValueError, match="dataset_config 'main' names a Hub dataset's config"):
        read_prompt_set(PromptsConfig(dataset=str(saved), dataset_config="main"))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "train.jsonl").write_text('{"prompt": "a?"}\n')
    (mixed / "more.csv").write_text("prompt\nb?\n")
    with pytest.raises(ValueError, match=r"data files of 2 formats \(more\.csv, train\.jsonl\)"):
        read_prompt_set(PromptsConfig(dataset=str(mixed)))


def test_a_utf8_file_that_starts_with_a_bom_is_read_as_without_it(tmp_path: Path) -> None:
    """Windows tools write UTF-8 with a byte-order mark first; JSON refuses it as a character
    ("Unexpected UTF-8 BOM"), and a CSV's header never had it (Arrow drops it)."""
    from tasks.prompt_files import read_prompt_file

    bom = b"\xef\xbb\xbf"
    files = {
        "p.jsonl": b'{"prompt": "One?"}\n{"prompt": "Two?"}\n',
        "p.json": b'["One?", "Two?"]',
        "p.csv": b"prompt\nOne?\nTwo?\n",
    }
    for name, body in files.items():
        path = tmp_path / name
        path.write_bytes(bom + body)
        rows = read_prompt_file(str(path)).table
        assert rows.column("prompt").to_pylist() == ["One?", "Two?"], name

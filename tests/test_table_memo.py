"""Tables a stage wrote are served from memory to the next stage only while they are exactly
what reading the file gives; a checkpoint in a stage's scratch is moved into the run."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.content_hashes import hash_directory
from tasks.stage import _inside
from tasks.store import RunStore, UnreadableArtifact
from tasks.table_memo import TABLES, TableMemo


@pytest.fixture(autouse=True)
def _fresh_memo():
    TABLES.clear()
    yield
    TABLES.clear()


def _rollouts() -> pa.Table:
    # A list column (Parquet reads its item back as ``element``) and pandas-style metadata.
    table = pa.table({"prompt_id": ["a", "b"], "responses": [["x", "y"], ["z"]]})
    return table.replace_schema_metadata({b"origin": b"generate"})


def test_written_table_is_served_as_the_file_reads(tmp_path):
    store = RunStore(str(tmp_path), "r")
    uri, _, _ = store.write_table(1, "generate", _rollouts())
    path = store.resolve(uri)
    served = store.read_table(uri)
    on_disk = pq.read_table(path)
    assert served.schema.equals(on_disk.schema, check_metadata=True)
    assert served.schema.field("responses").type == pa.list_(pa.field("element", pa.string()))
    assert served.equals(on_disk)
    assert TABLES.get(path) is served  # from memory, not decoded again
    assert store.read_table(uri) is served


def test_a_file_changed_since_is_read_again(tmp_path):
    store = RunStore(str(tmp_path), "r")
    uri, _, _ = store.write_table(1, "generate", _rollouts())
    path = store.resolve(uri)
    pq.write_table(pa.table({"prompt_id": ["c", "d", "e"]}), path)  # replaced behind its back
    assert store.read_table(uri).column("prompt_id").to_pylist() == ["c", "d", "e"]


def test_a_file_cut_short_since_is_unreadable(tmp_path):
    store = RunStore(str(tmp_path), "r")
    uri, _, nbytes = store.write_table(1, "generate", _rollouts())
    path = store.resolve(uri)
    with open(path, "r+b") as f:
        f.truncate(nbytes // 2)
    with pytest.raises(UnreadableArtifact, match="not a readable table"):
        store.read_table(uri)
    os.remove(path)
    with pytest.raises(UnreadableArtifact):
        store.read_table(uri)


def test_the_memo_keeps_the_most_recently_used_within_its_limit(tmp_path):
    table = pa.table({"x": list(range(1000))})
    memo = TableMemo(limit_bytes=int(table.get_total_buffer_size() * 2.5))
    paths = []
    for name in "abc":
        path = str(tmp_path / f"{name}.parquet")
        pq.write_table(table, path)
        memo.put(path, table)
        paths.append(path)
    assert memo.get(paths[0]) is None  # the oldest went first
    assert memo.get(paths[1]) is table and memo.get(paths[2]) is table
    memo.put(paths[1], None)  # forgotten
    assert memo.get(paths[1]) is None and len(memo) == 1


def _checkpoint(folder) -> str:
    os.makedirs(folder)
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"\x00" * 64)):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return str(folder)


def test_a_scratch_checkpoint_is_moved_and_any_other_copied(tmp_path):
    store = RunStore(str(tmp_path / "root"), "r")
    scratch = tmp_path / "scratch"
    moved = _checkpoint(scratch / "model")
    kept = _checkpoint(tmp_path / "user-model")
    digest = hash_directory(kept)
    assert _inside(moved, str(scratch)) and not _inside(kept, str(scratch))
    assert not _inside(str(scratch), str(scratch))

    uri, moved_hash = store.publish_model(1, moved, move=True)
    assert not os.path.exists(moved) and moved_hash == digest
    assert hash_directory(store.resolve(uri)) == digest
    uri, copied_hash = store.publish_model(2, kept)
    assert os.path.exists(kept) and copied_hash == digest
    assert hash_directory(store.resolve(uri)) == digest


def test_a_same_size_rewrite_is_read_again(tmp_path):
    # Same size, and possibly the same coarse mtime: the atomic rewrite is a new inode.
    store = RunStore(str(tmp_path), "r")
    uri, _, nbytes = store.write_table(1, "generate", pa.table({"x": [1, 2, 3]}))
    path = store.resolve(uri)
    pq.write_table(pa.table({"x": [7, 8, 9]}), path + ".new", compression="zstd")
    assert os.path.getsize(path + ".new") == nbytes
    os.replace(path + ".new", path)
    assert store.read_table(uri).column("x").to_pylist() == [7, 8, 9]

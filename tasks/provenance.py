"""What a stage's manifest records of where its output came from (each input, as this stage
read it), and the ``Ref`` that a manifest, or a stage the plan skipped, hands to the stages after
it.
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.keys import sha
from tasks.run_paths import iteration_dir
from tasks.store import Ref


def checkpoint_input(ref: Ref) -> dict[str, Any]:
    """What a manifest records of an input the stage did not read as a table (a checkpoint):
    the hash its own manifest gives it."""
    return {"uri": ref.uri, "content_hash": ref.content_hash}


def table_input(
    artifact: str, iteration: int | None, name: str, ref: Ref, digest: str
) -> dict[str, Any]:
    """What a manifest records of an input table: the hash of the bytes this stage read
    (``sha256``) and the content hash they make (as the input's own manifest computes it), not
    the hash that manifest recorded: a table edited by hand since (then said in one line) is
    what this stage's output comes from. An input that also carries a checkpoint keeps that
    part of its recorded hash (a checkpoint is not hashed again on every read)."""
    content_hash = sha(digest) if ref.model_uri is None else ref.content_hash
    if ref.model_uri is None and content_hash != ref.content_hash:
        _log(artifact).warning(
            "%s %s: its input %s (%s) is not the table its manifest recorded (changed since it "
            "was written): this stage reads it as it is now, and its manifest says so",
            artifact, iteration_dir(iteration), name, ref.uri,
        )  # fmt: skip
    return {"uri": ref.uri, "content_hash": content_hash, "sha256": digest}


def _log(artifact: str) -> logging.Logger | logging.LoggerAdapter:
    """The task run's logger inside a task (the UI shows the line), else the stage's."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:
        return logging.getLogger(f"eva.{artifact}")


def ref_of(m: dict[str, Any], rerun: bool = False) -> Ref:
    """The Ref a finished stage's manifest ``m`` hands on (``rerun``: see ``Ref``)."""
    return Ref(
        m["artifact"],
        m["iteration"],
        m["uri"],
        m["content_hash"],
        m["rows"],
        m.get("model_uri"),
        rerun=rerun,
    )


def skipped_ref(artifact: str, iteration: int | None) -> Ref:
    """The Ref of a stage the plan skipped: nothing was made."""
    return Ref(artifact, iteration, "", "", 0, skipped=True)

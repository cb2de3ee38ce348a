"""make runs the suite on two pytest-xdist workers with ``--dist loadgroup``, and tests/conftest.py
puts each module (and the modules that share a machine-wide state, as Ray's auth token) in one
group: its module fixtures are built once, and two modules of one group never run at once.

xdist schedules a group as one unit by the ``@GROUP`` it appends to each test's id on the
worker. pytest 9.2 keeps the id where xdist 3.8 no longer writes (pytest-dev/pytest-xdist#1386):
nothing fails, every test is scheduled alone. This test fails there instead.
"""

from __future__ import annotations

import os

import pytest


def test_a_test_on_an_xdist_worker_carries_its_modules_group(request: pytest.FixtureRequest):
    if os.environ.get("PYTEST_XDIST_WORKER") is None or not request.config.getvalue("loadgroup"):
        pytest.skip("runs on xdist's workers under --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@test_xdist_groups.py"), request.node.nodeid

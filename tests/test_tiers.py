"""The two test tiers: every test tests/conftest.py marks ``e2e`` exists (a renamed one would
drop into ``make test-fast`` unnoticed)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import E2E, SHARED

TESTS = Path(__file__).parent


def test_every_e2e_entry_names_a_test_module_and_its_tests() -> None:
    for module, names in E2E.items():
        path = TESTS / module
        assert path.is_file(), f"tests/conftest.py E2E: no {module}"
        defined = {
            node.name
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
        }
        missing = sorted(set(names or ()) - defined)
        assert not missing, f"tests/conftest.py E2E: {module} has no {', '.join(missing)}"


def test_every_shared_group_names_a_test_module() -> None:
    # A renamed module would leave its group and run beside the module it must not overlap.
    for module in SHARED:
        assert (TESTS / module).is_file(), f"tests/conftest.py SHARED: no {module}"

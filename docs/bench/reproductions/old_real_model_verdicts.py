"""The deleted module's report over the study file's results (issue 50's last check).

    git worktree add OLD 485459c^     # bench.real_model as it was before the port
    python docs/bench/reproductions/old_real_model_verdicts.py \\
        docs/bench/real-model-cpu.jsonl OLD > real-model-cpu-module-report.md

The records are rewritten into the module's results layout (``seed<S>-<arm>``: a base run's
theta_0 and theta_1, an arm's iterations in order, IFEval beside them) and the module's own
``report()`` prints its tables and verdicts, to set beside ``eva bench report real-model-cpu``.
"""

import json
import sys
from typing import Any


def module_layout(records: list[dict[str, Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for r in records:
        key = f"seed{r['seed']}-{r['arm']}"
        row = {k: v for k, v in r.items() if k not in ("seed", "arm", "grown")}
        if r["arm"] == "base":
            entry = results.setdefault(key, {})
            name = "theta_0" if r["iteration"] is None else "theta_1"
            entry[name] = {**row, "checkpoint": name}
        else:
            entry = results.setdefault(key, {"iterations": []})
            entry["iterations"].append(row)
        if "ifeval" in row:
            entry["ifeval"] = row["ifeval"]
    for entry in results.values():
        its = sorted(entry.get("iterations", []), key=lambda x: x["iteration"])
        assert [x["iteration"] for x in its] == list(range(1, len(its) + 1)), "a gap"
        if "iterations" in entry:
            entry["iterations"] = its
    return results


def main() -> None:
    path, old = sys.argv[1:3]
    sys.path.insert(0, old)
    from bench import real_model  # the module as it was before the port

    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    print(real_model.report(real_model.by_seed(module_layout(records)), 3))


if __name__ == "__main__":
    main()

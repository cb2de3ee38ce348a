"""Field by field: a results file a per-study module wrote (its JSON: seed -> arm -> result,
or ``{"runs": ...}``) against the records of a study file's results (JSONL). Timings are left
out; a module's ``topup`` is a record's ``grown``; theta_0 and theta_1 are the base arm's
iterations null and 0. Run once for issue 50's reproductions (docs/benchmarks.md):

    python docs/bench/reproductions/compare.py MODULE.json STUDY.jsonl
"""

from __future__ import annotations

import json
import sys
from typing import Any

LEFT_OUT = {"base", "topup", "seconds", "table", "iterations", "model"}


def checkpoints(runs: dict[str, Any]) -> list[tuple[tuple[str, str, int | None], dict[str, Any]]]:
    out = []
    for seed, per_seed in runs.items():
        for arm, entry in per_seed.items():
            if arm in ("theta_0", "theta_1"):
                row = {**entry, "grown": entry["topup"]} if "topup" in entry else dict(entry)
                out.append(((seed, "base", None if arm == "theta_0" else 0), row))
            elif isinstance(entry, dict) and "iterations" in entry:
                for t, row in enumerate(entry["iterations"], start=1):
                    grown = {"grown": entry["topup"]} if "topup" in entry else {}
                    out.append(((seed, arm, t), {**row, **grown}))
    return out


def main(module_json: str, study_jsonl: str) -> None:
    with open(module_json) as f:
        recorded = json.load(f)
    with open(study_jsonl) as f:
        records = {(str(r["seed"]), r["arm"], r["iteration"]): r for r in map(json.loads, f)}
    compared, equal, missing, different = 0, 0, [], []
    for key, row in checkpoints(recorded.get("runs", recorded)):
        record = records.get(key)
        if record is None:
            missing.append(key)
            continue
        for field, value in row.items():
            if field in LEFT_OUT:
                continue
            compared += 1
            if record.get(field, "<absent>") == value:
                equal += 1
            else:
                different.append((key, field, value, record.get(field, "<absent>")))
    print(f"checkpoints: {len(records)} records; missing: {missing or 'none'}")
    print(f"fields compared: {compared}, equal: {equal}, different: {len(different)}")
    for item in different:
        print("  ", *item)


if __name__ == "__main__":
    main(*sys.argv[1:3])

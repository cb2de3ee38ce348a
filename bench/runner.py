"""``eva bench run STUDY``: every (seed, arm) of a study as ordinary eva runs under one root, an
iteration at a time, each checkpoint's record written to one results file as it finishes.

A record is a seed, an arm, an iteration (None: theta_0) and what the study's measures read
there. The file is rewritten whole on every record (written aside, then renamed: a kill never
leaves half a record), and a rerun skips every record it holds; the runs' finished stages are
reused, so a stop loses at most the iteration in flight. Timings stay out of the file, so an
interrupted study resumed ends with the file an uninterrupted one writes.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np

from bench.arm_config import arm_config, responses_budget
from bench.arm_runs import run_arm
from bench.labels import world_answers
from bench.measures import MEASURES, available_pairs, generated, model_path, stage_prompts
from bench.study import Arm, Study, split_at
from bench.study_file import as_written
from eva_runtime.errors import ConfigError, EvaError
from eva_runtime.progress import duration
from eva_world import world
from eva_world.components import distribution_of
from tasks.store import RunStore

TOLERANCE = 0.01  # equal generation: each iteration within 1% of G
Say = Callable[[str], None]


class Results:
    """The results file: records in the order they were made, one per (seed, arm, iteration)."""

    def __init__(self, path: str):
        self.path, self.records = path, []
        if not os.path.exists(path):
            return
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})",
                              field="results") from None  # fmt: skip
        except OSError as exc:  # a folder, a file it may not read
            raise ConfigError(f"{path}: cannot be read ({exc.strerror})", field="results",
                              hint="--results names a file") from None  # fmt: skip
        read: dict[tuple[Any, ...], tuple[int, dict[str, Any]]] = {}
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            record = _record(path, n, line)
            key = (record["seed"], record["arm"], record["iteration"])
            if key not in read:
                read[key] = n, record
            elif read[key][1] != record:  # two sides of a merge: which is right is the user's
                raise ConfigError(
                    f"{path}, lines {read[key][0]} and {n}: two different records of seed "
                    f"{key[0]}, {key[1]}, iteration {key[2]}", field="results", hint=RECORDS,
                )  # fmt: skip
        self.records = [record for _, record in read.values()]  # a line twice: once

    def of(self, seed: int, arm: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["seed"] == seed and r["arm"] == arm]

    def get(self, seed: int, arm: str, t: int | None) -> dict[str, Any] | None:
        return next((r for r in self.of(seed, arm) if r["iteration"] == t), None)

    def done(self, seed: int, arm: str, ts: list[int | None]) -> bool:
        return all(self.get(seed, arm, t) for t in ts)

    def put(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            old = self.get(record["seed"], record["arm"], record["iteration"])
            if old is None:
                self.records.append(record)
            else:
                old.update(record)
        self.save()

    def drop(self, seed: int, arm: str) -> None:
        self.records = [r for r in self.records if (r["seed"], r["arm"]) != (seed, arm)]

    def save(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(f"{self.path}.tmp", "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in self.records)
        os.replace(f"{self.path}.tmp", self.path)


def _record(path: str, n: int, line: str) -> dict[str, Any]:
    """Line ``n`` of a results file, or one line naming it (a hand edit, a merge's markers)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        record, reason = None, f"not JSON ({exc.msg})"
    else:
        keys = record if isinstance(record, dict) else {}
        missing = [k for k in ("seed", "arm", "iteration") if k not in keys]
        reason = f"a record without {', '.join(missing)}" if missing else ""
        if not reason and not _typed(record):
            keyed = ", ".join(f"{k} {record[k]!r}" for k in ("seed", "arm", "iteration"))
            reason = f"{keyed}: a number, a name and a number or null"
    if reason:
        raise ConfigError(f"{path}, line {n}: {reason}", field="results", hint=RECORDS)
    return record


RECORDS = ("each line is one JSON record with seed, arm and iteration; remove the line and "
           "`eva bench run` remakes its piece")  # fmt: skip


def _typed(record: dict[str, Any]) -> bool:
    """The record's keys are what the runner writes (a record keyed otherwise matches no piece:
    its piece would run again, and the report would leave it out)."""
    seed, arm, t = record["seed"], record["arm"], record["iteration"]
    return _whole(seed) and isinstance(arm, str) and (t is None or _whole(t))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Stopped(Exception):
    """The deadline: the next piece of work would not finish in time."""


class Clock:
    """Progress by the pieces run so far, and the deadline. A piece's typical time is the
    median: the first piece after a restart may resume a piece from its cached stages and end
    in a fraction of the usual time, which a mean would spread over every estimate."""

    def __init__(self, total: int, done: int, deadline: float | None, say: Say):
        self.total, self.done, self.deadline, self.say = total, done, deadline, say
        self.started, self.times = time.monotonic(), list[float]()

    @contextmanager
    def run(self, what: str) -> Iterator[None]:
        """Time one piece; refuse it (``Stopped``) where the deadline has passed, or the median
        piece so far would not end before it."""
        if self.deadline is not None:
            left = self.deadline - (time.monotonic() - self.started)
            typical = statistics.median(self.times) if self.times else 0.0
            if left <= 0 or left < 1.2 * typical:  # the first piece: only a passed deadline
                raise Stopped(f"{left:.0f} s left, a piece takes {typical:.0f} s")
        self.say(f"{what}: running ({self.done + 1} of {self.total})")
        t0 = time.monotonic()
        yield
        self.times.append(time.monotonic() - t0)
        self.done += 1
        rest = (self.total - self.done) * statistics.median(self.times)
        self.say(f"{what}: done in {duration(self.times[-1])}; {self.total - self.done} left, "
                 f"about {duration(rest)} by the runs so far")  # fmt: skip


def units(arm: Arm) -> list[tuple[int, list[int | None]]]:
    """An arm's pieces: (iterations run, the checkpoints it records). An online arm is one
    piece, its segments recorded together (the first stands for them)."""
    if arm.source == "online":
        return [(arm.iterations, [1])]
    if arm.iterations == 0:
        return [(0, [0] if arm.start else [None, 0])]
    return [(t, [t]) for t in range(1, arm.iterations + 1)]


class StudyRun:
    def __init__(self, study: Study, root: str, results: Results, say: Say):
        self.study, self.results, self.say = study, results, say
        self.root = os.path.abspath(os.path.join(root, study.folder or study.name))

    def store(self, seed: int, arm: str) -> Any:
        return RunStore(self.root, f"s{seed}-{arm}")

    def factor(self, seed: int, arm: str) -> float:
        records = self.results.of(seed, arm)
        return float(records[0]["grown"]) if records else self.study.equalise.grow[0]

    def x0_factor(self, seed: int, arm: Arm) -> float:
        """How far the arm's X_0 grew: its own factor where it grows X_0 (a base run), else
        what the arm it starts from had (its theta was trained on that X_0)."""
        if arm.growth() == "prompts":
            return self.factor(seed, arm.name)
        if arm.start is None or arm.source == "online":
            return 1.0
        return self.x0_factor(seed, self.study.arm(split_at(arm.start)[0]))

    def config(self, seed: int, arm: Arm, factor: float, iterations: int | None = None) -> Any:
        x0 = 1.0 if arm.growth() == "prompts" else self.x0_factor(seed, arm)
        starts, inputs = self.starts(seed, arm), partial(self.input, seed)
        return arm_config(self.study, arm, self.root, seed, starts, factor=factor, x0_factor=x0,
                          iterations=iterations, inputs=inputs)  # fmt: skip

    def starts(self, seed: int, arm: Arm) -> dict[str, str]:
        study = self.study
        if arm.start is not None:
            return {arm.start: self.checkpoint(seed, arm.start)}
        if study.theta_0 == "shared" and seed != study.seeds[0]:
            return {"theta_0": self.checkpoint(study.seeds[0], f"{study.arms[0].name}@theta_0")}
        return {}

    def last(self, seed: int, arm: Arm) -> int:
        """The arm's last recorded iteration, else its last planned."""
        done = [r["iteration"] for r in self.results.of(seed, arm.name)]
        return max((t for t in done if t is not None), default=arm.iterations)

    def checkpoint(self, seed: int, ref: str) -> str:
        """ARM's checkpoint (its run made again, from its cached stages, if it is not here)."""
        name, at = split_at(ref)
        arm = self.study.arm(name)
        t = self.last(seed, arm) if at == "last" else at
        try:
            return model_path(self.store(seed, name), t)
        except FileNotFoundError:
            factor = self.factor(seed, name)
            config = self.config(seed, arm, factor)
            run_arm(arm, config, factor, responses_budget(self.study, arm, config))
            return model_path(self.store(seed, name), t)

    def input(self, seed: int, kind: str, arm: str) -> str:
        """The file a ``${KIND:ARM}`` placeholder names."""
        store = self.store(seed, arm)
        if kind in ("prompts", "heldout"):
            return str(store.absolute(store.read_manifest(None, kind)["uri"]))
        if kind == "answers":  # X_0's answers by the world's solver: a seed set's labels
            out = os.path.join(self.root, "answers", f"s{seed}-{arm}-x0.jsonl")
            world_answers(stage_prompts(store, None, "prompts"), out)
            return out
        raise EvaError(f"${{{kind}:{arm}}}: not a placeholder the runner fills")

    def record(
        self, seed: int, arm: Arm, config: Any, store: Any, ts: list[Any], factor: float
    ) -> None:
        rows = []
        for t in ts:
            row: dict[str, Any] = {"seed": seed, "arm": arm.name, "iteration": t, "grown": factor}
            for name in self.study.measures_at(arm, t):
                row.update(MEASURES[name](store, t, config))
            rows.append(row)
        self.results.put(rows)

    def run_arm(self, seed: int, arm: Arm, clock: Clock) -> None:
        if arm.source == "online":  # one piece: the run's segments, recorded together
            if self.results.of(seed, arm.name):
                return
            with clock.run(f"seed {seed}, {arm.name}"):
                config = self.config(seed, arm, 1.0)
                store = run_arm(arm, config, 1.0, None)
            segments = list(itertools.takewhile(
                lambda s: store.read_manifest(s, "evaluate") is not None, itertools.count(1)
            ))  # fmt: skip
            self.record(seed, arm, config, store, segments, 1.0)
            return
        factor = self.factor(seed, arm.name)
        pieces, i = units(arm), 0
        while i < len(pieces):
            t, ts = pieces[i]
            if self.results.done(seed, arm.name, ts):
                i += 1
                continue
            with clock.run(f"seed {seed}, {arm.name}, iteration {t}"):
                config = self.config(seed, arm, factor, t)
                budget = responses_budget(self.study, arm, config)
                store = run_arm(arm, config, factor, budget)
            if budget is not None and abs(generated(store, t) - budget) > TOLERANCE * budget:
                raise EvaError(f"{arm.name}, iteration {t}: {generated(store, t)} responses, "
                               f"not G = {budget}")  # fmt: skip
            grow = [f for f in self.study.equalise.grow
                    if f > factor and (arm.growth() != "split" or f <= 2.0)]  # fmt: skip
            k = self.study.equalise.pairs if budget is None and arm.growth() != "none" else None
            if k is not None and grow and available_pairs(store, t) < k:
                clock.say(f"seed {seed}, {arm.name}, iteration {t}: fewer than {k} pairs; its "
                          f"source grown x{grow[0]:g}")  # fmt: skip
                factor, clock.total, i = grow[0], clock.total + i + 1, 0  # its pieces again
                self.results.drop(seed, arm.name)
                continue
            self.record(seed, arm, config, store, ts, factor)
            i += 1

    def held_apart(self, seed: int) -> None:
        """The study's held-apart sets, drawn once every arm of the seed has run, apart from
        every prompt any of them trained on, and each offline checkpoint's reward there."""
        offline = [a for a in self.study.arms if a.source != "online"]
        records = [r for a in offline for r in self.results.of(seed, a.name)]
        specs = [s for s in self.study.held_apart if not all(s.name in r for r in records)]
        if not specs:
            return
        seen: set[str] = set()
        for arm in offline:
            store = self.store(seed, arm.name)
            for t in range(arm.iterations + 1):
                seen |= set(stage_prompts(store, t))
        first = self.study.arms[0]
        for spec in specs:
            dist = distribution_of(spec.distribution)
            held = world.sample_prompts(dist, spec.size, spec.draw, exclude=seen)
            for r in records:
                rewards = world_rewards(self.store(seed, r["arm"]), r["iteration"], held)
                r[spec.name], r[f"{spec.name}_exact"] = _mean(rewards), _mean(rewards == 1.0)
            if spec.pass_at:
                last = self.last(seed, first)
                rewards = world_rewards(self.store(seed, first.name), last, held, spec.pass_at)
                record = self.results.get(seed, first.name, last)
                assert record is not None
                record[f"pass@{spec.pass_at}"] = _mean((rewards == 1.0).any(axis=1))
            records[0][f"{spec.name}_set"] = {
                "size": len(held),
                "excluded": len(seen),
                "trained_on": sum(map(dist.contains, seen)),
            }
            self.results.save()


def world_rewards(store: Any, t: int | None, prompts: list[str], n: int = 1) -> np.ndarray:
    """The world's reward of a checkpoint's answers, a row per prompt: greedy for ``n`` = 1,
    else ``n`` samples at the world's temperature."""
    from tasks.backends.generate.transformers import TransformersGeneration

    backend = TransformersGeneration(
        temperature=0.0 if n == 1 else 0.7, max_new_tokens=10, batch_size=512
    )
    answers = backend.load(model_path(store, t)).generate(prompts, n=n, seed=0).texts
    pairs = zip(prompts, answers, strict=True)
    return np.array([[world.reward(p, a) for a in rs] for p, rs in pairs])


def _mean(a: np.ndarray) -> float:
    return round(float(a.mean()), 4)


def run_study(
    study: Study, root: str, results_path: str, deadline: float | None = None, say: Say = print
) -> bool:
    """Every (seed, arm) of ``study`` not in the results file yet; False when the deadline
    stopped it first."""
    results = Results(results_path)
    runner = StudyRun(study, root, results, say)
    done = [
        results.done(s, a.name, ts) for s in study.seeds for a in study.arms for _, ts in units(a)
    ]
    clock = Clock(len(done), sum(done), deadline, lambda line: say(f"{study.name}: {line}"))
    try:
        for seed in study.seeds:
            for arm in study.arms:
                try:
                    runner.run_arm(seed, arm, clock)
                except ConfigError as exc:  # a run's check names its field: say where it's set
                    raise as_written(study, arm, exc) from None
            runner.held_apart(seed)
    except Stopped as exc:
        say(f"{study.name}: stopped before the deadline ({exc}); rerun to continue")
        return False
    return True

# The same targets run locally and in CI (.ci/run -> the README's test command -> `make ci`).
PY ?= python

.PHONY: lint format typecheck test test-fast test-e2e test-all versions ci demo

lint:
	ruff check .
	ruff format --check .

format:
	ruff format .
	ruff check --fix .

typecheck:
	mypy

# Default suite: everything but GPU tests (which skip themselves anyway) and `slow` ones, in two
# tiers: test-fast is all but the end-to-end runs (marked `e2e` in tests/conftest.py), about 2
# minutes on 2 cores; test-e2e is the rest. `make test` runs the whole default suite at once.
# On two pytest-xdist workers, each test module whole on one and each worker on a core of its
# own (tests/conftest.py groups and pins them): the end-to-end tests wait on servers and
# subprocesses much of their time, so two at once take two thirds of the time of one after the
# other, and pinned, no model's threads spin against the other worker's. PARALLEL= runs them in
# one process, as does an environment without pytest-xdist (installed before the dev extra had
# it).
PARALLEL ?= $(shell $(PY) -c "import xdist" 2>/dev/null && echo "-n 2 --dist loadgroup")

test:
	$(PY) -m pytest -m "not slow" -q $(PARALLEL)

test-fast:
	$(PY) -m pytest -m "not slow and not e2e" -q $(PARALLEL)

# The slowest end-to-end tests are listed after the run: the tier's budget is watched from CI's log.
test-e2e:
	$(PY) -m pytest -m "e2e and not slow" -q $(PARALLEL) --durations=15

test-all:
	$(PY) -m pytest -q $(PARALLEL)

# Record the code of every stage and component after a change (bump its version first if what it
# writes can change); the test suite fails while a change is unrecorded (tasks/versions.py).
versions:
	$(PY) -m tasks.versions --write

# The fast tier first: a broken change fails in minutes; then the end-to-end runs.
ci: lint typecheck test-fast test-e2e

demo:
	eva run

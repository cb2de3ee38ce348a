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
# tiers: test-fast is all but the end-to-end runs (marked `e2e` in tests/conftest.py), under 3
# minutes on 2 cores; test-e2e is the rest. `make test` runs the whole default suite at once.
test:
	$(PY) -m pytest -m "not slow" -q

test-fast:
	$(PY) -m pytest -m "not slow and not e2e" -q

test-e2e:
	$(PY) -m pytest -m "e2e and not slow" -q

test-all:
	$(PY) -m pytest -q

# Record the code of every stage and component after a change (bump its version first if what it
# writes can change); the test suite fails while a change is unrecorded (tasks/versions.py).
versions:
	$(PY) -m tasks.versions --write

# The fast tier first: a broken change fails in minutes; then the end-to-end runs.
ci: lint typecheck test-fast test-e2e

demo:
	eva run

# The same targets run locally and in CI (.ci/run -> the README's test command -> `make ci`).
PY ?= python

.PHONY: lint format typecheck test test-all versions ci demo

lint:
	ruff check .
	ruff format --check .

format:
	ruff format .
	ruff check --fix .

typecheck:
	mypy

# Default suite: everything but GPU tests (which skip themselves anyway) and `slow` ones.
test:
	$(PY) -m pytest -m "not slow" -q

test-all:
	$(PY) -m pytest -q

# Record the code of every stage and component after a change (bump its version first if what it
# writes can change); the test suite fails while a change is unrecorded (tasks/versions.py).
versions:
	$(PY) -m tasks.versions --write

ci: lint typecheck test

demo:
	eva run

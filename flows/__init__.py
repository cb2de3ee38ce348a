"""eva's flows. Importing this package first puts eva's Prefect defaults in place.

Prefect reads its settings when it is imported, so these must be set before any flow module
(or the CLI, the benchmarks, a served deployment) imports it. Each is only a default: a value
already in the environment wins.
"""

import os

# The ephemeral API server needs 25-30 s to start on 2 cores, past Prefect's default 20 s.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# Its telemetry heartbeat races the run for the SQLite lock ("database is locked" tracebacks).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

"""The order in which each flow calls its artifacts within an iteration (setup: the first three
and evaluate). ``eva stage`` reruns one artifact and, with ``--downstream``, everything after it;
the stage framework knows no stage names, so a new stage is added here, next to the flow that
calls it, and nowhere else. A light module: the CLI reads it without importing the stages.
"""

OFFLINE_ORDER: tuple[str, ...] = (
    "prompts", "heldout", "bootstrap",
    "creator_generate", "creator_annotate", "score", "sample", "evolve", "mix",
    "complexity", "generate", "annotate", "pairs", "train", "evaluate",
)  # fmt: skip
ONLINE_ORDER: tuple[str, ...] = ("prompts", "heldout", "bootstrap", "online", "evaluate")
ALL_ARTIFACTS: tuple[str, ...] = (*OFFLINE_ORDER[:-1], "online", "evaluate")

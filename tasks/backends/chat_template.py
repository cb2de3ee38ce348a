"""Whether a prompt goes through its tokenizer's chat template: the one rule for the
``chat_template`` setting of every backend that samples from or trains a checkpoint (the
generation backends, the TRL solvers), so a solver sees each prompt as the sampler that answered
it did. A module of its own: the generation and the training code share it without either's
fingerprint (``tasks.versions``) taking in the other's modules."""

from __future__ import annotations

from eva_runtime.errors import ConfigError

# The config keys of the backends that hold the setting, for errors: a generation backend
# (evaluate.generation and a generated reference's generation are ones too: the stage's name in
# the failure line says which) and a solver (an online run's is online.solver).
GENERATION = "generate.backend"
SOLVER = "train.solver"


def template_use(has_template: bool, setting: str, model: str, field: str) -> bool:
    """Whether prompts go through the chat template under ``setting``: "always" (a
    ``ConfigError`` naming ``field`` when ``model``'s tokenizer has none), "auto" when it has
    one, "never" not. ``field`` is the config key of the backend holding the setting."""
    if setting == "always" and not has_template:
        raise ConfigError(
            f"chat_template: always, but {model} has no chat template",
            field=f"{field}.chat_template",
            hint="set it to auto (the template when the tokenizer has one) or never",
        )
    return setting == "always" or (setting == "auto" and has_template)

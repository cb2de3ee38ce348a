"""theta_0 of the built-in world: a tiny model trained from scratch by SFT on demonstrations.

``configs/world.yaml`` names this class as the run's policy builder
(``bootstrap.builder: {kind: python, factory: eva_world.bootstrap:WorldSFT}``): the bootstrap
stage calls ``build`` instead of loading a checkpoint. The demonstrations are easy problems of
every category, a share of them careless, so theta_0 can do a little of everything and much of
the seed set, which leaves informativeness a frontier to find (docs/benchmarks.md, world design).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from pydantic import BaseModel, ConfigDict, Field

from eva_world import world
from eva_world.components import check_world_prompts
from eva_world.configs import SFTConfig, TinyModelConfig


class WorldSFTOptions(BaseModel):
    """The builder's options, validated when the config is checked."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    model: TinyModelConfig = Field(default_factory=TinyModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    sft_examples: int = Field(
        default=192_000,
        ge=1,
        description="World demonstrations to draw (one pass at 3,000 steps x batch 64).",
    )
    careless: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="Share of careless world demonstrations (carries or borrows dropped, strings "
        "copied instead of reversed). Above one half, theta_0's most likely answer is often the "
        "careless one while the correct one stays among its samples: the uncertainty that "
        "preference optimization learns from (docs/benchmarks.md, world design).",
    )


class WorldSFT:
    """Builds theta_0: a character-level tiny Llama, SFT on world demonstrations."""

    version = 1
    libraries = ("torch", "transformers")

    check_prompts = staticmethod(check_world_prompts)

    def __init__(self, **options: object):
        self.options = WorldSFTOptions.model_validate(options)
        self._stats: dict[str, float | int | None] = {}

    def build(
        self,
        out_dir: str,
        seed: int,
        exclude: Collection[str],
        progress: Callable[[float], None],
    ) -> list[dict[str, float]]:
        """Train and save theta_0 to ``out_dir``; the SFT's logged (step, loss) rows. The
        ``exclude``d prompts (the held-out set) never appear among the demonstrations."""
        from eva_world.tiny_lm import build_char_tokenizer, build_tiny_model, save_checkpoint, sft

        o = self.options
        tokenizer = build_char_tokenizer(world.ALPHABET)
        model = build_tiny_model(o.model, tokenizer, seed=seed)
        examples = world.sft_examples(
            world.SFT_DISTRIBUTION, o.sft_examples, seed=seed, careless=o.careless, exclude=exclude
        )
        metrics = sft(
            model, tokenizer, examples, **o.sft.model_dump(), seed=seed, progress=progress
        )
        save_checkpoint(model, tokenizer, out_dir)
        final = metrics[-1] if metrics else {}
        self._stats = {
            "parameters": sum(p.numel() for p in model.parameters()),
            "steps": o.sft.steps,
            "final_loss": final.get("loss"),
        }
        return metrics

    def stats(self) -> dict[str, float | int | None]:
        return dict(self._stats)

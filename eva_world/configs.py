"""The shapes of the world's theta_0 and of its SFT, as the policy builder's options: plain
settings, so a config that names them is read without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class TinyModelConfig(BaseModel):
    """Shape of the demo policy: a small Llama (rotary positions) or GPT-2 (learned positions)."""

    model_config = ConfigDict(extra="forbid")

    arch: Literal["llama", "gpt2"] = Field(
        default="llama",
        description="llama: rotary position embeddings, SwiGLU MLP (the world's default: it "
        "learns the world's arithmetic faster and more reliably than GPT-2 at the same size). "
        "gpt2: learned absolute positions.",
    )
    n_layer: int = Field(default=3, ge=1, description="Transformer blocks.")
    n_embd: int = Field(default=96, ge=8, description="Hidden size; must divide by n_head.")
    n_head: int = Field(default=4, ge=1, description="Attention heads per block.")
    n_positions: int = Field(
        default=64, ge=8, description="Longest sequence (prompt + response + eos) in tokens."
    )
    dropout: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="Residual/embedding/attention dropout (gpt2 only). 0 because a model this "
        "small underfits rather than overfits, and dropout makes training slower to converge.",
    )


class SFTConfig(BaseModel):
    """Supervised warm-up of the demo policy; fields are ``sft()``'s keyword arguments."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(
        default=3000,
        ge=1,
        description="Optimizer steps. 3,000 brings every seed's "
        "theta_0 to a similar loss; at 1,500 one seed in three lagged far behind.",
    )
    batch_size: int = Field(default=64, ge=1, description="Sequences per step.")
    learning_rate: float = Field(default=3e-3, gt=0, description="Peak AdamW learning rate.")
    warmup_steps: int = Field(
        default=50, ge=0, description="Linear warm-up steps before the cosine decay to 0."
    )
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW decoupled weight decay.")
    max_grad_norm: float = Field(
        default=1.0, gt=0, description="Gradient clipping; keeps lr 3e-3 from spiking early."
    )
    log_every: int = Field(default=50, ge=1, description="Steps between returned metric rows.")

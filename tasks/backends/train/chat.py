"""The chat template at training time: a solver trains on a prompt exactly as generation fed it.

Generation wraps each prompt in the policy tokenizer's chat template, as one user turn followed
by the generation prompt, whenever the tokenizer has a template (``chat_template: auto``), and
the reward model scores each response as that turn's answer. Trained on the raw text instead, a
chat model would learn its answers after a question laid out as it never sees one. So when the
template applies, the solvers hand TRL *conversational* rows (the prompt as a user turn, each
response as an assistant turn) and TRL applies the template itself, by its documented dataset
formats. What that produces in TRL 1.16 (read from its source, checked against the transformers
sampler's ids in tests/test_chat_template_training.py):

- DPOTrainer (dpo, sppo, dpo_nll): the prompt's ids are ``apply_chat_template(prompt,
  add_generation_prompt=True, tokenize=True)``, which tokenizes without special tokens: the
  sampler's own ids. Prompt + response is templated whole and the response is what follows the
  common prefix: the answer and the template's end of turn (no extra eos is added).
- CPO / ORPO (simpo, orpo): ``maybe_apply_chat_template`` renders the text, tokenized without
  special tokens; like on plain text they prepend the tokenizer's BOS token when it has one and
  the rendered prompt does not start with it (templates of real models that use a BOS render it).
- RLOO / GRPO tokenize a conversational prompt with ``apply_chat_template(...,
  add_generation_prompt=True)``, online DPO renders it with ``maybe_apply_chat_template`` and
  tokenizes without special tokens: both the sampler's ids. Their reward functions then get the
  prompt and completions as messages; ``message_text`` turns them back into the strings eva's
  reward backends score.

A tokenizer without a template (the built-in world's) gets the plain strings, exactly as before.
"""

from __future__ import annotations

from typing import Any, Literal

from tasks.backends.chat_template import SOLVER, template_use

ChatTemplate = Literal["auto", "always", "never"]

CHAT_TEMPLATE_HELP = (
    '"auto" trains on the prompt wrapped in the tokenizer\'s chat template when it has one, '
    "as generation feeds it (keep it equal to the generation backend's chat_template), and on "
    'raw text otherwise; "always" fails without a template; "never" trains on raw text.'
)


def use_template(tokenizer: Any, setting: ChatTemplate, model: str) -> bool:
    """Whether training templates prompts: the generation backends' rule for the same
    setting, so a solver sees each prompt as the sampler that answered it did."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return template_use(has_template, setting, model, field=SOLVER)


def user_turn(prompt: str) -> list[dict[str, str]]:
    """A prompt as the conversation generation templates: one user message."""
    return [{"role": "user", "content": prompt}]


def assistant_turn(response: str) -> list[dict[str, str]]:
    """A response as TRL's conversational formats take a completion."""
    return [{"role": "assistant", "content": response}]


def message_text(value: str | list[dict[str, Any]]) -> str:
    """A prompt or completion as text: plain already, or the content of a conversation's last
    message (what ``user_turn`` / ``assistant_turn`` wrapped)."""
    return value if isinstance(value, str) else str(value[-1]["content"])


def template_overhead(tokenizer: Any) -> int:
    """Tokens the template adds around a prompt (an empty user turn plus the generation
    prompt), so a cap on prompt tokens can be spent on the prompt's own text."""
    ids = tokenizer.apply_chat_template(user_turn(""), add_generation_prompt=True)["input_ids"]
    return len(ids)

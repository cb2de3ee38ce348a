"""distilabel's tasks over eva's LLM client: ``ClientLLM`` is a distilabel ``LLM`` whose every
request goes through an ``eva_runtime.llm_client.LLMClient``.

Why: distilabel's own OpenAI-compatible LLM brings the ``openai`` library's client, so its
requests would escape eva's policy: the library's retries and backoff instead of ``backoff_s``
and ``max_backoff_s``, a timeout in whole seconds, counts of its own; and run outside a Pipeline,
one failed request raises out of ``asyncio.gather`` and loses the whole batch. Over
``LLMClient``, distilabel's requests get what every other eva request gets: at most
``concurrency`` in flight, eva's retries (timeouts, dropped connections, 408, 429 and 5xx, with
jittered exponential backoff and Retry-After), the key read once into the client's headers, and
the client's ``stats()`` (HTTP requests, retries, failures, tokens).

What it guarantees to a task (``generate`` gets a batch of inputs, each a chat or a raw prompt):

- requests run concurrently on the client's threads (``LLMClient.map``), answers in input order;
- a request that fails for good (retries spent, another 4xx, a malformed answer) answers ``""``
  for each generation, counted by cause. Tasks get strings only (EvolInstruct ``str.split``s
  every generation), so null content becomes ``""`` too, counted as ``no_content``;
- a configuration error (401/403/404), which no later request can avoid, stops the batch:
  ``LLMBatchError`` naming it;
- an input whose last message is ``SKIP`` is answered ``""`` without a request and counted as
  ``skipped_after_failure``: a task marks an input not worth sending (a chain link whose input
  failed, which rewriting only turns into junk);
- with a ``seed``, each request carries ``content_seed(seed, last message)``: its sample depends
  on neither batch position nor retries.

``counts`` are this LLM's own, a key present once nonzero: ``requests`` (requests made, each
once, however many HTTP attempts the client needed: those are in the client's stats),
``timeout``, ``error_<status>``, ``error_connection``, ``error_malformed``,
``skipped_after_failure`` and ``no_content``.

It is a synchronous ``LLM``, not an ``AsyncLLM``: the client runs requests on threads, so there
is no event loop to own. ``generate`` names its keyword arguments (distilabel checks
``generation_kwargs`` against its signature; a ``**kwargs`` there breaks pipeline validation).
The client belongs to the caller and outlives the LLM (``unload`` leaves it open), so tasks may
be loaded per batch over one client. For the same reason it serves tasks run standalone (as eva
runs them), not a distilabel Pipeline, which rebuilds each LLM in a worker process from its
serialized fields: the client (its key, connections and counts) is not one of them, and an LLM
rebuilt without it says so at its first request.

It only wraps the runtime client, so it lives in the runtime layer; what a task does with it
(EvolInstruct's chains, seeded mutations) stays with the task's backend. Importing this module
imports distilabel (seconds; its own pydantic warnings muted): import it lazily.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from pydantic import PrivateAttr

from eva_runtime.llm_client import LLMClient, LLMRequestError, content_seed

with warnings.catch_warnings(action="ignore"):
    from distilabel.models.llms.base import LLM

# The content of an input's last message that asks for "" without a request.
SKIP = "\x00eva-skip\x00"

Generation = dict[str, Any]  # distilabel's GenerateOutput: generations and statistics


def failure_key(exc: LLMRequestError) -> str:
    """The count a request that failed for good adds to: ``timeout``, ``error_<status>`` (an
    HTTP error status), ``error_connection`` (retries spent on a refused or dropped connection)
    or ``error_malformed`` (an answer that is not a completion)."""
    if exc.timed_out:
        return "timeout"
    if exc.status is not None and exc.status >= 400:
        return f"error_{exc.status}"
    return "error_connection" if exc.transient else "error_malformed"


with warnings.catch_warnings(action="ignore"):  # distilabel's fields warn on every subclass

    class ClientLLM(LLM):
        """A distilabel ``LLM`` over an eva ``LLMClient``; build it with ``ClientLLM.over``."""

        _client: Any = PrivateAttr(None)
        _seed: int | None = PrivateAttr(None)
        _counts: dict[str, int] = PrivateAttr(default_factory=dict)
        _lock: Any = PrivateAttr(default_factory=threading.Lock)

        @classmethod
        def over(
            cls, client: LLMClient, seed: int | None = None, **generation_kwargs: Any
        ) -> ClientLLM:
            """An LLM sending through ``client``; ``seed``: per-request seeds from it and the
            message; ``generation_kwargs``: ``generate``'s keyword arguments for every call."""
            llm = cls(generation_kwargs=generation_kwargs)
            llm._client, llm._seed = client, seed
            return llm

        @property
        def model_name(self) -> str:
            return str(self.client.model)

        @property
        def client(self) -> LLMClient:
            if self._client is None:
                raise RuntimeError("ClientLLM has no client: build it with ClientLLM.over")
            client: LLMClient = self._client
            return client

        @property
        def counts(self) -> dict[str, int]:
            """This LLM's request outcomes since it was built (see the module docstring)."""
            with self._lock:
                return dict(self._counts)

        def generate(
            self,
            inputs: list[Any],
            num_generations: int = 1,
            max_new_tokens: int = 128,
            temperature: float = 1.0,
            top_p: float = 1.0,
            stop: str | list[str] | None = None,
        ) -> list[Generation]:
            """Generates ``num_generations`` responses per input through the eva client.

            Args:
                inputs: the inputs, each a chat (a list of messages) or a raw prompt (a str).
                num_generations: the responses per input (sent as ``n``).
                max_new_tokens: the most tokens per response (sent as ``max_tokens``).
                temperature: the sampling temperature.
                top_p: the nucleus sampling mass.
                stop: the stop sequences, if any.

            Returns:
                Per input, its generations ("" where the request failed) and token statistics.
            """
            sampling: dict[str, Any] = {
                "n": num_generations,
                "max_tokens": max_new_tokens,
                "temperature": temperature,
                "top_p": top_p,
            }
            if stop is not None:
                sampling["stop"] = stop
            return self.client.map(lambda one: self._one(one, num_generations, sampling), inputs)

        def _one(self, input: Any, n: int, sampling: dict[str, Any]) -> Generation:
            if isinstance(input, str):
                content = input
            elif isinstance(input, list):
                content = str(input[-1]["content"]) if input else ""
            else:  # a (chat, structured output) pair: no structured output over this client
                raise TypeError(f"ClientLLM takes a chat or a prompt, not {type(input).__name__}")
            if content == SKIP:
                return self._empty(n, "skipped_after_failure")
            if self._seed is not None:
                sampling = {**sampling, "seed": content_seed(self._seed, content)}
            self._count("requests")
            try:
                if isinstance(input, str):
                    reply = self.client.completion_reply(input, **sampling)
                else:
                    reply = self.client.chat_reply(input, **sampling)
            except LLMRequestError as exc:
                if exc.config_error:
                    raise  # the batch stops: LLMBatchError
                return self._empty(n, failure_key(exc))
            if reply.nulls:
                self._count("no_content")
            return {
                "generations": reply.texts,
                "statistics": {
                    "input_tokens": [reply.prompt_tokens],
                    "output_tokens": [reply.completion_tokens],
                },
            }

        def _empty(self, n: int, count: str) -> Generation:
            self._count(count)
            return {
                "generations": [""] * n,
                "statistics": {"input_tokens": [0], "output_tokens": [0]},
            }

        def _count(self, key: str) -> None:
            with self._lock:
                self._counts[key] = self._counts.get(key, 0) + 1

"""Rollouts with CTranslate2, the fast inference engine for transformer models on CPU (int8) and
CUDA: the real-model recipe's ``Generator`` on a machine without a GPU.

Each checkpoint is converted once with CTranslate2's own converter
(``ctranslate2.converters.TransformersConverter``) into ``$EVA_CACHE_DIR/ctranslate2``, named by
the checkpoint's content (``eva_runtime.folder_cache``): the creator's and the solver's samples
and the evaluation of the same policy share one conversion, and a policy is never converted
again. For an int8 ``compute_type`` the weights are stored in int8 (130 MB for SmolLM2-135M
against 514 MB), otherwise as the checkpoint has them.

Prompts and answers go through the checkpoint's own Hugging Face tokenizer exactly as in the
transformers backend (``ChatCodec``): the same template, the same end-of-turn ids, the same cut
and ``finished`` flag (an answer finished when an end id came before ``max_new_tokens``).

Speed on a CPU comes from several one-thread engines decoding batches of about 16 sequences
side by side (``workers``): on 2 cores that samples SmolLM2-135M about twice as fast as one
two-thread engine on larger batches, and about 2x the transformers backend (docs/benchmarks.md,
section 6).

Seeding: CTranslate2 samples from one random generator per worker thread, seeded from the
process's seed (``ctranslate2.set_random_seed``) when the thread first samples. So each call of
``generate`` starts its engines anew (well under a second for a small model), each seeded in
turn, and engine k always decodes batches k, k + workers, ...: the same seed, prompts,
``batch_sequences``, ``workers``, ``threads`` and ``compute_type`` give the same responses.
Unlike the transformers backend's addressable noise, a prompt's samples depend on the prompts
batched with it and before it, as with vLLM.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from eva_runtime.errors import ConfigError, first_line
from eva_runtime.folder_cache import cache_dir, cached_folder
from eva_runtime.seeds import derive_seed
from tasks.backends.chat_template import GENERATION, template_use
from tasks.backends.generate.chat_codec import ChatCodec, end_ids
from tasks.backends.generate.transformers import check_fits
from tasks.backends.protocols import Generations, Progress, no_progress
from tasks.content_hashes import hash_directory

ComputeType = Literal[
    "auto",
    "int8",
    "int8_float32",
    "float32",
    "int8_float16",
    "int8_bfloat16",
    "float16",
    "bfloat16",
]
MISSING = "the 'ctranslate2' generation backend needs the ctranslate2 package"
INSTALL = "pip install ctranslate2 (CPU and CUDA wheels), or use kind: transformers"


class CTranslate2Generation(BaseModel):
    """Sample responses with CTranslate2 (int8 on a CPU by default)."""

    version: ClassVar[int] = 1  # bump when a change can change what it computes
    libraries: ClassVar[tuple[str, ...]] = ("ctranslate2", "transformers")

    model_config = ConfigDict(extra="forbid")

    kind: Literal["ctranslate2"] = "ctranslate2"
    temperature: float = Field(
        default=0.7,
        ge=0.0,
        description="Softmax temperature (eva's default 0.7). 0 = greedy: each prompt is "
        "decoded once and that response is repeated n times.",
    )
    top_p: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Nucleus sampling mass (eva's default 0.9)."
    )
    max_new_tokens: int = Field(default=256, ge=1, description="Response length cap in tokens.")
    batch_sequences: int = Field(
        default=16,
        ge=1,
        description="Sequences an engine decodes together (a prompt's n samples count n; "
        "prompts batched longest first): 16 suits a small model on one CPU core; on a GPU, "
        "larger batches fill it.",
    )
    workers: int = Field(
        default=0,
        ge=0,
        description="Engines decoding batches side by side, each with `threads` CPU threads; "
        "0 = one per CPU core this process may use, as many as a quarter of the free memory "
        "holds (a large model: fewer, each with the cores' share of threads), one on a GPU. On "
        "2 cores two one-thread engines sample a 135M model 2x faster than one two-thread one.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description='"auto" = cuda when CTranslate2 sees a GPU, else cpu.'
    )
    compute_type: ComputeType = Field(
        default="auto",
        description='"auto" = int8 on a CPU (weights quantized to 8 bits when the engine loads; '
        "docs/benchmarks.md measures what that changes), bfloat16 on a GPU that has it, else "
        "float16; float32 computes as the checkpoint was trained.",
    )
    threads: int = Field(default=1, ge=1, description="CPU threads of each engine.")
    chat_template: Literal["auto", "always", "never"] = Field(
        default="auto",
        description='"auto" applies the tokenizer\'s chat template when it has one and feeds raw '
        'text otherwise; "always" fails without a template; "never" feeds raw text.',
    )

    def load(self, model_dir: str) -> CTranslate2Generator:
        """The checkpoint in ``model_dir``, converted for CTranslate2 (once) and ready to
        sample; its tokenizer from ``model_dir``."""
        try:
            import ctranslate2
        except ImportError:
            raise ConfigError(MISSING, field=f"{GENERATION}.kind", hint=INSTALL) from None
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        device = self.device
        if device == "auto":
            device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
        compute_type = _compute_type(ctranslate2, self.compute_type, device)
        # int8 weights are stored as int8 (a quarter of the disk): what an int8 engine makes of
        # float32 weights when it loads them, to the bit.
        converted, fresh = convert(model_dir, "int8" if compute_type.startswith("int8") else None)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model_config = AutoConfig.from_pretrained(model_dir)
        try:
            generation_config = GenerationConfig.from_pretrained(model_dir)
        except OSError:  # a checkpoint without generation_config.json
            generation_config = None
        ends = end_ids(tokenizer, generation_config, model_config)
        if not ends:
            raise ConfigError(
                f"{model_dir} names no end-of-turn token: CTranslate2 could not tell a finished "
                "answer from a cut one",
                field="bootstrap.init_checkpoint",
                hint="set eos_token in the checkpoint's tokenizer_config.json",
            )
        has_template = bool(getattr(tokenizer, "chat_template", None))
        use = template_use(has_template, self.chat_template, model_dir, GENERATION)
        return CTranslate2Generator(
            converted, ChatCodec(tokenizer, ends, use), model_config, self, device, compute_type,
            conversions=int(fresh),
        )  # fmt: skip


def convert(model_dir: str, quantization: str | None = None) -> tuple[str, bool]:
    """The CTranslate2 model of the checkpoint in ``model_dir``, its weights stored as
    ``quantization`` (None: as the checkpoint has them): cached by its content, or converted now.
    Returns the folder and whether it was converted by this call; a checkpoint CTranslate2
    cannot convert is one line naming the backend's kind."""
    digest = hash_directory(model_dir)

    def build(out: str) -> None:
        from ctranslate2.converters import TransformersConverter

        try:  # transformers draws a loading bar on stderr, which no switch of its hides
            with contextlib.redirect_stderr(io.StringIO()):
                TransformersConverter(model_dir).convert(out, quantization=quantization, force=True)
        except (ValueError, NotImplementedError, KeyError, OSError) as exc:
            raise ConfigError(
                f"CTranslate2 cannot convert {model_dir}: {first_line(exc, with_type=False)}",
                field=f"{GENERATION}.kind",
                hint="use kind: transformers for this checkpoint",
            ) from None

    source = {"checkpoint": os.path.abspath(model_dir), "sha256": digest,
              "quantization": str(quantization)}  # fmt: skip
    key = digest[:16] + (f"-{quantization}" if quantization else "")
    return cached_folder(cache_dir("ctranslate2"), key, build, source)


def _compute_type(ctranslate2: Any, setting: str, device: str) -> str:
    if setting != "auto":
        return setting
    if device == "cpu":
        return "int8"
    supported = ctranslate2.get_supported_compute_types("cuda")
    return "bfloat16" if "bfloat16" in supported else "float16"


class CTranslate2Generator:
    """A converted policy that satisfies the ``Generator`` protocol."""

    def __init__(
        self,
        path: str,
        codec: ChatCodec,
        model_config: Any,
        config: CTranslate2Generation,
        device: str,
        compute_type: str,
        conversions: int,
    ):
        self.path, self.codec, self.model_config, self.config = path, codec, model_config, config
        self.device, self.compute_type = device, compute_type
        self.conversions = conversions  # 1 when load converted the checkpoint, 0 when cached

    def stats(self) -> dict[str, int]:
        """``conversions``: 1 when this backend converted its checkpoint, 0 when it found the
        conversion cached (an earlier stage on the same policy made it)."""
        return {"conversions": self.conversions}

    def generate(
        self, prompts: Sequence[str], n: int, seed: int, progress: Progress = no_progress
    ) -> Generations:
        """``n`` responses per prompt (new tokens only, cut at the first end-of-turn id, special
        tokens removed), each with whether it finished before ``max_new_tokens``."""
        import ctranslate2
        import torch

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        cfg = self.config
        greedy = cfg.temperature == 0.0
        encoded = [self.codec.encode(p) for p in prompts]
        if empty := [i for i, ids in enumerate(encoded) if not ids]:
            raise ValueError(f"prompts at {empty[:5]} encode to no tokens; nothing to condition on")
        try:
            check_fits(self.model_config, [len(ids) for ids in encoded], cfg.max_new_tokens)
        except ValueError as exc:  # check_fits leaves the field to its callers (flows.inputs)
            raise ConfigError(
                str(exc),
                field=f"{GENERATION}.max_new_tokens",
                hint="an evolved prompt is capped by evolve.max_chars, a file's by "
                "prompts.max_chars",
            ) from None
        tokens = self.codec.tokenizer.convert_ids_to_tokens
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        per_batch = max(1, cfg.batch_sequences // (1 if greedy else n))
        batches = [order[i : i + per_batch] for i in range(0, len(order), per_batch)]
        # CTranslate2 sets OpenMP's thread count of the thread that builds its engines, which is
        # torch's too: training after sampling in this process ran on one thread, twice as slow
        # on two cores. The count is put back once the engines are built.
        torch_threads = torch.get_num_threads()
        try:
            engines = self._engines(ctranslate2, seed, greedy)
        finally:
            torch.set_num_threads(torch_threads)
        texts: list[list[str]] = [[] for _ in prompts]
        finished: list[list[bool]] = [[] for _ in prompts]
        done = [0]
        lock = threading.Lock()

        def work(k: int) -> None:
            # Engine k decodes batches k, k + workers, ...: which engine samples which batch
            # never depends on timing, so the same seed gives the same responses.
            for chunk in batches[k :: len(engines)]:
                results = engines[k].generate_batch(
                    [tokens(encoded[i]) for i in chunk],
                    max_length=cfg.max_new_tokens, include_prompt_in_result=False,
                    end_token=self.codec.end_ids, return_end_token=True,
                    num_hypotheses=1 if greedy else n,
                    sampling_topk=1 if greedy else 0,  # 0: the whole vocabulary, cut by top_p
                    sampling_topp=cfg.top_p, sampling_temperature=cfg.temperature or 1.0,
                )  # fmt: skip
                decoded = [[self.codec.decode(ids) for ids in r.sequences_ids] for r in results]
                with lock:
                    for i, pairs in zip(chunk, decoded, strict=True):
                        texts[i] = [t for t, _ in pairs]
                        finished[i] = [f for _, f in pairs]
                    done[0] += len(chunk)
                    progress(min(1.0, done[0] / len(order)))

        with ThreadPoolExecutor(len(engines)) as pool:  # CTranslate2 decodes without the GIL
            for future in [pool.submit(work, k) for k in range(len(engines))]:
                future.result()
        engines.clear()  # their memory goes back before the stage goes on (a reward model loads)
        if greedy:
            texts, finished = [t * n for t in texts], [f * n for f in finished]
        return Generations(texts, finished)

    def _engines(self, ctranslate2: Any, seed: int, greedy: bool) -> list[Any]:
        """The workers' engines, each seeded in turn: an engine samples from a generator of its
        own thread, seeded from the process's seed when it first samples (module docstring),
        so each samples one token right after its seed is set."""
        count, threads = self._layout()
        engines = []
        for k in range(count):
            ctranslate2.set_random_seed(derive_seed(seed, k))
            engine = ctranslate2.Generator(
                self.path, device=self.device, compute_type=self.compute_type,
                inter_threads=1, intra_threads=threads,
            )  # fmt: skip
            if not greedy:
                start = self.codec.tokenizer.convert_ids_to_tokens(self.codec.end_ids[:1])
                engine.generate_batch([start], max_length=1, sampling_topk=0)
            engines.append(engine)
        return engines

    def _layout(self) -> tuple[int, int]:
        """How many engines, and threads each: ``workers`` and ``threads`` as configured; by
        default one one-thread engine a core on a CPU, as many as a quarter of the free memory
        holds copies of the weights (a large model gets fewer engines with more threads each),
        and one on a GPU."""
        if self.config.workers or self.device == "cuda":
            return self.config.workers or 1, self.config.threads
        import psutil

        cores = len(os.sched_getaffinity(0))
        weights = sum(f.stat().st_size for f in os.scandir(self.path) if f.is_file())
        fits = int(psutil.virtual_memory().available // 4 // max(weights, 1))
        count = max(1, min(cores, fits))
        return count, max(self.config.threads, cores // count)

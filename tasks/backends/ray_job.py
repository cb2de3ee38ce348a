"""The Ray job a stage submits: ``python -m tasks.backends.ray_job '<JobSpec as JSON>'``.

It runs on the cluster, in the cluster's environment, which need not be eva's (vLLM cannot share
one with prefect 3.8): this module and what it imports use no prefect, only pydantic, pyarrow,
fsspec, ray and the backend's own packages. It reads the stage's input table from the run root,
cuts it into blocks of ``rows_per_task`` rows that keep their row numbers, has ``workers`` Ray
Data workers run the stage's backend on them, and writes the results as parquet, in long form
(``row``, ``sample``, value: one row per response), to a staging folder under the run root. The
stage that submitted the job checks that folder row by row and publishes the artifact as usual.

Same seeds, same outputs: a transformers worker samples each prompt with its row number as the
noise address, and a reward backend scores each response on its own, so the shards together are
byte for byte what the in-process backend gives. On GPUs (``backend.kind == "vllm"``) the
workers are Ray Data LLM's vLLM engine replicas instead, each request seeded as the in-process
vLLM backend seeds sample ``j`` of prompt ``i`` (``derive_seed(seed, i) + j``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from eva_runtime.log import child_logger
from eva_runtime.progress import progress_line
from tasks.backends.chat_template import GENERATION, template_use
from tasks.backends.generate.openai import derive_seed
from tasks.backends.generate.vllm import VLLMGeneration
from tasks.backends.protocols import RewardModel
from tasks.content_hashes import is_hub_id
from tasks.store import RunStore

# The line the job writes for the stage that follows its log when it fails (responses done are
# eva_runtime.progress marks). Both go to stdout through ``child_logger`` (eva_runtime.log).
ERROR_MARK = "eva-ray-error"
LOGGER = "eva.ray_job"
# What a job writes per response, by task: its value and, for generation, whether it finished.
VALUE_COLUMNS = {"generate": ("response", "finished"), "annotate": ("reward",)}
CLUSTER_BACKENDS = ("transformers", "vllm")  # generation backends a cluster can run


class JobSpec(BaseModel):
    """Everything the job needs, passed on its command line (so: no secrets in the run's
    storage_options; the cluster should reach the run root with credentials of its own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    task: Literal["generate", "annotate"]
    root: str
    run: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    input: str  # the input table's uri as its manifest records it
    output: str  # staging folder, relative to the run
    backend: dict[str, Any]  # the stage's backend config, validated again here
    n: int = 1
    seed: int = 0
    model_uri: str | None = None  # generate: the policy checkpoint, as recorded
    model_hash: str | None = None
    workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    rows_per_task: int = 256


def blocks(table: pa.Table, rows_per_task: int) -> list[pa.Table]:
    """``table`` with a ``row`` column (its position in the stage input), in blocks of
    ``rows_per_task`` rows: the unit a worker takes at a time."""
    table = table.append_column("row", pa.array(range(table.num_rows), pa.int64()))
    return [table.slice(s, rows_per_task) for s in range(0, table.num_rows, rows_per_task)]


def long_form(rows: list[int], columns: dict[str, tuple[list[list[Any]], pa.DataType]]) -> pa.Table:
    """One output row per response: ``row``, ``sample`` (its position in the prompt's list),
    and its value in each of ``columns`` (name: one list per row, and its type); a prompt with
    no responses has no rows."""
    counts = [len(vs) for vs in next(iter(columns.values()))[0]]
    per_row = zip(rows, counts, strict=True)
    table = {
        "row": pa.array([r for r, c in per_row for _ in range(c)], pa.int64()),
        "sample": pa.array([j for c in counts for j in range(c)], pa.int32()),
    }
    for name, (values, kind) in columns.items():
        table[name] = pa.array([v for vs in values for v in vs], kind)
    return pa.table(table)


def vllm_processor_kwargs(
    backend: VLLMGeneration, spec: JobSpec, model_source: str, use_chat: bool
) -> dict[str, Any]:
    """The ``ray.data.llm.vLLMEngineProcessorConfig`` arguments for a vLLM stage: one engine
    replica per ``tensor_parallel_size`` GPUs, ``workers`` replicas (Ray places them across
    nodes), the in-process backend's engine settings, ``rows_per_task`` requests per call."""
    return {
        "model_source": model_source,
        "engine_kwargs": {
            "tensor_parallel_size": backend.tensor_parallel_size,
            "gpu_memory_utilization": backend.gpu_memory_utilization,
            "dtype": backend.dtype,
            "max_model_len": backend.max_model_len,
            "enforce_eager": backend.enforce_eager,
            "seed": 0,  # as in-process: sampling is seeded per request
        },
        "concurrency": (spec.workers, spec.workers),  # all replicas up: an int autoscales 1..n
        "batch_size": spec.rows_per_task,
        "chat_template_stage": use_chat,
        "tokenize_stage": True,
        "detokenize_stage": True,
    }


def vllm_requests(row: dict[str, Any], backend: VLLMGeneration, spec: JobSpec) -> list[dict]:
    """One request per sample (Ray Data LLM keeps a request's first output only), seeded as the
    in-process vLLM backend seeds sample ``j`` of an ``n``-sample request; greedy: one."""
    i, greedy = int(row["row"]), backend.temperature == 0.0
    text = row["prompt"]
    return [
        {
            "row": i,
            "sample": j,
            "copies": spec.n if greedy else 1,
            "prompt": text,
            "messages": [{"role": "user", "content": text}],
            "sampling_params": {
                "n": 1,
                "temperature": backend.temperature,
                "top_p": backend.top_p,
                "max_tokens": backend.max_tokens,
                "seed": derive_seed(spec.seed, i) + j,
            },
        }
        for j in range(1 if greedy else spec.n)
    ]


def _local_model(spec: JobSpec) -> str:
    """The policy checkpoint on this node: downloaded once per node from a remote run root
    (workers sharing a node take turns, so none reads a half-copied folder)."""
    from filelock import FileLock

    assert spec.model_uri is not None and spec.model_hash is not None
    lock = os.path.join(tempfile.gettempdir(), f"eva-model-{spec.model_hash[:16]}.lock")
    with FileLock(lock):
        store = RunStore(spec.root, spec.run, spec.storage_options)
        return store.local_model(spec.model_uri, spec.model_hash)


class StageWorker:
    """A Ray Data worker: loads the stage's backend once, then runs it on block after block.

    Its errors reach the job's driver wrapped by Ray (``UserCodeException: UDF failed to process
    a data block``), their own type and text only inside a traceback: a worker raises them as
    its error line, which the driver's traceback prints and the stage picks out.
    """

    def __init__(self, spec_json: str):
        try:
            self._load(spec_json)
        except Exception as exc:
            raise RuntimeError(error_line(exc)) from exc

    def __call__(self, batch: pa.Table) -> pa.Table:
        try:
            return self._run(batch)
        except Exception as exc:
            raise RuntimeError(error_line(exc)) from exc

    def _load(self, spec_json: str) -> None:
        # The backends are imported here, in the workers: the job's driver only moves tables,
        # and starts seconds sooner without torch.
        self.spec = spec = JobSpec.model_validate_json(spec_json)
        self.scorer: RewardModel
        if spec.task == "generate":
            from tasks.backends.generate.transformers import TransformersGeneration

            # (vllm stages never get here: Ray Data LLM runs them, see _vllm)
            backend = TransformersGeneration.model_validate(spec.backend)
            self.generator = backend.load(_local_model(spec))
        elif spec.backend.get("kind") == "python":
            # Plain Python: importing every reward backend would import torch, for nothing.
            from tasks.backends.python import PythonComponent

            self.scorer = PythonComponent.model_validate(spec.backend).load()
        else:
            from tasks.backends.reward import RewardBackend

            self.scorer = TypeAdapter(RewardBackend).validate_python(spec.backend).load()
        if "torch" in sys.modules:  # one intra-op thread per CPU the worker reserved
            sys.modules["torch"].set_num_threads(max(1, int(spec.cpus_per_worker)))

    def _run(self, batch: pa.Table) -> pa.Table:
        spec, rows = self.spec, batch.column("row").to_pylist()
        prompts = batch.column("prompt").to_pylist()
        if spec.task == "generate":
            got = self.generator.generate(prompts, spec.n, spec.seed, indices=rows)
            out = long_form(
                rows,
                {"response": (got.texts, pa.string()), "finished": (got.finished, pa.bool_())},
            )
        else:
            responses = batch.column("responses").to_pylist()
            rewards = self.scorer.score(prompts, responses)
            out = long_form(rows, {"reward": (rewards, pa.float64())})
        child_logger(LOGGER).info(progress_line(done=out.num_rows))  # as the stage counts
        return out


def _vllm(ds: Any, spec: JobSpec, model_source: str) -> Any:
    """Generation on Ray Data LLM's vLLM processor (GPU clusters; not run on CPU machines)."""
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    from transformers import AutoTokenizer

    backend = VLLMGeneration.model_validate(spec.backend)
    has_template = bool(AutoTokenizer.from_pretrained(model_source).chat_template)
    use_chat = template_use(has_template, backend.chat_template, model_source, GENERATION)
    config = vLLMEngineProcessorConfig(
        **vllm_processor_kwargs(backend, spec, model_source, use_chat)
    )
    processor = build_processor(
        config,
        postprocess=lambda r: vllm_response(r, backend.max_tokens),
    )  # fmt: skip
    ds = processor(ds.flat_map(lambda r: vllm_requests(r, backend, spec)))
    return ds.map_batches(fan_out, batch_format="pyarrow")


def vllm_response(row: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A Ray Data LLM output row as the job writes it. Ray Data LLM passes no finish reason: a
    response that used every one of ``max_tokens`` counts as cut at the cap (one that ended on
    its very last token counts so too)."""
    return {
        "row": row["row"], "sample": row["sample"], "copies": row["copies"],
        "response": row["generated_text"],
        "finished": row["num_generated_tokens"] < max_tokens,
    }  # fmt: skip


def fan_out(batch: pa.Table) -> pa.Table:
    """A greedy request's one response as its ``copies`` samples (the in-process backends
    repeat it n times too); sampled requests pass through."""
    copies = batch.column("copies").to_pylist()
    take = pa.array([i for i, c in enumerate(copies) for _ in range(c)], pa.int64())
    offset = pa.array([k for c in copies for k in range(c)], pa.int32())
    out = pa.table(
        {
            "row": batch.column("row").cast(pa.int64()).take(take),
            "sample": pc.add(batch.column("sample").cast(pa.int32()).take(take), offset),
            "response": batch.column("response").cast(pa.string()).take(take),
            "finished": batch.column("finished").cast(pa.bool_()).take(take),
        }
    )
    child_logger(LOGGER).info(progress_line(done=out.num_rows))
    return out


def run(spec: JobSpec) -> None:
    import ray
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    ray.init()  # the job's driver: joins the cluster it was submitted to
    ray.data.DataContext.get_current().enable_progress_bars = False  # the stage logs progress
    store = RunStore(spec.root, spec.run, spec.storage_options)
    columns = ["prompt"] if spec.task == "generate" else ["prompt", "responses"]
    table = store.read_table(spec.input).select(columns)
    ds: Any = ray.data.from_arrow(blocks(table, spec.rows_per_task))
    kind = spec.backend.get("kind", "transformers")
    if spec.task == "generate" and kind == "vllm":
        # Ray Data LLM fetches a remote checkpoint (s3://...) to each node itself.
        uri = spec.model_uri
        assert uri is not None
        ds = _vllm(ds, spec, uri if uri.startswith("/") or is_hub_id(uri) else store.absolute(uri))
    else:
        ds = ds.map_batches(
            StageWorker,
            fn_constructor_kwargs={"spec_json": spec.model_dump_json()},
            batch_size=None,  # one block per call
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=spec.workers),
            num_cpus=spec.cpus_per_worker,
            num_gpus=spec.gpus_per_worker or None,
        )
    path = store.resolve(spec.output)
    fs = None if store.is_local else PyFileSystem(FSSpecHandler(store.fs))
    # Writing is I/O: with no CPU of its own it runs beside the workers rather than waiting
    # for them to finish when they hold every CPU (on a 2-CPU cluster, 2 workers do).
    ds.write_parquet(path, filesystem=fs, ray_remote_args={"num_cpus": 0})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = JobSpec.model_validate_json(args[0])
    try:
        run(spec)
    except Exception as exc:
        traceback.print_exc()
        child_logger(LOGGER).error(error_line(exc))
        return 1
    return 0


def error_line(exc: BaseException) -> str:
    """The line that tells the stage why the job failed: the exception's type and text."""
    return f"{ERROR_MARK} {json.dumps({'type': type(exc).__name__, 'message': str(exc)})}"


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``served`` backend with real subprocesses: the test OpenAI server stands in for
``vllm serve`` (started the same way, on the stage's checkpoint, on a port picked at load)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter, ValidationError

from eva_core.schema import seed_records
from eva_runtime.engines import EnginePool
from eva_runtime.llm_config import LLMConfigError
from eva_world import world
from tasks.backends.generate import GenerationBackend
from tasks.backends.generate.served import (
    ServedGeneration,
    ServedGenerator,
    ServerStartError,
)
from tasks.backends.generate.transformers import TransformersGeneration
from tasks.backends.protocols import Generator, close_after
from tasks.evaluate import EvaluateConfig
from tasks.generate import GenerateConfig

REPO = str(Path(__file__).resolve().parents[1])
PROMPTS = ["12+34=", "r:abc=", "9-4=", "not a world prompt"]
SERVER = [
    sys.executable, "-m", "tests.support.openai_server", "--port", "{port}",
    "--model", "{name}", "--answer", "world", "--checkpoint", "{model}",
]  # fmt: skip
FAST_CLIENT = {"llm": {"backoff_s": 0.01, "max_retries": 1, "timeout_s": 10.0}}


def served(command: list[str] = SERVER, **overrides: Any) -> ServedGeneration:
    fields: dict[str, Any] = {
        "command": command,
        "env": {"PYTHONPATH": REPO},  # `-m tests.support...` from any working directory
        "startup_timeout_s": 20.0,
        "stop_timeout_s": 5.0,
        "client": FAST_CLIENT,
        **overrides,
    }
    return ServedGeneration.model_validate(fields)


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def refuses(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def drop_log(error: ServerStartError) -> None:
    """A failed start keeps its log directory for post-mortems; tests clean up after."""
    shutil.rmtree(os.path.dirname(error.log_path))


def test_serves_the_stage_checkpoint_answers_and_stops(tmp_path: Path):
    ckpt = str(tmp_path / "iter_3" / "policy")
    gen = served(reuse=False).load(ckpt)
    try:
        assert isinstance(gen, Generator) and gen.running
        # The server was started on the stage's checkpoint, under the name requests use.
        assert gen.argv[gen.argv.index("--checkpoint") + 1] == ckpt
        card = httpx.get(f"{gen.base_url}/models").json()["data"][0]
        assert card == {"id": "policy", "object": "model", "root": ckpt}
        out = gen.generate(PROMPTS, 2, seed=0).texts
        assert out[:3] == [["64"] * 2, ["cba"] * 2, ["5"] * 2]
        assert out[3] == [f"reply {j} to: not a world prompt" for j in range(2)]
        assert os.path.exists(gen.log_path)
    finally:
        gen.close()
    assert gen.process.returncode is not None  # reaped
    assert not gen.running and refuses(gen.port)
    assert not os.path.exists(gen.log_path)  # a clean stop removes its log directory
    gen.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        gen.generate(PROMPTS, 1, seed=0)


def test_close_kills_the_servers_children_too(tmp_path: Path):
    # Like vLLM's workers: a grandchild in the server's process group must go with it.
    pid_file = tmp_path / "child.pid"
    script = f'sleep 120 & echo $! > {pid_file}; exec "$@"'
    with served(["sh", "-c", script, "sh", *SERVER], reuse=False).load(str(tmp_path)) as gen:
        child = int(pid_file.read_text())
        assert alive(child) and gen.generate(["1+1="], 1, seed=0).texts == [["2"]]
    assert not alive(gen.process.pid) and wait_gone(child)


def test_a_server_that_exits_at_once_raises_with_its_log_tail(tmp_path: Path):
    lines = "; ".join(f"print('line {i}')" for i in range(40))
    crash = [sys.executable, "-c", f"{lines}; raise SystemExit('CUDA out of memory')"]
    with pytest.raises(ServerStartError, match="exited with code 1") as info:
        served([*crash, "{model}", "{port}"]).load(str(tmp_path))
    message = str(info.value)
    assert "CUDA out of memory" in message and "line 39" in message
    assert "line 10" in message and "line 9\n" not in message  # the last 30 lines only
    assert info.value.returncode == 1 and os.path.exists(info.value.log_path)  # kept
    drop_log(info.value)


def test_a_server_that_never_gets_ready_times_out_and_is_killed(tmp_path: Path):
    # It ignores SIGTERM too, so the stop has to escalate to SIGKILL.
    stuck = [
        sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('loading weights', flush=True); time.sleep(60)",
        "{model}", "{port}",
    ]  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="not ready after 1 s") as info:
        served(stuck, startup_timeout_s=1.0, stop_timeout_s=0.5).load(str(tmp_path))
    assert time.monotonic() - started < 10
    assert "loading weights" in str(info.value) and info.value.returncode is None
    assert wait_gone(info.value.pid)
    drop_log(info.value)


def test_a_server_serving_another_name_is_refused(tmp_path: Path):
    # Without {name} the client asks for the checkpoint path (vLLM's default name).
    other = [arg.replace("{name}", "someone-else") for arg in SERVER]
    expected = re.escape(f"serves ['someone-else'], not '{tmp_path}'")
    with pytest.raises(ServerStartError, match=expected) as info:
        served(other).load(str(tmp_path))
    assert wait_gone(info.value.pid)
    drop_log(info.value)


def test_a_missing_binary_says_where_to_point_the_command(tmp_path: Path):
    with pytest.raises(ServerStartError, match=r"\.venv-vllm/bin/vllm"):
        served([str(tmp_path / "no-such-vllm"), "serve", "{model}", "--port", "{port}"]).load(
            str(tmp_path)
        )


def test_a_missing_api_key_fails_before_the_server_starts(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("EVA_TEST_SERVED_KEY", raising=False)
    marker = tmp_path / "started"
    command = ["sh", "-c", f'touch {marker}; exec "$@"', "sh", *SERVER]
    client = {"llm": {**FAST_CLIENT["llm"], "api_key_env": "EVA_TEST_SERVED_KEY"}}
    with pytest.raises(LLMConfigError, match="EVA_TEST_SERVED_KEY"):
        served(command, client=client).load(str(tmp_path))
    assert not marker.exists()


def test_config_validation_and_the_backend_union():
    default = ServedGeneration()
    assert default.command[:3] == ["vllm", "serve", "{model}"]
    assert default.argv("/ckpt", 1234)[2:] == [
        "/ckpt", "--host", "127.0.0.1", "--port", "1234", "--seed", "0",
        "--served-model-name", "policy",
    ]  # fmt: skip
    assert default.served_name("/ckpt") == "policy"
    tp = ServedGeneration(command=["v", "serve", "{model}", "--port={port}"], extra_args=["-tp"])
    assert tp.argv("/c", 9) == ["v", "serve", "/c", "--port=9", "-tp"]
    assert tp.served_name("/c") == "/c"  # no {name}: vLLM serves it under its path
    for bad in ([], ["vllm", "serve", "--port", "{port}"], ["vllm", "serve", "{model}"]):
        with pytest.raises(ValidationError):
            ServedGeneration(command=bad)
    with pytest.raises(ValidationError, match=r"client\.llm\.base_url"):
        ServedGeneration.model_validate({"client": {"llm": {"base_url": "http://elsewhere/v1"}}})
    with pytest.raises(ValidationError):
        ServedGeneration.model_validate({"startup_timeout": 5})  # extra="forbid"
    with pytest.raises(ValidationError):
        default.startup_timeout_s = 1.0  # frozen
    assert default.model_validate(default.model_dump()) == default  # round-trips

    config = GenerateConfig.model_validate(
        {"n": 2, "backend": {"kind": "served", "extra_args": ["--tensor-parallel-size", "8"]}}
    )
    assert isinstance(config.backend, ServedGeneration)
    assert config.backend.extra_args == ["--tensor-parallel-size", "8"]
    evaluate = EvaluateConfig.model_validate(
        {"generation": {"kind": "served", "client": {"temperature": 0.0}}}
    )
    assert isinstance(evaluate.generation, ServedGeneration)
    assert evaluate.generation.client.temperature == 0.0
    adapter: TypeAdapter[Any] = TypeAdapter(GenerationBackend)
    assert isinstance(adapter.validate_python({"max_new_tokens": 3}), TransformersGeneration)
    with pytest.raises(ValidationError, match="'served'"):
        adapter.validate_python({"kind": "sglang"})


def test_close_after_closes_what_has_close_and_ignores_the_rest():
    class Closable:
        closed = False

        def close(self) -> None:
            self.closed = True

    with close_after(Closable()) as c:
        assert not c.closed
    assert c.closed
    with pytest.raises(KeyError), close_after(Closable()) as c:
        raise KeyError("boom")
    assert c.closed
    with close_after(object()):
        pass


def test_generate_stage_starts_and_stops_the_server(tmp_path: Path):
    from tasks.context import RunContext, StageContext
    from tasks.generate import generate
    from tasks.store import Ref

    ckpt = tmp_path / "policy"
    ckpt.mkdir()
    pid_file = ckpt / "server.pid"
    # exec keeps the pid, so the file names the server process itself.
    command = ["sh", "-c", 'echo $$ > "$0"/server.pid; exec "$@"', "{model}", *SERVER]
    config = GenerateConfig(n=2, backend=served(command, reuse=False))
    run = RunContext(root=str(tmp_path), run="t", seed=0)
    refs = {"policy": Ref("train", 0, "mem://x", "h", 0, model_uri=str(ckpt))}
    ctx = StageContext(run, 1, "generate", 7, refs, str(tmp_path), run.store(), lambda _: None)
    out = generate.fn(ctx, config, prompts=seed_records(PROMPTS[:3]))
    responses = out.table.column("responses").to_pylist()
    assert responses == [[world.solve(p)] * 2 for p in PROMPTS[:3]]
    assert not alive(int(pid_file.read_text()))  # the stage closed it
    assert out.stats["engine_starts"] == 1
    # One request per prompt (n in one request); the stand-in reports 1 + 1 tokens each.
    assert out.stats["backend"] == {
        "requests": 3, "retries": 0, "failures": 0, "prompt_tokens": 3, "completion_tokens": 3,
    }  # fmt: skip


def test_garbage_collection_stops_a_forgotten_server(tmp_path: Path):
    import gc

    gen: ServedGenerator | None = served(reuse=False).load(str(tmp_path))
    assert gen is not None
    pid, port = gen.process.pid, gen.port
    del gen
    gc.collect()
    assert wait_gone(pid) and refuses(port)


# --- one engine per checkpoint, shared by the stages that sample it --------------------------


def test_stages_on_one_checkpoint_share_one_server_and_a_new_checkpoint_replaces_it(
    tmp_path: Path,
):
    pool = EnginePool()
    first, second = str(tmp_path / "theta_1"), str(tmp_path / "theta_2")
    a = served().load(first, pool=pool)  # e.g. evaluate of theta_1
    a.close()
    assert a.engine.running and not a.running  # kept for the next stage; this handle is done
    greedy = served(client={**FAST_CLIENT, "temperature": 0.0})  # another client, same server
    b = greedy.load(first, pool=pool)  # the next iteration's creator_generate
    assert b.process.pid == a.process.pid and (a.engine_starts, b.engine_starts) == (1, 0)
    assert b.generate(["2+2="], 1, seed=0).texts == [["4"]]
    b.close()
    c = served().load(second, pool=pool)  # after training: theta_2
    assert c.engine_starts == 1 and c.process.pid != a.process.pid
    assert wait_gone(a.process.pid) and refuses(a.port)  # the stale server made room
    assert c.argv[c.argv.index("--checkpoint") + 1] == second
    elsewhere = served(env={"PYTHONPATH": REPO, "CUDA_VISIBLE_DEVICES": "1"})
    other_env = elsewhere.load(second, pool=pool)
    assert other_env.engine_starts == 1 and c.engine.running  # other settings, other server
    assert pool.starts == 3 and pool.stop_all() == 2
    assert wait_gone(c.process.pid) and wait_gone(other_env.process.pid)
    assert pool.stop_all() == 0


def test_a_reused_server_that_died_is_started_again(tmp_path: Path):
    pool = EnginePool()
    with served().load(str(tmp_path), pool=pool) as gen:
        os.killpg(gen.process.pid, signal.SIGKILL)
        assert wait_gone(gen.process.pid)
    again = served().load(str(tmp_path), pool=pool)
    assert again.engine_starts == 1 and again.generate(["1+1="], 1, seed=0).texts == [["2"]]
    pool.stop_all()


KILLED_EVA = """
import sys, time
from tasks.backends.generate.served import ServedGeneration
gen = ServedGeneration.model_validate({"command": sys.argv[2:], "env": {"PYTHONPATH": sys.argv[1]},
                                       "stop_timeout_s": 1.0})
gen = gen.load(sys.argv[1])
print(gen.process.pid, flush=True)
time.sleep(120)
"""


def test_a_sigkill_of_eva_leaves_no_server_behind(tmp_path: Path):
    # The server and a worker it forked (like vLLM's), in their own session: only the guard
    # can stop them once eva is killed outright, since no finalizer of eva's runs.
    pid_file = tmp_path / "worker.pid"
    script = f'sleep 120 & echo $! > {pid_file}; exec "$@"'
    eva = subprocess.Popen(
        [sys.executable, "-c", KILLED_EVA, REPO, "sh", "-c", script, "sh", *SERVER],
        stdout=subprocess.PIPE, cwd=REPO, text=True,
    )  # fmt: skip
    try:
        assert eva.stdout is not None
        guard = int(eva.stdout.readline())
        worker = int(pid_file.read_text())
        assert alive(guard) and alive(worker)
    finally:
        eva.kill()  # SIGKILL
        eva.wait()
    assert wait_gone(guard, 10.0) and wait_gone(worker, 10.0)


@pytest.mark.usefixtures("prefect_api")
def test_a_run_starts_one_server_per_checkpoint(tmp_path: Path):
    from eva_runtime.engines import ENGINES
    from flows.config import validate_config
    from flows.run import eva_run
    from tasks.store import RunStore
    from tests.conftest import tiny_run_config

    record = tmp_path / "starts.txt"
    command = [*SERVER, "--record", str(record)]
    command[command.index("world")] = "mixed"  # a right and a wrong answer: pairs to train on
    backend = served(command).model_dump()
    greedy = {**backend, "client": {**FAST_CLIENT, "temperature": 0.0}}
    root = str(tmp_path / "runs")
    cfg = tiny_run_config(root, run="served", generate={"n": 2, "backend": backend})
    cfg["evaluate"] = {"generation": greedy}
    starts_before = ENGINES.starts
    eva_run(validate_config(cfg))

    store = RunStore(root, "served")

    def manifest(t: int | None, stage: str) -> dict[str, Any]:
        found = store.read_manifest(t, stage)
        assert found is not None, (t, stage)
        return found

    checkpoints = [
        manifest(t, s)["model_uri"] for t, s in [(None, "bootstrap"), (0, "train"), (1, "train")]
    ]
    # theta_0, theta_1, theta_2: each started once, in order, whatever stages sampled it.
    started = record.read_text().splitlines()
    assert len(started) == len(checkpoints) == ENGINES.starts - starts_before == 3
    assert all(p.endswith(os.path.normpath(u)) for p, u in zip(started, checkpoints, strict=True))
    engine_starts = {
        (t, stage): manifest(t, stage)["stats"]["engine_starts"]
        for t, stage in [(None, "evaluate"), (0, "generate"), (0, "evaluate"),
                         (1, "creator_generate"), (1, "generate"), (1, "evaluate")]
    }  # fmt: skip
    assert engine_starts == {
        (None, "evaluate"): 1, (0, "generate"): 0, (0, "evaluate"): 1,
        (1, "creator_generate"): 0, (1, "generate"): 0, (1, "evaluate"): 1,
    }  # fmt: skip
    assert manifest(1, "train")["stats"]["engines_stopped"] == 1
    assert ENGINES.stop_all() == 0  # the run stopped the last one itself


# A `vllm` on PATH that records its command line, then serves as the stand-in does on the address
# and port it was given (the stand-in itself listens on 127.0.0.1 and takes no --host).
FAKE_VLLM = """#!{python}
import json, sys
args = sys.argv[1:]
with open({record!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
value = lambda flag: args[args.index(flag) + 1]
sys.path.insert(0, {repo!r})
from tests.support.openai_server import main
main(["--port", value("--port"), "--model", value("--served-model-name"),
      "--checkpoint", args[1]])
"""


def test_every_vllm_server_listens_on_loopback_unless_the_config_names_a_host(tmp_path: Path):
    record = tmp_path / "argv.jsonl"
    binary = tmp_path / "bin" / "vllm"
    binary.parent.mkdir()
    binary.write_text(FAKE_VLLM.format(python=sys.executable, record=str(record), repo=REPO))
    binary.chmod(0o755)
    # The command line as configs/world-served.yaml writes it: no {host} in it.
    line = [str(binary), "serve", "{model}", "--port", "{port}", "--served-model-name", "{name}"]
    with served(line, reuse=False).load(str(tmp_path)) as gen:
        assert gen.generate(["1+1="], 1, seed=0).texts == [["2"]]
        assert gen.base_url == f"http://127.0.0.1:{gen.port}/v1"
    started = json.loads(record.read_text().splitlines()[0])
    assert started[started.index("--host") + 1] == "127.0.0.1" and started.count("--host") == 1

    def host_of(argv: list[str]) -> str:
        assert argv.count("--host") == 1, argv
        return argv[argv.index("--host") + 1]

    # Every vLLM command line: the default, a venv's binary, the API server module.
    assert host_of(ServedGeneration().argv("/c", 1)) == "127.0.0.1"
    venv = ServedGeneration(command=[".venv-vllm/bin/vllm", "serve", "{model}", "--port={port}"])
    assert host_of(venv.argv("/c", 1)) == "127.0.0.1"
    module = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}"]
    assert host_of(ServedGeneration(command=[*module, "--port", "{port}"]).argv("/c", 1)) == (
        "127.0.0.1"
    )
    # A host the user names: the server listens there, the client calls it (loopback for a
    # wildcard address).
    everywhere = ServedGeneration(host="0.0.0.0")
    assert host_of(everywhere.argv("/c", 1)) == "0.0.0.0"
    assert everywhere.client_host() == "127.0.0.1"
    assert ServedGeneration(host="10.1.2.3").client_host() == "10.1.2.3"
    assert ServedGeneration(host="::1").client_host() == "[::1]"
    assert ServedGeneration().engine_settings() != everywhere.engine_settings()
    # Another server's command line says where its address goes; none is added to it.
    other = ServedGeneration(command=["sglang", "{model}", "--bind={host}", "--port", "{port}"])
    assert other.argv("/c", 1) == ["sglang", "/c", "--bind=127.0.0.1", "--port", "1"]
    # --host written into the command is refused: the client would not know to call it.
    for bad in ({"extra_args": ["--host", "0.0.0.0"]}, {"extra_args": ["--host=0.0.0.0"]}):
        with pytest.raises(ValidationError, match="set host instead"):
            ServedGeneration.model_validate(bad)

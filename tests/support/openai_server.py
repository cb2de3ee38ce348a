"""A real OpenAI-compatible HTTP server on localhost, for backends that talk HTTP.

It implements ``POST /v1/chat/completions`` and ``POST /v1/completions`` (with ``n``) and
``GET /v1/models``, and answers with a pluggable ``respond(prompt, index, request) -> str``.
Tests use it to drive real HTTP clients (openai, httpx, distilabel's OpenAILLM) through
timeouts, errors, empty answers and refusals, which no fake object could exercise honestly.

Failure injection, per request (``fail`` callable returning None or an action):
``("status", 503)`` answers with that HTTP status; ``("sleep", seconds)`` delays the answer;
``("retry_after", seconds)`` answers 429 with that ``Retry-After`` header;
``("echo_key", status)`` answers that status with a body quoting the request's key, as some
proxies do: for a 4xx a JSON error quoting its ``Authorization`` header, for a 5xx a plain-text
page with the bare key from its 290th character on (a client that cut the page at 300
characters before it redacted would show the key's first ten);
``("trickle", seconds)`` sends the whole answer, status line first, one byte every ``seconds``;
``("trickle_body", seconds)`` sends the head at once, then the body one byte every ``seconds``;
``("hang", 0)`` never answers, holding the connection until the server stops.
``judging(verdict)`` is a ``respond`` for the evaluation judge: it reads the prompt and both
answers out of eva's judging template and answers what ``verdict`` scripts.
Every request is recorded in ``server.requests`` (with headers and the client's port, one per
connection) so tests can assert retries, concurrency, connection reuse and that an API key was
sent.

Scripted answers, by arrival (``script``): the n-th request gets ``script[n]``, later ones
``Step()``, a 200 with the ``respond`` text; a ``Step`` can answer another status (its message:
``scripted <status>``) with headers of its own, another ``usage`` or none, a null content, or
wait first (``delay`` waits before every answer). ``numbered`` answers ``answer N`` to the N-th
request, so a test sees which attempt was answered. The ``serve`` fixture (tests/conftest.py)
starts servers for a test and stops them after it.

Run as a module it is a stand-in for ``vllm serve`` in its own process (the ``served`` backend's
tests start it the way that backend starts vLLM)::

    python -m tests.support.openai_server --port P --model NAME --answer world|echo|mixed \\
        [--checkpoint DIR] [--record FILE]

``--answer world`` replies with the world's reference answer (echo for other prompts), ``mixed``
with it for sample 0 and an echo for the others; ``--record`` appends the checkpoint to a file at
each start, so a test can count starts;
``--checkpoint`` is listed as the model's ``root`` in ``/v1/models``, as vLLM lists the path it
loaded, so a test can see which checkpoint the server was started on.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eva_world import world

Respond = Callable[[str, int, dict[str, Any]], str]
Fail = Callable[[dict[str, Any]], tuple[str, float] | None]


@dataclass
class Step:
    """One scripted answer: an HTTP status, extra headers, the ``usage`` of a 200 (None: no
    usage field), seconds to wait before answering (0: the server's ``delay``), and whether its
    content is null."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    usage: tuple[int, int] | None = (1, 1)
    delay: float = 0.0
    null: bool = False


_answering = threading.local()  # .n: the arrival number of the request this thread answers


def numbered(prompt: str, index: int, request: dict[str, Any]) -> str:
    """``answer N`` for the server's N-th request (from 0): which attempt got the answer."""
    return f"answer {_answering.n}"


def echo(prompt: str, index: int, request: dict[str, Any]) -> str:
    return f"reply {index} to: {prompt}"


def world_answer(prompt: str, index: int, request: dict[str, Any]) -> str:
    """The world's reference answer; an echo for a prompt outside the world."""
    try:
        return world.solve(prompt)
    except ValueError:
        return echo(prompt, index, request)


def mixed_answer(prompt: str, index: int, request: dict[str, Any]) -> str:
    """Sample 0 right, the others an echo: rollouts a preference pair can be built from."""
    return world_answer(prompt, index, request) if index == 0 else echo(prompt, index, request)


def endless(prompt: str, index: int, request: dict[str, Any]) -> str:
    """An answer that never ends: every request is cut at its ``max_tokens``."""
    return "and so on " * 100_000


ANSWERS: dict[str, Respond] = {
    "world": world_answer, "echo": echo, "mixed": mixed_answer, "endless": endless,
}  # fmt: skip


def judging(verdict: Callable[[str, str, str], str]) -> Respond:
    """A judge: each request laid out by eva's judging template (``DEFAULT_TEMPLATE`` of
    tasks.backends.judge.llm) is answered ``verdict(prompt, answer_a, answer_b)``, a judgment
    the test scripts (a fair label, a position bias, garbage); any other request is echoed."""
    from tasks.backends.judge.llm import DEFAULT_TEMPLATE

    pattern = re.escape(DEFAULT_TEMPLATE)
    for name in ("prompt", "answer_a", "answer_b"):
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>.*)")
    layout = re.compile(pattern, re.DOTALL)

    def respond(prompt: str, index: int, request: dict[str, Any]) -> str:
        asked = layout.fullmatch(prompt)
        if asked is None:
            return echo(prompt, index, request)
        return verdict(asked["prompt"], asked["answer_a"], asked["answer_b"])

    return respond


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 drops connects under concurrency tests


class OpenAICompatibleServer:
    def __init__(
        self,
        respond: Respond = echo,
        fail: Fail | None = None,
        model: str = "tiny",
        port: int = 0,
        root: str | None = None,
        keep_alive: bool = False,
        script: Sequence[Step] = (),
        delay: float = 0.0,
        models_status: int = 200,
    ):
        self.respond, self.fail, self.model, self.root = respond, fail, model, root
        self.models_status = models_status  # another status: GET /models answers as a bad key
        self.script, self.delay = list(script), delay
        # HTTP/1.1: a client may send its next request on the same connection, as to vLLM;
        # HTTP/1.0 (the default) closes it after each answer.
        self.keep_alive = keep_alive
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # ends hung and trickling answers at __exit__
        self._httpd = _Server(("127.0.0.1", port), self._handler())
        # A short poll interval: shutdown waits for it, once per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def times(self) -> list[float]:
        """When each request arrived (monotonic), in order."""
        return [r["time"] for r in self.requests]

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    @property
    def headers(self) -> list[dict[str, str]]:
        return [r["headers"] for r in self.requests]

    def __enter__(self) -> OpenAICompatibleServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def serve_forever(self) -> None:
        """Serve on this thread until the process is stopped (the module's ``main``)."""
        try:
            self._httpd.serve_forever(poll_interval=0.05)
        finally:
            self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if server.keep_alive else "HTTP/1.0"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            counted = False  # this request is in server.in_flight

            def _answered(self) -> None:
                # Before any byte of the answer leaves: a client that has its answer may send
                # its next request at once, and that one must not overlap this one in the count.
                if self.counted:
                    self.counted = False
                    with server._lock:
                        server.in_flight -= 1

            def _send(
                self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(body).encode()
                self._answered()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _trickle(self, status: int, body: dict[str, Any], seconds: float, head: bool):
                """The answer one byte every ``seconds``, its head included if ``head``."""
                data = json.dumps(body).encode()
                top = (
                    f"{self.protocol_version} {status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                ).encode()
                self._answered()
                if not head:
                    self.wfile.write(top)
                for i in range(0 if head else len(top), len(top) + len(data)):
                    if server._stopping.wait(seconds):
                        return
                    self.wfile.write((top + data)[i : i + 1])

            def _echo_key(self, status: int) -> None:
                auth = self.headers.get("Authorization", "")
                if status < 500:
                    message = f"Incorrect API key provided. Request had Authorization: {auth}"
                    self._send(status, {"error": {"message": message}})
                    return
                # The bare credential from the 290th character on: across a cut at 300.
                head = "Upstream failed. " + "." * 261 + " credential "
                data = (head + auth.removeprefix("Bearer ") + " rejected").encode()
                self._answered()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models") and server.models_status != 200:
                    self._echo_key(server.models_status)
                elif self.path.rstrip("/").endswith("/models"):
                    card: dict[str, Any] = {"id": server.model, "object": "model"}
                    if server.root is not None:
                        card["root"] = server.root
                    self._send(200, {"object": "list", "data": [card]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                request = json.loads(self.rfile.read(length) or b"{}")
                record = {
                    "path": self.path,
                    "body": request,
                    "headers": dict(self.headers),
                    "time": time.monotonic(),
                    "client_port": self.client_address[1],  # one per connection
                }
                with server._lock:
                    _answering.n = n = len(server.requests)
                    server.requests.append(record)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                step = server.script[n] if n < len(server.script) else Step()
                self.counted = True
                try:
                    if wait := step.delay or server.delay:
                        time.sleep(wait)
                    if step.status != 200:
                        error = {"error": {"message": f"scripted {step.status}"}}
                        self._send(step.status, error, step.headers)
                        return
                    action = server.fail(request) if server.fail else None
                    if action and action[0] == "sleep":
                        time.sleep(action[1])
                    elif action and action[0] == "status":
                        self._send(int(action[1]), {"error": {"message": "injected failure"}})
                        return
                    elif action and action[0] == "retry_after":
                        error = {"error": {"message": "injected rate limit"}}
                        self._send(429, error, {"Retry-After": f"{action[1]:g}"})
                        return
                    elif action and action[0] == "echo_key":
                        self._echo_key(int(action[1]))
                        return
                    elif action and action[0] == "hang":
                        server._stopping.wait()
                        return
                    elif action and action[0] in ("trickle", "trickle_body"):
                        body = self._body(request)
                        self._trickle(200, body, action[1], head=action[0] == "trickle")
                        return
                    self._answer(request, step)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing to answer
                finally:
                    self._answered()  # no answer was sent (the client gave up)

            def _answer(self, request: dict[str, Any], step: Step) -> None:
                if self.path.endswith("/completions"):
                    body = self._body(request)
                    for choice in body["choices"] if step.null else []:
                        if "message" in choice:
                            choice["message"]["content"] = None
                        else:
                            choice["text"] = None
                    if step.usage is None:
                        del body["usage"]
                    else:
                        prompt, completion = step.usage
                        body["usage"] = {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        }
                    self._send(200, body, step.headers)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def _body(self, request: dict[str, Any]) -> dict[str, Any]:
                """The completion ``request`` asks for (chat or raw prompt, by the path). A
                character is a token here: an answer longer than ``max_tokens`` is cut there,
                with ``finish_reason: length`` as vLLM reports a cut answer."""
                n = int(request.get("n") or 1)
                limit = request.get("max_tokens")
                chat = self.path.endswith("/chat/completions")
                if chat:
                    messages = request.get("messages") or []
                    prompt = messages[-1]["content"] if messages else ""
                else:
                    prompt = request.get("prompt") or ""
                choices = []
                for i in range(n):
                    text = server.respond(prompt, i, request)
                    cut = isinstance(limit, int) and isinstance(text, str) and len(text) > limit
                    text = text[:limit] if cut else text
                    choice: dict[str, Any] = {
                        "index": i,
                        "finish_reason": "length" if cut else "stop",
                    }
                    if chat:
                        choice["message"] = {"role": "assistant", "content": text}
                    else:
                        choice["text"] = text
                    choices.append(choice)
                obj = "chat.completion" if chat else "text_completion"
                return {
                    "id": "cmpl-test",
                    "object": obj,
                    "created": int(time.time()),
                    "model": request.get("model", server.model),
                    "choices": choices,
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }

        return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A stand-in for `vllm serve`, for tests.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="tiny", help="served model name")
    parser.add_argument("--answer", choices=tuple(ANSWERS), default="world")
    parser.add_argument("--checkpoint", default=None, help="listed as the model's root")
    parser.add_argument("--record", help="a file each start appends its checkpoint to")
    args = parser.parse_args(argv)
    respond = ANSWERS[args.answer]
    if args.record:
        with open(args.record, "a") as f:
            f.write(f"{args.checkpoint}\n")
    server = OpenAICompatibleServer(respond, model=args.model, port=args.port, root=args.checkpoint)
    print(f"serving {args.model!r} ({args.checkpoint}) on {server.base_url}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

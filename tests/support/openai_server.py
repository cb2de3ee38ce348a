"""A real OpenAI-compatible HTTP server on localhost, for backends that talk HTTP.

It implements ``POST /v1/chat/completions`` and ``POST /v1/completions`` (with ``n``) and
``GET /v1/models``, and answers with a pluggable ``respond(prompt, index, request) -> str``.
Tests use it to drive real HTTP clients (openai, httpx, distilabel's OpenAILLM) through
timeouts, errors, empty answers and refusals, which no fake object could exercise honestly.

Failure injection, per request (``fail`` callable returning None or an action):
``("status", 503)`` answers with that HTTP status; ``("sleep", seconds)`` delays the answer.
Every request is recorded in ``server.requests`` (with headers) so tests can assert retries,
concurrency and that an API key was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Respond = Callable[[str, int, dict[str, Any]], str]
Fail = Callable[[dict[str, Any]], tuple[str, float] | None]


def echo(prompt: str, index: int, request: dict[str, Any]) -> str:
    return f"reply {index} to: {prompt}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default backlog of 5 drops connects under concurrency tests


class OpenAICompatibleServer:
    def __init__(self, respond: Respond = echo, fail: Fail | None = None, model: str = "tiny"):
        self.respond, self.fail, self.model = respond, fail, model
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), self._handler())
        # A short poll interval: shutdown waits for it, once per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> OpenAICompatibleServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(
                        200, {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                    )
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
                }
                with server._lock:
                    server.requests.append(record)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    action = server.fail(request) if server.fail else None
                    if action and action[0] == "sleep":
                        time.sleep(action[1])
                    elif action and action[0] == "status":
                        self._send(int(action[1]), {"error": {"message": "injected failure"}})
                        return
                    self._answer(request)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test); nothing to answer
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, request: dict[str, Any]) -> None:
                n = int(request.get("n") or 1)
                if self.path.endswith("/chat/completions"):
                    messages = request.get("messages") or []
                    prompt = messages[-1]["content"] if messages else ""
                    choices = [
                        {
                            "index": i,
                            "finish_reason": "stop",
                            "message": {
                                "role": "assistant",
                                "content": server.respond(prompt, i, request),
                            },
                        }
                        for i in range(n)
                    ]
                    obj = "chat.completion"
                elif self.path.endswith("/completions"):
                    prompt = request.get("prompt") or ""
                    choices = [
                        {
                            "index": i,
                            "finish_reason": "stop",
                            "text": server.respond(prompt, i, request),
                        }
                        for i in range(n)
                    ]
                    obj = "text_completion"
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                self._send(
                    200,
                    {
                        "id": "cmpl-test",
                        "object": obj,
                        "created": int(time.time()),
                        "model": request.get("model", server.model),
                        "choices": choices,
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

        return Handler

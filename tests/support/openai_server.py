"""A tiny OpenAI-compatible server with scripted replies, for tests that need exact output.

Replies are chosen by the first rule whose ``contains`` substring occurs in the prompt (or
the last user message); each request is recorded. ``tool_rules`` make a chat request that
offers tools answer with tool calls instead: ``(contains, [(name, arguments dict), …])``. ``fail_next`` makes the next N requests
answer HTTP 503, to exercise retries; ``fails_on`` makes every request of one shape (each of
its keys with that value: ``{"tool_choice": "required"}``) answer HTTP ``fails_on_status``, as
vLLM answered 500 to a tool_choice it could not serve, while the rest are served, and
``models_status`` what its health probe (GET /v1/models) gets; ``latency_s`` delays every completion (a stand-in for a
model's generation time). ``stop()`` and ``start()`` take the server down and bring it back on
the same port, to exercise outages. While ``holding``, every completion waits for ``release()``
before it answers (a rollout kept between its model call and its end for as long as a test
needs); ``answered`` lists the completion requests served, in order. ``reply_extra`` adds its
keys to every completion's reply (the llama.cpp host's ``coevo_degraded``, say).

``flavor`` makes it answer as that server's own routes do (a word is a token, as in its
usage counts): ``vllm`` lists ``max_model_len`` (``context_tokens``) in /v1/models and counts
at POST /tokenize; ``llama.cpp`` lists its models as owned by llamacpp, reports ``n_ctx`` at
/props and tokenizes at POST /tokenize; ``llama-cpp-python`` counts at POST
/extras/tokenize/count and reports no context. Those requests go to ``probes``, not
``requests``; ``context_tokens`` makes a completion longer than the context answer HTTP 400
with llama.cpp's ``context_length_exceeded``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ScriptedPolicy:
    rules: list[tuple[str, str]] = field(default_factory=list)
    tool_rules: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = field(default_factory=list)
    # "required": tool calls only when the request's tool_choice is "required" (a model that
    # needs telling to use its tools).
    tools_when: str | None = None
    default: str = "    pass\n"
    requests: list[dict[str, Any]] = field(default_factory=list)
    # The HTTP headers of each of those requests, in the same order.
    headers: list[dict[str, str]] = field(default_factory=list)
    fail_next: int = 0
    fails_on: dict[str, Any] = field(default_factory=dict)
    fails_on_status: int = 500
    # What GET /v1/models (the health probe) answers: 500 for a server that is failing.
    models_status: int = 200
    latency_s: float = 0.0
    model: str = "scripted"
    flavor: str | None = None
    context_tokens: int | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    holding: bool = False
    answered: list[dict[str, Any]] = field(default_factory=list)
    reply_extra: dict[str, Any] = field(default_factory=dict)
    # How a plain chat reply ends ("length": cut at the token limit).
    finish_reason: str = "stop"
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _held: int = 0
    _releases: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    @property
    def held_replies(self) -> int:
        """Completions waiting for a ``release()`` now."""
        return self._held

    def release(self, replies: int = 1) -> None:
        """Let ``replies`` held completions answer (the next ones, if fewer wait now)."""
        for _ in range(replies):
            self._releases.release()

    def release_all(self) -> None:
        """Stop holding: the completions waiting answer now, the next ones at once."""
        with self._lock:
            self.holding = False
            waiting = self._held
        self.release(waiting)

    def wait_while_holding(self) -> None:
        """Called by the server for each completion: waits for its release while holding."""
        with self._lock:
            if not self.holding:
                return
            self._held += 1
        try:
            self._releases.acquire(timeout=600)
        finally:
            with self._lock:
                self._held -= 1

    def reply_for(self, text: str) -> str:
        for needle, reply in self.rules:
            if needle in text:
                return reply
        return self.default

    def tool_calls_for(self, text: str) -> list[tuple[str, dict[str, Any]]] | None:
        for needle, calls in self.tool_rules:
            if needle in text:
                return calls
        return None

    def reply_for_request(self, text: str, model: str | None) -> str:
        """The reply to a request for ``model`` (a subclass may answer per model)."""
        return self.reply_for(text)


class _Handler(BaseHTTPRequestHandler):
    policy: ScriptedPolicy

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        policy = self.policy
        if self.path.rstrip("/") == "/v1/models" and policy.models_status != 200:
            self._json(policy.models_status, {"error": "internal server error"})
        elif self.path.rstrip("/") == "/v1/models":
            entry: dict[str, Any] = {"id": policy.model, "object": "model"}
            if policy.flavor == "vllm":
                entry.update(owned_by="vllm", max_model_len=policy.context_tokens)
            elif policy.flavor == "llama.cpp":
                entry["owned_by"] = "llamacpp"
            self._json(200, {"object": "list", "data": [entry]})
        elif self.path == "/props" and policy.flavor == "llama.cpp":
            policy.probes.append({"path": self.path})
            self._json(200, {"default_generation_settings": {"n_ctx": policy.context_tokens}})
        else:
            self._json(404, {"error": "not found"})

    def _tokenize(self, body: dict[str, Any]) -> bool:
        """Answers the flavor's tokenizer route; False: not one."""
        flavor, path = self.policy.flavor, self.path
        if flavor == "vllm" and path == "/tokenize":
            count = len(str(body.get("prompt", "")).split())
            self._json(200, {"count": count, "max_model_len": self.policy.context_tokens,
                             "tokens": list(range(count))})  # fmt: skip
        elif flavor == "llama.cpp" and path == "/tokenize":
            self._json(200, {"tokens": list(range(len(str(body.get("content", "")).split())))})
        elif flavor == "llama-cpp-python" and path == "/extras/tokenize/count":
            self._json(200, {"count": len(str(body.get("input", "")).split())})
        else:
            return False
        self.policy.probes.append({"path": path, **body})
        return True

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.startswith("/v1/"):
            if not self._tokenize(body):
                self._json(404, {"error": "not found"})
            return
        with self.policy._lock:
            self.policy.requests.append({"path": self.path, **body})
            self.policy.headers.append(dict(self.headers))
            if self.policy.fail_next > 0:
                self.policy.fail_next -= 1
                self._json(503, {"error": "overloaded"})
                return
            fails_on = self.policy.fails_on
            if fails_on and all(body.get(key) == value for key, value in fails_on.items()):
                self._json(self.policy.fails_on_status, {"object": "error", "message": (
                    "list index out of range"), "type": "InternalServerError", "param": None,
                    "code": self.policy.fails_on_status})  # fmt: skip
                return
        self.policy.wait_while_holding()
        if self.policy.latency_s:
            time.sleep(self.policy.latency_s)
        context = self.policy.context_tokens
        asked = len(str(body.get("prompt") or body.get("messages") or "").split())
        if context and asked + int(body.get("max_tokens") or 0) > context:
            self._json(400, {"error": {"code": "context_length_exceeded", "message": (
                f"This model's maximum context length is {context} tokens, however you "
                f"requested {asked + int(body.get('max_tokens') or 0)} tokens")}})  # fmt: skip
            return
        if self.path == "/v1/completions":
            text = self.policy.reply_for_request(body.get("prompt", ""), body.get("model"))
            choice = {"index": 0, "text": text, "finish_reason": "stop"}
        elif self.path == "/v1/chat/completions":
            last = (body.get("messages") or [{}])[-1].get("content") or ""
            last = last if isinstance(last, str) else json.dumps(last)
            offered = body.get("tools") and (
                self.policy.tools_when is None or body.get("tool_choice") == self.policy.tools_when
            )
            calls = self.policy.tool_calls_for(last) if offered else None
            if calls:
                text = ""
                tool_calls = [
                    {
                        "id": f"call_{len(self.policy.requests)}_{i}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                    for i, (name, arguments) in enumerate(calls)
                ]
                message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
                choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            else:
                text = self.policy.reply_for_request(last, body.get("model"))
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": self.policy.finish_reason,
                }
        else:
            self._json(404, {"error": "not found"})
            return
        prompt_text = body.get("prompt") or json.dumps(body.get("messages"))
        with self.policy._lock:
            self.policy.answered.append({"path": self.path, **body})
        self._json(
            200,
            {
                "id": "cmpl-test",
                "object": "text_completion",
                "model": self.policy.model,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt_text.split()),
                    "completion_tokens": len(text.split()),
                    "total_tokens": len(prompt_text.split()) + len(text.split()),
                },
                **self.policy.reply_extra,
            },
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent rollouts connect at once in benchmarks


class ScriptedOpenAIServer:
    def __init__(self, policy: ScriptedPolicy | None = None, *, port: int = 0) -> None:
        self.policy = policy or ScriptedPolicy()
        self._handler = type("Handler", (_Handler,), {"policy": self.policy})
        self._server: _Server | None = _Server(("127.0.0.1", port), self._handler)
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        if self._server is None:
            self._server = _Server(("127.0.0.1", self.port), self._handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedOpenAIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

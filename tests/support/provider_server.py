"""A local server that behaves like a hosted model provider: OpenAI's API or Anthropic's.

Like the providers, it requires its API key (``Authorization: Bearer`` for OpenAI, ``x-api-key``
with an ``anthropic-version`` for Anthropic; 401 in the provider's error shape otherwise),
refuses a request parameter it does not know (400: OpenAI's "Unrecognized request argument
supplied: …", Anthropic's "…: Extra inputs are not permitted"), and, while ``rate_limit_next``
is above zero, answers 429 with a ``Retry-After`` of ``retry_after`` seconds. Replies are
scripted as the OpenAI test server scripts them (``rules``: the first whose substring is in the
last user message), in the provider's reply shape; ``requests`` and ``headers`` record what
came (each body with its ``path``); ``echo_key_in_errors`` makes its 401 quote the key it got,
as a careless gateway might. ``cached_tokens`` is how many prompt tokens each reply says the
provider's prompt cache served (OpenAI's ``prompt_tokens_details``, Anthropic's
``cache_read_input_tokens``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_CHAT = frozenset(
    {
        "model", "messages", "max_completion_tokens", "max_tokens", "temperature", "top_p", "n",
        "stop", "seed", "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs",
        "tools", "tool_choice", "parallel_tool_calls", "response_format", "stream", "user",
    }
)  # fmt: skip
OPENAI_COMPLETIONS = frozenset(
    {
        "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
        "frequency_penalty", "presence_penalty", "logprobs", "stream", "user",
    }
)  # fmt: skip
ANTHROPIC_MESSAGES = frozenset(
    {
        "model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k",
        "stop_sequences", "tools", "tool_choice", "metadata", "stream",
    }
)  # fmt: skip


@dataclass
class ProviderPolicy:
    api_key: str
    provider: str = "openai"  # or "anthropic"
    rules: list[tuple[str, str]] = field(default_factory=list)
    default: str = "ok"
    model: str = "gpt-test"
    rate_limit_next: int = 0
    retry_after: str = "1"
    echo_key_in_errors: bool = False
    cached_tokens: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reply_for(self, text: str) -> str:
        return next((reply for key, reply in self.rules if key in text), self.default)


class _Handler(BaseHTTPRequestHandler):
    policy: ProviderPolicy

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, kind: str, message: str) -> None:
        if self.policy.provider == "anthropic":
            body = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        self._json(status, body)

    def _authorized(self) -> bool:
        policy = self.policy
        if policy.provider == "anthropic":
            got = self.headers.get("x-api-key") or ""
            if not self.headers.get("anthropic-version"):
                self._error(400, "invalid_request_error", "anthropic-version: header is required")
                return False
        else:
            got = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if got == policy.api_key:
            return True
        shown = got if policy.echo_key_in_errors else (got[:3] + "***" if got else "")
        kind = "authentication_error" if policy.provider == "anthropic" else "invalid_request_error"
        self._error(401, kind, f"Incorrect API key provided: {shown or 'none'}.")
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.policy.model}]})
        else:
            self._error(404, "not_found_error", f"No route {self.path}")

    def do_POST(self) -> None:
        policy = self.policy
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with policy._lock:
            policy.requests.append({"path": self.path, **body})
            policy.headers.append(dict(self.headers))
        if not self._authorized():
            return
        with policy._lock:
            limited = policy.rate_limit_next > 0
            policy.rate_limit_next -= 1 if limited else 0
        if limited:
            kind = "rate_limit_error" if policy.provider == "anthropic" else "requests"
            self._json(
                429,
                {"error": {"message": "Rate limit reached for requests.", "type": kind}},
                {"Retry-After": policy.retry_after},
            )
            return
        known = {
            "/v1/chat/completions": OPENAI_CHAT,
            "/v1/completions": OPENAI_COMPLETIONS,
            "/v1/messages": ANTHROPIC_MESSAGES,
        }.get(self.path)
        if known is None or (self.path == "/v1/messages") != (policy.provider == "anthropic"):
            self._error(404, "not_found_error", f"No route POST {self.path}")
            return
        unknown = sorted(set(body) - known)
        if unknown:
            if policy.provider == "anthropic":
                self._error(
                    400, "invalid_request_error", f"{unknown[0]}: Extra inputs are not permitted"
                )
            else:
                self._error(400, "invalid_request_error", f"Unrecognized request argument supplied: {unknown[0]}")  # fmt: skip
            return
        if self.path == "/v1/completions":
            text = policy.reply_for(str(body.get("prompt")))
            self._json(200, _openai(policy, {"index": 0, "text": text, "finish_reason": "stop"}))  # fmt: skip
            return
        last = (body.get("messages") or [{}])[-1].get("content")
        last = last if isinstance(last, str) else json.dumps(last)
        text = policy.reply_for(last)
        if policy.provider == "anthropic":
            self._json(200, {
                "id": "msg_test", "type": "message", "role": "assistant", "model": policy.model,
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": len(last.split()),
                                                 "cache_read_input_tokens": policy.cached_tokens,
                                                 "output_tokens": len(text.split())},
            })  # fmt: skip
            return
        message = {"role": "assistant", "content": text}
        self._json(200, _openai(policy, {"index": 0, "message": message, "finish_reason": "stop"}))  # fmt: skip


def _openai(policy: ProviderPolicy, choice: dict[str, Any]) -> dict[str, Any]:
    text = choice.get("text") or choice.get("message", {}).get("content") or ""
    usage: dict[str, Any] = {
        "prompt_tokens": 3,
        "completion_tokens": len(text.split()),
        "total_tokens": 3 + len(text.split()),
    }
    if policy.cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": policy.cached_tokens}
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": policy.model,
        "choices": [choice],
        "usage": usage,
    }


class ProviderServer:
    def __init__(self, policy: ProviderPolicy) -> None:
        self.policy = policy
        handler = type("Handler", (_Handler,), {"policy": policy})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> ProviderServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

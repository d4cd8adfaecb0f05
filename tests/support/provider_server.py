"""A local server that behaves like a hosted model provider: OpenAI's API or Anthropic's.

Like the providers, it requires its API key (``Authorization: Bearer`` for OpenAI, ``x-api-key``
with an ``anthropic-version`` for Anthropic; 401 in the provider's error shape otherwise),
refuses a request parameter it does not know (400: OpenAI's "Unrecognized request argument
supplied: …", Anthropic's "…: Extra inputs are not permitted"; OpenAI's also one inside a
message, a content part, a tool call or a tool, such as Anthropic's ``cache_control``), and,
while ``rate_limit_next`` is above zero, answers 429 with a ``Retry-After`` of ``retry_after``
seconds. Replies are scripted as the OpenAI test server scripts them (``rules``: the first
whose substring is in the last user message), in the provider's reply shape; ``requests`` and
``headers`` record what came (each body with its ``path``); ``echo_key_in_errors`` makes its
401 quote the key it got, as a careless gateway might. ``cached_tokens`` is how many prompt
tokens each reply says the provider's prompt cache served (OpenAI's
``prompt_tokens_details``, Anthropic's ``cache_read_input_tokens``), ``cache_write_tokens`` how
many Anthropic's reply says it wrote to that cache (``cache_creation_input_tokens``).

Prompt caching, as Anthropic does it: an Anthropic request with ``cache_control`` markers is
counted block by block in Anthropic's order (tools, system, messages; a block's tokens are its
words, a text block's those of its text), and its usage says so instead of the scripted counts:
the longest prefix (ending at any block up to the last marker) that an earlier request marked
is read from the cache (``cache_read_input_tokens``), the rest of the prompt up to the last
marker is written to it (``cache_creation_input_tokens``; each marked prefix is remembered),
and what follows the last marker is ``input_tokens``. Without markers the scripted counts
apply. Markers are checked as Anthropic checks them: at most four, each ``{"type":
"ephemeral"}`` with an optional ttl of "5m" or "1h".

Tools: ``tool_rules`` (the first whose substring is in the last message, when the request
offers tools) answer with those tool calls: OpenAI's ``tool_calls`` (finish_reason
"tool_calls"), Anthropic's ``tool_use`` blocks (stop_reason "tool_use"). The Anthropic server
checks a request as Anthropic's API does (``anthropic_request_problem``): each tool's name and
``input_schema``, ``tool_choice`` only with tools, non-empty messages, and every ``tool_use``
answered by a ``tool_result`` in the next message, each result naming a call of the previous
one; what it refuses is a 400 ``invalid_request_error`` with Anthropic's message.
"""

from __future__ import annotations

import json
import re
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
    cache_write_tokens: int = 0
    tool_rules: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    # The marked prompt prefixes written to the prompt cache (their JSON, with the model).
    prompt_cache: set[str] = field(default_factory=set)
    headers: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reply_for(self, text: str) -> str:
        return next((reply for key, reply in self.rules if key in text), self.default)

    def tool_calls_for(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        return next((calls for key, calls in self.tool_rules if key in text), [])


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

    def _error(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        if self.policy.provider == "anthropic":
            body = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        self._json(status, body, headers)

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
            self._error(
                429, kind, "Rate limit reached for requests.", {"Retry-After": policy.retry_after}
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
        inner = openai_inner_problem(body) if policy.provider == "openai" else None
        if inner:
            self._error(400, "invalid_request_error", inner)
            return
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
        if policy.provider == "anthropic":
            problem = anthropic_request_problem(body)
            if problem:
                self._error(400, "invalid_request_error", problem)
                return
        last = (body.get("messages") or [{}])[-1].get("content")
        last = last if isinstance(last, str) else json.dumps(last)
        calls = policy.tool_calls_for(last) if body.get("tools") else []
        choice = body.get("tool_choice") if isinstance(body.get("tool_choice"), dict) else {}
        if choice.get("disable_parallel_tool_use") or body.get("parallel_tool_calls") is False:
            calls = calls[:1]
        text = "" if calls else policy.reply_for(last)
        with policy._lock:
            turn = len(policy.requests) - 1  # this request's index
        if policy.provider == "anthropic":
            usage = prompt_cache_usage(policy, body) or {
                "input_tokens": len(last.split()),
                "cache_creation_input_tokens": policy.cache_write_tokens,
                "cache_read_input_tokens": policy.cached_tokens,
            }
            content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            content += [
                {"type": "tool_use", "id": f"toolu_{turn:02d}{i}", "name": name, "input": args}
                for i, (name, args) in enumerate(calls)
            ]
            self._json(200, {
                "id": "msg_test", "type": "message", "role": "assistant", "model": policy.model,
                "content": content, "stop_reason": "tool_use" if calls else "end_turn",
                "stop_sequence": None,
                "usage": {**usage, "output_tokens": len(text.split()) + len(calls)},
            })  # fmt: skip
            return
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{turn}_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for i, (name, args) in enumerate(calls)
            ]
        finish = "tool_calls" if calls else "stop"
        self._json(200, _openai(policy, {"index": 0, "message": message, "finish_reason": finish}))  # fmt: skip


# Anthropic's custom tools: a name of this pattern and an object input_schema, nothing else.
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_TOOL_KEYS = frozenset({"type", "name", "description", "input_schema", "cache_control"})
_TOOL_CHOICES = frozenset({"auto", "any", "tool", "none"})


def anthropic_request_problem(body: dict[str, Any]) -> str | None:
    """What Anthropic's API says of a Messages request it refuses (its 400's message), or None."""
    if body.get("max_tokens") is None:
        return "max_tokens: Field required"
    markers = [marker for _, _, marker in _prompt_blocks(body) if marker is not None]
    if len(markers) > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {len(markers)}."
    for marker in markers:
        if not isinstance(marker, dict) or marker.get("type") != "ephemeral":
            return "cache_control.type: Input should be 'ephemeral'"
        if marker.get("ttl", "5m") not in ("5m", "1h"):
            return "cache_control.ttl: Input should be '5m' or '1h'"
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        where = f"tools.{i}.custom"
        if not isinstance(tool, dict):
            return f"tools.{i}: Input should be a valid dictionary"
        extra = sorted(set(tool) - _TOOL_KEYS)
        if extra:
            return f"{where}.{extra[0]}: Extra inputs are not permitted"
        if not isinstance(tool.get("name"), str) or not _TOOL_NAME.match(tool["name"]):
            return f"{where}.name: String should match pattern '{_TOOL_NAME.pattern}'"
        schema = tool.get("input_schema")
        if schema is None:
            return f"{where}.input_schema: Field required"
        if not isinstance(schema, dict):
            return f"{where}.input_schema: Input should be a valid dictionary"
        if schema.get("type") != "object":
            return f"{where}.input_schema.type: Input should be 'object'"
        if not isinstance(schema.get("properties", {}), dict):
            return (
                f"{where}.input_schema: JSON schema is invalid. It must match JSON Schema draft "
                "2020-12 (https://json-schema.org/)."
            )
    choice = body.get("tool_choice")
    if choice is not None:
        if not tools:
            return "tool_choice: tool_choice may only be specified while providing tools"
        if not isinstance(choice, dict) or choice.get("type") not in _TOOL_CHOICES:
            return "tool_choice: Input tag does not match any of the expected tags"
    return _messages_problem(body.get("messages"))


def _messages_problem(messages: Any) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    asked: list[str] = []  # the tool_use ids of the previous message
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            return f"messages.{i}.content: Input should be a valid list"
        final_assistant = i == len(messages) - 1 and message.get("role") == "assistant"
        if not blocks and not final_assistant:
            return (
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        answered = []
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and not block.get("text"):
                return f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
            if kind == "tool_result":
                if block.get("tool_use_id") not in asked:
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous message."
                    )
                answered.append(block["tool_use_id"])
            if kind == "tool_use" and (
                not isinstance(block.get("id"), str) or not isinstance(block.get("input"), dict)
            ):
                return f"messages.{i}.content.{j}.tool_use: id and input are required"
        unanswered = [use for use in asked if use not in answered]
        if unanswered:
            return (
                f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                f"immediately after: {', '.join(unanswered)}. Each `tool_use` block must have a "
                "corresponding `tool_result` block in the next message."
            )
        asked = [b["id"] for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    return None


def prompt_cache_usage(policy: ProviderPolicy, body: dict[str, Any]) -> dict[str, int] | None:
    """An Anthropic request's input usage as its prompt cache makes it (see the module's doc);
    None for a request without markers."""
    blocks = _prompt_blocks(body)
    marks = [i for i, (_, _, marker) in enumerate(blocks) if marker is not None]
    if not marks:
        return None
    tokens = [count for _, count, _ in blocks]
    # Anthropic looks for a cached prefix at each block boundary before a marker, not only at
    # this request's markers: the last turn's marked end is found in this turn's longer prompt.
    prefixes = [
        json.dumps([body.get("model"), [shown for shown, _, _ in blocks[: i + 1]]])
        for i in range(marks[-1] + 1)
    ]
    with policy._lock:
        hits = [i for i, prefix in enumerate(prefixes) if prefix in policy.prompt_cache]
        policy.prompt_cache.update(prefixes[i] for i in marks)
    read = sum(tokens[: hits[-1] + 1]) if hits else 0
    written = sum(tokens[: marks[-1] + 1]) - read
    return {
        "input_tokens": sum(tokens) - read - written,
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": read,
    }


def _prompt_blocks(body: dict[str, Any]) -> list[tuple[Any, int, Any]]:
    """The prompt in the order Anthropic caches it (tools, system, messages), a block at a
    time: (the block as it counts for the cache, without its marker; its tokens; its marker)."""
    found: list[tuple[Any, int, Any]] = []

    def add(role: str, block: Any) -> None:
        if not isinstance(block, dict):
            block = {"type": "text", "text": str(block)}
        shown = {k: v for k, v in block.items() if k != "cache_control"}
        text = block.get("text") if isinstance(block.get("text"), str) else json.dumps(shown)
        found.append(([role, shown], len(text.split()), block.get("cache_control")))

    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        add("tool", tool)
    for block in _listed(body.get("system")):
        add("system", block)
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            for block in _listed(message.get("content")):
                add(str(message.get("role")), block)
    return found


def _listed(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [content]
    return content if isinstance(content, list) else []


# What OpenAI's chat API takes inside a request's messages, content parts, tool calls and tools.
_OPENAI_MESSAGE = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio", "function_call"}
)
_OPENAI_PART = frozenset({"type", "text", "image_url", "input_audio", "file", "refusal"})
_OPENAI_CALL = frozenset({"id", "type", "function"})
_OPENAI_TOOL = frozenset({"type", "function"})


def openai_inner_problem(body: dict[str, Any]) -> str | None:
    """What OpenAI's API says of a key it does not know inside a chat request, or None."""
    holders: list[tuple[Any, frozenset[str], str]] = []
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        holders.append((tool, _OPENAI_TOOL, f"tools.{i}"))
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        holders.append((message, _OPENAI_MESSAGE, f"messages.{i}"))
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            holders.append((part, _OPENAI_PART, f"messages.{i}.content.{j}"))
        for j, call in enumerate(message.get("tool_calls") or []):
            holders.append((call, _OPENAI_CALL, f"messages.{i}.tool_calls.{j}"))
    for holder, known, where in holders:
        extra = sorted(set(holder) - known) if isinstance(holder, dict) else []
        if extra:
            return (
                f"Additional properties are not allowed ({extra[0]!r} was unexpected) - {where!r}"
            )
    return None


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

"""What the model boundary accepts from a program harness, and the shapes of what it answers.

The boundary (workers/boundary.py) speaks the OpenAI HTTP API to harnesses written against it
(the ``openai`` SDK, LiteLLM, LangGraph, a CLI agent). This module is its vocabulary, with no
I/O: checking a request body (known keys kept, the rest dropped and reported, sampling
defaults made explicit so that servers' own defaults never decide a result), the error bodies
the OpenAI SDKs parse, the model list, and the server-sent events of a streamed reply, made
from the whole reply the worker got from the policy server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

# Bounds on what one request may ask; above them the request is refused (400).
MAX_CHOICES = 16
MAX_MESSAGES = 10_000
MAX_TOOLS = 128
MAX_STOPS = 16
# What a policy server adds to a reply for the parts of a request it could not honour
# (coevo/policies/llamacpp_features.py), and how much of it a trace keeps.
DEGRADED_KEY = "coevo_degraded"
MAX_DEGRADED = 16
MAX_DEGRADED_CHARS = 1000
# When a request names no max_tokens: at most this many, and less where the rollout's token
# budget or the policy's context leaves less (default_max_tokens; OpenAI's own default is the
# rest of the context, which on a CPU model is minutes a call).
DEFAULT_MAX_TOKENS = 1024
# A prompt's tokens before it is sent, for the default's share of the context: its UTF-8 bytes
# over this. Tokenizers take 3-4 bytes a token on English and code (Gemma's, Llama's): an
# estimate on the long side, so that the default leaves the prompt room rather than have the
# server refuse prompt + max_tokens past its context.
BYTES_PER_TOKEN_LOW = 3

_SHARED_KEYS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "frequency_penalty",
        "presence_penalty",
        "logprobs",
        "user",
        # vLLM's extension: the prompt's and the reply's token ids, recorded in the trace.
        "return_token_ids",
    }
)
CHAT_KEYS = _SHARED_KEYS | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}
COMPLETION_KEYS = _SHARED_KEYS | {"prompt"}
# Accepted (SDKs send them) but never passed to the policy server.
_DROPPED = frozenset({"model", "user", "stream", "stream_options"})


class BadRequest(Exception):
    """A request the boundary refuses before any model sees it (HTTP 400)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """An error as the OpenAI API writes it (the SDKs raise it with this message)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def models_list(model: str) -> dict[str, Any]:
    """``GET /v1/models``: one model, the rollout's policy version, whatever its name."""
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": 0, "owned_by": "coevo"}],
    }


def check_request(
    api: str,
    body: Any,
    *,
    seed: int,
    max_tokens_left: int,
    calls_left: int | None = None,
    context_tokens: int | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The body to send to the policy server, and the keys dropped from it.

    ``api`` is ``chat`` or ``completions``. Sampling parameters the request leaves out get
    OpenAI's documented defaults, sent explicitly (what a kind of server has beyond OpenAI's,
    such as top_k, the policy client adds with its neutral value: coevo/policies/
    request_tables.py); a missing seed becomes ``seed`` (the
    rollout's, one per call) so that a rerun asks the same; a missing max_tokens is sized by
    ``default_max_tokens`` from the rollout's remaining budget (``max_tokens_left`` tokens,
    ``calls_left`` model calls) and the policy's context window (None: not known).
    """
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    allowed = CHAT_KEYS if api == "chat" else COMPLETION_KEYS
    dropped = sorted(key for key in body if key not in allowed)
    clean = {k: v for k, v in body.items() if k in allowed and k not in _DROPPED}
    if api == "chat":
        _check_messages(clean.get("messages"))
        _check_tools(clean)
        if "max_completion_tokens" in clean:
            clean.setdefault("max_tokens", clean.pop("max_completion_tokens"))
    else:
        clean["prompt"] = _check_prompt(clean.get("prompt"))
    n = clean.get("n", 1)
    if not _is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise BadRequest(f"n must be an integer from 1 to {MAX_CHOICES}.", param="n")
    clean["n"] = n
    max_tokens = clean.get("max_tokens")
    if max_tokens is None:
        clean["max_tokens"] = default_max_tokens(
            clean,
            max_tokens_left=max_tokens_left,
            calls_left=calls_left,
            context_tokens=context_tokens,
        )
    elif not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer.", param="max_tokens")
    for key, low, high, default in (
        ("temperature", 0.0, 2.0, 1.0),
        ("top_p", 0.0, 1.0, 1.0),
        ("frequency_penalty", -2.0, 2.0, 0.0),
        ("presence_penalty", -2.0, 2.0, 0.0),
    ):
        value = clean.get(key, default)
        if value is None:
            value = default
        if not _is_number(value) or not low <= value <= high:
            raise BadRequest(f"{key} must be a number from {low} to {high}.", param=key)
        clean[key] = value
    clean["seed"] = _check_seed(clean.get("seed"), seed)
    stop = clean.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stops, list)
            or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stops)
        ):
            raise BadRequest(
                f"stop must be a string or a list of at most {MAX_STOPS} strings.", param="stop"
            )
        clean["stop"] = stops
    return clean, dropped


def default_max_tokens(
    clean: dict[str, Any],
    *,
    max_tokens_left: int,
    calls_left: int | None = None,
    context_tokens: int | None = None,
) -> int:
    """A request's max_tokens when it names none: the least of DEFAULT_MAX_TOKENS, the
    rollout's remaining token budget, that budget's share per model call left (each of ``n``
    samples is a call), and the context the prompt leaves (where the context is known; the
    prompt estimated from its size, see BYTES_PER_TOKEN_LOW); at least 1."""
    bounds = [DEFAULT_MAX_TOKENS, max_tokens_left]
    if calls_left is not None and calls_left > 0:
        bounds.append(max_tokens_left // calls_left)
    if context_tokens:
        shown = [clean.get("prompt"), clean.get("messages"), clean.get("tools")]
        size = len(json.dumps(shown, ensure_ascii=False, default=str).encode())
        bounds.append(context_tokens - size // BYTES_PER_TOKEN_LOW)
    return max(1, min(bounds))


def wants_stream(body: Any) -> tuple[bool, bool]:
    """(stream, include usage in the stream) as the request asks."""
    if not isinstance(body, dict) or body.get("stream") is not True:
        return False, False
    options = body.get("stream_options")
    return True, isinstance(options, dict) and options.get("include_usage") is True


def stream_events(api: str, reply: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """A whole reply as the server-sent events of a streamed one: for each choice a first
    chunk with everything it says (content, tool calls), then its finish reason, the usage
    when asked for, and ``[DONE]``."""
    base = {
        "id": reply.get("id") or "coevo",
        "created": reply.get("created") or int(time.time()),
        "model": reply.get("model") or "",
        "object": "chat.completion.chunk" if api == "chat" else "text_completion",
    }
    for index, choice in enumerate(reply.get("choices") or []):
        if not isinstance(choice, dict):
            continue
        position = choice.get("index", index)
        if api == "chat":
            message = choice.get("message") or {}
            delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            tool_calls = message.get("tool_calls")
            if isinstance(tool_calls, list) and tool_calls:
                delta["tool_calls"] = [
                    {**call, "index": i}
                    for i, call in enumerate(tool_calls)
                    if isinstance(call, dict)
                ]
            first = {"index": position, "delta": delta, "finish_reason": None}
            last = {"index": position, "delta": {}, "finish_reason": choice.get("finish_reason")}
            if choice.get("logprobs") is not None:
                first["logprobs"] = choice["logprobs"]
        else:
            first = {"index": position, "text": choice.get("text") or "", "finish_reason": None}
            first["logprobs"] = choice.get("logprobs")
            last = {
                "index": position,
                "text": "",
                "finish_reason": choice.get("finish_reason"),
                "logprobs": None,
            }
        yield _event({**base, "choices": [first]})
        yield _event({**base, "choices": [last]})
    if include_usage:
        yield _event({**base, "choices": [], "usage": reply.get("usage")})
    yield b"data: [DONE]\n\n"


def tool_calls_of(api: str, reply: dict[str, Any]) -> list[dict[str, Any]]:
    """Every tool call of every choice (for the trace), each with its choice's index."""
    if api != "chat":
        return []
    found = []
    for index, choice in enumerate(reply.get("choices") or []):
        message = choice.get("message") if isinstance(choice, dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                found.append(
                    {
                        "choice": index,
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments"),
                    }
                )
    return found


def degraded_of(reply: dict[str, Any]) -> list[dict[str, str]]:
    """What the policy server says it could not honour of the request (the coevo llama.cpp
    host's ``coevo_degraded``: ``{"field", "why"}`` each), bounded, for the trace; [] for a
    server that says nothing (vLLM, hosted APIs)."""
    found = reply.get(DEGRADED_KEY)
    entries = []
    for entry in found[:MAX_DEGRADED] if isinstance(found, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("field"), str):
            why = entry.get("why")
            entries.append(
                {
                    "field": entry["field"][:100],
                    "why": why[:MAX_DEGRADED_CHARS] if isinstance(why, str) else "",
                }
            )
    return entries


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list.", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"messages holds more than {MAX_MESSAGES} entries.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(
                f"messages[{i}] must be an object with a role.", param=f"messages[{i}]"
            )


def _check_tools(clean: dict[str, Any]) -> None:
    tools = clean.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise BadRequest(f"tools must be a list of at most {MAX_TOOLS} tools.", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': …}}}}.",
                param=f"tools[{i}]",
            )


def _check_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("prompt must be a string (one prompt per request).", param="prompt")
    return prompt


def _check_seed(value: Any, default: int) -> int:
    if value is None:
        return default
    if not _is_int(value):
        raise BadRequest("seed must be an integer.", param="seed")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

"""A chat request sent to Anthropic's Messages API, and its reply read back as a chat reply.

An endpoint of kind ``anthropic`` serves ``POST /v1/messages``. The policy client speaks
OpenAI's chat API to every other kind, so for this one it translates (no I/O here; the boundary's
workers/anthropic_messages.py is the other direction, for harnesses that speak Messages):

- ``system`` messages → the request's ``system`` (joined, in order); ``user`` and ``assistant``
  messages as they are, text and image parts as content blocks;
- an assistant's ``tool_calls`` → its ``tool_use`` blocks (arguments parsed from JSON); each
  ``tool`` message → a ``tool_result`` block, consecutive ones in one user turn (Anthropic
  wants every result of a turn together, right after it);
- function ``tools`` → custom tools (name, description, input_schema); ``tool_choice`` "auto" /
  "required" / "none" / a function → auto / any / none / tool, and ``parallel_tool_calls:
  false`` → ``disable_parallel_tool_use``;
- prompt-cache markers (``cache_control``) where Anthropic takes them, from where the chat
  carries them (workers/chat_extensions.py): a content part's on its block (a system message
  of text parts: the ``system`` prompt as text blocks), a function tool's on its tool, a tool
  call's on its ``tool_use`` block, a message's own on its last block (a tool message's on its
  ``tool_result``); a tool message's ``is_error`` on its ``tool_result``;
- ``stop`` → ``stop_sequences``; ``max_tokens``, ``temperature`` as they are; ``top_p`` only
  where it cuts (below 1): 1 is what Anthropic does without it, and its newer models refuse a
  request naming both ``temperature`` and ``top_p``;
- the reply's text blocks → the message's content, ``tool_use`` blocks → ``tool_calls``,
  ``stop_reason`` end_turn / stop_sequence / max_tokens / tool_use → ``finish_reason`` stop /
  stop / length / tool_calls; usage input (with cache reads and writes) / output tokens →
  prompt / completion tokens, cache reads also → ``prompt_tokens_details.cached_tokens``, and
  Anthropic's ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` kept as they are
  (the client prices reads and writes apart: coevo/policies/pricing.py).

What the Messages API cannot do is refused before anything is sent (PolicyRequestRejected,
the request's fault): a completions request (there is no such API), ``n`` above 1, a marker
that is not Anthropic's (``{"type": "ephemeral"}``, ``ttl`` "5m" or "1h") or more than four of
them, in the words Anthropic's 400 would use.
"""

from __future__ import annotations

import json
from typing import Any

from coevo.errors import PolicyRequestRejected
from workers.chat_extensions import CACHE_CONTROL, breakpoints_check, error_flag, marked
from workers.openai_requests import BadRequest

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def request_from_chat(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request for a chat ``body`` (already cut to the kind's table)."""
    if api != "chat":
        raise PolicyRequestRejected(
            "Anthropic's API has no completions: send chat requests to an anthropic endpoint "
            "(policy_api = 'chat' in harness.toml, api = 'chat' for a proposer).",
            status=400,
        )
    if int(body.get("n") or 1) != 1:
        raise PolicyRequestRejected(
            "Anthropic's API answers one choice per request: send n = 1 (or several requests).",
            status=400,
        )
    try:
        breakpoints_check(body)
        system, messages = _messages(body.get("messages") or [])
        tools = [_tool(tool, where=f"tools[{i}]") for i, tool in enumerate(body.get("tools") or [])]
    except BadRequest as exc:
        raise PolicyRequestRejected(str(exc), status=400, reply=str(exc)) from None
    request: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "max_tokens": body.get("max_tokens"),
    }
    if system:
        request["system"] = system
    for key in ("temperature", "stream"):
        if key in body:
            request[key] = body[key]
    top_p = body.get("top_p")
    if isinstance(top_p, int | float) and top_p < 1:
        request["top_p"] = top_p
    if body.get("stop"):
        stop = body["stop"]
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if tools:
        request["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False:
            choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
        if choice is not None:
            request["tool_choice"] = choice
    return request


def reply_to_chat(reply: dict[str, Any]) -> dict[str, Any]:
    """A Message as a chat completion (one choice)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    content = reply.get("content")
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": json.dumps(block.get("input") or {}),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    prompt = sum(
        _count(usage.get(key))
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    completion = _count(usage.get("output_tokens"))
    return {
        "id": reply.get("id"),
        "object": "chat.completion",
        "model": reply.get("model"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _FINISH.get(str(reply.get("stop_reason")), "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            # Cache reads, in OpenAI's place for them: priced at the cached-input price.
            "prompt_tokens_details": {
                "cached_tokens": _count(usage.get("cache_read_input_tokens"))
            },
            # Anthropic's own counts kept (as LiteLLM's gateway keeps them): cache writes have
            # no place in OpenAI's usage, and are priced at the cache-write price.
            "cache_read_input_tokens": _count(usage.get("cache_read_input_tokens")),
            "cache_creation_input_tokens": _count(usage.get("cache_creation_input_tokens")),
        },
    }


def _messages(messages: list[Any]) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """The request's ``system`` (a string; text blocks where one is marked) and messages."""
    system: list[list[dict[str, Any]]] = []  # each system message's text blocks
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        where = f"messages[{i}]"
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_marked_last(message, _blocks(message.get("content"), where), where))
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": _text(message.get("content")),
            }
            if error_flag(message.get("is_error"), where=where):
                result["is_error"] = True
            (result,) = _marked_last(message, [result], where)
            if out and out[-1]["role"] == "user" and _all_results(out[-1]["content"]):
                out[-1]["content"].append(result)
            else:
                out.append({"role": "user", "content": [result]})
        elif role == "assistant":
            blocks = _blocks(message.get("content"), where)
            for j, call in enumerate(message.get("tool_calls") or []):
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    use = {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "input": _arguments(function.get("arguments")),
                    }
                    blocks.append(marked(call, use, where=f"{where}.tool_calls[{j}]"))
            out.append({"role": "assistant", "content": _marked_last(message, blocks, where)})
        else:
            blocks = _blocks(message.get("content"), where)
            out.append({"role": "user", "content": _marked_last(message, blocks, where)})
    blocks = [b for said in system for b in said if b["type"] == "text"]
    if any(CACHE_CONTROL in block for block in blocks):
        return [block for block in blocks if block["text"]], out
    texts = ("".join(b["text"] for b in said if b["type"] == "text") for said in system)
    return "\n\n".join(text for text in texts if text), out


def _marked_last(
    message: dict[str, Any], blocks: list[dict[str, Any]], where: str
) -> list[dict[str, Any]]:
    """``blocks`` with the message's own marker (LiteLLM's message-level ``cache_control``) on
    the last of them: the prompt up to the message's end."""
    if blocks and message.get(CACHE_CONTROL) is not None:
        blocks[-1] = marked(message, dict(blocks[-1]), where=where)
    return blocks


def _all_results(content: Any) -> bool:
    return isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for k, part in enumerate(content if isinstance(content, list) else []):
        if not isinstance(part, dict):
            continue
        at = f"{where}.content[{k}]"
        if part.get("type") == "text":
            blocks.append(
                marked(part, {"type": "text", "text": str(part.get("text") or "")}, where=at)
            )
        elif part.get("type") == "image_url":
            url = str((part.get("image_url") or {}).get("url") or "")
            image = {"type": "image", "source": _image_source(url)}
            blocks.append(marked(part, image, where=at))
    return blocks


def _image_source(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": "base64", "media_type": media, "data": data}
    return {"type": "url", "url": url}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(
        str(p.get("text") or "") for p in parts if isinstance(p, dict) and p.get("type") == "text"
    )


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tool(tool: dict[str, Any], *, where: str) -> dict[str, Any]:
    function = tool.get("function") or {}
    out = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        out["description"] = function["description"]
    return marked(tool, out, where=where)


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return {"type": "tool", "name": choice["function"].get("name")}
    return None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

"""Anthropic's Messages API at the model boundary, as the policy server's chat API.

CLI coding agents are mostly built on Anthropic's SDKs, which speak ``POST /v1/messages``, not
OpenAI's chat API. The boundary (workers/boundary.py) serves that route by translating: a
Messages request becomes a chat request (then checked, counted and recorded exactly as one
sent to ``/v1/chat/completions``), and the policy server's chat reply becomes a Message. No
I/O here: the request, the reply, a streamed reply's events and the error bodies.

What maps to what:

- ``system`` (a string or text blocks) → a leading ``system`` message;
- text and image blocks → a message's content (a string when it is one text block);
- an assistant's ``tool_use`` blocks → its ``tool_calls`` (the id kept, ``input`` as JSON
  arguments); a user's ``tool_result`` blocks → ``tool`` messages, before the user's own text,
  since a chat API wants tool results right after the call;
- ``tools`` (custom ones: name, description, input_schema) → function tools; ``tool_choice``
  auto / any / tool / none → "auto" / "required" / that function / "none", and
  ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``;
- ``cache_control`` markers (prompt caching) on the chat-side piece each block became (a text
  or image part, a function tool, a tool call, a tool message; a marked system prompt stays
  text parts), and a ``tool_result``'s ``is_error`` on its tool message: only an
  ``anthropic`` endpoint gets them back as Anthropic takes them, every other kind's request
  goes without them (workers/chat_extensions.py). A marker is Anthropic's own (``ephemeral``,
  ``ttl`` "5m" or "1h") and at most four are sent, else the request is refused as Anthropic
  would refuse it, whatever kind of endpoint serves the policy: a harness is answered as the
  API it speaks answers, and a provider is not paid a round trip to say no;
- ``stop_sequences`` → ``stop``; ``max_tokens`` (required, as Anthropic requires it),
  ``temperature`` (0 to 1, as Anthropic allows) and ``top_p`` as they are;
- the reply's ``finish_reason`` stop / length / tool_calls → ``stop_reason`` end_turn /
  max_tokens / tool_use; ``stop_sequence`` when the server says which stop string ended it
  (vLLM's ``stop_reason``); usage prompt / completion tokens → input / output tokens, and
  where the reply says some of the prompt was read from or written to a prompt cache, those
  as ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` (Anthropic's, kept by
  coevo/policies/anthropic_api.py, or OpenAI's ``cached_tokens``), out of ``input_tokens`` as
  Anthropic counts them.

Thinking blocks sent back by a client are dropped (the policy never made them); keys with no
chat counterpart (``top_k``, ``metadata``, ``thinking``, …) are dropped and reported as the
request's dropped keys; Anthropic's built-in tools (bash, text editor, web search) and
document blocks are refused, since no policy server behind the boundary runs them.

``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}`` for a Messages request
(``count_tokens``): the request's messages and tools, translated as above, counted by the
policy server's tokenizer where the boundary's handler offers one, else estimated (see
``CHARS_PER_TOKEN_ESTIMATE``); in both cases with a chat template's per-message markers added.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from workers.chat_extensions import CACHE_CONTROL, breakpoints_check, error_flag, marked
from workers.openai_requests import BadRequest

PATH = "/v1/messages"
COUNT_TOKENS_PATH = PATH + "/count_tokens"
# count_tokens with no tokenizer at hand: code and prose run about 3-4 characters a token in
# Gemma's, Llama's and Qwen's tokenizers (coevo/campaigns/proposers/fitting.py); the low end,
# so that the estimate errs high and an agent that compacts its context at a threshold does
# so early rather than past the window.
CHARS_PER_TOKEN_ESTIMATE = 3.0
# A chat template's role markers and separators around each message, and the reply's opening.
MESSAGE_OVERHEAD_TOKENS = 4
REPLY_OVERHEAD_TOKENS = 3
# An image, whatever its size (Anthropic's own count for one of about 1.15 megapixels).
IMAGE_TOKENS_ESTIMATE = 1600

# Request keys translated to the chat body; every other key is dropped and reported.
_TRANSLATED = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "stream",
    }
)

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

# HTTP status → Anthropic's error type (docs.anthropic.com, "Errors").
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def chat_request(body: Any) -> tuple[dict[str, Any], list[str]]:
    """The chat request a Messages request asks for, and the request keys dropped."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if body.get("max_tokens") is None:
        raise BadRequest("max_tokens is required (Anthropic's Messages API).", param="max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float)
        or isinstance(temperature, bool)
        or not 0.0 <= temperature <= 1.0
    ):
        raise BadRequest("temperature must be a number from 0 to 1.", param="temperature")
    system, messages = _lift_system(body.get("system"), body.get("messages"))
    chat: dict[str, Any] = {
        "messages": _system(system) + _messages(messages),
        "max_tokens": body["max_tokens"],
    }
    for key in ("model", "temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    stops = body.get("stop_sequences")
    if stops is not None:
        chat["stop"] = stops
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice))
    breakpoints_check(chat)
    return chat, sorted(key for key in body if key not in _TRANSLATED)


def count_tokens(
    body: Any, *, tokenizer: Callable[[str], int | None] | None = None
) -> dict[str, int]:
    """``count_tokens``' answer for a Messages request (without ``max_tokens``, as there):
    its text (messages, tool calls and tool schemas) counted by ``tokenizer`` (None, or one
    that answers None: estimated), plus each message's template markers and each image."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    chat, _ = chat_request({**body, "max_tokens": 1})
    texts, images = [], 0
    for said in chat["messages"]:
        content = said.get("content")
        for part in content if isinstance(content, list) else [{"text": content or ""}]:
            if part.get("type") == "image_url":
                images += 1
            else:
                texts.append(str(part.get("text") or ""))
        for call in said.get("tool_calls") or []:
            texts.append(call["function"]["name"] + call["function"]["arguments"])
    if chat.get("tools"):
        texts.append(json.dumps([_unmarked(tool) for tool in chat["tools"]]))
    text = "\n".join(texts)
    counted = tokenizer(text) if tokenizer is not None else None
    if counted is None:
        counted = math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)
    overhead = MESSAGE_OVERHEAD_TOKENS * len(chat["messages"]) + REPLY_OVERHEAD_TOKENS
    return {"input_tokens": counted + overhead + IMAGE_TOKENS_ESTIMATE * images}


def message(reply: dict[str, Any], *, stop_sequences: list[str] | None = None) -> dict[str, Any]:
    """A chat reply (its first choice) as a Message."""
    choices = reply.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    said = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content: list[dict[str, Any]] = []
    text = _text(said.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    for i, call in enumerate(said.get("tool_calls") or []):
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{i}",
                "name": function.get("name") or "",
                "input": _tool_input(function.get("arguments")),
            }
        )
    finish = choice.get("finish_reason")
    stop_reason = _STOP_REASONS.get(finish, "end_turn")
    if any(block["type"] == "tool_use" for block in content):
        stop_reason = "tool_use"
    stop_sequence = None
    matched = choice.get("stop_reason")  # vLLM: the stop string that ended the choice
    if finish == "stop" and isinstance(matched, str) and matched in (stop_sequences or []):
        stop_reason, stop_sequence = "stop_sequence", matched
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    return {
        "id": str(reply.get("id") or "msg_coevo"),
        "type": "message",
        "role": "assistant",
        "model": str(reply.get("model") or ""),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(usage),
    }


def stream_events(whole: dict[str, Any]) -> Iterator[bytes]:
    """A whole Message as the server-sent events of a streamed one: message_start, for each
    block its content_block_start, one delta (all its text, or all its input as JSON) and
    content_block_stop, then message_delta (stop reason, output tokens) and message_stop."""
    usage = whole["usage"]
    start = {
        **whole,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opened},
        )
        yield _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error as Anthropic's API writes it (the SDKs raise it with this message)."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_of(status: int, openai_error: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style error body (the boundary's and the runner's) in Anthropic's shape."""
    error = openai_error.get("error")
    text = error.get("message") if isinstance(error, dict) else None
    return error_body(status, str(text or error or "error"))


# --- requests -------------------------------------------------------------------------------


def _lift_system(system: Any, messages: Any) -> tuple[Any, Any]:
    """Claude Code sends part of its system prompt as messages of role ``system`` among the
    others (the API it is written for takes them): their text blocks go to the end of the
    top-level system prompt (markers and all), so that the chat has one leading system message
    (the only kind some chat templates, Gemma's among them, accept). Anything else is left for
    ``_system`` and ``_messages`` to judge."""
    if not isinstance(messages, list) or not any(
        isinstance(m, dict) and m.get("role") == "system" for m in messages
    ):
        return system, messages
    lifted, kept = [], []
    for i, entry in enumerate(messages):
        if not (isinstance(entry, dict) and entry.get("role") == "system"):
            kept.append(entry)
            continue
        content = entry.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not _text_blocks(blocks):
            raise BadRequest(
                f"messages[{i}]: a system message must hold text only.", param=f"messages[{i}]"
            )
        lifted.extend(blocks)
    if system in (None, "", []):
        given = []
    elif isinstance(system, str):
        given = [{"type": "text", "text": system}]
    elif _text_blocks(system):
        given = list(system)
    else:
        return system, messages  # a malformed system: _system says so
    return [b for b in given + lifted if b["text"]], kept


def _text_blocks(blocks: Any) -> bool:
    return isinstance(blocks, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        for b in blocks
    )


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if _text_blocks(system):
        if any(b.get(CACHE_CONTROL) is not None for b in system):
            # The markers stay on their blocks: the system prompt as text parts.
            parts = [
                marked(b, {"type": "text", "text": b["text"]}, where=f"system[{i}]")
                for i, b in enumerate(system)
            ]
            return [{"role": "system", "content": parts}]
        return [{"role": "system", "content": "\n\n".join(b["text"] for b in system)}]
    raise BadRequest("system must be a string or a list of text blocks.", param="system")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list.", param="messages")
    chat: list[dict[str, Any]] = []
    for i, entry in enumerate(messages):
        where = f"messages[{i}]"
        role = entry.get("role") if isinstance(entry, dict) else None
        if role not in ("user", "assistant"):
            raise BadRequest(f"{where}.role must be 'user' or 'assistant'.", param=where)
        content = entry.get("content")
        if isinstance(content, str):
            chat.append({"role": role, "content": content})
            continue
        if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
            raise BadRequest(
                f"{where}.content must be a string or a list of content blocks.", param=where
            )
        if role == "assistant":
            chat.append(_assistant(content, where))
        else:
            chat.extend(_user(content, where))
    return chat


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            texts.append(
                marked(block, {"type": "text", "text": str(block.get("text") or "")}, where=at)
            )
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise BadRequest(f"{at}: a tool_use block needs an id and a name.", param=at)
            call = {
                "id": block["id"],
                "type": "function",
                "function": {
                    "name": block["name"],
                    "arguments": json.dumps(block.get("input") or {}),
                },
            }
            calls.append(marked(block, call, where=at))
        elif kind not in ("thinking", "redacted_thinking"):
            raise BadRequest(_unsupported_block(kind, at), param=at)
    said: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(t["text"] for t in texts) or None,
    }
    if any(CACHE_CONTROL in t for t in texts):
        said["content"] = texts  # text parts, each keeping its marker
    if calls:
        said["tool_calls"] = calls
    elif said["content"] is None:
        said["content"] = ""
    return said


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    results, parts = [], []
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise BadRequest(f"{at}: a tool_result block needs a tool_use_id.", param=at)
            result = {
                "role": "tool",
                "tool_call_id": block["tool_use_id"],
                "content": _tool_result_text(block.get("content"), at),
            }
            # A marker on one of the result's own text blocks marks the result: a chat tool
            # message holds one string, the prefix ends with it all the same.
            inner = block.get("content") if isinstance(block.get("content"), list) else []
            for k, part in enumerate(inner):
                marked(part, result, where=f"{at}.content[{k}]")
            marked(block, result, where=at)
            if error_flag(block.get("is_error"), where=at):
                result["is_error"] = True
            results.append(result)
        else:
            parts.append(_part(block, at))
    said = []
    if parts:
        one_text = len(parts) == 1 and parts[0]["type"] == "text" and CACHE_CONTROL not in parts[0]
        said.append({"role": "user", "content": parts[0]["text"] if one_text else parts})
    return results + said


def _part(block: dict[str, Any], at: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return marked(block, {"type": "text", "text": str(block.get("text") or "")}, where=at)
    if kind == "image":
        source = block.get("source") if isinstance(block.get("source"), dict) else {}
        if source.get("type") == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        elif source.get("type") == "url":
            url = str(source.get("url"))
        else:
            raise BadRequest(f"{at}: an image's source must be base64 or a url.", param=at)
        return marked(block, {"type": "image_url", "image_url": {"url": url}}, where=at)
    raise BadRequest(_unsupported_block(kind, at), param=at)


def _tool_result_text(content: Any, at: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" for b in content
    ):
        return "\n".join(str(b.get("text") or "") for b in content)
    raise BadRequest(
        f"{at}: a tool_result's content must be a string or text blocks (a chat API's tool "
        "message holds text only).",
        param=at,
    )


def _unsupported_block(kind: Any, at: str) -> str:
    return (
        f"{at}: content blocks of type {kind!r} are not served here: the boundary translates "
        "text, image, tool_use and tool_result blocks."
    )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list.", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") not in ("custom", None):
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(
                f"{where} is Anthropic's built-in tool {kind!r}: the boundary serves custom "
                "tools only ({'name', 'description', 'input_schema'}), which your program runs.",
                param=where,
            )
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise BadRequest(f"{where} needs a name and an input_schema object.", param=where)
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append(marked(tool, {"type": "function", "function": function}, where=where))
    return functions


def _unmarked(tool: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in tool.items() if key != CACHE_CONTROL}


def _tool_choice(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool" and isinstance(choice.get("name"), str):
        chat: dict[str, Any] = {
            "tool_choice": {"type": "function", "function": {"name": choice["name"]}}
        }
    elif kind in ("auto", "any", "none"):
        chat = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}[kind]}
    else:
        raise BadRequest(
            "tool_choice must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': …}.",
            param="tool_choice",
        )
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
    return chat


# --- replies --------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, as some servers answer
        return "".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as tool_use input (an object): a model's arguments that are not
    a JSON object are handed over whole as ``{"raw_arguments": …}``, for the program to see."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except (ValueError, RecursionError):
        parsed = None
    return parsed if isinstance(parsed, dict) else {"raw_arguments": arguments}


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    read = _count(usage.get("cache_read_input_tokens")) or _count(cached)
    written = _count(usage.get("cache_creation_input_tokens"))
    prompt = _count(usage.get("prompt_tokens"))
    counted = {
        "input_tokens": max(0, prompt - read - written),
        "output_tokens": _count(usage.get("completion_tokens")),
    }
    if read or written:
        counted.update(cache_creation_input_tokens=written, cache_read_input_tokens=read)
    return counted


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()

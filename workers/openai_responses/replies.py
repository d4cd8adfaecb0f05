"""A chat reply as a Response, whole or as the Responses API's server-sent events."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from workers.openai_responses.requests import Request


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def response(
    reply: dict[str, Any], request: Request, clean: dict[str, Any], *, response_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chat reply (its first choice) as a Response, and the reply as a chat message (for
    the conversation kept under the response's id). ``clean``: the chat request as sent."""
    choices = reply.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    said = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    finish = choice.get("finish_reason")
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish)
    item_status = "incomplete" if incomplete else "completed"
    text = _reply_text(said.get("content"))
    calls = []
    for call in said.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            arguments = function.get("arguments")
            calls.append(
                {
                    "id": str(call.get("id") or new_id("call")),
                    "type": "function",
                    "function": {
                        "name": str(function.get("name") or ""),
                        "arguments": arguments if isinstance(arguments, str) else "{}",
                    },
                }
            )
    output: list[dict[str, Any]] = []
    if text or not calls:
        output.append(
            {
                "type": "message",
                "id": new_id("msg"),
                "role": "assistant",
                "status": item_status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for call in calls:
        output.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
    input_tokens = _count(usage.get("prompt_tokens"))
    output_tokens = _count(usage.get("completion_tokens"))
    whole = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": str(reply.get("model") or ""),
        "output": output,
        "parallel_tool_calls": clean.get("parallel_tool_calls", True),
        "temperature": clean.get("temperature"),
        "top_p": clean.get("top_p"),
        "max_output_tokens": clean.get("max_tokens"),
        "store": request.store,
        **request.echo,
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    elif message["content"] is None:
        message["content"] = ""
    return whole, message


def stream_events(whole: dict[str, Any]) -> Iterator[bytes]:
    """A whole Response as the server-sent events of a streamed one, in OpenAI's order:
    response.created and response.in_progress (no output yet), for each output item its
    added event, its content (one text or arguments delta with all of it) and its done events,
    then response.completed (or response.incomplete) with the whole Response."""
    sequence = iter(range(1 << 62))

    def event(kind: str, **payload: Any) -> bytes:
        data = {"type": kind, "sequence_number": next(sequence), **payload}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    started = {**whole, "status": "in_progress", "output": [], "usage": None}
    started["incomplete_details"] = None
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(whole["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            empty = {**part, "text": ""}
            yield event("response.content_part.added", **at, content_index=0, part=empty)
            if part["text"]:
                yield event(
                    "response.output_text.delta",
                    **at,
                    content_index=0,
                    delta=part["text"],
                    logprobs=[],
                )
            yield event(
                "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
            )
            yield event("response.content_part.done", **at, content_index=0, part=part)
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done",
                **at,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield event("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
    yield event(final, response=whole)


# --- helpers ------------------------------------------------------------------------------


def _reply_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, as some servers answer
        return "".join(
            str(p.get("text") or "") for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

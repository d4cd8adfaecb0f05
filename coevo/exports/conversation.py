"""A recorded model call as the conversation TRL's SFT trainer reads, tool calls included.

TRL's conversational datasets with tools (its docs: "Dataset formats", Tool Calling; "SFT
Trainer", Tool Calling with SFT) hold the conversation in ``messages``, an assistant turn's
tool calls as ``{"type": "function", "function": {"name", "arguments": {...}}}`` and each
tool's result as a ``{"role": "tool", "content"}`` message, and the tools offered in a
``tools`` column of JSON schemas, which the trainer passes to the chat template. The boundary
records calls as the OpenAI API carries them (workers/program.py), so three things change on
the way out:

- a tool call's ``arguments`` become the JSON object they encode: chat templates render a
  dict (``| tojson``), and a string would reach the model quoted twice. Arguments that are not
  a JSON object (a model's malformed call) stay the string the model wrote, so that what it
  said is what is trained;
- a tool message carries ``name`` as well as ``tool_call_id`` (the templates that name the
  tool read ``name``; the OpenAI API sends only the id): the name of the call it answers;
- an assistant turn with no text has ``content: ""`` (the API sends null or leaves it out).

Everything else in a message is dropped except ``name``: the export is the conversation, not
the request. A call of an ``agent:run`` harness without tools becomes exactly what it always
did: ``{"role", "content"}`` messages and a text reply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workers.trace import ModelCall


@dataclass(frozen=True)
class Reply:
    """One reply of the policy to a call: a call asked for ``n`` gets ``n`` (``choice``)."""

    content: Any
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    choice: int | None = None  # the choice's index, for calls recorded with all their choices
    finish_reason: str | None = None

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def call_exportable(call: ModelCall) -> bool:
    """A call the policy answered: one the policy server refused (recorded with ``rejected``,
    e.g. a prompt past the context window) has no reply to learn."""
    return call.rejected is None


def call_tools(call: ModelCall) -> list[Any] | None:
    """The tools the call offered the model (OpenAI's function schemas, which are TRL's), or
    None when it offered none."""
    tools = call.tools
    return list(tools) if isinstance(tools, list) and tools else None


def call_prompt(call: ModelCall) -> str:
    """A completions call's prompt as text ("" for a call recorded without one)."""
    return "" if call.prompt is None else str(call.prompt)


def call_prompt_messages(call: ModelCall) -> list[dict[str, Any]]:
    """The conversation the model was given: the call's messages, or a completions call's
    prompt as one user message."""
    if call.messages is None:
        return [{"role": "user", "content": call_prompt(call)}]
    names: dict[Any, str] = {}
    messages = []
    for raw in call.messages:
        raw = raw if isinstance(raw, dict) else {}
        message: dict[str, Any] = {
            "role": str(raw.get("role", "")),
            "content": raw.get("content", ""),
        }
        calls = _tool_calls(raw.get("tool_calls"))
        if calls:
            message["tool_calls"] = calls
            if message["content"] is None:
                message["content"] = ""
            names.update((c["id"], c["function"]["name"]) for c in calls if "id" in c)
        if message["role"] == "tool":
            if message["content"] is None:
                message["content"] = ""
            if raw.get("tool_call_id") is not None:
                message["tool_call_id"] = raw["tool_call_id"]
            name = raw.get("name") or names.get(raw.get("tool_call_id"))
            if isinstance(name, str) and name:
                message["name"] = name
        elif isinstance(raw.get("name"), str) and raw["name"]:
            message["name"] = raw["name"]
        messages.append(message)
    return messages


def call_replies(call: ModelCall) -> list[Reply]:
    """The policy's replies to the call, in choice order.

    A boundary call is recorded once with every choice it asked for (``choices``, the server's
    reply, and ``tool_calls`` flattened with each one's ``choice``); an ``agent:run`` call is
    recorded once per sample, with its text in ``completion``.
    """
    recorded = _by_choice(call.tool_calls)
    choices = call.choices
    if not isinstance(choices, list):
        return [
            Reply(
                content=str(call.completion or ""),
                tool_calls=recorded.get(0, []),
                finish_reason=call.finish_reason,
            )
        ]
    replies = []
    for index, choice in enumerate(choices):
        choice = choice if isinstance(choice, dict) else {}
        position = choice.get("index", index)
        position = position if isinstance(position, int) else index
        message = choice.get("message")
        if isinstance(message, dict):  # chat
            content = message.get("content")
            calls = recorded.get(index) or _tool_calls(message.get("tool_calls"))
        else:  # completions
            content, calls = choice.get("text"), []
        replies.append(
            Reply(
                content=content if isinstance(content, str | list) else "",
                tool_calls=calls,
                choice=position,
                finish_reason=choice.get("finish_reason"),
            )
        )
    return replies


def _by_choice(recorded: Any) -> dict[int, list[dict[str, Any]]]:
    """The boundary's flat ``[{choice, id, name, arguments}]`` as TRL's tool calls, per choice."""
    found: dict[int, list[dict[str, Any]]] = {}
    for call in recorded if isinstance(recorded, list) else []:
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            choice = call.get("choice") if isinstance(call.get("choice"), int) else 0
            found.setdefault(choice, []).append(
                _tool_call(call.get("id"), call["name"], call.get("arguments"))
            )
    return found


def _tool_calls(raw: Any) -> list[dict[str, Any]]:
    """OpenAI's ``[{id, type, function: {name, arguments}}]`` as TRL's tool calls."""
    calls = []
    for call in raw if isinstance(raw, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            calls.append(_tool_call(call.get("id"), function["name"], function.get("arguments")))
    return calls


def _tool_call(call_id: Any, name: str, arguments: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": name, "arguments": _arguments(arguments)},
    }
    if isinstance(call_id, str) and call_id:
        call["id"] = call_id
    return call


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return {} if arguments is None else arguments

"""A Responses request checked and translated to a chat request (see the package's doc)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workers.openai_requests import MAX_MESSAGES, MAX_TOOLS, BadRequest
from workers.openai_responses.store import MAX_STORED_CHARS, MAX_STORED_RESPONSES

# Bounds on what one request may say, beside the body's own (workers/boundary.py); OpenAI's
# own where it has them (metadata: 16 pairs, keys of 64 characters, values of 512).
MAX_ID_CHARS = 256
MAX_DESCRIPTION_CHARS = 32_000
MAX_SCHEMA_CHARS = 64_000
MAX_METADATA = 16
MAX_INCLUDE = 32
# How many of the request's unknown keys the trace lists (a hostile body may hold thousands).
MAX_DROPPED = 32
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")
# Keys accepted and not passed to the policy: they change nothing a policy server could do
# (or nothing it can do: reasoning effort, logprobs in include), and are listed as dropped.
_IGNORED = frozenset(
    {
        "reasoning",
        "include",
        "truncation",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "service_tier",
        "stream_options",
    }
)
_HONOURED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_output_tokens",
        "parallel_tool_calls",
        "previous_response_id",
        "store",
        "stream",
        "metadata",
        "text",
    }
)
# Keys that would change the reply if honoured and cannot be: refused when set.
_REFUSED = {
    "background": "the boundary answers while the request waits (no background responses)",
    "conversation": "the boundary keeps no conversations; send input, or previous_response_id",
    "prompt": "the boundary has no stored prompt templates; send instructions and input",
    "max_tool_calls": "the policy server has no bound on tool calls per reply",
    "top_logprobs": "the boundary does not return logprobs on this route",
}
_BUILT_IN = (
    "web_search, file_search, computer_use, code_interpreter, image_generation, mcp, "
    "local_shell, shell, custom and apply_patch tools"
)


class UnknownResponse(BadRequest):
    """A previous_response_id this rollout's boundary does not keep (OpenAI's code, which
    clients tell apart from other refusals)."""

    code = "previous_response_not_found"


@dataclass
class Request:
    """A checked Responses request: the chat request to ask, and what the reply echoes."""

    chat: dict[str, Any]
    dropped: list[str]
    # The conversation to keep under the new response's id: its messages without the
    # instructions (the reply is added once known).
    conversation: list[dict[str, Any]]
    echo: dict[str, Any]
    stream: bool
    store: bool


def parse_request(body: Any, *, history: Callable[[str], list[dict[str, Any]] | None]) -> Request:
    """Check a Responses request and translate it; ``history`` gives the conversation kept
    under a response id (None: unknown to this rollout)."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False, 0):
            raise BadRequest(f"{key} is not served here: {why}.", param=key)
    for key in ("stream", "store", "parallel_tool_calls"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise BadRequest(f"{key} must be true or false.", param=key)
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > MAX_ID_CHARS):
        raise BadRequest(
            f"model must be a string of at most {MAX_ID_CHARS} characters.", param="model"
        )
    conversation: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str) or not 1 <= len(previous) <= MAX_ID_CHARS:
            raise BadRequest(
                f"previous_response_id must be a response id of at most {MAX_ID_CHARS} characters.",
                param="previous_response_id",
            )
        kept = history(previous)
        if kept is None:
            raise UnknownResponse(
                f"Previous response with id {previous!r} not found: previous_response_id names "
                "a response this rollout got (the latest "
                f"{MAX_STORED_RESPONSES} are kept, up to {MAX_STORED_CHARS // 2**20} MiB, "
                "not those asked with store: false); otherwise send the whole conversation "
                "as input.",
                param="previous_response_id",
            )
        conversation = list(kept)
    conversation += _input(body.get("input"))
    if len(conversation) > MAX_MESSAGES:
        raise BadRequest(f"The conversation holds more than {MAX_MESSAGES} items.", param="input")
    messages = _instructions(body.get("instructions")) + conversation
    chat: dict[str, Any] = {"messages": messages}
    if model is not None:
        chat["model"] = model
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    max_output = body.get("max_output_tokens")
    if max_output is not None:
        if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 1:
            raise BadRequest(
                "max_output_tokens must be a positive integer.", param="max_output_tokens"
            )
        chat["max_tokens"] = max_output
    tools, names = _tools(body.get("tools"))
    if tools:
        chat["tools"] = [_chat_tool(tool) for tool in tools]
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice, names)
    if body.get("parallel_tool_calls") is not None and tools:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    text, verbosity = _text_config(body.get("text"))
    if text["format"]["type"] != "text":
        chat["response_format"] = _response_format(text["format"])
    metadata = _metadata(body.get("metadata"))
    _check_ignored(body)
    unknown = sorted(key for key in body if key not in _HONOURED | _IGNORED | set(_REFUSED))
    dropped = sorted(k for k in body if k in _IGNORED and body[k] not in (None, "", [], {}))
    dropped += [key[:64] for key in unknown[:MAX_DROPPED]]
    if verbosity:
        dropped.append("text.verbosity")
    echo = {
        "instructions": body.get("instructions"),
        "metadata": metadata,
        "previous_response_id": previous,
        "tools": tools,
        "tool_choice": choice if choice is not None else "auto",
        "text": text,
        "truncation": "disabled",
    }
    return Request(
        chat=chat,
        dropped=dropped,
        conversation=conversation,
        echo=echo,
        stream=body.get("stream") is True,
        store=body.get("store") is not False,
    )


# --- requests -------------------------------------------------------------------------------


def _instructions(instructions: Any) -> list[dict[str, Any]]:
    if instructions is None or instructions == "":
        return []
    if isinstance(instructions, str):
        return [{"role": "system", "content": instructions}]
    if isinstance(instructions, list):
        return _items(instructions, "instructions")
    raise BadRequest(
        "instructions must be a string or a list of input items.", param="instructions"
    )


def _input(given: Any) -> list[dict[str, Any]]:
    if given is None:
        return []
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list):
        raise BadRequest("input must be a string or a list of input items.", param="input")
    return _items(given, "input")


def _items(items: list[Any], name: str) -> list[dict[str, Any]]:
    if len(items) > MAX_MESSAGES:
        raise BadRequest(f"{name} holds more than {MAX_MESSAGES} items.", param=name)
    chat: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an input item (an object).", param=where)
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            chat.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            last = chat[-1] if chat else None
            if last is not None and last["role"] == "assistant":
                # The calls of one reply follow its text: they are one chat message.
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None
            else:
                chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_ID_CHARS:
                raise BadRequest(f"{where}.call_id must be the call's id.", param=where)
            output = _output_text(item.get("output"), where)
            chat.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue  # the policy made no reasoning item: one sent back is the client's
        else:
            raise BadRequest(
                f"{where}: input items of type {_name(kind)!r} are not served here: the "
                "boundary translates message, function_call, function_call_output and "
                "reasoning items (item_reference: send the item itself).",
                param=where,
            )
    return chat


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = _ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
    if role is None:
        raise BadRequest(
            f"{where}.role must be 'user', 'system', 'developer' or 'assistant'.", param=where
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of parts.", param=where)
    parts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and role == "user" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise BadRequest(
                f"{at}: a part of type {_name(kind)!r} is not served here: the boundary "
                "translates input_text, output_text and refusal parts, and a user's "
                "input_image given by image_url (no file_id, files or audio).",
                param=at,
            )
    if role != "user" or all(p["type"] == "text" for p in parts):
        if any(p["type"] != "text" for p in parts):
            raise BadRequest(f"{where}: only a user message may hold images.", param=where)
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_ID_CHARS:
        raise BadRequest(f"{where}.call_id must be the call's id.", param=where)
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_ID_CHARS:
        raise BadRequest(f"{where}.name must be the function's name.", param=where)
    if not isinstance(arguments, str):
        raise BadRequest(f"{where}.arguments must be a string (the call's JSON).", param=where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(
        isinstance(p, dict) and p.get("type") in _TEXT_PARTS and isinstance(p.get("text"), str)
        for p in output
    ):
        return "".join(p["text"] for p in output)
    raise BadRequest(
        f"{where}.output must be a string or input_text parts (a chat API's tool message holds "
        "text only).",
        param=where,
    )


def _tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    if tools is None:
        return [], []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise BadRequest(f"tools must be a list of at most {MAX_TOOLS} tools.", param="tools")
    checked, names = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise BadRequest(
                f"{where} is a tool of type {_name(kind)!r}: the boundary serves function "
                f"tools only ({{'type': 'function', 'name', 'parameters'}}), which your program "
                f"runs; built-in tools ({_BUILT_IN}) need OpenAI's servers.",
                param=where,
            )
        name, description = tool.get("name"), tool.get("description")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise BadRequest(f"{where}.name must be 1 to 64 letters, digits, _ or -.", param=where)
        if name in names:
            raise BadRequest(f"{where}.name {name!r} names an earlier tool too.", param=where)
        if description is not None and (
            not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS
        ):
            raise BadRequest(
                f"{where}.description must be a string of at most {MAX_DESCRIPTION_CHARS} "
                "characters.",
                param=where,
            )
        parameters = tool.get("parameters")
        if parameters is not None and (
            not isinstance(parameters, dict) or len(json.dumps(parameters)) > MAX_SCHEMA_CHARS
        ):
            raise BadRequest(
                f"{where}.parameters must be a JSON Schema object of at most {MAX_SCHEMA_CHARS} "
                "characters of JSON.",
                param=where,
            )
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(f"{where}.strict must be true or false.", param=where)
        names.append(name)
        checked.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": parameters,
                "strict": strict,
            }
        )
    return checked, names


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"]}
    for key in ("description", "parameters", "strict"):
        if tool[key] is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, names: list[str]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        if choice["name"] not in names:
            raise BadRequest(
                f"tool_choice names {choice['name'][:64]!r}, which is not one of the tools.",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest(
        "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': …} "
        "(allowed_tools and built-in tools are not served here).",
        param="tool_choice",
    )


def _text_config(text: Any) -> tuple[dict[str, Any], bool]:
    """``text`` as the Response echoes it, and whether it asked a verbosity (ignored)."""
    if text is None:
        return {"format": {"type": "text"}}, False
    if not isinstance(text, dict):
        raise BadRequest("text must be an object ({'format': {...}}).", param="text")
    form = text.get("format") if text.get("format") is not None else {"type": "text"}
    if not isinstance(form, dict) or form.get("type") not in ("text", "json_object", "json_schema"):
        raise BadRequest(
            "text.format must be {'type': 'text'}, {'type': 'json_object'} or "
            "{'type': 'json_schema', 'name': …, 'schema': {…}}.",
            param="text.format",
        )
    if form["type"] == "json_schema":
        if not isinstance(form.get("name"), str) or not _TOOL_NAME.fullmatch(form["name"]):
            raise BadRequest(
                "text.format.name must be 1 to 64 letters, digits, _ or -.", param="text.format"
            )
        if not isinstance(form.get("schema"), dict):
            raise BadRequest(
                "text.format.schema must be a JSON Schema object.", param="text.format"
            )
        if len(json.dumps(form)) > MAX_SCHEMA_CHARS:
            raise BadRequest(
                f"text.format is larger than {MAX_SCHEMA_CHARS} characters of JSON.",
                param="text.format",
            )
        if not isinstance(form.get("strict", False), bool | None):
            raise BadRequest("text.format.strict must be true or false.", param="text.format")
        if not isinstance(form.get("description", ""), str | None):
            raise BadRequest("text.format.description must be a string.", param="text.format")
    keys = ("type", "name", "schema", "strict", "description")
    echoed = {key: form[key] for key in keys if form.get(key) is not None}
    return {"format": echoed}, text.get("verbosity") is not None


def _response_format(form: dict[str, Any]) -> dict[str, Any]:
    if form["type"] == "json_object":
        return {"type": "json_object"}
    spec = {k: form[k] for k in ("name", "schema", "strict", "description") if k in form}
    return {"type": "json_schema", "json_schema": spec}


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA
        or not all(
            len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in metadata.items()
        )
    ):
        raise BadRequest(
            f"metadata must be at most {MAX_METADATA} pairs of strings (keys of at most 64 "
            "characters, values of at most 512).",
            param="metadata",
        )
    return metadata


def _check_ignored(body: dict[str, Any]) -> None:
    """The ignored keys still have a shape: a client that sends nonsense is told."""
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list)
        or len(include) > MAX_INCLUDE
        or not all(isinstance(v, str) and len(v) <= 128 for v in include)
    ):
        raise BadRequest(
            f"include must be a list of at most {MAX_INCLUDE} strings.", param="include"
        )
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise BadRequest("truncation must be 'auto' or 'disabled'.", param="truncation")
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise BadRequest("reasoning must be an object.", param="reasoning")
    for key in ("user", "safety_identifier", "prompt_cache_key", "service_tier"):
        value = body.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 512):
            raise BadRequest(f"{key} must be a string of at most 512 characters.", param=key)


def _name(kind: Any) -> str:
    """A ``type`` the request gave, for a message (whatever JSON it is, never its whole)."""
    return kind[:64] if isinstance(kind, str) else type(kind).__name__

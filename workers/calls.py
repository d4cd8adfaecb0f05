"""Parsing what the harness sends: each call's parameters checked before anything is done with
them, and its log and error messages bounded before they enter the trace.

A bad parameter ends the rollout as a harness_error (InvalidCall) whose message names the call
and the field; a malformed call is a ProtocolViolation.
"""

from __future__ import annotations

import json
import re
from typing import Any

from workers.outcomes import InvalidCall, ProtocolViolation
from workers.policy import Sampling
from workers.trace import HarnessException, Log

MAX_SAMPLES = 16
MAX_STOPS = 16
MAX_ACTION_CHARS = 4000
MAX_LOG_CHARS = 10000
MAX_FRAMES = 50
CHAT_ROLES = ("system", "user", "assistant", "tool")
# Tool calling (ctx.llm.chat's tools, tool_choice, response_format): OpenAI's own bounds where
# it has them (128 tools, names of 1-64 letters, digits, _ or -), ours below the channel's 1 MiB
# message otherwise, so that a refusal names the field rather than the channel.
CHAT_OPTIONS = ("tools", "tool_choice", "response_format")
MAX_TOOLS = 128
MAX_TOOL_CALLS = 128
MAX_DESCRIPTION_CHARS = 8000
MAX_SCHEMA_CHARS = 64000
MAX_ARGUMENTS_CHARS = 64000
MAX_CALL_ID_CHARS = 256
MAX_CALL_NAME_CHARS = 256
TOOL_CHOICES = ("auto", "none", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_call(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A ``call`` message's method and params."""
    method = message.get("method")
    params = message.get("params")
    if params is None:
        params = {}
    if not isinstance(method, str):
        raise ProtocolViolation(f"protocol violation: a call without a method name ({method!r})")
    if not isinstance(params, dict):
        raise ProtocolViolation(f"protocol violation: the params of {method} must be an object")
    return method, params


def parse_reset(params: dict[str, Any], name: str) -> None:
    if params:
        raise InvalidCall(f"{name}: takes no parameters, got {sorted(params)}")


def parse_action(params: dict[str, Any], name: str) -> str:
    unknown = set(params) - {"action"}
    if unknown:
        raise InvalidCall(f"{name}: unknown parameters {sorted(unknown)}")
    action = params.get("action")
    if not isinstance(action, str):
        raise InvalidCall(f"{name}: action must be a string, got {type(action).__name__}")
    if len(action) > MAX_ACTION_CHARS:
        raise InvalidCall(f"{name}: action is longer than {MAX_ACTION_CHARS} characters")
    return action


def log_step(message: dict[str, Any]) -> Log:
    fields = message.get("fields")
    if isinstance(fields, dict) and fields:
        text = json.dumps(fields)
        fields = fields if len(text) <= MAX_LOG_CHARS else {"truncated": text[:2000]}
    else:
        fields = None
    return Log(message=str(message.get("message", ""))[:MAX_LOG_CHARS], fields=fields)


def exception_step(message: dict[str, Any]) -> HarnessException:
    """The harness's error with its traceback text and frames (file relative to the harness
    root, line, function), which the trace viewer links to the candidate's source."""
    frames = []
    raw_frames = message.get("frames")
    for frame in raw_frames[-MAX_FRAMES:] if isinstance(raw_frames, list) else []:
        if not isinstance(frame, dict):
            continue
        line = frame.get("line")
        frames.append(
            {
                "file": str(frame.get("file", ""))[:500],
                "line": line if isinstance(line, int) and not isinstance(line, bool) else None,
                "function": str(frame.get("function", ""))[:200],
                "code": str(frame.get("code", ""))[:500],
                "in_harness": frame.get("in_harness") is True,
            }
        )
    return HarnessException(
        error=str(message.get("error", ""))[:2000],
        traceback=str(message.get("traceback") or "")[-8000:],
        frames=frames,
    )


def parse_prompt(params: dict[str, Any], name: str) -> str:
    prompt = params.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidCall(f"{name}: prompt must be a string, got {type(prompt).__name__}")
    return prompt


def parse_messages(params: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """``[{role, content}, ...]``; an assistant message may carry ``tool_calls`` (its content
    then may be null) and a ``tool`` message answers one of them by ``tool_call_id``."""
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidCall(f"{name}: messages must be a non-empty list of {{role, content}}")
    parsed = []
    call_ids: set[str] = set()
    for i, message in enumerate(messages):
        where = f"{name}: messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidCall(f"{where} must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise InvalidCall(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {role!r}")
        allowed = {"role", "content"}
        if role == "assistant":
            allowed.add("tool_calls")
        elif role == "tool":
            allowed.add("tool_call_id")
        extra = set(message) - allowed
        if extra:
            raise InvalidCall(f"{where} has unknown keys {sorted(extra)}")
        tool_calls = message.get("tool_calls")
        if not isinstance(content, str) and not (content is None and tool_calls):
            raise InvalidCall(
                f"{where}.content must be a string, got {type(content).__name__}"
                + (" (null only beside tool_calls)" if role == "assistant" else "")
            )
        entry: dict[str, Any] = {"role": role, "content": content}
        if tool_calls is not None:
            entry["tool_calls"] = _parse_tool_calls(tool_calls, f"{where}.tool_calls")
            call_ids.update(call["id"] for call in entry["tool_calls"])
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidCall(
                    f"{where}.tool_call_id must be the id of the tool call it answers, got "
                    f"{call_id!r}"
                )
            if call_id not in call_ids:
                raise InvalidCall(
                    f"{where}.tool_call_id {call_id[:MAX_CALL_ID_CHARS]!r} answers no tool call "
                    "of an earlier assistant message (send the assistant message with its "
                    "tool_calls first: Completion.message)"
                )
            entry["tool_call_id"] = call_id
        parsed.append(entry)
    return parsed


def _parse_tool_calls(tool_calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(tool_calls, list) or not tool_calls:
        raise InvalidCall(f"{where} must be a non-empty list of tool calls")
    if len(tool_calls) > MAX_TOOL_CALLS:
        raise InvalidCall(f"{where} has {len(tool_calls)} calls; at most {MAX_TOOL_CALLS}")
    parsed = []
    for j, call in enumerate(tool_calls):
        at = f"{where}[{j}]"
        shape = "{'id': ..., 'type': 'function', 'function': {'name': ..., 'arguments': ...}}"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise InvalidCall(f"{at} must be {shape}")
        extra = set(call) - {"id", "type", "function"}
        if extra:
            raise InvalidCall(f"{at} has unknown keys {sorted(extra)}")
        if call.get("type", "function") != "function":
            raise InvalidCall(f"{at}.type must be 'function', got {call.get('type')!r}")
        call_id, function = call.get("id"), call["function"]
        if not isinstance(call_id, str) or not 1 <= len(call_id) <= MAX_CALL_ID_CHARS:
            raise InvalidCall(
                f"{at}.id must be a string of 1 to {MAX_CALL_ID_CHARS} characters (the id the "
                "model gave the call)"
            )
        extra = set(function) - {"name", "arguments"}
        if extra:
            raise InvalidCall(f"{at}.function has unknown keys {sorted(extra)}")
        call_name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(call_name, str) or not 1 <= len(call_name) <= MAX_CALL_NAME_CHARS:
            raise InvalidCall(
                f"{at}.function.name must be a string of 1 to {MAX_CALL_NAME_CHARS} characters"
            )
        if not isinstance(arguments, str):
            raise InvalidCall(
                f"{at}.function.arguments must be a string (the JSON the model wrote), got "
                f"{type(arguments).__name__}"
            )
        if len(arguments) > MAX_ARGUMENTS_CHARS:
            raise InvalidCall(
                f"{at}.function.arguments is longer than {MAX_ARGUMENTS_CHARS} characters"
            )
        parsed.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call_name, "arguments": arguments},
            }
        )
    return parsed


def parse_chat_options(params: dict[str, Any], name: str) -> dict[str, Any]:
    """``tools``, ``tool_choice`` and ``response_format`` as the request gives them, each
    checked; only those it gives (none: the call is sent as before tools existed)."""
    options: dict[str, Any] = {}
    tools = params.get("tools")
    names: list[str] = []
    if tools is not None:
        options["tools"], names = _parse_tools(tools, f"{name}: tools")
    choice = params.get("tool_choice")
    if choice is not None:
        options["tool_choice"] = _parse_tool_choice(choice, names, f"{name}: tool_choice")
    response_format = params.get("response_format")
    if response_format is not None:
        options["response_format"] = _parse_response_format(
            response_format, f"{name}: response_format"
        )
    return options


def _parse_tools(tools: Any, where: str) -> tuple[list[dict[str, Any]], list[str]]:
    shape = (
        "{'type': 'function', 'function': {'name': ..., 'description': ..., 'parameters': {...}}}"
    )
    if not isinstance(tools, list) or not tools:
        raise InvalidCall(f"{where} must be a non-empty list of {shape}")
    if len(tools) > MAX_TOOLS:
        raise InvalidCall(f"{where} has {len(tools)} tools; at most {MAX_TOOLS}")
    parsed, names = [], []
    for i, tool in enumerate(tools):
        at = f"{where}[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise InvalidCall(f"{at} must be {shape}")
        extra = set(tool) - {"type", "function"}
        if extra:
            raise InvalidCall(f"{at} has unknown keys {sorted(extra)}")
        if tool.get("type") != "function":
            raise InvalidCall(f"{at}.type must be 'function', got {tool.get('type')!r}")
        function = tool["function"]
        extra = set(function) - {"name", "description", "parameters", "strict"}
        if extra:
            raise InvalidCall(f"{at}.function has unknown keys {sorted(extra)}")
        tool_name = function.get("name")
        if not isinstance(tool_name, str) or not _TOOL_NAME.fullmatch(tool_name):
            raise InvalidCall(
                f"{at}.function.name must be 1 to 64 letters, digits, _ or -, got {tool_name!r}"
            )
        if tool_name in names:
            raise InvalidCall(f"{at}.function.name {tool_name!r} names an earlier tool too")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidCall(f"{at}.function.description must be a string")
        if description is not None and len(description) > MAX_DESCRIPTION_CHARS:
            raise InvalidCall(
                f"{at}.function.description is longer than {MAX_DESCRIPTION_CHARS} characters"
            )
        parameters = function.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise InvalidCall(
                    f"{at}.function.parameters must be a JSON Schema object, got "
                    f"{type(parameters).__name__}"
                )
            if len(json.dumps(parameters)) > MAX_SCHEMA_CHARS:
                raise InvalidCall(
                    f"{at}.function.parameters is larger than {MAX_SCHEMA_CHARS} characters of JSON"
                )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidCall(f"{at}.function.strict must be true or false, got {strict!r}")
        names.append(tool_name)
        parsed.append({"type": "function", "function": dict(function)})
    return parsed, names


def _parse_tool_choice(choice: Any, names: list[str], where: str) -> Any:
    if not names:
        raise InvalidCall(f"{where} needs tools: offer them with tools=[...]")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise InvalidCall(
                f"{where} must be one of {', '.join(TOOL_CHOICES)} or "
                f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}"
            )
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    if (
        not isinstance(function, dict)
        or choice.get("type") != "function"
        or set(choice) != {"type", "function"}
        or set(function) != {"name"}
    ):
        raise InvalidCall(
            f"{where} must be one of {', '.join(TOOL_CHOICES)} or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {str(choice)[:200]}"
        )
    if function["name"] not in names:
        raise InvalidCall(
            f"{where}.function.name {str(function['name'])[:64]!r} is not one of the tools "
            f"offered ({', '.join(names[:10])}{', ...' if len(names) > 10 else ''})"
        )
    return {"type": "function", "function": {"name": function["name"]}}


def _parse_response_format(response_format: Any, where: str) -> dict[str, Any]:
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise InvalidCall(
            f"{where} must be {{'type': 'text'}}, {{'type': 'json_object'}} or "
            f"{{'type': 'json_schema', 'json_schema': {{'name': ..., 'schema': {{...}}}}}}, got "
            f"{str(response_format)[:200]}"
        )
    keys = {"type", "json_schema"} if kind == "json_schema" else {"type"}
    extra = set(response_format) - keys
    if extra:
        raise InvalidCall(f"{where} has unknown keys {sorted(extra)}")
    if kind != "json_schema":
        return {"type": kind}
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidCall(f"{where}.json_schema must be {{'name': ..., 'schema': {{...}}}}")
    extra = set(spec) - {"name", "description", "schema", "strict"}
    if extra:
        raise InvalidCall(f"{where}.json_schema has unknown keys {sorted(extra)}")
    schema_name = spec.get("name")
    if not isinstance(schema_name, str) or not _TOOL_NAME.fullmatch(schema_name):
        raise InvalidCall(
            f"{where}.json_schema.name must be 1 to 64 letters, digits, _ or -, got {schema_name!r}"
        )
    if not isinstance(spec.get("schema", {}), dict):
        raise InvalidCall(f"{where}.json_schema.schema must be a JSON Schema object")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidCall(f"{where}.json_schema.description must be a string")
    if "strict" in spec and not isinstance(spec["strict"], bool):
        raise InvalidCall(f"{where}.json_schema.strict must be true or false")
    if len(json.dumps(spec)) > MAX_SCHEMA_CHARS:
        raise InvalidCall(
            f"{where}.json_schema is larger than {MAX_SCHEMA_CHARS} characters of JSON"
        )
    return {"type": "json_schema", "json_schema": dict(spec)}


def parse_sampling(
    params: dict[str, Any], name: str, *, default_seed: int, chat: bool = False
) -> tuple[Sampling, int]:
    """Sampling parameters, each checked; a bad one ends the rollout naming the call and field.
    ``chat``: the call may also carry CHAT_OPTIONS (parse_chat_options checks them)."""
    known = {"prompt", "messages", "max_tokens", "temperature", "top_p", "stop", "n", "seed"}
    unknown = set(params) - known - (set(CHAT_OPTIONS) if chat else set())
    if unknown:
        also = sorted(unknown & set(CHAT_OPTIONS))
        hint = f" ({', '.join(also)}: ctx.llm.chat only)" if also else ""
        raise InvalidCall(f"{name}: unknown parameters {sorted(unknown)}{hint}")

    def number(key: str, default: float, *, integer: bool) -> Any:
        value = params.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidCall(f"{name}: {key} must be a number, got {value!r}")
        if integer and not float(value).is_integer():
            raise InvalidCall(f"{name}: {key} must be an integer, got {value!r}")
        return int(value) if integer else float(value)

    max_tokens = number("max_tokens", 256, integer=True)
    temperature = number("temperature", 0.0, integer=False)
    top_p = number("top_p", 1.0, integer=False)
    n = number("n", 1, integer=True)
    seed = number("seed", default_seed, integer=True)
    stop = params.get("stop")
    if stop is None:
        stop = []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise InvalidCall(f"{name}: stop must be a list of non-empty strings, got {stop!r}")
    if len(stop) > MAX_STOPS:
        raise InvalidCall(f"{name}: stop has {len(stop)} strings; at most {MAX_STOPS}")
    if max_tokens < 1:
        raise InvalidCall(f"{name}: max_tokens must be positive, got {max_tokens}")
    if not 0.0 <= temperature <= 2.0:
        raise InvalidCall(f"{name}: temperature must be between 0 and 2, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise InvalidCall(f"{name}: top_p must be in (0, 1], got {top_p}")
    if not 1 <= n <= MAX_SAMPLES:
        raise InvalidCall(f"{name}: n must be between 1 and {MAX_SAMPLES}, got {n}")
    sampling = Sampling(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=tuple(stop), seed=seed
    )
    return sampling, n

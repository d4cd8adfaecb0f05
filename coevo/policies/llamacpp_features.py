"""What the coevo llama.cpp host can honour of a request, from the model it serves.

llama-cpp-python's server (llama_cpp/llama_chat_format.py, 0.3.x) renders a chat request with
the GGUF's own chat template (``tokenizer.chat_template``; without one, its ``llama-2`` format)
and parses no tool call back out of the model's text. So of an OpenAI chat request:

- ``tools`` reach the model only when that template renders them (it mentions ``tools``);
  even then a call the model writes comes back as text, never as ``tool_calls``;
- ``tool_choice`` naming a function is honoured: the reply is constrained by a grammar to that
  function's parameters and returned as its tool call (the model still sees the tools only if
  the template renders them); ``"required"`` is not enforced; ``"none"`` and ``"auto"`` need
  nothing;
- ``response_format`` ``json_object`` (with llama-cpp-python's ``schema`` extension) is
  honoured by a grammar; OpenAI's ``json_schema`` is refused by llama-cpp-python's request
  model (422), so the host translates it to ``json_object`` with its schema: honoured;
- ``n`` is dropped by llama_cpp.server (one choice per request);
- the sampling parameters coevo sends (temperature, top_p, seed, stop, penalties,
  repeat_penalty, logprobs) are honoured.

The host answers such a request normally and adds ``coevo_degraded`` to its reply: one
``{"field", "why"}`` per part it could not honour, ``why`` a sentence for the trace page. A
request it cannot serve at all (a named ``tool_choice`` not among ``tools``, an unknown
``response_format``) is refused with OpenAI's error naming the field.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from coevo.policies.llamacpp_children import Refused

DEGRADED_KEY = "coevo_degraded"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
# GGUF value types (ggml's gguf.h) and the size of each fixed-size one.
_STRING, _ARRAY = 8, 9
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# Bounds on a header the host reads before it serves: a corrupt file ends the read, not the host.
_MAX_KVS = 1_000_000
_MAX_STRING = 64 * 1024 * 1024


class _Unreadable(Exception):
    pass


def chat_template_read(path: Path) -> str | None:
    """The GGUF's chat template (``tokenizer.chat_template``), or None when it has none or
    the header cannot be read (then llama-cpp-python has none either: it uses ``llama-2``)."""
    try:
        with path.open("rb") as f:
            return _template_of(f)
    except (OSError, _Unreadable, struct.error, UnicodeDecodeError):
        return None


def _template_of(f: BinaryIO) -> str | None:
    if f.read(4) != b"GGUF":
        raise _Unreadable
    (version,) = _unpack(f, "<I")
    if version < 2:  # GGUF v1 (2023, 32-bit counts): llama.cpp no longer reads it either
        raise _Unreadable
    _tensors, kvs = _unpack(f, "<QQ")
    if kvs > _MAX_KVS:
        raise _Unreadable
    for _ in range(kvs):
        key = _string(f)
        (kind,) = _unpack(f, "<I")
        if key == CHAT_TEMPLATE_KEY and kind == _STRING:
            return _string(f)
        _skip(f, kind)
    return None


def _unpack(f: BinaryIO, layout: str) -> tuple[int, ...]:
    size = struct.calcsize(layout)
    data = f.read(size)
    if len(data) != size:
        raise _Unreadable
    return struct.unpack(layout, data)


def _string(f: BinaryIO) -> str:
    (length,) = _unpack(f, "<Q")
    if length > _MAX_STRING:
        raise _Unreadable
    data = f.read(length)
    if len(data) != length:
        raise _Unreadable
    return data.decode("utf-8")


def _skip(f: BinaryIO, kind: int) -> None:
    if kind in _SIZES:
        f.seek(_SIZES[kind], 1)
    elif kind == _STRING:
        (length,) = _unpack(f, "<Q")
        f.seek(length, 1)
    elif kind == _ARRAY:
        item, count = _unpack(f, "<IQ")
        if item in _SIZES:
            f.seek(_SIZES[item] * count, 1)
        else:  # the vocabulary: a quarter of a million strings for Gemma 3
            for _ in range(count):
                _skip(f, item)
    else:
        raise _Unreadable


def template_renders_tools(template: str | None) -> bool:
    """Whether a chat template shows the model a request's tools (HF templates that do read
    the ``tools`` variable; Gemma 3's does not mention it)."""
    return template is not None and "tools" in template


def request_adapt(path: str, body: dict[str, Any], *, template: str | None) -> list[dict[str, str]]:
    """What of ``body`` (a completion request for ``path``) the host cannot honour, as
    ``coevo_degraded`` entries; ``body`` is changed where the host honours a part by
    translating it. Refused (400, naming the field) for a request it cannot serve."""
    degraded: list[dict[str, str]] = []
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 1:
        degraded.append(
            {
                "field": "n",
                "why": f"one choice came back, not n={n}: llama-cpp-python's server answers "
                "one choice per request",
            }
        )
    if path != "/v1/chat/completions":
        return degraded
    _response_format_adapt(body)
    tools = body.get("tools")
    choice = body.get("tool_choice")
    named = _named_tool(choice)
    if named is not None and not any(
        isinstance(tool, dict) and (tool.get("function") or {}).get("name") == named
        for tool in tools or []
    ):
        raise Refused(
            400,
            f"tool_choice names the function `{named}`, which is not among the request's tools.",
            param="tool_choice",
        )
    if not tools or choice == "none":
        return degraded
    forced = ""
    if named is not None:
        forced = (
            f"; the named tool_choice was honoured: the reply is a call to `{named}` whose "
            "arguments a grammar kept to its parameters"
        )
    if template is None:
        why = (
            "tools were not passed to the model: its GGUF has no chat template, and "
            "llama-cpp-python's fallback format (llama-2) has no place for tools"
        )
        degraded.append({"field": "tools", "why": why + forced})
    elif not template_renders_tools(template):
        why = (
            "tools were not passed to the model: its chat template (the GGUF's "
            "tokenizer.chat_template) has no place for tools, so the prompt holds only the "
            "messages"
        )
        degraded.append({"field": "tools", "why": why + forced})
    elif named is None:
        why = (
            "tool calls were not parsed back: the model saw the tools (its chat template "
            "renders them), but llama-cpp-python does not parse a call out of the model's "
            "text, which comes back as content"
        )
        degraded.append({"field": "tools", "why": why})
    if choice == "required":
        degraded.append(
            {
                "field": "tool_choice",
                "why": 'tool_choice "required" was not enforced: llama-cpp-python forces a '
                'call only for a named function ({"type": "function", "function": {"name": '
                "…}})",
            }
        )
    return degraded


def _named_tool(choice: Any) -> str | None:
    if not isinstance(choice, dict):
        return None
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def _response_format_adapt(body: dict[str, Any]) -> None:
    """OpenAI's ``json_schema`` as llama-cpp-python's ``json_object`` with a schema (the same
    grammar-constrained reply); ``text`` and ``json_object`` as they are."""
    fmt = body.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict):
            body["response_format"] = {"type": "json_object", "schema": schema}
            return
        raise Refused(
            400,
            'response_format {"type": "json_schema"} needs json_schema.schema, a JSON schema '
            "object.",
            param="response_format",
        )
    raise Refused(
        400,
        f"response_format type {str(kind)[:50]!r} is not served here: send text, json_object "
        "or json_schema.",
        param="response_format",
    )

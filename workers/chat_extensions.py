"""Anthropic's keys that ride on a chat request: prompt-cache markers and a tool error flag.

Anthropic's Messages API takes a ``cache_control`` marker on a tool, a system text block or a
message's content block: the prompt up to and including that block is a cache breakpoint,
written to Anthropic's prompt cache the first time (priced at the cache-write price) and read
from it by a later request that starts the same way (at the cached-input price). Harnesses
built on Anthropic's SDKs (Claude Code) mark their long system prompt and tools so. A
``tool_result`` block's ``is_error`` tells the model that the tool failed.

The policy client speaks OpenAI's chat vocabulary to every endpoint kind, so between the
boundary's Messages route (workers/anthropic_messages.py) and an ``anthropic`` endpoint
(coevo/policies/anthropic_api.py) these keys ride where OpenAI-compatible gateways (LiteLLM's)
carry them:

- ``cache_control`` on a chat content part (``{"type": "text", "text": …, "cache_control":
  …}``; a system prompt with markers is a system message of text parts), on a function tool
  (beside ``type`` and ``function``), on an assistant's tool call (its ``tool_use`` block), and
  on a message itself for the message's last block (a ``tool`` message's ``tool_result``);
- ``is_error: true`` on a ``tool`` message.

Only a kind whose request table takes them (``anthropic``) gets them; every other kind's
request has them taken out (``chat_without``), each key named once among the call's dropped
keys: OpenAI's API refuses keys it does not know inside a message as at the top level. A
message that loses its markers is sent as it would have been without them (llama-cpp-python's
server refuses a system message that is not one string).
"""

from __future__ import annotations

from typing import Any

from workers.openai_requests import BadRequest

CACHE_CONTROL = "cache_control"
IS_ERROR = "is_error"
KEYS = frozenset({CACHE_CONTROL, IS_ERROR})
# Anthropic's limit on one request's cache breakpoints (it refuses a fifth).
MAX_BREAKPOINTS = 4
# A marker's lifetimes: Anthropic's default of five minutes, or an hour (dearer to write).
TTLS = ("5m", "1h")

# A message whose markers are taken out is sent as it would have been without them: its text
# parts as one string, joined as the boundary joins that role's blocks (a system prompt's
# blocks by a blank line, an assistant's text as one run); a user's several parts stay parts.
_JOINERS = {"system": "\n\n", "developer": "\n\n", "assistant": ""}


def marker(value: Any, *, where: str) -> dict[str, str]:
    """A ``cache_control`` marker as Anthropic takes it, ``{"type": "ephemeral"}`` with an
    optional ``ttl`` of "5m" or "1h"; BadRequest (Anthropic's 400) for anything else."""
    if (
        not isinstance(value, dict)
        or value.get("type") != "ephemeral"
        or not set(value) <= {"type", "ttl"}
        or ("ttl" in value and value["ttl"] not in TTLS)
    ):
        raise BadRequest(
            f"{where}.cache_control must be {{'type': 'ephemeral'}}, with an optional 'ttl' of "
            f"{' or '.join(repr(t) for t in TTLS)} (Anthropic's prompt caching).",
            param=f"{where}.cache_control",
        )
    return {"type": "ephemeral", **({"ttl": value["ttl"]} if "ttl" in value else {})}


def marked(source: dict[str, Any], target: dict[str, Any], *, where: str) -> dict[str, Any]:
    """``target`` with ``source``'s ``cache_control`` marker on it (checked), where it has one."""
    if source.get(CACHE_CONTROL) is not None:
        target[CACHE_CONTROL] = marker(source[CACHE_CONTROL], where=where)
    return target


def error_flag(value: Any, *, where: str) -> bool:
    """A tool result's ``is_error`` (absent: False); BadRequest for one that is not a bool."""
    if value is None or isinstance(value, bool):
        return bool(value)
    raise BadRequest(f"{where}.is_error must be true or false.", param=f"{where}.is_error")


def breakpoints_check(chat: dict[str, Any]) -> None:
    """BadRequest for a chat request with more cache breakpoints than Anthropic allows, in its
    words."""
    found = breakpoints_count(chat)
    if found > MAX_BREAKPOINTS:
        raise BadRequest(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}.",
            param=CACHE_CONTROL,
        )


def breakpoints_count(chat: dict[str, Any]) -> int:
    """The ``cache_control`` markers a chat request carries, wherever they ride."""
    return sum(1 for holder in _holders(chat) if holder.get(CACHE_CONTROL) is not None)


def chat_without(chat: dict[str, Any], *, kept: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    """``chat`` without the keys of ``KEYS`` not in ``kept`` (a copy where any is taken out), and
    the keys taken out, sorted."""
    gone = KEYS - kept
    if not gone or not any(key in holder for holder in _holders(chat) for key in gone):
        return chat, []
    taken: set[str] = set()

    def without(holder: dict[str, Any]) -> dict[str, Any]:
        taken.update(key for key in gone if key in holder)
        return {key: value for key, value in holder.items() if key not in gone}

    out = dict(chat)
    if isinstance(chat.get("tools"), list):
        out["tools"] = [without(t) if isinstance(t, dict) else t for t in chat["tools"]]
    messages = []
    for message in _list(chat.get("messages")):
        if not isinstance(message, dict):
            messages.append(message)
            continue
        said = without(message)
        content = said.get("content")
        if isinstance(content, list):
            parts = [without(p) if isinstance(p, dict) else p for p in content]
            stripped = any(isinstance(p, dict) and not gone.isdisjoint(p) for p in content)
            said["content"] = _unparted(said.get("role"), parts) if stripped else parts
        if isinstance(said.get("tool_calls"), list):
            said["tool_calls"] = [
                without(c) if isinstance(c, dict) else c for c in said["tool_calls"]
            ]
        messages.append(said)
    if isinstance(chat.get("messages"), list):
        out["messages"] = messages
    return out, sorted(taken)


def _unparted(role: Any, parts: list[Any]) -> Any:
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) != len(parts) or not all(isinstance(t, str) for t in texts):
        return parts
    if role in _JOINERS:
        return _JOINERS[role].join(texts)
    return texts[0] if len(texts) == 1 else parts


def _holders(chat: dict[str, Any]) -> list[dict[str, Any]]:
    """Everything in a chat request that may carry one of ``KEYS``: tools, messages, their
    content parts and tool calls."""
    found = [t for t in _list(chat.get("tools")) if isinstance(t, dict)]
    for message in _list(chat.get("messages")):
        if not isinstance(message, dict):
            continue
        found.append(message)
        found += [p for p in _list(message.get("content")) if isinstance(p, dict)]
        found += [c for c in _list(message.get("tool_calls")) if isinstance(c, dict)]
    return found


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []

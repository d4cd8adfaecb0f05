"""Parsing what the harness sends: each call's parameters checked before anything is done with
them, and its log and error messages bounded before they enter the trace.

A bad parameter ends the rollout as a harness_error (InvalidCall) whose message names the call
and the field; a malformed call is a ProtocolViolation.
"""

from __future__ import annotations

import json
from typing import Any

from workers.outcomes import InvalidCall, ProtocolViolation
from workers.policy import Sampling

MAX_SAMPLES = 16
MAX_STOPS = 16
MAX_ACTION_CHARS = 4000
MAX_LOG_CHARS = 10000
MAX_FRAMES = 50
CHAT_ROLES = ("system", "user", "assistant")


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


def log_payload(message: dict[str, Any]) -> dict[str, Any]:
    payload: dict[str, Any] = {"message": str(message.get("message", ""))[:MAX_LOG_CHARS]}
    fields = message.get("fields")
    if isinstance(fields, dict) and fields:
        text = json.dumps(fields)
        payload["fields"] = fields if len(text) <= MAX_LOG_CHARS else {"truncated": text[:2000]}
    return payload


def exception_payload(message: dict[str, Any]) -> dict[str, Any]:
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
    return {
        "error": str(message.get("error", ""))[:2000],
        "traceback": str(message.get("traceback") or "")[-8000:],
        "frames": frames,
    }


def parse_prompt(params: dict[str, Any], name: str) -> str:
    prompt = params.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidCall(f"{name}: prompt must be a string, got {type(prompt).__name__}")
    return prompt


def parse_messages(params: dict[str, Any], name: str) -> list[dict[str, str]]:
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidCall(f"{name}: messages must be a non-empty list of {{role, content}}")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidCall(f"{name}: messages[{i}] must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise InvalidCall(
                f"{name}: messages[{i}].role must be one of {', '.join(CHAT_ROLES)}, got {role!r}"
            )
        if not isinstance(content, str):
            raise InvalidCall(
                f"{name}: messages[{i}].content must be a string, got {type(content).__name__}"
            )
        extra = set(message) - {"role", "content"}
        if extra:
            raise InvalidCall(f"{name}: messages[{i}] has unknown keys {sorted(extra)}")
        parsed.append({"role": role, "content": content})
    return parsed


def parse_sampling(params: dict[str, Any], name: str, *, default_seed: int) -> tuple[Sampling, int]:
    """Sampling parameters, each checked; a bad one ends the rollout naming the call and field."""
    known = {"prompt", "messages", "max_tokens", "temperature", "top_p", "stop", "n", "seed"}
    unknown = set(params) - known
    if unknown:
        raise InvalidCall(f"{name}: unknown parameters {sorted(unknown)}")

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

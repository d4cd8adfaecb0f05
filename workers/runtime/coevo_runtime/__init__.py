"""The coevo harness runtime: what harness code sees as ``ctx``.

It runs inside the sandbox, so it has no third-party dependencies and no access to anything
but its stdin and stdout, over which it speaks JSON lines with the worker. Every model call,
environment step and helper runs on the worker (which records it and enforces the manifest's
limits); this side only asks. A request the worker refuses (a limit, a malformed parameter, a
call the suite does not offer) ends the rollout as a ``harness_error``: the worker stops this
process, so harness code never sees such a refusal as an exception it could swallow.

``ctx`` offers:

- ``ctx.llm.complete(prompt, **sampling)`` (manifest ``policy_api = "completions"``) and
  ``ctx.llm.chat(messages, **sampling)`` (``policy_api = "chat"``); sampling is ``max_tokens``,
  ``temperature``, ``top_p``, ``stop``, ``n`` (samples: each one is a recorded model call) and
  ``seed``. Both return a ``Completion`` (``.text``, ``.texts``, ``.finish_reasons``, tokens).
- Tool calling: ``ctx.llm.chat(messages, tools=[...], tool_choice=..., response_format=...)``
  takes OpenAI's shapes (``tools``: at most 128 ``{"type": "function", "function": {"name",
  "description", "parameters"}}``; ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or
  ``{"type": "function", "function": {"name": ...}}``). The model only asks: its calls come back
  as ``Completion.tool_calls`` (``ToolCall``: ``.id``, ``.name``, ``.arguments``, the JSON text as
  the model wrote it, and ``.parsed_arguments()``), and the tools are harness code, run here in
  the sandbox. Send the results back in the next call: ``messages + [reply.message]`` (the
  assistant message with its tool calls) and one ``call.tool_message(result)`` per call
  (``{"role": "tool", "tool_call_id": ..., "content": ...}``); then the model answers or calls
  again. Every call, with its tools and tool calls, is in the trace.
- ``ctx.env.reset()`` / ``ctx.env.step(action)`` on multi-step suites (``bool(ctx.env)`` is
  False elsewhere); ``step`` returns ``{"observation": {...}, "reward": float, "done": bool}``.
- ``ctx.knobs`` (the manifest's defaults overridden by the evaluation), ``ctx.limits``.
- ``ctx.log(*parts, **fields)``: a line (and JSON-able fields) in the trace.
- ``ctx.helpers`` (names the suite offers), ``ctx.helper(name, **params)``, and shorthands such as
  ``ctx.check(completion)`` on HumanEval (the prompt's own visible examples, never the hidden tests).
- Workspace tasks: ``ctx.workspace`` is the directory to work in (``/app``, writable; None on
  other suites), and ``ctx.shell(command, timeout_s=60)`` runs a shell command there in a
  sandbox of its own, recorded in the trace: ``{"exit_code", "stdout", "stderr", "timed_out",
  "duration_ms"}``. The harness may also edit files and run commands itself (they are not in
  the trace); hidden tests judge what the workspace holds when ``run`` returns.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO

PROTOCOL_VERSION = 2


class HarnessRuntimeError(Exception):
    """The worker answered a request with an error."""


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asks the harness to run; ``arguments`` is the JSON text it wrote."""

    id: str
    name: str
    arguments: str

    def parsed_arguments(self) -> Any:
        """``arguments`` parsed; ValueError (naming the tool) when the model wrote no JSON."""
        try:
            return json.loads(self.arguments or "{}")
        except ValueError:
            raise ValueError(
                f"the model's arguments for tool {self.name!r} are not JSON: "
                f"{self.arguments[:200]!r}"
            ) from None

    def tool_message(self, content: Any) -> dict[str, Any]:
        """The message that answers this call (``content`` not a string is sent as JSON)."""
        text = content if isinstance(content, str) else json.dumps(content, default=repr)
        return {"role": "tool", "tool_call_id": self.id, "content": text}

    def as_dict(self) -> dict[str, Any]:
        """As an assistant message's ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Completion:
    """The answer to ``ctx.llm.complete`` / ``ctx.llm.chat``: one text (and, for chat with
    tools, one list of tool calls) per sample; ``.text`` and ``.tool_calls`` are the first's."""

    texts: list[str]
    finish_reasons: list[str | None] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    tool_calls_by_sample: list[list[ToolCall]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.texts[0] if self.texts else ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.tool_calls_by_sample[0] if self.tool_calls_by_sample else []

    @property
    def message(self) -> dict[str, Any]:
        """The first sample as the assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [call.as_dict() for call in self.tool_calls]
        return message

    @classmethod
    def from_result(cls, result: dict[str, Any]) -> Completion:
        result = dict(result)
        samples = result.pop("tool_calls", None) or []
        return cls(
            **result,
            tool_calls_by_sample=[[ToolCall(**call) for call in sample] for sample in samples],
        )


class Channel:
    """JSON lines over the process's stdin/stdout (the only way out of the sandbox)."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO) -> None:
        self._reader = reader
        self._writer = writer
        self._next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        self._writer.write(json.dumps(message, ensure_ascii=False).encode() + b"\n")
        self._writer.flush()

    def receive(self) -> dict[str, Any]:
        line = self._reader.readline()
        if not line:
            raise SystemExit("coevo runtime: the worker closed the channel")
        return json.loads(line)

    def start(self) -> dict[str, Any] | None:
        """Wait for the worker's ``start`` message and answer ``ready``; None (the worker told
        why) when the first message is something else."""
        start = self.receive()
        if start.get("type") != "start":
            self.send({"type": "error", "error": f"expected a start message, got {start!r}"})
            return None
        self.send({"type": "ready", "protocol": PROTOCOL_VERSION})
        return start

    def call(self, method: str, params: dict[str, Any]) -> Any:
        self._next_id += 1
        self.send({"type": "call", "id": self._next_id, "method": method, "params": params})
        reply = self.receive()
        if reply.get("type") != "reply" or reply.get("id") != self._next_id:
            raise HarnessRuntimeError(f"unexpected reply from the worker: {reply!r}")
        if "error" in reply:
            raise HarnessRuntimeError(reply["error"])
        return reply["result"]


class LLM:
    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def complete(
        self,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | str | None = None,
        n: int = 1,
        seed: int | None = None,
    ) -> Completion:
        """Ask the policy to continue ``prompt``; ``n`` samples are ``n`` recorded calls."""
        params = _sampling(max_tokens, temperature, top_p, stop, n, seed)
        return Completion.from_result(
            self._channel.call("llm.complete", {"prompt": prompt, **params})
        )

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: list[str] | str | None = None,
        n: int = 1,
        seed: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        response_format: dict[str, Any] | None = None,
    ) -> Completion:
        """Ask the policy for the next assistant message after ``messages``
        (``[{"role": "system"|"user"|"assistant", "content": str}, ...]``, and with tools the
        assistant's ``tool_calls`` and ``{"role": "tool", "tool_call_id", "content"}``).
        ``tools``, ``tool_choice`` and ``response_format`` are OpenAI's (see the module doc)."""
        params = _sampling(max_tokens, temperature, top_p, stop, n, seed)
        for key, value in (
            ("tools", tools),
            ("tool_choice", tool_choice),
            ("response_format", response_format),
        ):
            if value is not None:
                params[key] = value
        return Completion.from_result(
            self._channel.call("llm.chat", {"messages": messages, **params})
        )


class Env:
    """The environment of a multi-step suite; falsy (and refused by the worker) elsewhere."""

    def __init__(self, channel: Channel, *, available: bool) -> None:
        self._channel = channel
        self.available = available

    def __bool__(self) -> bool:
        return self.available

    def reset(self) -> dict[str, Any]:
        """Start the episode; returns the first observation payload."""
        return self._channel.call("env.reset", {})

    def step(self, action: str) -> dict[str, Any]:
        """Act; returns ``{"observation": {...}, "reward": float, "done": bool}``."""
        return self._channel.call("env.step", {"action": action})


class Context:
    """What ``run(task, ctx)`` receives."""

    def __init__(
        self,
        channel: Channel,
        knobs: dict[str, Any],
        *,
        limits: dict[str, Any] | None = None,
        multi_step: bool = False,
        helpers: list[str] | tuple[str, ...] = (),
    ) -> None:
        self._channel = channel
        self.llm = LLM(channel)
        self.env = Env(channel, available=multi_step)
        self.knobs = dict(knobs)
        self.limits = dict(limits or {})
        self.helpers = tuple(helpers)
        self.workspace: str | None = os.environ.get("COEVO_WORKSPACE") or None

    def log(self, *parts: Any, **fields: Any) -> None:
        """Record a line in the trace (stdout is the protocol channel: do not print to it)."""
        message: dict[str, Any] = {"type": "log", "message": " ".join(str(p) for p in parts)}
        if fields:
            message["fields"] = json.loads(json.dumps(fields, default=repr))
        self._channel.send(message)

    def helper(self, name: str, **params: Any) -> dict[str, Any]:
        """Call a helper the suite offers (see ``ctx.helpers``); it runs on the worker side."""
        return self._channel.call(f"helper.{name}", params)

    def check(self, completion: str) -> dict[str, Any]:
        """HumanEval: run ``prompt + completion`` against the prompt's visible ``>>>`` examples.

        Returns ``{"passed", "examples", "failed", "output", "timed_out"}``.
        """
        return self.helper("check", completion=completion)

    def shell(self, command: str | list[str], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Workspace tasks: run ``command`` (a shell string or an argv list) in the workspace.

        Returns ``{"exit_code", "stdout", "stderr", "timed_out", "duration_ms"}``; each command
        counts as one step against the manifest's ``max_steps``.
        """
        params: dict[str, Any] = {"command": command}
        if timeout_s is not None:
            params["timeout_s"] = timeout_s
        return self.helper("exec", **params)


def _sampling(
    max_tokens: Any, temperature: Any, top_p: Any, stop: Any, n: Any, seed: Any
) -> dict[str, Any]:
    if isinstance(stop, str):
        stop = [stop]
    return {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stop": list(stop) if isinstance(stop, list | tuple) else stop or [],
        "n": n,
        "seed": seed,
    }

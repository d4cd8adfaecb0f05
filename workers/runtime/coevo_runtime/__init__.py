"""The coevo harness runtime: what harness code sees as ``ctx``.

It runs inside the sandbox, so it has no third-party dependencies and no access to anything
but its stdin and stdout, over which it speaks JSON lines with the worker. Every model call is
made by the worker (which records it and enforces the limits); this side only asks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO

PROTOCOL_VERSION = 1


class HarnessRuntimeError(Exception):
    """The worker refused a request (for example a limit was reached)."""


@dataclass(frozen=True)
class Completion:
    """The answer to ``ctx.llm.complete``: ``texts`` holds one string per sample."""

    texts: list[str]
    finish_reasons: list[str | None] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def text(self) -> str:
        return self.texts[0] if self.texts else ""


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
        stop: list[str] | None = None,
        n: int = 1,
        seed: int | None = None,
    ) -> Completion:
        """Ask the policy to continue ``prompt``; ``n`` samples are ``n`` recorded calls."""
        result = self._channel.call(
            "llm.complete",
            {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop": list(stop or []),
                "n": n,
                "seed": seed,
            },
        )
        return Completion(**result)


class Context:
    """What ``run(task, ctx)`` receives."""

    def __init__(self, channel: Channel, knobs: dict[str, Any]) -> None:
        self._channel = channel
        self.llm = LLM(channel)
        self.knobs = dict(knobs)

    def log(self, *parts: Any) -> None:
        """Record a line in the trace (stdout is the protocol channel: do not print to it)."""
        self._channel.send({"type": "log", "message": " ".join(str(p) for p in parts)})

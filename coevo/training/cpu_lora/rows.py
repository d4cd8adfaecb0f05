"""A trajectory export read into token sequences to train on (plain Python: no torch here).

The export's rows (docs/training.md, "The trainer contract"; coevo/exports/records.py):

- chat: ``{"messages": [..., {"role": "assistant", "content", "weight"}], "weight", ...}``: the
  last message is the model turn the row teaches, the messages before it are its prompt; a
  completions call's prompt is one user message.
- prompt_completion: ``{"prompt": text or messages, "completion": text or [assistant
  message], "weight", ...}``: a completions call keeps its raw text prompt.

Rows with weight 0 (turns of failed rollouts, or before ``last_turns``) are dropped: supervised
fine-tuning has no use for negatives. So are rows longer than the maximum length (truncating one
would cut off the very turn it teaches), rows whose reply is a tool call (this trainer learns
text), and conversations when there is no chat template to render them. Every drop is counted.

The example TRL trainer (examples/trainers/trl_sft_lora.py) reads exports with ``rows_read``
too, before it checks its own libraries: keep this module free of torch and transformers.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# An export line is one model call; a line past this is not one coevo wrote.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Reasons a row is dropped (RowCounts.dropped), shared with the example TRL trainer.
DROP_TOOL_CALL = "with a tool call (this trainer learns text replies)"
DROP_SEVERAL_MESSAGES = "with several prompt messages (--prompt-style plain trains raw text)"


def drop_too_long(max_length: int) -> str:
    return f"longer than --max-length {max_length} tokens"


class BadInput(Exception):
    """The export or the options cannot be trained on (exit status 2)."""


class Tokens(Protocol):
    """What the rows need of a tokenizer (coevo.training.cpu_lora.model wraps Hugging Face's)."""

    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, adding no special token of its own."""
        ...

    def chat(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str | None:
        """``messages`` rendered by the chat template; None when there is none."""
        ...


@dataclass(frozen=True)
class Example:
    """One model turn to learn: ``prompt`` is text, or a list of ``{"role", "content"}``."""

    prompt: str | list[dict[str, str]]
    completion: str
    tool_call: bool = False  # the reply called a tool: not text this trainer can learn


@dataclass(frozen=True)
class Sequence:
    """A row's tokens; the loss covers ``ids[prompt_tokens:]`` (the model turn) only."""

    ids: list[int]
    prompt_tokens: int


@dataclass
class RowCounts:
    rows: int = 0
    zero_weight: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> rows

    def used(self, sequences: int) -> str:
        parts = [f"{self.zero_weight} with weight 0"] if self.zero_weight else []
        parts += [f"{n} {reason}" for reason, n in sorted(self.dropped.items())]
        return f"training on {sequences} of {self.rows} row(s)" + (
            f"; dropped {', '.join(parts)}" if parts else ""
        )


def _text(content: Any) -> str:
    """A message's content as text (OpenAI content parts are joined)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _messages(raw: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise BadInput(f"{where}: expected a list of messages")
    # Role and content only: a turn's "weight" is coevo's, not the chat template's.
    return [{"role": str(m.get("role", "")), "content": _text(m.get("content"))} for m in raw]


def _weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"{where}: weight must be a number, not {value!r}")
    return float(value)


def _example(row: dict[str, Any], fmt: str, where: str) -> tuple[Example, float]:
    if fmt == "chat":
        messages = row.get("messages")
        if messages is None:
            raise BadInput(
                f"{where}: a chat row needs 'messages' (is the export prompt_completion?)"
            )
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            raise BadInput(f"{where}: 'messages' must end with the assistant turn")
        reply = messages[-1]
        if reply.get("role") != "assistant":
            raise BadInput(f"{where}: the last message is {reply.get('role')!r}, not assistant")
        weight = _weight(reply.get("weight", row.get("weight", 1)), where)
        example = Example(
            _messages(messages[:-1], where),
            _text(reply.get("content")),
            tool_call=bool(reply.get("tool_calls")),
        )
        return example, weight
    if "prompt" not in row or "completion" not in row:
        raise BadInput(
            f"{where}: a prompt_completion row needs 'prompt' and 'completion' (is the export chat?)"
        )
    weight = _weight(row.get("weight", 1), where)
    prompt, completion, tool_call = row["prompt"], row["completion"], False
    if isinstance(completion, list):  # conversational: [assistant message]
        if not completion or not isinstance(completion[-1], dict):
            raise BadInput(f"{where}: a list 'completion' must end with the assistant message")
        last = completion[-1]
        completion, tool_call = _text(last.get("content")), bool(last.get("tool_calls"))
    if isinstance(prompt, list):
        return Example(_messages(prompt, where), _text(completion), tool_call), weight
    return Example(_text(prompt), _text(completion), tool_call), weight


def rows_read(path: Path, fmt: str) -> tuple[list[Example], RowCounts]:
    """The export's rows with a positive weight. Raises BadInput when none is left."""
    if not path.is_file():
        raise BadInput(f"the export {path} does not exist")
    counts = RowCounts()
    examples: list[Example] = []
    with path.open("rb") as lines:
        for number, line in enumerate(iter(lambda: lines.readline(MAX_LINE_BYTES + 1), b""), 1):
            where = f"{path.name} line {number}"
            if len(line) > MAX_LINE_BYTES:
                raise BadInput(f"{where}: longer than {MAX_LINE_BYTES} bytes")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise BadInput(f"{where}: not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise BadInput(f"{where}: expected a JSON object")
            counts.rows += 1
            example, weight = _example(row, fmt, where)
            if weight <= 0:
                counts.zero_weight += 1
            else:
                examples.append(example)
    if counts.rows == 0:
        raise BadInput(f"the export {path} holds no rows")
    if not examples:
        raise BadInput(
            f"none of the export's {counts.rows} row(s) has a positive weight: there is nothing "
            "to imitate (a campaign's export keeps only successful rollouts by default)"
        )
    return examples, counts


def _style(example: Example, requested: str) -> str:
    if requested != "auto":
        return requested
    prompt = example.prompt
    if isinstance(prompt, str) or (len(prompt) == 1 and prompt[0]["role"] == "user"):
        # How coevo exports a completions call in the chat format, and how a base model (the
        # shipped Gemma 3 270M) is called: raw text.
        return "plain"
    return "chat"


def _sequence(example: Example, style: str, tokens: Tokens) -> Sequence | str:
    """The example's tokens, or why it cannot be trained on in ``style``."""
    prompt = example.prompt
    if style == "plain":
        if isinstance(prompt, list):
            if len(prompt) != 1 or prompt[0]["role"] != "user":
                return DROP_SEVERAL_MESSAGES
            prompt = prompt[0]["content"]
        head = ([tokens.bos_id] if tokens.bos_id is not None else []) + tokens.encode(prompt)
        tail = tokens.encode(example.completion)
        # The model learns to stop where the policy stopped.
        tail += [tokens.eos_id] if tokens.eos_id is not None else []
        return Sequence(head + tail, len(head))
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    start = tokens.chat(messages, generation_prompt=True)
    whole = tokens.chat(
        [*messages, {"role": "assistant", "content": example.completion}], generation_prompt=False
    )
    if start is None or whole is None:
        return "with a conversation, and the tokenizer has no chat template to render it"
    if not whole.startswith(start):
        return "whose chat rendering does not extend its prompt's"
    # The template writes the special tokens (BOS, end of turn) itself.
    head = tokens.encode(start)
    return Sequence(head + tokens.encode(whole[len(start) :]), len(head))


def rows_encode(
    examples: list[Example],
    *,
    tokens: Tokens,
    max_length: int,
    prompt_style: str,
    counts: RowCounts,
) -> list[Sequence]:
    """Token sequences of the examples that fit; each drop is counted in ``counts.dropped``."""
    sequences = []
    for example in examples:
        if example.tool_call:
            counts.dropped[DROP_TOOL_CALL] += 1
            continue
        sequence = _sequence(example, _style(example, prompt_style), tokens)
        if isinstance(sequence, str):
            counts.dropped[sequence] += 1
        elif len(sequence.ids) > max_length:
            counts.dropped[drop_too_long(max_length)] += 1
        elif len(sequence.ids) <= max(sequence.prompt_tokens, 1):
            counts.dropped["with nothing to learn (no token after the prompt)"] += 1
        else:
            sequences.append(sequence)
    if not sequences:
        raise BadInput(f"no row is left to train on ({counts.used(0)})")
    return sequences

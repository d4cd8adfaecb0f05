"""Fitting an llm-patch workspace into the proposer model's context window.

A prompt longer than the context minus the answer's ``max_tokens`` is refused by the server
(llama.cpp: ``context_length_exceeded``), which wastes a proposal on nothing. So the window is
learned first (the server's own figure where it gives one, else the campaign's
``context_tokens`` option, else the COEVO_PROPOSER_CONTEXT_TOKENS setting; the smallest of the
server's and the option's when both are known), the answer and a margin are reserved, and the
workspace is rebuilt smaller until the server's tokenizer (or, without one, a conservative
estimate) says it fits. The workspace drops its least useful material first
(coevo.campaigns.workspace.TRIM_ORDER); one that cannot fit even at its minimum is refused
before any request, with the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coevo.campaigns.workspace import ProposerPrompt

# Code and traces run about 3-4 characters a token in the tokenizers of Gemma, Llama and Qwen;
# the low end, so an estimate errs towards a shorter prompt, never a refused one.
CHARS_PER_TOKEN_ESTIMATE = 3.0
# Chat templates add their role markers, and a tokenizer counted on text may differ from the
# prompt's by a token or two at the seams: the margin covers both.
MIN_MARGIN_TOKENS = 32
MIN_PROMPT_TOKENS = 256
MAX_FIT_ROUNDS = 4
CONTEXT_SOURCES = ("server", "option", "setting")


@dataclass(frozen=True)
class ContextWindow:
    tokens: int | None  # None: unknown (only workspace_chars bounds the prompt)
    source: str  # one of CONTEXT_SOURCES, or "unknown"


class PromptTooLarge(Exception):
    """The workspace cannot fit the context; ``str(exc)`` says why, with the numbers."""

    def __init__(self, message: str, *, workspace: ProposerPrompt, record: dict[str, Any]) -> None:
        super().__init__(message)
        self.workspace = workspace
        self.record = record


def context_window_resolve(
    *, server_tokens: int | None, option_tokens: int | None, setting_tokens: int
) -> ContextWindow:
    """The context window to fit: the server's and the option's smaller (an option below the
    server's caps the prompt's cost), else the setting's (0: unknown)."""
    known = [(t, s) for t, s in ((server_tokens, "server"), (option_tokens, "option")) if t]
    if known:
        tokens, source = min(known)
        return ContextWindow(tokens, source)
    if setting_tokens > 0:
        return ContextWindow(setting_tokens, "setting")
    return ContextWindow(None, "unknown")


def workspace_fit(
    *,
    build: Callable[[int], ProposerPrompt],
    budget_chars: int,
    window: ContextWindow,
    max_tokens: int,
    count: Callable[[str], int | None],
) -> tuple[ProposerPrompt, dict[str, Any]]:
    """The largest workspace (at most ``budget_chars``) whose prompt leaves ``max_tokens`` and
    a margin free in ``window``, and the record of how it was fitted (``Proposal.params``'s
    ``context``). ``build(chars)`` builds a workspace of about that many characters; ``count``
    is the server's tokenizer (None where it has none). Raises PromptTooLarge."""
    record: dict[str, Any] = {
        "window_tokens": window.tokens,
        "source": window.source,
        "max_tokens": max_tokens,
    }
    if window.tokens is None:
        workspace = build(budget_chars)
        return workspace, {**record, "budget_chars": budget_chars, "counted_by": None}
    margin = max(MIN_MARGIN_TOKENS, window.tokens // 50)
    room = window.tokens - max_tokens - margin
    record.update(margin_tokens=margin, prompt_budget_tokens=room)
    if room < MIN_PROMPT_TOKENS:
        workspace = build(budget_chars)
        raise PromptTooLarge(
            f"max_tokens {max_tokens:,} leaves {max(room, 0):,} tokens of the proposer's "
            f"{window.tokens:,}-token context ({_source(window)}) for the prompt, less than the "
            f"{MIN_PROMPT_TOKENS} any workspace needs: lower max_tokens. No request was sent.",
            workspace=workspace,
            record=record,
        )
    chars = min(budget_chars, int(room * CHARS_PER_TOKEN_ESTIMATE))
    best: tuple[ProposerPrompt, int, bool] | None = None
    for _ in range(MAX_FIT_ROUNDS):
        workspace = build(chars)
        counted = count(workspace.text)
        tokens = counted if counted is not None else _estimate(workspace.text)
        fits = tokens <= room
        if fits:
            if best is None or len(workspace.text) > len(best[0].text):
                best = (workspace, tokens, counted is not None)
            # An estimate is as good as it gets; a count this close is good enough.
            if counted is None or chars >= budget_chars or tokens >= 0.95 * room:
                break
        elif chars <= workspace.shown["minimum_chars"]:
            break  # nothing left to trim
        # Scale by what the count said, a little under so the next round fits.
        chars = int(len(workspace.text) * room / max(tokens, 1) * 0.97)
        chars = min(budget_chars, max(chars, workspace.shown["minimum_chars"]))
    if best is None:
        record.update(
            prompt_tokens=tokens,
            counted_by="server tokenizer" if counted is not None else "estimate",
            budget_chars=chars,
        )
        raise PromptTooLarge(
            "the workspace cannot fit the proposer's context: at its smallest (the "
            f"instructions, the manifest and the parent's editable files: "
            f"{workspace.shown['minimum_chars']:,} characters) it is {tokens:,} tokens "
            f"({_counted_by(counted)}), more than the {room:,} left of the "
            f"{window.tokens:,}-token context ({_source(window)}) after max_tokens "
            f"{max_tokens:,} and a margin of {margin}. Lower max_tokens, choose a proposer "
            "model with a longer context (or set context_tokens if the server's is longer), or "
            "declare fewer or smaller components. No request was sent.",
            workspace=workspace,
            record=record,
        )
    workspace, tokens, was_counted = best
    record.update(
        prompt_tokens=tokens,
        counted_by="server tokenizer" if was_counted else "estimate",
        budget_chars=workspace.shown["budget_chars"],
    )
    return workspace, record


def _estimate(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)


def _counted_by(counted: int | None) -> str:
    return "by the server's tokenizer" if counted is not None else "estimated"


def _source(window: ContextWindow) -> str:
    return {
        "server": "as the server reports it",
        "option": "the context_tokens option",
        "setting": "COEVO_PROPOSER_CONTEXT_TOKENS, as the server does not report one",
    }.get(window.source, window.source)

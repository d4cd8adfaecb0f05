"""The JSONL lines of an export: one line per model reply of each selected rollout.

Chat format: ``{"messages": [...the call's messages (or the prompt as one user message)...,
{"role": "assistant", "content": reply, "weight": w}], "weight": w, "provenance": {...}}``.
Prompt/completion format: ``{"prompt": text or messages, "completion": text or
[assistant message], "weight": w, "provenance": {...}}``. A call that offered tools adds
``"tools"`` (its function schemas), and its messages and reply carry tool calls and tool
results as TRL's SFT trainer reads them (coevo/exports/conversation.py).

One line per call, and per choice when a program's call asked for several (``n``): each line
ends in exactly one reply the policy produced, as the worker received it. Lines are not one
per leaf of a session's call tree (workers/program.py): the assistant turns inside a later
call's messages are the program's copies of earlier replies, which it may have edited,
truncated or summarised (the reason interface records are rebuilt into trees at all), and a
choice the program did not continue would be lost. The tree is in each boundary line's
provenance (``call``, ``session``, ``parent``, ``relation``, ``choice``), so a trainer can
keep leaves only; the prompt/completion format learns each reply once.

Weights: 1 for the model turns of successful (passed) rollouts, 0 for every other rollout's
turns (kept, so a trainer can use them as negatives or drop them; ``successful_only`` drops
them here). With ``last_turns`` N, turns before a rollout's last N get weight 0 as well: in a
multi-step episode the final moves are usually the ones that decided it. A turn is a recorded
call the policy answered (all choices of one call share its turn and weight).

Lines are serialized deterministically (sorted keys, no export id or timestamp), so the same
rollouts always give the same bytes, hence the same content hash.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Max, QuerySet

from coevo.evaluations.models import (
    Rollout,
    TraceStep,
)
from coevo.evaluations.traces import trace_step_payload
from coevo.exports.conversation import (
    Reply,
    call_exportable,
    call_prompt,
    call_prompt_messages,
    call_replies,
    call_tools,
)
from coevo.exports.models import ExportFormat
from coevo.suites.models import Split
from workers.outcomes import RolloutOutcome
from workers.trace import VIA_BOUNDARY, ModelCall, StepKind

EXPORTABLE_OUTCOMES = (
    RolloutOutcome.PASSED,
    RolloutOutcome.TASK_FAILURE,
    RolloutOutcome.HARNESS_ERROR,
)


@dataclass(frozen=True)
class Selection:
    """Which rollouts to read (the resolved filters of one export)."""

    evaluation_ids: list[Any]
    splits: list[str]
    successful_only: bool
    min_score: float | None
    last_turns: int | None


def rollouts_selected(selection: Selection) -> QuerySet[Rollout]:
    """Finished, scored rollouts of the selected evaluations. Infra errors are never exported
    (the policy server failed, not the harness); held-out rollouts are excluded here too, even
    if a held-out evaluation were somehow among the ids: the seal must not depend on callers."""
    splits = [s for s in selection.splits if s != Split.HELDOUT]
    rollouts = Rollout.objects.filter(
        evaluation_id__in=selection.evaluation_ids,
        evaluation__split__in=splits,
        state="done",
        outcome__in=EXPORTABLE_OUTCOMES,
    ).exclude(task__split=Split.HELDOUT)
    # A reused rollout's trace is its source's: never one from the sealed split, whatever an
    # older cache key let through (coevo.evaluations.cache).
    rollouts = rollouts.exclude(reused_from__evaluation__split=Split.HELDOUT)
    if selection.successful_only:
        rollouts = rollouts.filter(outcome=RolloutOutcome.PASSED)
    if selection.min_score is not None:
        rollouts = rollouts.filter(score__gte=selection.min_score)
    return rollouts.select_related(
        "evaluation__candidate", "evaluation__policy_version", "evaluation__suite", "task"
    ).order_by("evaluation__created_at", "evaluation_id", "task__position", "epoch")


def _model_calls(rollout: Rollout) -> list[ModelCall]:
    """The model calls of the attempt that produced the rollout's result, in order. A rollout
    reused from the cache has no trace of its own: its source's trace is the one that ran."""
    source_id = rollout.reused_from_id or rollout.id
    steps = TraceStep.objects.filter(rollout_id=source_id)
    last = steps.aggregate(last=Max("attempt"))["last"]
    if last is None:
        return []
    return [
        ModelCall.from_payload(trace_step_payload(step))
        for step in steps.filter(attempt=last, kind=StepKind.MODEL_CALL)
        .order_by("index")
        .iterator()
    ]


def _provenance(
    rollout: Rollout, call: ModelCall, reply: Reply, turn: int, turns: int
) -> dict[str, Any]:
    evaluation = rollout.evaluation
    provenance = {
        "harness_sha": evaluation.candidate.sha,
        "policy_version": evaluation.policy_version.name,
        "model": call.model or "",
        "suite": {"name": evaluation.suite.name, "version": evaluation.suite.version},
        "split": evaluation.split,
        "task": rollout.task.key,
        "epoch": rollout.epoch,
        "score": rollout.score,
        "outcome": rollout.outcome,
        "evaluation": str(evaluation.id),
        "rollout": str(rollout.id),
        "trace_rollout": str(rollout.reused_from_id or rollout.id),
        "turn": turn,
        "turns": turns,
    }
    if call.via == VIA_BOUNDARY:
        # Where the row sits in the rollout's call tree (workers/program.py): a trainer can
        # rebuild the sessions, or keep only their leaves, from these alone.
        provenance.update(
            {
                "via": VIA_BOUNDARY,
                "call": call.call,
                "session": call.session,
                "parent": call.parent,
                "relation": call.relation,
                "choice": reply.choice,
                "finish_reason": reply.finish_reason,
            }
        )
    return provenance


def _line(fmt: str, call: ModelCall, reply: Reply, weight: int, provenance: dict) -> dict[str, Any]:
    prompt_messages = call_prompt_messages(call)
    tools = call_tools(call)
    if fmt == ExportFormat.CHAT:
        line: dict[str, Any] = {
            "messages": [*prompt_messages, {**reply.message(), "weight": weight}],
            "weight": weight,
            "provenance": provenance,
        }
    elif call.messages is not None:
        # TRL's conversational prompt/completion: the prompt is the conversation so far.
        line = {
            "prompt": prompt_messages,
            "completion": [reply.message()],
            "weight": weight,
            "provenance": provenance,
        }
    else:
        line = {
            "prompt": call_prompt(call),
            "completion": reply.content,
            "weight": weight,
            "provenance": provenance,
        }
    if tools is not None:
        line["tools"] = tools  # TRL's column: the chat template renders them into the prompt
    return line


@dataclass
class Counts:
    rows: int = 0
    rollouts: int = 0


def export_lines(*, selection: Selection, fmt: str, counts: Counts) -> Iterator[bytes]:
    """The export's lines as UTF-8 bytes (each ending in a newline), counting as it goes."""
    for rollout in rollouts_selected(selection).iterator(chunk_size=200):
        calls = [call for call in _model_calls(rollout) if call_exportable(call)]
        if not calls:
            continue
        counts.rollouts += 1
        successful = rollout.outcome == RolloutOutcome.PASSED
        first_learned = 0 if selection.last_turns is None else len(calls) - selection.last_turns
        for turn, call in enumerate(calls):
            weight = int(successful and turn >= first_learned)
            for reply in call_replies(call):
                provenance = _provenance(rollout, call, reply, turn, len(calls))
                line = _line(fmt, call, reply, weight, provenance)
                counts.rows += 1
                yield (
                    json.dumps(line, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
                    + "\n"
                ).encode()

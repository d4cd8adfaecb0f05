"""The JSONL lines of an export: one line per model call of each selected rollout.

Chat format: ``{"messages": [...the call's messages (or the prompt as one user message)...,
{"role": "assistant", "content": reply, "weight": w}], "weight": w, "provenance": {...}}``.
Prompt/completion format: ``{"prompt": text or messages, "completion": text or
[assistant message], "weight": w, "provenance": {...}}``.

Weights: 1 for the model turns of successful (passed) rollouts, 0 for every other rollout's
turns (kept, so a trainer can use them as negatives or drop them; ``successful_only`` drops
them here). With ``last_turns`` N, turns before a rollout's last N get weight 0 as well: in a
multi-step episode the final moves are usually the ones that decided it.

Lines are serialized deterministically (sorted keys, no export id or timestamp), so the same
rollouts always give the same bytes, hence the same content hash.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import Max, QuerySet

from coevo.evaluations.models import Outcome, Rollout, TraceStep
from coevo.evaluations.traces import trace_step_payload
from coevo.exports.models import ExportFormat
from coevo.suites.models import Split

EXPORTABLE_OUTCOMES = (Outcome.PASSED, Outcome.TASK_FAILURE, Outcome.HARNESS_ERROR)


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
        rollouts = rollouts.filter(outcome=Outcome.PASSED)
    if selection.min_score is not None:
        rollouts = rollouts.filter(score__gte=selection.min_score)
    return rollouts.select_related(
        "evaluation__candidate", "evaluation__policy_version", "evaluation__suite", "task"
    ).order_by("evaluation__created_at", "evaluation_id", "task__position", "epoch")


def _model_calls(rollout: Rollout) -> list[dict[str, Any]]:
    """The model calls of the attempt that produced the rollout's result, in order. A rollout
    reused from the cache has no trace of its own: its source's trace is the one that ran."""
    source_id = rollout.reused_from_id or rollout.id
    steps = TraceStep.objects.filter(rollout_id=source_id)
    last = steps.aggregate(last=Max("attempt"))["last"]
    if last is None:
        return []
    return [
        trace_step_payload(step)
        for step in steps.filter(attempt=last, kind="model_call").order_by("index").iterator()
    ]


def _provenance(rollout: Rollout, call: dict[str, Any], turn: int, turns: int) -> dict:
    evaluation = rollout.evaluation
    return {
        "harness_sha": evaluation.candidate.sha,
        "policy_version": evaluation.policy_version.name,
        "model": call.get("model") or "",
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


def _line(fmt: str, call: dict[str, Any], weight: int, provenance: dict) -> dict[str, Any]:
    completion = str(call.get("completion") or "")
    if "messages" in call:
        prompt_messages = [
            {"role": str(m.get("role", "")), "content": m.get("content", "")}
            for m in call["messages"]
        ]
    else:
        prompt_messages = [{"role": "user", "content": str(call.get("prompt", ""))}]
    if fmt == ExportFormat.CHAT:
        reply = {"role": "assistant", "content": completion, "weight": weight}
        return {"messages": [*prompt_messages, reply], "weight": weight, "provenance": provenance}
    if "messages" in call:
        # TRL's conversational prompt/completion: the prompt is the conversation so far.
        prompt: Any = prompt_messages
        completion_value: Any = [{"role": "assistant", "content": completion}]
    else:
        prompt, completion_value = str(call.get("prompt", "")), completion
    return {
        "prompt": prompt,
        "completion": completion_value,
        "weight": weight,
        "provenance": provenance,
    }


@dataclass
class Counts:
    rows: int = 0
    rollouts: int = 0


def export_lines(*, selection: Selection, fmt: str, counts: Counts) -> Iterator[bytes]:
    """The export's lines as UTF-8 bytes (each ending in a newline), counting as it goes."""
    for rollout in rollouts_selected(selection).iterator(chunk_size=200):
        calls = _model_calls(rollout)
        if not calls:
            continue
        counts.rollouts += 1
        successful = rollout.outcome == Outcome.PASSED
        first_learned = 0 if selection.last_turns is None else len(calls) - selection.last_turns
        for turn, call in enumerate(calls):
            weight = int(successful and turn >= first_learned)
            line = _line(fmt, call, weight, _provenance(rollout, call, turn, len(calls)))
            counts.rows += 1
            yield (
                json.dumps(line, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"
            ).encode()

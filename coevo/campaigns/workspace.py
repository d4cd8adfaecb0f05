"""What an llm-patch proposer sees: raw material from the campaign, rendered as one prompt.

Meta-Harness's finding is that a proposer does better with the raw record (code, per-task
results, failing traces) than with summaries of it, so this module hands over the record
itself, cut to a character budget: the parent's editable files in full, the earlier
proposals (their patches, search scores, per-task search results, why rejected ones were
rejected), the traces of failed SEARCH-split tasks, and the campaign's failure patterns when
that module exists.

The sealed-split rule (docs/architecture.md, "The held-out seal"): only SEARCH-split material is read here.
Every evaluation and rollout is filtered on the campaign's search split at the query, and no
validation score is shown either: a proposer that saw validation scores would be searching on
the split the campaign selects on.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from coevo.campaigns.edits import EditRejected, path_check
from coevo.campaigns.models import Campaign, Proposal, ProposalState, ProposerKind
from coevo.evaluations.models import (
    Rollout,
    RolloutState,
)
from coevo.evaluations.selectors import evaluation_task_scores, rollout_trace
from coevo.evaluations.traces import Cursor
from coevo.suites.models import Split
from harness_store.manifest import MANIFEST_NAME, Manifest
from harness_store.models import Candidate
from harness_store.selectors import candidate_files, candidate_read_file
from workers.outcomes import RolloutOutcome
from workers.trace import (
    Answer,
    EnvReset,
    EnvStep,
    Error,
    HarnessException,
    HelperCall,
    Log,
    ModelCall,
    ProgramOutput,
    TypedStep,
    UnknownStep,
    Verdict,
    parse_step,
)

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_CHARS = 24_000
MAX_FILE_CHARS = 12_000
MAX_PATCH_CHARS = 3_000
MAX_PROPOSALS_SHOWN = 12
MAX_TRACES = 8
MIN_TRACE_CHARS = 600
MAX_TRACE_STEPS = 200
STEP_TEXT_CHARS = 800

INTRODUCTION = """You improve an LLM-agent harness: the code and prompts that drive a small
language model (the policy) to solve tasks. Read the harness files, the earlier attempts and
the traces of failed tasks below, form ONE hypothesis about what makes tasks fail, and change
the harness to fix it.

"""

TEXT_ANSWER = """Answer in this exact format and nothing else:

HYPOTHESIS: <one line: what you change and why it should help>
<<<<<<< SEARCH <path of a file listed under EDITABLE FILES>
<lines copied exactly from the file>
=======
<the new lines>
>>>>>>> REPLACE

You may write several SEARCH/REPLACE blocks. Each SEARCH text must occur exactly once in its
file, whitespace included; an empty SEARCH creates a new file inside a component directory.
(A unified diff with '--- a/PATH' and '+++ b/PATH' headers is accepted instead.) Edit only
the files and directories listed as components; """

JSON_ANSWER = """Answer with one JSON object and nothing else:

{"hypothesis": "<one line: what you change and why it should help>",
 "edits": [{"path": "<a file listed under EDITABLE FILES>",
            "search": "<lines copied exactly from the file>",
            "replace": "<the new lines>"}]}

Each search text must occur exactly once in its file, whitespace included (write line breaks
as \\n); an empty search creates a new file inside a component directory. Edit only the files
and directories listed as components; """

JSON_LINES_ANSWER = """Answer with one JSON object and nothing else:

{"hypothesis": "<one line: what you change and why it should help>",
 "edits": [{"path": "<a file listed under EDITABLE FILES>",
            "search": "<one whole line copied from that file>",
            "replace": "<the new line or lines that take its place>"}]}

Each edit replaces one line of the file (write line breaks as \\n). Edit only the files
listed as components; """

# The last line of the prompt, by answer format: where the model starts writing.
ANSWER_CUES = {
    "text": "Now write your answer (HYPOTHESIS line, then the edits).",
    "json": "Now write your answer as one JSON object.",
}
# The order the workspace gives material up in when it must shrink, least useful first: the
# traces of older proposals' failed tasks, then the parent's, then the failure patterns, then
# the oldest earlier proposals. The instructions, the manifest and the parent's editable files
# are never cut: without them no edit can apply.
TRIM_ORDER = ("traces", "failure_patterns", "proposals")


# The contract the edited harness must keep, by kind (docs/harnesses.md).
ENTRYPOINT_CONTRACT = "keep `def run(task, ctx)` working."
PROGRAM_CONTRACT = """keep the program's contract working: it is started
as its command in the harness directory, reads its task (JSON) from the file named by
$COEVO_TASK_FILE and its knobs from $COEVO_KNOBS_FILE (or the COEVO_KNOB_<NAME> variables),
reaches the model only through the OpenAI-compatible API at $OPENAI_BASE_URL (with
$OPENAI_API_KEY), and writes its answer as one JSON value to $COEVO_ANSWER_FILE before it
exits with status 0. It has no other network."""


def _instructions(manifest: Manifest, answer_format: str) -> str:
    answer = {"json": JSON_ANSWER, "json-lines": JSON_LINES_ANSWER}.get(answer_format, TEXT_ANSWER)
    return (
        INTRODUCTION + answer + (PROGRAM_CONTRACT if manifest.is_program else ENTRYPOINT_CONTRACT)
    )


def _manifest_summary(manifest: Manifest) -> str:
    if manifest.is_program:
        start = (
            f"command: {json.dumps(list(manifest.command))} (a program harness; its model is "
            "the OpenAI-compatible endpoint at $OPENAI_BASE_URL: chat and completions, tools)"
        )
    else:
        start = f"entrypoint: {manifest.entrypoint}\npolicy_api: {manifest.policy_api}"
    if manifest.requirements:
        start += f"\nrequirements (declared dependencies): {manifest.requirements}"
    return (
        f"{start}\n"
        f"components (the only paths you may edit): {', '.join(manifest.components)}\n"
        f"limits: {json.dumps(manifest.limits.as_dict())}"
    )


@dataclass
class ProposerPrompt:
    """The rendered prompt and the record of what it contains (``Proposal.shown``)."""

    text: str
    shown: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)


def workspace_build(
    *,
    campaign: Campaign,
    parent: Candidate,
    manifest: Manifest,
    budget_chars: int = DEFAULT_BUDGET_CHARS,
    answer_format: str = "text",
) -> ProposerPrompt:
    """The workspace for a proposal derived from ``parent`` (whose manifest is ``manifest``),
    asking for the answer in ``answer_format`` (text: HYPOTHESIS line and SEARCH/REPLACE
    blocks; json: coevo.campaigns.answers' object).

    It is cut to ``budget_chars`` in TRIM_ORDER; ``shown["trimmed"]`` says what was left out,
    and ``shown["minimum_chars"]`` what cannot be (the instructions, the manifest, the files):
    a budget below it gives a workspace longer than the budget, which the caller refuses."""
    files = _component_files(parent, manifest)
    proposals = list(
        Proposal.objects.filter(campaign=campaign)
        .select_related("candidate")
        .order_by("-sequence")[:MAX_PROPOSALS_SHOWN]
    )
    proposals.reverse()
    task_scores = {
        p.id: _search_scores(campaign, p) for p in proposals if p.search_evaluation_id is not None
    }
    patterns = _failure_patterns(campaign)
    answer_format = answer_format if answer_format in ("json", "json-lines") else "text"
    cue = ANSWER_CUES["text" if answer_format == "text" else "json"]

    head = "\n\n".join(
        [
            _instructions(manifest, answer_format),
            _section("MANIFEST", _manifest_summary(manifest)),
            _section(
                f"EDITABLE FILES of the parent candidate {parent.short_sha}",
                "\n\n".join(
                    f"### {path}\n```\n{_cut(text, MAX_FILE_CHARS)}\n```"
                    for path, text in files.items()
                )
                or "(none)",
            ),
        ]
    )
    minimum = len(head) + 2 + len(cue)
    room = budget_chars - minimum
    entries = [(p, _render_proposal(p, task_scores.get(p.id) or {})) for p in proposals]
    pattern_body = "\n".join(_render_pattern(p) for p in patterns)
    whole = sum(len(text) + 2 for _, text in entries) + len(pattern_body) + 80
    # Everything but the traces fits: they get the rest. Otherwise shares keep room for the
    # traces Meta-Harness found most useful: a third for the history, a sixth for patterns.
    history_room = room if whole <= room else room // 3
    pattern_room = room if whole <= room else room // 6
    kept: list[tuple[Proposal, str]] = []
    used = 0
    for proposal, text in reversed(entries):  # the newest first
        if used + len(text) + 2 > history_room - 40:
            if not kept and history_room > 400:
                kept.append((proposal, _cut(text, history_room - 80)))  # the newest, cut
            break
        kept.append((proposal, text))
        used += len(text) + 2
    kept.reverse()
    shown_proposals = [p for p, _ in kept]
    dropped = [p.sequence for p in proposals if p not in shown_proposals]
    history = _section(
        "EARLIER PROPOSALS (search split)",
        "\n\n".join(text for _, text in kept)
        or ("(none yet)" if not proposals else "(left out to fit the context)"),
    )
    pattern_text = ""
    patterns_cut = 0
    if pattern_body and pattern_room > 200:
        pattern_text = _section("FAILURE PATTERNS", _cut(pattern_body, pattern_room - 30))
        patterns_cut = max(0, len(pattern_body) - (pattern_room - 30))
    elif pattern_body:
        patterns_cut = len(pattern_body)
    fixed = "\n\n".join(part for part in [head, history, pattern_text] if part)
    trace_room = budget_chars - len(fixed) - len(cue) - 200
    trace_text, trace_ids, trace_tasks, traces_left_out = _render_traces(
        campaign, parent, proposals, trace_room
    )
    text = "\n\n".join(
        part
        for part in [
            fixed,
            _section("TRACES OF FAILED SEARCH TASKS", trace_text) if trace_text else "",
            cue,
        ]
        if part
    )
    shown_scores = [task_scores.get(p.id) or {} for p in shown_proposals]
    shown_tasks = sorted({key for scores in shown_scores for key in scores} | trace_tasks)
    shown = {
        "proposer": ProposerKind.LLM_PATCH.value,
        "parent": parent.sha,
        "files": sorted(files),
        "candidates": [
            {
                "sha": p.candidate.sha,
                "sequence": p.sequence,
                "search_score": p.search_score,
            }
            for p in shown_proposals
            if p.candidate_id is not None
        ],
        "proposals": [p.sequence for p in shown_proposals],
        "task_keys": shown_tasks,
        "trace_ids": trace_ids,
        "failure_patterns": [str(p.get("id") or p.get("name")) for p in patterns]
        if pattern_text
        else [],
        "split": campaign.search_split,
        "budget_chars": budget_chars,
        "minimum_chars": minimum,
        "chars": len(text),
        "answer_format": answer_format,
        # What was left out to fit the budget, in TRIM_ORDER: failed traces not shown, chars of
        # the failure patterns cut, earlier proposals (by sequence) not shown.
        "trimmed": {
            "traces": traces_left_out,
            "failure_patterns_chars": patterns_cut,
            "proposals": dropped,
        },
    }
    return ProposerPrompt(text=text, shown=shown, files=files)


# --- sections ------------------------------------------------------------------------------


def _section(title: str, body: str) -> str:
    return f"== {title} ==\n{body.rstrip()}"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    if limit <= 40:
        return text[:limit]
    return text[: limit - 30] + f"\n… [{len(text) - limit + 30} chars cut]"


def _component_files(parent: Candidate, manifest: Manifest) -> dict[str, str]:
    """The parent's text files inside the declared components."""
    files: dict[str, str] = {}
    for entry in candidate_files(candidate=parent):
        try:
            path_check(entry.path, manifest.components)
        except EditRejected:
            continue
        try:
            files[entry.path] = candidate_read_file(candidate=parent, path=entry.path).decode()
        except UnicodeDecodeError:
            continue  # binary: not editable as text
    if MANIFEST_NAME not in files:
        # Read-only context: the knobs and limits the code refers to.
        files[f"{MANIFEST_NAME} (read-only)"] = candidate_read_file(
            candidate=parent, path=MANIFEST_NAME
        ).decode()
    return files


def _search_scores(campaign: Campaign, proposal: Proposal) -> dict[str, float]:
    evaluation = proposal.search_evaluation
    if evaluation is None or evaluation.split != campaign.search_split:
        return {}
    return {
        key: sum(values) / len(values)
        for key, values in evaluation_task_scores(evaluation_id=evaluation.id).items()
    }


def _render_proposal(p: Proposal, scores: dict[str, float]) -> str:
    sha = p.candidate.short_sha if p.candidate_id else "-"
    score = "-" if p.search_score is None else f"{p.search_score:.3f}"
    line = f"#{p.sequence} {p.kind} candidate {sha} state {p.state} search score {score}"
    hypothesis = (p.params or {}).get("hypothesis")
    if hypothesis:
        line += f"\n  hypothesis: {hypothesis}"
    elif p.candidate_id and p.kind != ProposerKind.SEED:
        line += f"\n  message: {p.candidate.message.splitlines()[0][:200]}"
    if p.state == ProposalState.INVALID:
        line += f"\n  {p.state_detail[:400]}"
    if scores:
        line += "\n  per-task search scores: " + ", ".join(
            f"{key}={value:.2f}" for key, value in sorted(scores.items())
        )
    if p.patch:
        line += f"\n  patch:\n{_cut(p.patch, MAX_PATCH_CHARS)}"
    return line


def _render_pattern(pattern: dict[str, Any]) -> str:
    line = (
        f"- {pattern.get('name', '?')} [{pattern.get('status', 'open')}, "
        f"{pattern.get('occurrences', '?')} occurrence(s)]"
    )
    if pattern.get("tasks"):
        line += f" on tasks {', '.join(map(str, pattern['tasks']))}"
    if pattern.get("addressed_by"):
        line += f"; addressed by {str(pattern['addressed_by'])[:12]}"
    if pattern.get("detail"):
        line += f" ({_cut(str(pattern['detail']), 200)})"
    for excerpt in pattern.get("excerpts") or []:
        line += f"\n    > {_cut(str(excerpt), 300)}"
    return line


def _failure_patterns(campaign: Campaign) -> list[dict[str, Any]]:
    try:
        from coevo.campaigns.patterns import failure_patterns_for_proposer
    except ImportError:
        return []
    try:
        return list(failure_patterns_for_proposer(campaign=campaign))
    except Exception:  # noqa: BLE001 - context for the proposer, never a reason to stop
        logger.exception("campaign %s: failure patterns unavailable", campaign.id)
        return []


# --- traces --------------------------------------------------------------------------------


def _failed_search_rollouts(
    campaign: Campaign, parent: Candidate, proposals: list[Proposal]
) -> list[Rollout]:
    """Failed rollouts of SEARCH evaluations: the parent's first, then the newest proposals'."""
    ordered = sorted(
        (p for p in proposals if p.search_evaluation_id is not None),
        key=lambda p: (p.candidate_id != parent.id, -p.sequence),
    )
    found: list[Rollout] = []
    for proposal in ordered:
        rows = (
            Rollout.objects.filter(
                evaluation_id=proposal.search_evaluation_id,
                # Both the evaluation's and the task's split: belt and braces around the seal.
                evaluation__split=campaign.search_split,
                task__split=campaign.search_split,
                state=RolloutState.DONE,
                outcome__in=[RolloutOutcome.TASK_FAILURE, RolloutOutcome.HARNESS_ERROR],
            )
            .exclude(task__split__in=[Split.HELDOUT, campaign.validation_split])
            .select_related("task", "evaluation__candidate")
            .defer("task__verifier")
            .order_by("task__position", "epoch")
        )
        for rollout in rows:
            found.append(rollout)
            if len(found) >= MAX_TRACES:
                return found
    return found


def _render_traces(
    campaign: Campaign, parent: Candidate, proposals: list[Proposal], room: int
) -> tuple[str, list[str], set[str], int]:
    """The traces that fit ``room`` (the parent's first, so older proposals' go first), their
    ids and tasks, and how many failed traces were left out."""
    rollouts = _failed_search_rollouts(campaign, parent, proposals)
    if not rollouts:
        return "", [], set(), 0
    if room < MIN_TRACE_CHARS:
        return "", [], set(), len(rollouts)
    count = max(1, min(len(rollouts), room // MIN_TRACE_CHARS))
    share = room // count
    parts, ids, tasks = [], [], set()
    for rollout in rollouts[:count]:
        body = _render_trace(rollout)
        header = (
            f"--- task {rollout.task.key} (candidate {rollout.evaluation.candidate.short_sha}, "
            f"epoch {rollout.epoch}): {rollout.outcome}, score {rollout.score}"
        )
        inputs = _cut(json.dumps(rollout.task.inputs, ensure_ascii=False), 600)
        parts.append(_cut(f"{header}\ntask inputs: {inputs}\n{body}", share))
        ids.append(str(rollout.id))
        tasks.add(rollout.task.key)
    return "\n\n".join(parts), ids, tasks, len(rollouts) - count


def _render_trace(rollout: Rollout) -> str:
    # The attempt that ended the rollout: an earlier one (its worker died, or an infra error
    # sent it back) left steps that stop mid-run and say nothing of the outcome.
    page = rollout_trace(
        rollout=rollout, cursor=Cursor(rollout.attempts, 0), page_size=MAX_TRACE_STEPS
    )
    lines = []
    for step in page.steps:
        line = _render_step(parse_step(step.kind, step.payload))
        if line:
            lines.append(line)
    if page.next_cursor is not None:
        lines.append(f"… (trace continues beyond {MAX_TRACE_STEPS} steps)")
    if rollout.detail:
        lines.append(f"outcome detail: {_cut(rollout.detail, STEP_TEXT_CHARS)}")
    return "\n".join(lines)


def _render_step(step: TypedStep | UnknownStep) -> str:
    if isinstance(step, ModelCall):
        request = _text(step.prompt) or _text(step.messages)
        line = f"[model call] prompt (tail): {request}\n[model said] {_text(step.completion)}"
        calls = [c for c in step.tool_calls or [] if isinstance(c, dict)]
        if calls:
            line += "\n[model called tools] " + "; ".join(
                f"{str(c.get('name'))[:80]}({_cut(str(c.get('arguments') or ''), 200)})"
                for c in calls[:8]
            )
        if step.rejected:
            line += f"\n[the policy server refused the call] {_text(step.rejected, 400)}"
        return line
    if isinstance(step, ProgramOutput):
        return (
            f"[program exited with {step.exit_code}] stdout (tail): "
            f"{_text(step.stdout, STEP_TEXT_CHARS)}"
        )
    if isinstance(step, EnvReset):
        return f"[env reset] {_text(step.observation)}"
    if isinstance(step, EnvStep):
        return (
            f"[env step {step.index}] action: {_text(step.action, 200)} → reward "
            f"{step.reward}, done {step.done}: {_text(step.observation)}"
        )
    if isinstance(step, Log):
        return f"[log] {_text(step.message, 400)}"
    if isinstance(step, HelperCall):
        return f"[helper {step.name}] {_text(step.result, 400)}"
    if isinstance(step, Answer):
        return f"[answer] {_text(step.answer)}"
    if isinstance(step, Verdict):
        return f"[verdict] score {step.score}: {_text(step.detail, 400)} {_text(step.output, 400)}"
    if isinstance(step, HarnessException):
        return f"[harness exception] {_text(step.error, 400)}\n{_text(step.traceback, 1200)}"
    if isinstance(step, Error):
        return (
            f"[error] {_text(step.outcome, 40)}: {_text(step.message, 400)} "
            f"{_text(step.stderr, 600)}"
        )
    return ""


def _text(value: Any, limit: int = STEP_TEXT_CHARS) -> str:
    """A payload's value as text (JSON when it is not a string), its tail."""
    if value is None:
        return ""
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    return _tail(value, limit)


def _tail(text: str, limit: int) -> str:
    """The end of a long text: a prompt's end is where the model was left to continue."""
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :]

"""Formatting helpers for the dashboard templates."""

from __future__ import annotations

import json
import shlex
from decimal import Decimal
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from coevo.evaluations.models import (
    Rollout,
    RolloutState,
)
from coevo.evaluations.stats.means import MEAN_SCORE, PASS_RATE, ScoreSummary
from coevo.evaluations.stats.paired import PairedComparison
from workers.outcomes import RolloutOutcome
from workers.trace import StepKind

register = template.Library()

_BADGES = {
    RolloutOutcome.PASSED: ("pass", "pass", ""),
    RolloutOutcome.TASK_FAILURE: ("fail", "fail", "task failure"),
    RolloutOutcome.HARNESS_ERROR: ("fail", "fail", "harness error"),
    RolloutOutcome.INFRA_ERROR: ("infra", "infra error", "not scored"),
}


@register.filter
def percent(value: float | None, digits: int = 1) -> str:
    """0.15 → "15.0%"; None (nothing scored yet) → "—"."""
    if value is None:
        return "—"
    return f"{value * 100:.{digits}f}%"


@register.filter
def thousands(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


@register.filter
def usd(value: Decimal | str | None) -> str:
    """US dollars to the millionth (a small model's call costs less than a cent); "—" for no
    price (None), which is not $0."""
    if value is None or value == "":
        return "—"
    return f"${Decimal(value):,.6f}"


@register.filter
def short_sha(sha: str | None) -> str:
    return (sha or "")[:12]


@register.filter
def as_text(value: Any) -> str:
    """Strings as they are; anything else as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def as_json(value: Any) -> str:
    """One-line JSON, e.g. sampling parameters as they were sent."""
    return json.dumps(value, ensure_ascii=False, default=str)


@register.simple_tag
def score_line(score: ScoreSummary, epochs: int = 1) -> SafeString:
    """ "15.0% [5.2%, 36.0%] over 20 tasks", with the interval's kind in a tooltip."""
    if score.mean is None or score.interval is None:
        return mark_safe('<span class="muted">no scored rollouts yet</span>')
    unit = "task" if epochs == 1 else "rollout"
    return format_html(
        '<strong class="score">{}</strong> '
        '<span class="interval" title="{}% {} interval">[{}, {}]</span> '
        "over {} {}{}",
        percent(score.mean),
        f"{score.confidence * 100:g}",
        "Wilson score" if score.method == "wilson" else "bootstrap (resampling tasks)",
        percent(score.interval.low),
        percent(score.interval.high),
        score.n,
        unit,
        "" if score.n == 1 else "s",
    )


@register.simple_tag
def score_name(kind: str) -> str:
    """The name a page gives a score: "pass_rate" → "pass rate" (evaluation tables, from the
    outcomes), "mean_score" → "mean per-task score" (campaigns and comparisons, from the
    scores). Every page that shows an evaluation's score names it with this."""
    return {"pass_rate": PASS_RATE, "mean_score": MEAN_SCORE}[kind]


@register.simple_tag
def paired_verdict(statistics: PairedComparison) -> SafeString:
    """A paired comparison as one labelled line: the verdict with the exact test that decides
    it, then the mean difference, then its bootstrap interval or why none is shown
    (`PairedComparison.interval_note`), so the line cannot contradict itself."""
    verdict = format_html(
        '<strong class="verdict" id="comparison-verdict">{}</strong> '
        '<span class="verdict-test">(verdict of the {}: p = {})</span>',
        statistics.verdict,
        statistics.test,
        f"{statistics.p_value:.4f}",
    )
    if statistics.difference is None:
        return format_html("{} · {}", verdict, statistics.interval_note or "")
    difference = format_html(
        '{} difference <strong id="comparison-difference">{}</strong>',
        statistics.score_name,
        signed_percent(statistics.difference),
    )
    interval = statistics.shown_interval
    if interval is None:
        tail = format_html(
            '<span class="muted" id="comparison-interval">{}</span>', statistics.interval_note
        )
    else:
        tail = format_html(
            '<span class="interval" id="comparison-interval">{}% paired bootstrap interval of '
            "the mean difference [{}, {}]</span>",
            f"{statistics.confidence * 100:g}",
            signed_percent(interval.low),
            signed_percent(interval.high),
        )
    return format_html("{} · {} · {}", verdict, difference, tail)


@register.simple_tag
def outcome_badge(rollout: Rollout) -> SafeString:
    """pass/fail badge plus the error kind; the state while the rollout is not done."""
    if rollout.state != RolloutState.DONE:
        return format_html('<span class="badge state-{}">{}</span>', rollout.state, rollout.state)
    css, label, kind = _BADGES.get(rollout.outcome, ("infra", rollout.outcome, ""))
    if not kind:
        return format_html('<span class="badge {}">{}</span>', css, label)
    return format_html(
        '<span class="badge {}">{}</span> <span class="kind">{}</span>', css, label, kind
    )


@register.filter
def spaces(value: str) -> str:
    """A name in words: model_call → model call."""
    return str(value).replace("_", " ")


# The trace's step kinds by name, for templates: ``step.kind == kinds.MODEL_CALL``.
_STEP_KINDS = {kind.name: kind for kind in StepKind}


@register.simple_tag
def step_kinds() -> dict[str, StepKind]:
    """``{% step_kinds as kinds %}``: the step kinds a template compares a step's kind with
    (workers/trace.py names them), never spelled out in the template."""
    return _STEP_KINDS


@register.simple_tag
def spend(spent: int, reserved: int, limit: int | None) -> SafeString:
    """ "1,200 spent + 800 reserved of 5,000" (or "… no limit")."""
    tail = f"of {thousands(limit)}" if limit is not None else "no limit"
    return format_html(
        '<strong>{}</strong> spent{} · <span class="muted">{}</span>',
        thousands(spent),
        f" + {thousands(reserved)} reserved" if reserved else "",
        tail,
    )


@register.filter
def signed_percent(value: float | None, digits: int = 1) -> str:
    """+12.5 pts / −3.0 pts: a difference of two rates, in percentage points."""
    if value is None:
        return "—"
    return f"{value * 100:+.{digits}f} pts"


@register.filter
def shell_command(argv: Any) -> str:
    """A program harness's command as one would type it: ["python", "main.py"] → python main.py."""
    if isinstance(argv, list | tuple):
        return shlex.join(str(arg) for arg in argv)
    return str(argv)


# A paired comparison's flip kinds (PairedComparison.flips, the comparison's per-task rows) in
# words: "3 both_pass" read as a raw key on the reviewer's evidence.
_FLIP_LABELS = {
    "fixed": "fixed",
    "broken": "broken",
    "both_pass": "passed by both",
    "both_fail": "failed by both",
    "improved": "improved",
    "regressed": "regressed",
    "tied": "tied",
}


@register.filter
def flip_label(kind: str | None) -> str:
    """ "both_pass" → "passed by both"; an unknown kind with its underscores as spaces."""
    if not kind:
        return ""
    return _FLIP_LABELS.get(kind, spaces(kind))

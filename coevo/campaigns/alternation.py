"""Alternating campaigns: when a policy step (train an adapter) takes the place of a harness
proposal. Self-HPO / WHALE style co-evolution: harness search and weight updates take turns.

The configuration (``Campaign.alternation``; ``{}`` = harness steps only)::

    {"trainer": "tiny-lora",          # a registered trainer (coevo/training)
     "switch": "fixed",               # or "patience"
     "harness_steps": 3,              # fixed: harness proposals per harness phase
     "policy_steps": 1,               # fixed: policy steps per policy phase
     "patience": 2,                   # patience: a phase ends after this many steps in a row
                                      #   without a validation improvement
     "max_policy_steps": 3,           # policy steps in the whole campaign
     "time_limit_s": null,            # per training run (at most the trainer's own limit)
     "export": {"format": "chat", "successful_only": true, "min_score": null,
                "last_turns": null}}

A policy step trains on the current best candidate's rollouts on the SEARCH split under the
current policy (harness-matched, on-policy): never validation, which selects, nor held-out.
The phase is derived from the proposals themselves (``phase_of``), so the runner needs no
extra state and a restarted worker resumes exactly where the history says.

The stored configuration is validated once (``alternation_validate``); code reads it through
``alternation_read``, as an ``Alternation``, never by its keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from coevo.errors import InvalidInput
from coevo.training.trainers import trainer_get

SWITCH_RULES = ("fixed", "patience")
EXPORT_FORMATS = ("chat", "prompt_completion")
DEFAULTS: dict[str, Any] = {
    "switch": "fixed",
    "harness_steps": 3,
    "policy_steps": 1,
    "patience": 2,
    "max_policy_steps": 3,
    "time_limit_s": None,
}
EXPORT_DEFAULTS: dict[str, Any] = {
    "format": "chat",
    "successful_only": True,
    "min_score": None,
    "last_turns": None,
}


def alternation_validate(*, raw: Any, campaign_patience: int | None) -> dict[str, Any]:
    """The cleaned configuration, with every default filled in; {} when ``raw`` is empty."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise InvalidInput("alternation must be an object (or empty for harness steps only).")
    known = {"trainer", "export", *DEFAULTS}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidInput(f"alternation: unknown keys {unknown} (known: {sorted(known)}).")
    trainer = raw.get("trainer")
    if not isinstance(trainer, str) or not trainer:
        raise InvalidInput("alternation.trainer: name a registered trainer.")

    trainer_obj = trainer_get(name=trainer)
    cleaned: dict[str, Any] = {"trainer": trainer, **DEFAULTS}
    for key in DEFAULTS:
        if raw.get(key) is not None:
            cleaned[key] = raw[key]
    if cleaned["switch"] not in SWITCH_RULES:
        raise InvalidInput(
            f"alternation.switch: {cleaned['switch']!r} is not a rule (fixed or patience)."
        )
    for key in ("harness_steps", "policy_steps", "patience", "max_policy_steps"):
        value = cleaned[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1000:
            raise InvalidInput(f"alternation.{key} must be an integer in [1, 1000].")
    limit = cleaned["time_limit_s"]
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not limit >= 1
    ):
        raise InvalidInput("alternation.time_limit_s must be a positive integer of seconds.")
    if limit is not None and limit > trainer_obj.time_limit_s:
        raise InvalidInput(
            f"alternation.time_limit_s={limit} is above the trainer {trainer}'s own limit "
            f"({trainer_obj.time_limit_s} s)."
        )
    if (
        cleaned["switch"] == "patience"
        and campaign_patience is not None
        and cleaned["patience"] >= campaign_patience
    ):
        raise InvalidInput(
            f"alternation.patience ({cleaned['patience']}) must be below the campaign's "
            f"patience ({campaign_patience}), or the campaign stops before any switch."
        )
    cleaned["export"] = _export_validate(raw.get("export"))
    return cleaned


def _export_validate(raw: Any) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidInput("alternation.export must be an object.")
    unknown = sorted(set(raw) - set(EXPORT_DEFAULTS))
    if unknown:
        raise InvalidInput(
            f"alternation.export: unknown keys {unknown} (known: {sorted(EXPORT_DEFAULTS)}); "
            "the split is always the campaign's search split and the candidate its best."
        )
    cleaned = {**EXPORT_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    if cleaned["format"] not in EXPORT_FORMATS:
        raise InvalidInput("alternation.export.format: chat or prompt_completion.")
    if not isinstance(cleaned["successful_only"], bool):
        raise InvalidInput("alternation.export.successful_only must be true or false.")
    score = cleaned["min_score"]
    if score is not None and (
        not isinstance(score, int | float) or isinstance(score, bool) or not 0 <= score <= 1
    ):
        raise InvalidInput("alternation.export.min_score must lie in [0, 1].")
    turns = cleaned["last_turns"]
    if turns is not None and (not isinstance(turns, int) or isinstance(turns, bool) or turns < 1):
        raise InvalidInput("alternation.export.last_turns must be a positive integer.")
    return cleaned


@dataclass(frozen=True)
class ExportSettings:
    """Which of the best candidate's rollouts a policy step trains on (coevo.exports)."""

    format: str
    successful_only: bool
    min_score: float | None
    last_turns: int | None


@dataclass(frozen=True)
class Alternation:
    """A validated alternation configuration, as ``Campaign.alternation`` stores it."""

    trainer: str
    switch: str
    harness_steps: int
    policy_steps: int
    patience: int
    max_policy_steps: int
    time_limit_s: int | None
    export: ExportSettings

    def steps_per_phase(self, phase: str) -> int:
        """The fixed schedule's steps in a ``phase`` ("harness" or "policy")."""
        return self.policy_steps if phase == "policy" else self.harness_steps


def alternation_read(*, stored: Mapping[str, Any] | None) -> Alternation | None:
    """The configuration ``alternation_validate`` stored; None for a campaign of harness
    steps only (``{}``)."""
    if not stored:
        return None
    export = {**EXPORT_DEFAULTS, **(stored.get("export") or {})}
    return Alternation(
        trainer=stored["trainer"],
        switch=stored.get("switch", DEFAULTS["switch"]),
        harness_steps=stored.get("harness_steps", DEFAULTS["harness_steps"]),
        policy_steps=stored.get("policy_steps", DEFAULTS["policy_steps"]),
        patience=stored.get("patience", DEFAULTS["patience"]),
        max_policy_steps=stored.get("max_policy_steps", DEFAULTS["max_policy_steps"]),
        time_limit_s=stored.get("time_limit_s"),
        export=ExportSettings(
            format=export["format"],
            successful_only=export["successful_only"],
            min_score=export["min_score"],
            last_turns=export["last_turns"],
        ),
    )


@dataclass(frozen=True)
class EndedProposal:
    """An ended proposal as the switch rules see it."""

    policy: bool
    improved: bool


@dataclass(frozen=True)
class Phase:
    name: str  # "harness" or "policy": what the next step is
    steps: int  # steps taken in this phase so far
    stale: int  # of those, in a row without a validation improvement
    policy_steps: int  # policy steps in the whole campaign
    reason: str  # why the next step is what it is, for the campaign page


def phase_of(*, alternation: Alternation | None, steps: Iterable[EndedProposal]) -> Phase:
    """The phase the next step belongs to, given the ended steps in order (seed and manual
    proposals left out). A campaign starts in a harness phase (the seed is its baseline)."""
    if alternation is None:
        return Phase("harness", 0, 0, 0, "harness steps only")
    rule = alternation.switch
    phase, taken, stale, policy_steps = "harness", 0, 0, 0
    reason = "a campaign starts with harness steps"
    for step in steps:
        kind = "policy" if step.policy else "harness"
        if kind != phase:  # a history the rules did not write (e.g. a changed configuration)
            phase, taken, stale = kind, 0, 0
        taken += 1
        policy_steps += step.policy
        stale = 0 if step.improved else stale + 1
        if rule == "fixed" and taken >= alternation.steps_per_phase(phase):
            reason = f"{taken} {phase} step(s) taken (fixed schedule)"
        elif rule == "patience" and stale >= alternation.patience:
            reason = f"{stale} {phase} step(s) in a row without a validation improvement"
        else:
            continue
        phase, taken, stale = ("policy" if phase == "harness" else "harness"), 0, 0
    if phase == "policy" and policy_steps >= alternation.max_policy_steps:
        phase, reason = "harness", f"max policy steps reached ({alternation.max_policy_steps})"
    return Phase(phase, taken, stale, policy_steps, reason)


__all__ = [
    "Alternation",
    "EndedProposal",
    "ExportSettings",
    "Phase",
    "alternation_read",
    "alternation_validate",
    "phase_of",
]

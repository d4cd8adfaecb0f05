"""Proposers and the campaign strategy (which proposers, with which options).

``manual`` is no strategy entry: a human's or CI's commit is submitted to a campaign
(``coevo.campaigns.services.campaign_submit_candidate``), never proposed by the runner.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

from coevo.campaigns.models import Campaign, ProposerKind
from coevo.campaigns.proposers.agentic import AgenticProposer, agentic_options_validate
from coevo.campaigns.proposers.base import Draft, ProposalOutcome, Proposer
from coevo.campaigns.proposers.config import ConfigProposer, config_options_validate
from coevo.campaigns.proposers.llm_patch import LlmPatchProposer, llm_patch_options_validate
from coevo.campaigns.proposers.merge import MergeProposer, merge_options_validate
from coevo.campaigns.proposers.random_search import RandomProposer, random_options_validate
from coevo.errors import InvalidInput
from coevo.projects.models import Project
from harness_store.manifest import Manifest

Validator = Callable[..., dict[str, Any]]


def _merge_available() -> bool:
    # The merge proposer lands in its own module; until it does, the strategy refuses it.
    return importlib.util.find_spec("coevo.campaigns.proposers.merge") is not None


def available_kinds() -> tuple[str, ...]:
    kinds = [
        ProposerKind.CONFIG.value,
        ProposerKind.RANDOM.value,
        ProposerKind.LLM_PATCH.value,
        ProposerKind.AGENTIC.value,
    ]
    if _merge_available():
        kinds.append(ProposerKind.MERGE.value)
    return tuple(kinds)


def _validator(kind: str, project: Project) -> Validator:
    if kind == ProposerKind.CONFIG:
        return config_options_validate
    if kind == ProposerKind.RANDOM:
        return random_options_validate
    if kind == ProposerKind.LLM_PATCH:
        return llm_patch_options_validate
    if kind == ProposerKind.AGENTIC:
        # The only one whose options name a row: its program, a candidate of this project.
        return functools.partial(agentic_options_validate, project=project)

    return merge_options_validate


def _build(kind: str, campaign: Campaign, options: dict[str, Any]) -> Proposer:
    if kind == ProposerKind.CONFIG:
        return ConfigProposer(campaign, options)
    if kind == ProposerKind.RANDOM:
        return RandomProposer(campaign, options)
    if kind == ProposerKind.LLM_PATCH:
        return LlmPatchProposer(campaign, options)
    if kind == ProposerKind.AGENTIC:
        return AgenticProposer(campaign, options)
    if kind == ProposerKind.MERGE and _merge_available():
        return MergeProposer(campaign, options)
    raise InvalidInput(f"The {kind} proposer is not available.")


def strategy_validate(
    *, strategy: Any, manifest: Manifest, project: Project
) -> list[dict[str, Any]]:
    """``[{"kind": "config", "options": {...}}, ...]`` checked against the seed's manifest and
    the campaign's ``project``."""
    if strategy is None:
        strategy = [{"kind": ProposerKind.CONFIG.value}]
    if not isinstance(strategy, list) or not strategy:
        raise InvalidInput(
            'strategy must be a non-empty list of proposers, e.g. [{"kind": "config"}].'
        )
    available = available_kinds()
    cleaned = []
    for i, entry in enumerate(strategy):
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
            raise InvalidInput(f"strategy[{i}]: expected an object with a kind.")
        unknown = sorted(set(entry) - {"kind", "options"})
        if unknown:
            raise InvalidInput(f"strategy[{i}]: unknown keys {unknown} (expected kind, options).")
        kind = entry["kind"]
        options = entry.get("options") or {}
        if not isinstance(options, dict):
            raise InvalidInput(f"strategy[{i}] options: expected an object.")
        if kind == ProposerKind.MANUAL:
            raise InvalidInput(
                f"strategy[{i}]: manual candidates are submitted to a running campaign (a human "
                "or CI commit), not proposed; leave manual out of the strategy."
            )
        if kind == ProposerKind.MERGE and kind not in available:
            raise InvalidInput(f"strategy[{i}]: the merge proposer is not available yet.")
        if kind not in available:
            raise InvalidInput(
                f"strategy[{i}]: unknown proposer {kind!r} (available: {', '.join(available)})."
            )
        cleaned.append(
            {
                "kind": kind,
                "options": _validator(kind, project)(manifest=manifest, options=options),
            }
        )
    return cleaned


def proposer_for(*, campaign: Campaign, sequence: int) -> Proposer:
    """The proposer of the ``sequence``-th proposal (the strategy's entries take turns)."""
    entry = campaign.strategy[(sequence - 1) % len(campaign.strategy)]
    return _build(entry["kind"], campaign, entry.get("options") or {})


def proposer_for_proposal(*, campaign: Campaign, kind: str) -> Proposer | None:
    """The proposer to tell a proposal's outcome (None: its kind has no strategy entry)."""
    for entry in campaign.strategy:
        if entry["kind"] == kind:
            return _build(kind, campaign, entry.get("options") or {})
    return None


__all__ = [
    "Draft",
    "ProposalOutcome",
    "Proposer",
    "available_kinds",
    "proposer_for",
    "proposer_for_proposal",
    "strategy_validate",
]

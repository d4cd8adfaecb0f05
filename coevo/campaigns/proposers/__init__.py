"""Proposers and the campaign strategy (which proposers, with which options)."""

from __future__ import annotations

from typing import Any

from coevo.campaigns.models import Campaign, ProposerKind
from coevo.campaigns.proposers.base import Draft, Outcome, Proposer
from coevo.errors import InvalidInput
from workers.manifest import Manifest

AVAILABLE = (ProposerKind.CONFIG,)
NOT_YET = (ProposerKind.LLM_PATCH, ProposerKind.MERGE, ProposerKind.MANUAL)


def strategy_validate(*, strategy: Any, manifest: Manifest) -> list[dict[str, Any]]:
    """``[{"kind": "config", "options": {...}}, ...]`` checked against the seed's manifest."""
    from coevo.campaigns.proposers.config import config_options_validate

    if strategy is None:
        strategy = [{"kind": ProposerKind.CONFIG.value}]
    if not isinstance(strategy, list) or not strategy:
        raise InvalidInput(
            'strategy must be a non-empty list of proposers, e.g. [{"kind": "config"}].'
        )
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
        if kind in NOT_YET:
            raise InvalidInput(
                f"strategy[{i}]: the {kind} proposer is not available yet; use "
                f"{', '.join(k.value for k in AVAILABLE)}."
            )
        if kind != ProposerKind.CONFIG:
            raise InvalidInput(
                f"strategy[{i}]: unknown proposer {kind!r} (available: "
                f"{', '.join(k.value for k in AVAILABLE)}; coming: "
                f"{', '.join(k.value for k in NOT_YET)})."
            )
        cleaned.append(
            {"kind": kind, "options": config_options_validate(manifest=manifest, options=options)}
        )
    return cleaned


def proposer_for(*, campaign: Campaign, sequence: int) -> Proposer:
    """The proposer of the ``sequence``-th proposal (the strategy's entries take turns)."""
    from coevo.campaigns.proposers.config import ConfigProposer

    entry = campaign.strategy[(sequence - 1) % len(campaign.strategy)]
    if entry["kind"] == ProposerKind.CONFIG:
        return ConfigProposer(campaign, entry.get("options") or {})
    raise InvalidInput(f"The {entry['kind']} proposer is not available yet.")


def proposer_for_proposal(*, campaign: Campaign, kind: str) -> Proposer | None:
    from coevo.campaigns.proposers.config import ConfigProposer

    for entry in campaign.strategy:
        if entry["kind"] == kind == ProposerKind.CONFIG:
            return ConfigProposer(campaign, entry.get("options") or {})
    return None


__all__ = [
    "Draft",
    "Outcome",
    "Proposer",
    "proposer_for",
    "proposer_for_proposal",
    "strategy_validate",
]

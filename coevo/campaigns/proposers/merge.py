"""The ``merge`` proposer: combine two candidates that improved on different search tasks.

HarnessCompass / ModularRSI evolve components separately and then integrate them. Here the
per-task front (``campaign_task_front``: which candidates solve which SEARCH task best) says
who is good at what; two candidates each best on tasks the other is not are merged with a real
three-way git merge (``harness_store.derive.candidate_merge``: a commit with both as parents),
so a prompt fix from one line of descent and a tool fix from another meet in one candidate.

Pairs are ranked by the number of search tasks they are best on together; a pair is tried
once (conflicts included: merging it again would conflict again), and a pair whose tasks one
candidate is already best on all of is skipped (the merge could at most tie it). The proposer reads only
search-split results: never validation or held-out material.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from coevo.campaigns.models import Campaign, Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers.base import Draft, stage
from coevo.campaigns.selectors import campaign_task_front
from coevo.errors import InvalidInput
from harness_store.derive import candidate_merge_preview
from harness_store.manifest import Manifest

NO_PAIR_REASON = "no two candidates improved on different tasks yet"
OPTIONS = {"validated_only"}
# Previews (a git merge each) tried per proposal at most before giving up for this turn.
MAX_PREVIEWS = 25


def merge_options_validate(*, manifest: Manifest, options: dict[str, Any]) -> dict[str, Any]:
    """``{"validated_only": bool}``: merge only candidates that went on to a validation run
    (default false: a candidate pruned on the search split may still be best on some task)."""
    if not isinstance(options, dict):
        raise InvalidInput("merge options: expected an object.")
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise InvalidInput(
            f"merge options: unknown keys {unknown} (expected {', '.join(sorted(OPTIONS))})."
        )
    validated_only = options.get("validated_only", False)
    if not isinstance(validated_only, bool):
        raise InvalidInput("merge options: validated_only must be true or false.")
    return {"validated_only": validated_only}


class MergeProposer:
    drafts_slowly = False

    def __init__(self, campaign: Campaign, options: dict[str, Any]) -> None:
        self.campaign = campaign
        self.validated_only = bool((options or {}).get("validated_only", False))

    def propose(self, *, history: list[dict[str, Any]]) -> Draft:
        proposals = self._eligible()
        wins = self._wins(proposals)
        tried = {
            frozenset(shas)
            for shas in Proposal.objects.filter(
                campaign=self.campaign, kind=ProposerKind.MERGE
            ).values_list("parent_shas", flat=True)
            if len(shas) == 2
        }
        ranked = sorted(
            (
                (a, b)
                for a, b in combinations(sorted(wins), 2)
                if wins[a] - wins[b]
                and wins[b] - wins[a]
                and frozenset((a, b)) not in tried
                and not _covered(wins[a] | wins[b], wins)
            ),
            key=lambda pair: (
                -len(wins[pair[0]] | wins[pair[1]]),
                -sum(proposals[sha].search_score or 0.0 for sha in pair),
                min(proposals[sha].sequence for sha in pair),
                pair,
            ),
        )
        for a, b in ranked[:MAX_PREVIEWS]:
            ours, theirs = sorted(
                (proposals[a], proposals[b]),
                key=lambda p: (-(p.search_score or 0.0), -len(wins[p.candidate.sha]), p.sequence),
            )
            draft = self._merge(ours, theirs, wins)
            if draft is not None:
                return draft
        return Draft(
            kind=ProposerKind.MERGE,
            parents=[],
            changes={},
            message="merge: nothing to merge",
            shown=self._shown([], wins, proposals),
            stages=[stage("applies", False, NO_PAIR_REASON)],
        )

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None:
        """Nothing to learn: the next pick reads the per-task front afresh."""

    # --- helpers ----------------------------------------------------------------------------

    def _eligible(self) -> dict[str, Proposal]:
        """Evaluated candidates of the campaign (search evaluation done), by SHA."""
        queryset = (
            Proposal.objects.filter(
                campaign=self.campaign,
                state=ProposalState.EVALUATED,
                candidate__isnull=False,
                search_evaluation__isnull=False,
            )
            .select_related("candidate")
            .order_by("sequence")
        )
        if self.validated_only:
            queryset = queryset.filter(validation_score__isnull=False)
        eligible: dict[str, Proposal] = {}
        for proposal in queryset:
            eligible.setdefault(proposal.candidate.sha, proposal)
        return eligible

    def _wins(self, proposals: dict[str, Proposal]) -> dict[str, frozenset[str]]:
        """Per eligible candidate, the search tasks it is best on (the per-task front)."""
        wins: dict[str, set[str]] = {}
        for task, shas in campaign_task_front(campaign=self.campaign).items():
            for sha in shas:
                if sha in proposals:
                    wins.setdefault(sha, set()).add(task)
        return {sha: frozenset(tasks) for sha, tasks in wins.items()}

    def _merge(
        self, ours: Proposal, theirs: Proposal, wins: dict[str, frozenset[str]]
    ) -> Draft | None:
        a, b = ours.candidate, theirs.candidate
        preview = candidate_merge_preview(project=self.campaign.project, ours=a, theirs=b)
        if preview.tree_sha in (a.tree_sha, b.tree_sha):
            # One already contains the other's changes (an ancestor): the merge adds nothing.
            return None
        only_ours = sorted(wins[a.sha] - wins[b.sha])
        only_theirs = sorted(wins[b.sha] - wins[a.sha])
        draft = Draft(
            kind=ProposerKind.MERGE,
            parents=[a, b],
            changes={},
            message=(
                f"merge {b.short_sha} into {a.short_sha}: best on {_tasks(only_ours)} and on "
                f"{_tasks(only_theirs)} respectively"
            ),
            patch=preview.patch,
            params={
                "ours": a.sha,
                "theirs": b.sha,
                "ours_tasks": only_ours,
                "theirs_tasks": only_theirs,
                "union": len(wins[a.sha] | wins[b.sha]),
            },
            shown=self._shown([ours, theirs], wins, {}),
        )
        if preview.conflicts:
            draft.stages.append(
                stage(
                    "applies",
                    False,
                    f"merging {b.short_sha} into {a.short_sha} conflicts in "
                    f"{', '.join(preview.conflicts)}",
                )
            )
        else:
            draft.stages.append(
                stage(
                    "applies",
                    True,
                    f"{b.short_sha} merges cleanly into {a.short_sha} (three-way, against "
                    "their merge base)",
                )
            )
        return draft

    def _shown(
        self,
        pair: list[Proposal],
        wins: dict[str, frozenset[str]],
        proposals: dict[str, Proposal],
    ) -> dict[str, Any]:
        # What the pick was based on: search scores and per-task wins, nothing else.
        shown_proposals = pair or [proposals[sha] for sha in sorted(wins) if sha in proposals]
        return {
            "proposer": "merge",
            "candidates": [
                {
                    "sha": p.candidate.sha,
                    "search_score": p.search_score,
                    "best_on": sorted(wins.get(p.candidate.sha, ())),
                }
                for p in shown_proposals
            ],
            "task_keys": sorted(set().union(*(wins.get(p.candidate.sha, ()) for p in pair)))
            if pair
            else [],
            "trace_ids": [],
        }


def _covered(tasks: frozenset[str], wins: dict[str, frozenset[str]]) -> bool:
    """Some candidate is already best on all these tasks (say, an earlier merge of one of the
    two): merging the pair could at most tie it."""
    return any(won >= tasks for won in wins.values())


def _tasks(keys: list[str]) -> str:
    shown = ", ".join(keys[:5])
    return shown + (f" (+{len(keys) - 5})" if len(keys) > 5 else "")


__all__ = ["NO_PAIR_REASON", "MergeProposer", "merge_options_validate"]

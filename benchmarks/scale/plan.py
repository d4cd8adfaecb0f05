"""How much a scale fill writes. ``full`` is issue 21's figures (10,000 candidates, campaigns of
2,000 proposals, ~1,000,000 rollouts in evaluations of up to 5,000, ~10,000,000 trace steps,
1,000,000 audit events); ``medium`` about 1/20 of it, ``small`` about 1/1000 (for tests);
``pages`` full's largest page subjects (one campaign of 2,000 proposals, two 5,000-rollout
evaluations, promotions) with one trace step a rollout, for profiling those pages in minutes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

# A fixed year, so the same seed writes the same commits (a commit's SHA includes its date).
YEAR_START = datetime(2025, 12, 1, tzinfo=UTC)
YEAR = timedelta(days=365)


@dataclass(frozen=True)
class ScalePlan:
    name: str
    campaigns: int
    proposals_per_campaign: int
    # Commits on the main line (CI and people), which campaigns start from.
    mainline_candidates: int
    search_tasks: int
    validation_tasks: int
    heldout_tasks: int
    # A proposal's search evaluation: staged, smoke then minibatch, paired with its parent.
    search_eval_tasks: int
    smoke_tasks: int
    # The share of valid proposals validated (the rest stopped early as clearly worse).
    validated_share: float
    # Main-line candidates evaluated on the whole search split, ``full_epochs`` samples a task.
    full_evaluations: int
    full_epochs: int
    policies: int
    # The harness × policy matrix: this many candidates × every policy version.
    matrix_candidates: int
    promotions: int
    steps_per_rollout: float
    audit_events: int
    # Rows per transaction of the bulk phases (rollouts; audit events and tokens).
    chunk_rollouts: int = 20_000
    chunk_events: int = 50_000

    @property
    def proposals(self) -> int:
        return self.campaigns * self.proposals_per_campaign


SCALES = {
    "full": ScalePlan(
        name="full",
        campaigns=5,
        proposals_per_campaign=2_000,
        mainline_candidates=400,
        search_tasks=1_000,
        validation_tasks=100,
        heldout_tasks=200,
        search_eval_tasks=40,
        smoke_tasks=4,
        validated_share=0.57,
        full_evaluations=10,
        full_epochs=5,
        policies=4,
        matrix_candidates=8,
        promotions=40,
        steps_per_rollout=10.0,
        audit_events=1_000_000,
    ),
    "medium": ScalePlan(
        name="medium",
        campaigns=2,
        proposals_per_campaign=250,
        mainline_candidates=20,
        search_tasks=1_000,
        validation_tasks=100,
        heldout_tasks=200,
        search_eval_tasks=40,
        smoke_tasks=4,
        validated_share=0.57,
        full_evaluations=1,
        full_epochs=5,
        policies=4,
        matrix_candidates=4,
        promotions=4,
        steps_per_rollout=10.0,
        audit_events=50_000,
    ),
    "small": ScalePlan(
        name="small",
        campaigns=1,
        proposals_per_campaign=10,
        mainline_candidates=3,
        search_tasks=40,
        validation_tasks=20,
        heldout_tasks=8,
        search_eval_tasks=20,
        smoke_tasks=2,
        validated_share=0.57,
        full_evaluations=1,
        full_epochs=2,
        policies=2,
        matrix_candidates=2,
        promotions=3,
        steps_per_rollout=10.0,
        audit_events=1_000,
        chunk_rollouts=200,
        chunk_events=300,
    ),
}

# Full's page subjects at their full size (a campaign of 2,000 proposals, 5,000-rollout
# evaluations, 40 promotions), the rest of the project small.
SCALES["pages"] = replace(
    SCALES["full"],
    name="pages",
    campaigns=1,
    mainline_candidates=20,
    full_evaluations=2,
    policies=2,
    matrix_candidates=4,
    steps_per_rollout=1.0,
    audit_events=10_000,
)

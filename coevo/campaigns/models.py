"""Evolution campaigns: a seed candidate evolved by proposers, every proposal kept.

A campaign evaluates one proposal at a time: its SEARCH evaluation (staged, early-stopped
against the parent), then, unless it stopped as clearly worse, its VALIDATION evaluation. The
best candidate is chosen on the validation score (AutoSaddler: selection on validation, never on
the split the proposer searched). With ``batch_size`` N > 1 a round drafts N proposals and
races their search evaluations (coevo.campaigns.racing) before the survivors are validated.
"""

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.evaluations.models import USD_DIGITS, Budget, Evaluation
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite
from harness_store.models import Candidate


class CampaignState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"  # by a user
    FINISHED = "finished"  # a stop rule ended it
    FAILED = "failed"


CAMPAIGN_FINAL_STATES = (CampaignState.STOPPED, CampaignState.FINISHED, CampaignState.FAILED)


class ProposerKind(models.TextChoices):
    # The seed itself, evaluated first as proposal 0: the baseline every proposal is paired
    # against and the first "best".
    SEED = "seed"
    CONFIG = "config"
    # Uniform draws over the same knobs as config: the baseline config search must beat.
    RANDOM = "random"
    LLM_PATCH = "llm-patch"
    AGENTIC = "agentic"
    MERGE = "merge"
    MANUAL = "manual"
    # An alternating campaign's policy step: train an adapter on the best candidate's
    # harness-matched trajectories, then evaluate that candidate under the new policy version.
    POLICY = "policy"


class Campaign(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="campaigns")
    name = models.CharField(max_length=200)
    seed_candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="+")
    policy_version = models.ForeignKey(PolicyVersion, on_delete=models.PROTECT, related_name="+")
    suite = models.ForeignKey(Suite, on_delete=models.PROTECT, related_name="campaigns")
    search_split = models.CharField(max_length=16, choices=Split.choices, default=Split.SEARCH)
    validation_split = models.CharField(
        max_length=16, choices=Split.choices, default=Split.VALIDATION
    )
    # Validated by coevo.campaigns.proposers.strategy_validate:
    # [{"kind": "config", "options": {...}}].
    strategy = models.JSONField(default=list)
    # The ledger account every evaluation of the campaign reserves on (as parent_budget).
    budget = models.OneToOneField(Budget, on_delete=models.PROTECT, related_name="campaign")
    max_proposals = models.PositiveIntegerField(default=10)
    # Proposals drafted per round: 1 evaluates one at a time; more are raced on the search
    # split (coevo.campaigns.racing), the ones clearly worse than the best eliminated early.
    batch_size = models.PositiveSmallIntegerField(default=1)
    max_candidates = models.PositiveIntegerField(null=True, blank=True)
    # coevo.evaluations.plans.EvaluationPlan.as_dict() for the search evaluations.
    plan = models.JSONField(default=dict, blank=True)
    patience = models.PositiveIntegerField(null=True, blank=True)
    target_score = models.FloatField(null=True, blank=True)
    epochs = models.PositiveSmallIntegerField(default=1)
    seed = models.BigIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=CampaignState.choices, default=CampaignState.PENDING
    )
    state_detail = models.TextField(blank=True)
    stop_reason = models.TextField(blank=True)
    best_candidate = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    best_validation_score = models.FloatField(null=True, blank=True)
    # Proposals ended since the best validation score last improved (the patience rule).
    proposals_since_improvement = models.PositiveIntegerField(default=0)
    # Validated by coevo.campaigns.alternation and read as its Alternation: {} runs harness
    # steps only; otherwise policy steps alternate with them ({"trainer", "switch", ...}).
    alternation = models.JSONField(default=dict, blank=True)
    # The policy harness proposals are evaluated under now: ``policy_version`` until a policy
    # step is adopted (it improved the best validation score).
    current_policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # A proposer that writes slowly (llm-patch: a model call of minutes) drafts outside the
    # campaign's row lock: the sequence it drafts and since when (coevo.campaigns.runner).
    drafting_sequence = models.PositiveIntegerField(null=True, blank=True)
    drafting_at = models.DateTimeField(null=True, blank=True)
    # A round of batch_size > 1 drafts its slow proposals in parallel, one task each: the same
    # tickets, {"<sequence>": "<drafting_at, ISO 8601>"}, read and written under the row lock.
    drafting_batch = models.JSONField(default=dict, blank=True)
    # The policy the best candidate scored best_validation_score under.
    best_policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(max_proposals__gte=1), name="campaign_max_proposals_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(epochs__gte=1), name="campaign_epochs_positive"
            ),
            models.CheckConstraint(
                condition=models.Q(batch_size__gte=1, batch_size__lte=16),
                name="campaign_batch_size_range",
            ),
            models.CheckConstraint(
                condition=models.Q(patience__isnull=True) | models.Q(patience__gte=1),
                name="campaign_patience_positive",
            ),
            models.CheckConstraint(
                condition=~models.Q(search_split=models.F("validation_split")),
                name="campaign_splits_differ",
            ),
            models.CheckConstraint(
                condition=~models.Q(search_split="heldout") & ~models.Q(validation_split="heldout"),
                name="campaign_no_heldout_split",
            ),
        ]
        indexes = [
            # campaigns_advance_running (beat): the running campaigns.
            models.Index(
                fields=["state"],
                name="campaign_running_idx",
                condition=models.Q(state="running"),
            ),
        ]

    def __str__(self) -> str:
        return f"campaign {self.name}"

    @property
    def is_final(self) -> bool:
        return self.state in CAMPAIGN_FINAL_STATES

    @property
    def active_policy_version(self) -> PolicyVersion:
        return self.current_policy_version or self.policy_version

    @property
    def alternates(self) -> bool:
        return bool(self.alternation)


class ProposalState(models.TextChoices):
    # A manual proposal (a human or CI commit) waiting for the runner: evaluated before the
    # proposers' next proposal, first submitted first. Not "open": the one-open-proposal
    # constraint is about evaluation, and any number may wait.
    QUEUED = "queued"
    PROPOSED = "proposed"
    INVALID = "invalid"  # rejected by a validation stage; never evaluated further
    EVALUATING = "evaluating"
    EVALUATED = "evaluated"
    FAILED = "failed"  # the evaluation could not run (infra, budget, campaign stopped)


PROPOSAL_OPEN_STATES = (ProposalState.PROPOSED, ProposalState.EVALUATING)
PROPOSAL_FINAL_STATES = (ProposalState.INVALID, ProposalState.EVALUATED, ProposalState.FAILED)


class Proposal(TimeStampedModel):
    """One proposal, rejected ones included. What it was shown, what it wrote and the patch are
    written once; only its progress (state, evaluations, scores) changes afterwards."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="proposals")
    sequence = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=ProposerKind.choices)
    # The resulting commit's parents (first parent first).
    parent_shas = models.JSONField(default=list, blank=True)
    # What the proposer saw: {"candidates": [{"sha", "search_score"}], "task_keys": [...],
    # "trace_ids": [...], ...}. Search split only: never validation or held-out material.
    shown = models.JSONField(default=dict, blank=True)
    # The proposer's own parameters (config: the knob values of its Optuna trial).
    params = models.JSONField(default=dict, blank=True)
    trial_number = models.IntegerField(null=True, blank=True)
    prompt = models.TextField(blank=True)
    response = models.TextField(blank=True)
    proposer_tokens = models.PositiveIntegerField(default=0)
    # How long the proposer took to write it (llm-patch: its model call); charged with its
    # tokens to the campaign's budget as proposer spend (coevo.evaluations.ledger).
    proposer_wall_ms = models.PositiveIntegerField(default=0)
    # US dollars of its proposer model calls (at the prices that applied); null: no price.
    proposer_cost_usd = models.DecimalField(null=True, blank=True, **USD_DIGITS)
    patch = models.TextField(blank=True)
    # [{"stage": applies|manifest|imports|duplicate|smoke, "ok": bool, "reason": str}]
    stages = models.JSONField(default=list, blank=True)
    state = models.CharField(
        max_length=16, choices=ProposalState.choices, default=ProposalState.PROPOSED
    )
    state_detail = models.TextField(blank=True)
    candidate = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.PROTECT, related_name="proposals"
    )
    search_evaluation = models.ForeignKey(
        Evaluation, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    validation_evaluation = models.ForeignKey(
        Evaluation, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    search_score = models.FloatField(null=True, blank=True)
    validation_score = models.FloatField(null=True, blank=True)
    # Policy tokens per validation task (per search task when it had no validation run).
    tokens_per_task = models.FloatField(null=True, blank=True)
    # The policy its evaluations ran under (for a policy step: the version it trained).
    policy_version = models.ForeignKey(
        PolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # A policy step's training data and training run.
    export = models.ForeignKey(
        "exports.TrajectoryExport",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    training_run = models.ForeignKey(
        "training.TrainingRun", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # It raised the campaign's best validation score (the patience and switch rules count these).
    improved = models.BooleanField(default=False)
    # The round it was drafted in (the sequence of the round's first proposal) when the
    # campaign drafts batch_size > 1 per round; None for proposals evaluated one at a time.
    batch = models.PositiveIntegerField(null=True, blank=True)
    # Eliminated by the round's race (coevo.campaigns.racing): by which proposal, after how
    # many search tasks, when, the statistic ({"kind", "p_value", "reason", "means"}), and
    # the search rollouts that were then not run (the campaign's "rollouts saved by racing").
    eliminated_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    eliminated_after_tasks = models.PositiveIntegerField(null=True, blank=True)
    eliminated_at = models.DateTimeField(null=True, blank=True)
    elimination = models.JSONField(default=dict, blank=True)
    rollouts_saved = models.PositiveIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["campaign", "sequence"]
        constraints = [
            models.UniqueConstraint(
                fields=["campaign", "sequence"], name="proposal_unique_sequence"
            ),
            # The runner evaluates one proposal at a time outside rounds: a second open one is a
            # race it lost. A round's proposals are open together; the runner opens a round only
            # when nothing is open, under the campaign's row lock.
            models.UniqueConstraint(
                fields=["campaign"],
                condition=models.Q(state__in=["proposed", "evaluating"], batch__isnull=True),
                name="proposal_one_open_per_campaign",
            ),
            models.UniqueConstraint(
                fields=["campaign"],
                condition=models.Q(kind="seed"),
                name="proposal_one_seed_per_campaign",
            ),
            models.CheckConstraint(
                condition=~models.Q(state="evaluated") | models.Q(candidate__isnull=False),
                name="proposal_evaluated_has_candidate",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.campaign_id} #{self.sequence} ({self.kind})"

    @property
    def is_final(self) -> bool:
        return self.state in PROPOSAL_FINAL_STATES


class PatternStatus(models.TextChoices):
    OPEN = "open"
    ADDRESSED = "addressed"  # a candidate solved most of its tasks
    REGRESSED = "regressed"  # a later best fails most of them again


class FailurePattern(TimeStampedModel):
    """A recurring failure of a campaign's candidates on the SEARCH split, kept as a persistent
    issue with identity, lifecycle and evidence (ADIAS: re-deriving it from candidate history
    each round loses repair progress). Written by ``coevo.campaigns.patterns`` only."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    campaign = models.ForeignKey(
        Campaign, on_delete=models.CASCADE, related_name="failure_patterns"
    )
    # sha1 of ``signature``: the identity failures are grouped by.
    key = models.CharField(max_length=40)
    name = models.CharField(max_length=120)
    # "<outcome> | <error kind> | <normalized message> [| last: <normalized observation>]"
    signature = models.TextField()
    outcome = models.CharField(max_length=16)
    status = models.CharField(
        max_length=16, choices=PatternStatus.choices, default=PatternStatus.OPEN
    )
    status_detail = models.TextField(blank=True)
    addressed_by = models.ForeignKey(
        Candidate, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Proposals are never deleted on their own (only with their campaign), so CASCADE here
    # only follows a campaign's deletion, and never breaks the addressed-has-proposal check.
    addressed_in = models.ForeignKey(
        Proposal, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    regressed_in = models.ForeignKey(
        Proposal, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    # Search tasks it was seen on (sorted), and a few examples:
    # [{"task", "rollout", "proposal", "excerpt"}].
    task_keys = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=list, blank=True)
    first_seen = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="+")
    last_seen = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="+")
    occurrences = models.PositiveIntegerField(default=0)  # failed rollouts
    proposals = models.PositiveIntegerField(default=0)  # search evaluations it appeared in
    # The search evaluations already counted, so a repeated update counts nothing twice.
    evaluation_ids = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["campaign", "-occurrences", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["campaign", "key"], name="failure_pattern_unique_signature"
            ),
            models.CheckConstraint(
                condition=~models.Q(status="addressed") | models.Q(addressed_in__isnull=False),
                name="failure_pattern_addressed_has_proposal",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"

import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite, Task
from harness_store.models import Candidate
from workers.outcomes import RolloutOutcome

# US dollars, exact: per-million prices with six places over a million tokens need twelve
# (coevo/policies/prices.py); 12 digits before the point is far beyond any budget.
USD_DIGITS = {"max_digits": 24, "decimal_places": 12}


class EvaluationState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


class PauseKind(models.TextChoices):
    """Why an evaluation is paused. Only a policy outage ends by itself (the watchdog resumes
    it once the server answers); a campaign's pause (a person paused the campaign) waits for
    the campaign to resume."""

    POLICY_OUTAGE = "policy_outage"
    CAMPAIGN = "campaign"


EVALUATION_OPEN_STATES = (
    EvaluationState.PENDING,
    EvaluationState.RUNNING,
    EvaluationState.PAUSED,
)


EVALUATION_FINAL_STATES = (
    EvaluationState.FINISHED,
    EvaluationState.FAILED,
    EvaluationState.CANCELLED,
)


class Evaluation(TimeStampedModel):
    """A candidate × policy version × suite split × epochs; fans out to one rollout per task × epoch."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="evaluations")
    policy_version = models.ForeignKey(
        PolicyVersion, on_delete=models.PROTECT, related_name="evaluations"
    )
    suite = models.ForeignKey(Suite, on_delete=models.PROTECT, related_name="evaluations")
    split = models.CharField(max_length=16, choices=Split.choices)
    epochs = models.PositiveSmallIntegerField(default=1)
    seed = models.BigIntegerField(default=0)
    task_limit = models.PositiveIntegerField(null=True, blank=True)
    knobs = models.JSONField(default=dict, blank=True)
    # The staged plan as created (see coevo.evaluations.plans.EvaluationPlan.as_dict).
    plan = models.JSONField(default=dict, blank=True)
    reference = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The evaluation this one is compared with, task by task, for early stopping.",
    )
    use_cache = models.BooleanField(default=True)
    # Its rollouts are sent a few tasks at a time by whoever paces it (a campaign's race,
    # coevo.campaigns.racing), not a stage at once: the engine starts its stages but sends
    # nothing, and announces each step with evaluation_progressed.
    paced = models.BooleanField(default=False)
    state = models.CharField(
        max_length=16, choices=EvaluationState.choices, default=EvaluationState.PENDING
    )
    state_detail = models.TextField(blank=True)
    # Set while paused (and only then): who or what paused it, which decides who resumes it.
    pause_kind = models.CharField(max_length=16, choices=PauseKind.choices, blank=True)
    stage = models.PositiveSmallIntegerField(default=0)
    stop_reason = models.TextField(blank=True)
    # Policy outages met since the evaluation last (re)started; past a threshold it pauses.
    policy_outages = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set once retention deleted its trace steps (coevo.evaluations.retention); scores stay.
    traces_pruned_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(epochs__gte=1), name="evaluation_epochs_positive"
            ),
            models.CheckConstraint(
                condition=(models.Q(state=EvaluationState.PAUSED) & ~models.Q(pause_kind=""))
                | (~models.Q(state=EvaluationState.PAUSED) & models.Q(pause_kind="")),
                name="evaluation_pause_kind_iff_paused",
            ),
        ]

    def __str__(self) -> str:
        return f"evaluation {self.id}"

    @property
    def is_final(self) -> bool:
        return self.state in EVALUATION_FINAL_STATES


class StageKind(models.TextChoices):
    SMOKE = "smoke"
    MINIBATCH = "minibatch"
    FULL = "full"


class StageState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    STOPPED = "stopped", "stopped early"
    SKIPPED = "skipped"


STAGE_FINAL_STATES = (
    StageState.PASSED,
    StageState.FAILED,
    StageState.STOPPED,
    StageState.SKIPPED,
)


class EvaluationStage(models.Model):
    """One stage of an evaluation's plan (smoke → minibatch → full) and how it ended."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="stages")
    index = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=16, choices=StageKind.choices)
    state = models.CharField(max_length=16, choices=StageState.choices, default=StageState.PENDING)
    tasks = models.PositiveIntegerField()
    reason = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["evaluation", "index"]
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "index"], name="stage_unique_index"),
        ]

    def __str__(self) -> str:
        return f"{self.evaluation_id} stage {self.index} ({self.kind})"

    @property
    def is_final(self) -> bool:
        return self.state in STAGE_FINAL_STATES


class RolloutState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


ROLLOUT_FINAL_STATES = (RolloutState.DONE, RolloutState.CANCELLED)


# How a rollout ended: the runtime's outcomes (workers/outcomes.py, ``RolloutOutcome``), which
# it records; the labels are the pages'.
ROLLOUT_OUTCOME_CHOICES = [
    (RolloutOutcome.PASSED.value, "Passed"),
    (RolloutOutcome.TASK_FAILURE.value, "task failure"),
    (RolloutOutcome.HARNESS_ERROR.value, "harness error"),
    (RolloutOutcome.INFRA_ERROR.value, "infra error"),
]


class Rollout(TimeStampedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="rollouts")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="rollouts")
    epoch = models.PositiveSmallIntegerField(default=0)
    seed = models.BigIntegerField()
    stage = models.PositiveSmallIntegerField(default=0)
    # Identical inputs (project, split, tree, policy version, task, seed, knobs) give a
    # reusable result; empty on the held-out split, which the cache never serves.
    cache_key = models.CharField(max_length=64, blank=True)
    reused_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state = models.CharField(
        max_length=16, choices=RolloutState.choices, default=RolloutState.PENDING
    )
    outcome = models.CharField(max_length=16, choices=ROLLOUT_OUTCOME_CHOICES, blank=True)
    error_kind = models.CharField(max_length=32, blank=True)
    score = models.FloatField(null=True, blank=True)
    detail = models.TextField(blank=True)
    answer = models.JSONField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    model_calls = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    # US dollars: the sum of its model calls' costs, each at the price that applied when it
    # was made (on its model-call step); null when no call had a price ("—", not 0).
    cost_usd = models.DecimalField(null=True, blank=True, **USD_DIGITS)
    # Every claim is an attempt (trace steps are numbered by it); attempts lost to a policy
    # outage or wiped by a resume are ``forgiven``: only the others count against the maximum.
    attempts = models.PositiveSmallIntegerField(default=0)
    forgiven_attempts = models.PositiveSmallIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["task__position", "epoch"]
        constraints = [
            models.UniqueConstraint(
                fields=["evaluation", "task", "epoch"], name="rollout_one_per_task_epoch"
            ),
            models.CheckConstraint(
                condition=~models.Q(state="done") | ~models.Q(outcome=""),
                name="rollout_done_has_outcome",
            ),
        ]
        indexes = [
            # evaluation_progress: counts of rollouts by state for one evaluation.
            models.Index(fields=["evaluation", "state"], name="rollout_eval_state_idx"),
            # cache_lookup: a finished, scored rollout with the same inputs.
            models.Index(
                fields=["cache_key"],
                name="rollout_cache_idx",
                condition=models.Q(state="done", reused_from__isnull=True)
                & ~models.Q(cache_key=""),
            ),
            # The watchdog: rollouts waiting for a worker (lost messages are sent again).
            models.Index(
                fields=["enqueued_at"],
                name="rollout_pending_idx",
                condition=models.Q(state="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"rollout {self.id}"

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def counted_attempts(self) -> int:
        return self.attempts - self.forgiven_attempts

    @property
    def is_final(self) -> bool:
        return self.state in ROLLOUT_FINAL_STATES


class TraceStep(models.Model):
    """One step of a rollout's trace. Kept out of list pages: only the rollout page loads them."""

    # No index of its own: trace_step_unique_index leads with rollout and serves every lookup,
    # and one index fewer makes trace ingest faster.
    rollout = models.ForeignKey(
        Rollout, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    attempt = models.PositiveSmallIntegerField(default=1)
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=32)
    # A payload over coevo.evaluations.traces.COMPRESS_OVER_BYTES is stored zlib-compressed
    # here, and ``payload`` keeps an excerpt of it (read through traces.trace_step_payload).
    payload = models.JSONField()
    payload_zlib = models.BinaryField(null=True, blank=True, editable=False)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["rollout", "attempt", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["rollout", "attempt", "index"], name="trace_step_unique_index"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rollout_id} #{self.attempt}.{self.index} {self.kind}"


class Budget(TimeStampedModel):
    """A ledger account: what may be spent (limits), what is promised (reserved), what was spent.

    Work reserves its worst case before it is enqueued (one rollout, the manifest's token and
    wall-time limits) and settles the actual figures when it ends, so concurrent evaluations
    cannot together overrun a limit. A budget may have a parent (a campaign's budget): every
    reservation and settlement applies to the whole chain.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="budgets")
    evaluation = models.OneToOneField(
        Evaluation, null=True, blank=True, on_delete=models.CASCADE, related_name="budget"
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    name = models.CharField(max_length=200)
    limit_rollouts = models.PositiveBigIntegerField(null=True, blank=True)
    limit_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    limit_wall_s = models.PositiveBigIntegerField(null=True, blank=True)
    # A campaign's proposer spend, in units of its own (coevo.evaluations.ledger).
    limit_proposer_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    limit_proposer_wall_ms = models.PositiveBigIntegerField(null=True, blank=True)
    # US dollars: the policy's (rollouts, reserved at the worst case) and the proposers'.
    limit_usd = models.DecimalField(null=True, blank=True, **USD_DIGITS)
    limit_proposer_usd = models.DecimalField(null=True, blank=True, **USD_DIGITS)
    # Reserved per rollout: the manifest's token and wall-time limits (worst case).
    unit_tokens = models.BigIntegerField(default=0)
    unit_wall_s = models.BigIntegerField(default=0)
    # The manifest's token limit at the highest per-token price of the version's endpoints.
    unit_usd = models.DecimalField(default=0, **USD_DIGITS)
    reserved_rollouts = models.BigIntegerField(default=0)
    reserved_tokens = models.BigIntegerField(default=0)
    reserved_wall_s = models.BigIntegerField(default=0)
    spent_rollouts = models.BigIntegerField(default=0)
    spent_tokens = models.BigIntegerField(default=0)
    spent_wall_s = models.BigIntegerField(default=0)
    reserved_proposer_tokens = models.BigIntegerField(default=0)
    reserved_proposer_wall_ms = models.BigIntegerField(default=0)
    spent_proposer_tokens = models.BigIntegerField(default=0)
    spent_proposer_wall_ms = models.BigIntegerField(default=0)
    reserved_usd = models.DecimalField(default=0, **USD_DIGITS)
    spent_usd = models.DecimalField(default=0, **USD_DIGITS)
    reserved_proposer_usd = models.DecimalField(default=0, **USD_DIGITS)
    spent_proposer_usd = models.DecimalField(default=0, **USD_DIGITS)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(reserved_rollouts__gte=0)
                & models.Q(reserved_tokens__gte=0)
                & models.Q(reserved_wall_s__gte=0),
                name="budget_reservations_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"budget {self.name}"


class LedgerKind(models.TextChoices):
    RESERVE = "reserve"
    SETTLE = "settle"
    REFUND = "refund"


class LedgerEntry(models.Model):
    """One movement on a budget; the budget's counters are the sum of its entries."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="entries")
    kind = models.CharField(max_length=16, choices=LedgerKind.choices)
    rollout = models.ForeignKey(
        Rollout, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rollouts = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    wall_s = models.BigIntegerField(default=0)
    proposer_tokens = models.BigIntegerField(default=0)
    proposer_wall_ms = models.BigIntegerField(default=0)
    usd = models.DecimalField(default=0, **USD_DIGITS)
    proposer_usd = models.DecimalField(default=0, **USD_DIGITS)
    note = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["budget", "created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.rollouts}r {self.tokens}t {self.wall_s}s"

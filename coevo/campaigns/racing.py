"""A round's race: the valid proposals of a round of ``batch_size`` > 1 evaluated on the search
split together, task by task, and each dropped as soon as another is clearly better.

Called by the runner under the campaign's row lock. Each proposal keeps its own search
evaluation, paired against the same reference and early-stopped against it as a single
proposal's is; what the race adds is the order and the eliminations:

- Its search evaluations are *paced* (``Evaluation.paced``): the engine sends none of their
  rollouts; ``round_follow`` sends each proposal's next tasks, in the same task order for all,
  at most ``RACE_AHEAD_TASKS`` ahead of the tasks every one of them has finished, interleaved
  (task 1 of each, then task 2 of each, ...). So a proposal that falls behind has its remaining
  tasks still unsent when it is eliminated.
- After every step the race is replayed over the tasks all racers finished
  (``coevo.evaluations.stats.racing.Race``: anytime-valid betting evidence, so looking after
  every task needs no correction). A proposal clearly worse than another is eliminated: its
  search evaluation is cancelled (its unsent rollouts are never run, and their reservation is
  refunded in the ledger), and it ends evaluated but pruned, with who eliminated it, after how
  many tasks, when, and the statistic. Those unsent rollouts are its ``rollouts_saved``.
- A proposal whose search ends otherwise (finished, stopped early against the reference, smoke
  failure) follows ``proposal_follow`` as a single proposal does: survivors are validated, and
  the best is chosen on validation.

The race is replayed from the stored scores at every step rather than kept in memory, so a
redelivered task, two workers at once, or a restarted worker all see the same race; the
proposals it already eliminated are out of it (their evaluation is over), and an elimination
is recorded once (the proposal's state moves by compare-and-swap).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from coevo.campaigns.evaluating import (
    evaluation_score,
    proposal_end,
    proposal_follow,
    search_evaluation_create,
    search_start,
)
from coevo.campaigns.models import (
    PROPOSAL_OPEN_STATES,
    Campaign,
    CampaignState,
    Proposal,
    ProposalState,
)
from coevo.campaigns.proposers import ProposalOutcome
from coevo.campaigns.stop_rules import campaign_finish
from coevo.errors import BudgetExceeded, CoevoError, InvalidState
from coevo.evaluations.lifecycle import evaluation_cancel
from coevo.evaluations.models import (
    EVALUATION_OPEN_STATES,
    Evaluation,
    EvaluationState,
    Rollout,
    RolloutState,
)
from coevo.evaluations.plans import EvaluationPlan, stages_for
from coevo.evaluations.selectors import evaluation_task_scores
from coevo.evaluations.services import evaluation_enqueue
from coevo.evaluations.stats.racing import Race
from coevo.suites.models import Task

logger = logging.getLogger(__name__)

# How many tasks a racer's rollouts may be sent ahead of the tasks all racers have finished:
# enough to keep workers busy while the slowest racer catches up, few enough that an
# eliminated proposal leaves most of its search split unsent.
RACE_AHEAD_TASKS = 2


def round_follow(campaign: Campaign, proposals: Sequence[Proposal]) -> bool:
    """The round's next step once all its drafts are in: start the race, eliminate, pace, and
    follow each proposal; True when another step may follow at once."""
    open_ = [p for p in proposals if p.state in PROPOSAL_OPEN_STATES]
    if any(p.search_evaluation_id is None for p in open_):
        return _race_start(campaign, open_)
    _race_step(campaign, open_)
    moved = False
    for proposal in Proposal.objects.filter(
        id__in=[p.id for p in open_], state__in=PROPOSAL_OPEN_STATES
    ).order_by("sequence"):
        if campaign.state != CampaignState.RUNNING:
            break
        moved = proposal_follow(campaign, proposal) or moved
        campaign.refresh_from_db()
    return moved


def _race_start(campaign: Campaign, proposals: list[Proposal]) -> bool:
    """Create the racers' search evaluations, in sequence order, as far as the campaign's
    budget reaches (each reserves its worst case): those it cannot cover are not evaluated."""
    waiting = [p for p in proposals if p.search_evaluation_id is None]
    if len(proposals) == 1:
        return search_start(campaign, proposals[0])  # no rival: evaluated as today
    refusal = ""
    for proposal in waiting:
        if refusal:
            proposal_end(campaign, proposal, ProposalState.FAILED, f"not evaluated: {refusal}")
            continue
        try:
            search_evaluation_create(campaign=campaign, proposal=proposal, paced=True)
        except BudgetExceeded as exc:
            refusal = str(exc)
            proposal_end(campaign, proposal, ProposalState.FAILED, f"not evaluated: {exc}")
        except CoevoError as exc:
            proposal_end(campaign, proposal, ProposalState.FAILED, f"not evaluated: {exc}")
            campaign_finish(campaign, CampaignState.FAILED, f"proposal {proposal.sequence}: {exc}")
            return False
    started = Proposal.objects.filter(
        id__in=[p.id for p in proposals], search_evaluation__isnull=False
    ).count()
    if refusal and not started:
        campaign_finish(campaign, CampaignState.FINISHED, f"budget spent: {refusal}")
        return False
    logger.info(
        "campaign %s: race of %d proposals started (round %s)",
        campaign.id,
        started,
        proposals[0].batch,
    )
    # The next step (after this commits and the engine started the evaluations) sends the
    # first tasks.
    return True


def _race_step(campaign: Campaign, proposals: list[Proposal]) -> None:
    racers = _racers(proposals)
    if not racers:
        return
    order = _task_order(campaign, racers[0][1])
    scores = {p.id: _complete_scores(evaluation) for p, evaluation in racers}
    labels = {p.id: f"#{p.sequence}" for p, _ in racers}
    by_label = {labels[p.id]: (p, evaluation) for p, evaluation in racers}
    finished_all = len(order)
    if len(racers) >= 2:
        plan = EvaluationPlan.from_dict(campaign.plan)
        contest = Race(list(labels.values()), alpha=plan.alpha, total_tasks=len(order))
        for key in order:
            alive = [by_label[label][0] for label in contest.alive]
            if not all(key in scores[p.id] for p in alive):
                break
            for record in contest.observe({labels[p.id]: scores[p.id][key] for p in alive}):
                loser, evaluation = by_label[record.candidate]
                if evaluation.state in EVALUATION_OPEN_STATES:
                    _eliminate(
                        campaign, loser, evaluation, by=by_label[record.by][0], record=record
                    )
            if contest.finished:
                break
        finished_all = len(order) if contest.finished else contest.tasks_seen
    _pace(racers, order, limit=finished_all + RACE_AHEAD_TASKS)


def _racers(proposals: list[Proposal]) -> list[tuple[Proposal, Evaluation]]:
    """Proposals still in the race: a paced search evaluation that is open, or that finished
    every task (it may still outrun a racer that is behind)."""
    racers = []
    for proposal in proposals:
        if proposal.search_evaluation_id is None or proposal.eliminated_at is not None:
            continue
        evaluation = Evaluation.objects.get(id=proposal.search_evaluation_id)
        if not evaluation.paced or proposal.validation_evaluation_id is not None:
            continue
        complete = evaluation.state == EvaluationState.FINISHED and not evaluation.stop_reason
        if evaluation.state in EVALUATION_OPEN_STATES or complete:
            racers.append((proposal, evaluation))
    return racers


def _task_order(campaign: Campaign, evaluation: Evaluation) -> list[str]:
    """The search tasks in the order the plan runs them: the racers share the plan and seed,
    hence the order."""
    tasks = Task.objects.filter(suite=campaign.suite, split=campaign.search_split).order_by(
        "position"
    )
    stages = stages_for(
        list(tasks.only("id", "key")),
        plan=EvaluationPlan.from_dict(evaluation.plan),
        seed=evaluation.seed,
        key=lambda task: task.key,
    )
    return [task.key for stage in stages for task in stage.tasks]


def _complete_scores(evaluation: Evaluation) -> dict[str, float]:
    """Per-task score (the mean over epochs) of the tasks whose every epoch was scored."""
    return {
        key: sum(values) / len(values)
        for key, values in evaluation_task_scores(evaluation_id=evaluation.id).items()
        if len(values) >= evaluation.epochs
    }


def _eliminate(
    campaign: Campaign, proposal: Proposal, evaluation: Evaluation, *, by: Proposal, record: Any
) -> None:
    unsent = Rollout.objects.filter(
        evaluation=evaluation, state=RolloutState.PENDING, attempts=0
    ).count()
    try:
        evaluation_cancel(evaluation=evaluation, reason=f"eliminated by the race: {record.reason}")
    except InvalidState:
        return  # it ended meanwhile (finished, stopped by the user): nothing to save
    score, tokens = evaluation_score(evaluation)
    detail = (
        f"eliminated in round {proposal.batch}'s race by proposal #{by.sequence} "
        f"{record.reason.removeprefix('eliminated ')}; {unsent} search rollouts not run"
    )
    moved = Proposal.objects.filter(
        id=proposal.id, state__in=PROPOSAL_OPEN_STATES, eliminated_at__isnull=True
    ).update(
        eliminated_by=by,
        eliminated_after_tasks=record.after_tasks,
        eliminated_at=timezone.now(),
        elimination={"kind": record.kind, "p_value": record.p_value, "reason": record.reason},
        rollouts_saved=unsent,
        search_score=score,
        tokens_per_task=tokens,
        updated_at=timezone.now(),
    )
    if not moved:
        return
    proposal.refresh_from_db()
    proposal_end(
        campaign, proposal, ProposalState.EVALUATED, detail, outcome=ProposalOutcome.PRUNED
    )
    logger.info("campaign %s: proposal %d %s", campaign.id, proposal.sequence, detail)


def _pace(racers: list[tuple[Proposal, Evaluation]], order: list[str], *, limit: int) -> None:
    """Send each open racer's unsent rollouts of its current stage among the first ``limit``
    tasks, task by task across racers (once this step commits)."""
    position = {key: i for i, key in enumerate(order[:limit])}
    batches: list[tuple[int, int, Any, list[Any]]] = []
    for n, (_, evaluation) in enumerate(racers):
        evaluation.refresh_from_db(fields=["state", "stage"])
        if evaluation.state not in (EvaluationState.PENDING, EvaluationState.RUNNING):
            continue
        per_task: dict[str, list[Any]] = {}
        for rollout_id, key in Rollout.objects.filter(
            evaluation=evaluation,
            state=RolloutState.PENDING,
            enqueued_at__isnull=True,
            stage=evaluation.stage,
            task__key__in=list(position),
        ).values_list("id", "task__key"):
            per_task.setdefault(key, []).append(rollout_id)
        batches += [(position[key], n, evaluation.id, ids) for key, ids in per_task.items()]
    if not batches:
        return
    batches.sort(key=lambda batch: batch[:2])

    def send() -> None:
        for _, _, evaluation_id, ids in batches:
            evaluation_enqueue(evaluation_id=evaluation_id, only_unsent=True, rollout_ids=ids)

    transaction.on_commit(send)

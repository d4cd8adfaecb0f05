"""The demo's promotion: the campaign's best candidate is requested for ``production``, the
sealed held-out games are played, and a second demo user, a reviewer, is shown where to
approve it (approval needs a reviewer other than the requester: docs/architecture.md, "The held-out seal").

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from coevo.campaigns.models import Campaign
from coevo.demo.campaign import pct
from coevo.demo.processes import Services, say
from coevo.demo.progress import HEARTBEAT_S, progress_step
from coevo.demo.users import demo_user
from coevo.errors import CoevoError
from coevo.evaluations.selectors import evaluation_progress
from coevo.projects.models import Role
from coevo.reviews.models import PROMOTION_OPEN_STATES, PromotionRequest, PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.evidence_types import evidence_read
from coevo.reviews.services import channel_get_or_create

CHANNEL = "production"
REVIEWER = "reviewer"


def demo_reviewer(*, project: Any, home: Path) -> tuple[Any, str]:
    """The second demo login: a reviewer of the demo project (not an admin, so what the page
    lets them do is what a reviewer may do)."""
    return demo_user(project=project, home=home, username=REVIEWER, role=Role.REVIEWER)


def demo_promotion(*, campaign: Campaign, requester: Any) -> PromotionRequest | None:
    """Request ``production`` for the campaign's best candidate, on the held-out games of the
    campaign's suite; None when the campaign's best is its seed (nothing to promote)."""
    best = campaign.best_candidate
    if best is None or best.id == campaign.seed_candidate_id:
        say("the campaign found nothing better than its seed on validation: no promotion requested")
        return None
    # The pair that scored best on validation: in a co-evolving campaign the same candidate may
    # have been evaluated under two policies (a policy step evaluates the best candidate under
    # the new one), and the promotion is of the pair.
    policy_version = campaign.best_policy_version or campaign.active_policy_version
    channel = channel_get_or_create(project=campaign.project, name=CHANNEL)
    try:
        request = promotion_request_create(
            channel=channel,
            candidate=best,
            policy_version=policy_version,
            requester=requester,
            suite=campaign.suite,
            seed=campaign.seed,
        )
    except CoevoError as exc:  # e.g. an earlier demo run already promoted this candidate
        say(f"no promotion requested: {exc}")
        return None
    reference = request.holder_candidate or request.baseline_candidate
    say(
        f"requested {CHANNEL} for {best.short_sha}: playing the sealed held-out games"
        + (
            f" (and {reference.short_sha}'s, "
            + ("the channel's holder)" if request.holder_candidate else "the campaign's seed)")
            if reference is not None
            else ""
        )
    )
    return request


def wait_for_promotion(
    request: PromotionRequest, services: Services, *, every_s: float = HEARTBEAT_S
) -> None:
    """Until the held-out evaluations are final and the evidence is assembled."""
    with progress_step(
        "held-out evaluations", waiting_on="waiting for the worker", every_s=every_s
    ) as step:
        while True:
            services.check_alive()
            request.refresh_from_db()
            evaluations = [
                e
                for e in (request.candidate_evaluation, *_reference_evaluations(request))
                if e is not None
            ]
            done = total = 0
            for evaluation in evaluations:
                evaluation.refresh_from_db()
                progress = evaluation_progress(evaluation=evaluation)
                done, total = done + progress.done, total + progress.total
            step.update(f"held-out: {done}/{total} games played; request {request.state}")
            open_ = request.state in PROMOTION_OPEN_STATES
            if not open_ or request.state == PromotionState.READY:
                return
            time.sleep(1)


def _reference_evaluations(request: PromotionRequest) -> list[Any]:
    """The channel's holder's held-out evaluation, or the baseline's when the channel is empty
    (the campaign's seed: coevo.reviews.promotions.create)."""
    return [request.holder_evaluation, request.baseline_evaluation]


def promotion_summary(request: PromotionRequest, url: str) -> list[str]:
    """What held-out made of the campaign's gain, and where to decide."""
    request.refresh_from_db()
    lines = []
    evidence = evidence_read(payload=request.evidence)
    if request.state == PromotionState.FAILED or evidence is None or evidence.candidate is None:
        lines.append(f"Held-out: no evidence ({request.state}: {request.state_detail})")
    else:
        if evidence.reference is not None:
            lines.append(evidence.reference.summary)
        candidate = evidence.candidate.scores["heldout"]
        games = candidate.n_tasks or 0
        line = f"Held-out: candidate {pct(candidate.mean)} on {games} game{'s' * (games != 1)}"
        comparison = evidence.comparison
        if comparison:
            interval = comparison.interval
            ci = f" [95% CI {interval.low:+.1%}, {interval.high:+.1%}]" if interval else ""
            line += (
                f" vs reference {pct(comparison.reference_mean)}: "
                f"paired difference {comparison.difference:+.1%}{ci}, "
                f"{'significant' if comparison.significant else 'not significant'} "
                f"(p = {comparison.p_value:.2g})"
            )
        lines.append(line)
        generalization = evidence.generalization
        if (
            generalization
            and generalization.search_gain is not None
            and generalization.gap is not None
        ):
            lines.append(
                f"Search gain {generalization.search_gain:+.1%}, held-out gain "
                f"{generalization.heldout_gain:+.1%}: gap {generalization.gap:+.1%} "
                "(the part of the search-set gain that held-out did not confirm; HDA)"
            )
    lines.append(f"Promotion to {request.channel.name}: {request.state} · {url}")
    return lines

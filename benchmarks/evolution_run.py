"""The campaigns of ``benchmarks/evolution.py``: imported once Django is set up (its COEVO_HOME
decides the database), so this module may import models at its top."""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from benchmarks.evolution import (
    AGENTIC_KNOBS,
    LLM_PATCH_OPTIONS,
    MODEL_PROPOSERS,
    NUDGE_EVERY_S,
    PROGRESS_EVERY_S,
    PROMOTION_SEED,
    REPO,
    results_append,
)
from coevo.campaigns.models import (
    PROPOSAL_OPEN_STATES,
    Campaign,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.campaigns.selectors import (
    campaign_best_proposal,
    campaign_progress,
    campaign_rollouts_saved,
)
from coevo.campaigns.services import (
    campaign_advance_enqueue,
    campaign_create,
    campaign_start,
    campaign_stop,
)
from coevo.demo.campaign import CAMPAIGN_KNOBS, demo_textworld_suite, naive_seed_import
from coevo.demo.processes import (
    Services,
    require_free_port,
    running_services,
    say,
    start_policy_and_worker,
)
from coevo.demo.promotion import wait_for_promotion
from coevo.demo.users import demo_user
from coevo.errors import CoevoError
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.selectors import evaluation_compare, evaluation_progress
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project, Role
from coevo.projects.services import project_get_or_create
from coevo.reviews.models import PromotionRequest
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.services import channel_get_or_create
from harness_store.services import candidate_import_directory

KNOB_PROPOSERS = ("config", "random")
AGENTIC_PROGRAM = REPO / "examples" / "proposers" / "agentic"


def run_campaigns(
    *,
    args: argparse.Namespace,
    todo: list[tuple[str, int]],
    results: Path,
    settings_row: dict[str, Any],
) -> None:
    """Start llama.cpp (unless COEVO_POLICY_URL is set) and one worker, run the campaigns in
    ``todo`` one after another, appending each one's row to ``results`` as it ends."""
    home = Path(settings.COEVO_HOME)
    logs_dir = home / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    say(f"state lives in {home} (COEVO_HOME); results go to {results}")
    if "COEVO_POLICY_URL" not in os.environ:
        require_free_port("127.0.0.1", args.policy_port, "--policy-port")
    child_env = dict(os.environ)
    # llama.cpp answers one request at a time: two rollouts in flight overlap one's sandbox
    # start-up and scoring with the other's model call (as the demo does).
    child_env.setdefault("COEVO_WORKER_CONCURRENCY", "2")
    # The agentic proposer's pinned dependencies come from the local wheel directory.
    wheelhouse = Path(os.environ.get("COEVO_HARNESS_FIND_LINKS") or REPO / "var" / "wheelhouse")
    if "agentic" in args.strategies and wheelhouse.is_dir():
        child_env["COEVO_HARNESS_FIND_LINKS"] = str(wheelhouse)
    say("preparing the database")
    call_command("migrate", interactive=False, verbosity=0)
    with running_services(logs_dir) as services:
        start_policy_and_worker(
            services=services,
            settings=settings,
            policy_port=args.policy_port,
            env=child_env,
            worker_name="bench-evolution",
        )
        for number, (strategy, seed) in enumerate(todo, 1):
            say(f"campaign {number}/{len(todo)}: {strategy}, seed {seed}")
            started = time.monotonic()
            project, user, seed_candidate, suite = campaign_project(
                args=args, home=home, strategy=strategy, seed=seed
            )
            campaign = campaign_create(
                project=project,
                name=f"bench {strategy} seed {seed} ({timezone.now():%Y-%m-%d %H:%M})",
                seed_candidate=seed_candidate,
                policy_version=policy_version_get_default(),
                suite=suite,
                strategy=[strategy_entry(strategy=strategy, project=project, user=user)],
                budget_limits=BudgetLimits(rollouts=args.rollouts),
                max_proposals=args.max_proposals,
                batch_size=args.batch_size,
                seed=seed,
                created_by=user,
            )
            campaign_start(campaign=campaign)
            try:
                campaign_wait(campaign=campaign, services=services, timeout_s=args.campaign_timeout)
                request = best_promote(campaign=campaign, requester=user, strategy=strategy)
                if request is not None:
                    wait_for_promotion(request, services)
            except KeyboardInterrupt:
                # Left running, the next run's worker would go on with it unseen.
                campaign_stop(campaign=campaign, reason="the benchmark was interrupted")
                say(f"stopped campaign {campaign.id}; no row written for {strategy}, seed {seed}")
                raise
            row = campaign_row(
                campaign=campaign,
                strategy=strategy,
                request=request,
                wall_s=time.monotonic() - started,
            )
            row["settings"] = settings_row
            results_append(results, row)
            say(
                f"{strategy}, seed {seed}: best {row['best']}, validation "
                f"{_signed(row['validation']['difference'])}, held-out "
                f"{_signed(row['heldout'].get('difference'))}, {row['rollouts']} rollouts, "
                f"{row['wall_s']:.0f} s (row written)"
            )


def campaign_project(
    *, args: argparse.Namespace, home: Path, strategy: str, seed: int
) -> tuple[Project, Any, Any, Any]:
    """A new project for one campaign, with its own seed candidate and suite slice.

    Campaigns must not share a project: a project's campaigns share its duplicate check (a
    knob setting one campaign drew is refused to the next) and its evaluation cache (a later
    campaign would get earlier campaigns' rollouts free, and the seed's held-out run would be
    one run for all). Each attempt gets a project of its own, also after an interrupted one.
    """
    slug = f"bench-{strategy}-{seed}-{uuid.uuid4().hex[:8]}"
    project = project_get_or_create(
        slug=slug,
        name=f"Evolution benchmark: {strategy}, seed {seed}",
        description="benchmarks/evolution.py: one campaign from the naive TextWorld seed.",
    )
    user, _ = demo_user(project=project, home=home, username="bench", role=Role.ADMIN)
    seed_candidate, _ = naive_seed_import(project=project, user=user, author="coevo benchmark")
    suite = demo_textworld_suite(
        project=project,
        games=args.games,
        max_steps=args.max_steps,
        heldout_games=args.heldout,
    )
    return project, user, seed_candidate, suite


def strategy_entry(*, strategy: str, project: Project, user: Any) -> dict[str, Any]:
    """The campaign's one proposer, with the options the benchmark runs it with."""
    if strategy in ("config", "random"):
        return {"kind": strategy, "options": {"knobs": CAMPAIGN_KNOBS}}
    if strategy == "llm-patch":
        return {"kind": strategy, "options": dict(LLM_PATCH_OPTIONS)}
    program, _ = candidate_import_directory(
        project=project,
        directory=AGENTIC_PROGRAM,
        message="The agentic proposer program (examples/proposers/agentic)",
        author_name="coevo benchmark",
        author_email="bench@localhost",
        created_by=user,
    )
    return {"kind": strategy, "options": {"program": program.sha, "knobs": dict(AGENTIC_KNOBS)}}


def campaign_wait(*, campaign: Campaign, services: Services, timeout_s: int) -> None:
    """Until the campaign ends, printing a line (the proposal and split running, proposals
    ended, rollouts spent of the budget) whenever it changes; stopped after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last, printed, nudged = "", 0.0, time.monotonic()
    while True:
        services.check_alive()
        campaign.refresh_from_db()
        progress = campaign_progress(campaign=campaign)
        budget = progress.budget
        ended = sum(
            n for state, n in progress.by_state.items() if state not in PROPOSAL_OPEN_STATES
        )
        line = (
            f"  {ended}/{campaign.max_proposals} proposals ended, rollouts "
            f"{budget.spent_rollouts}+{budget.reserved_rollouts} reserved of "
            f"{budget.limit_rollouts}, saved by racing {progress.rollouts_saved}"
        )
        for proposal in campaign.proposals.filter(state__in=PROPOSAL_OPEN_STATES):
            label = "seed" if proposal.kind == ProposerKind.SEED else f"#{proposal.sequence}"
            evaluation = proposal.validation_evaluation or proposal.search_evaluation
            if evaluation is None:
                line += f"; {label} drafting"
                continue
            split = "validation" if proposal.validation_evaluation_id else "search"
            done = evaluation_progress(evaluation=evaluation)
            line += f"; {label} {split} {done.done}/{done.total}"
        if campaign.is_final:
            print(line, flush=True)
            say(f"campaign {campaign.state}: {campaign.stop_reason}")
            return
        if line != last or time.monotonic() - printed > PROGRESS_EVERY_S:
            print(line, flush=True)
            last, printed = line, time.monotonic()
        if time.monotonic() > deadline:
            campaign_stop(campaign=campaign, reason=f"--campaign-timeout {timeout_s} s passed")
            deadline = float("inf")
            continue
        if time.monotonic() - nudged > NUDGE_EVERY_S:
            campaign_advance_enqueue(campaign_id=campaign.id)
            nudged = time.monotonic()
        time.sleep(2)


def best_promote(*, campaign: Campaign, requester: Any, strategy: str) -> PromotionRequest | None:
    """A promotion request of the campaign's best to an empty channel of its own, so that the
    evidence compares it with the campaign's seed on the sealed held-out split; None when the
    best is the seed (nothing to compare)."""
    campaign.refresh_from_db()
    best = campaign_best_proposal(campaign=campaign)
    if best is None or best.candidate_id == campaign.seed_candidate_id:
        return None
    channel = channel_get_or_create(
        project=campaign.project, name=f"bench-{strategy}-{campaign.seed}"
    )
    try:
        request = promotion_request_create(
            channel=channel,
            candidate=best.candidate,
            policy_version=best.policy_version or campaign.active_policy_version,
            requester=requester,
            suite=campaign.suite,
            seed=PROMOTION_SEED,
        )
    except CoevoError as exc:
        say(f"no promotion requested: {exc}")
        return None
    say(f"requested {channel.name} for {best.candidate.short_sha}: playing the held-out games")
    return request


def campaign_row(
    *, campaign: Campaign, strategy: str, request: PromotionRequest | None, wall_s: float
) -> dict[str, Any]:
    """The campaign's results row. Held-out figures are the promotion evidence's aggregates
    (difference, interval, p-value, the HDA split): never a held-out task, trace or flip."""
    campaign.refresh_from_db()
    progress = campaign_progress(campaign=campaign)
    seed = Proposal.objects.get(campaign=campaign, kind=ProposerKind.SEED)
    best = campaign_best_proposal(campaign=campaign)
    best_is_seed = best is None or best.candidate_id == campaign.seed_candidate_id
    proposals = Proposal.objects.filter(campaign=campaign).exclude(kind=ProposerKind.SEED)
    valid = proposals.filter(search_evaluation__isnull=False).count()
    rejected = proposals.filter(state=ProposalState.INVALID, search_evaluation__isnull=True)
    entry = campaign.strategy[0]
    row: dict[str, Any] = {
        "strategy": strategy,
        "seed": campaign.seed,
        "campaign": str(campaign.id),
        "project": campaign.project.slug,
        "state": campaign.state,
        "stop_reason": campaign.stop_reason,
        "proposer_model": (
            entry["options"].get("model") or campaign.policy_version.served_name
            if strategy in MODEL_PROPOSERS
            else ""
        ),
        "best": "the seed" if best_is_seed else best.candidate.short_sha,
        # The knob values a config or random proposal drew (an llm-patch one's are its usage).
        "best_params": best.params if not best_is_seed and strategy in KNOB_PROPOSERS else {},
        "seed_search": seed.search_score,
        "seed_validation": seed.validation_score,
        "best_search": seed.search_score if best_is_seed else best.search_score,
        "best_validation": seed.validation_score if best_is_seed else best.validation_score,
        "rollouts": progress.budget.spent_rollouts,
        "proposer_tokens": progress.budget.spent_proposer_tokens,
        "rollouts_saved": campaign_rollouts_saved(campaign=campaign),
        "proposals": dict(progress.by_state),
        "valid": valid,
        "judged": valid + rejected.count(),
        "wall_s": round(wall_s, 1),
        "finished_at": timezone.now().isoformat(timespec="seconds"),
    }
    if best_is_seed:
        same = {"difference": 0.0, "low": 0.0, "high": 0.0, "p_value": 1.0, "significant": False}
        row["validation"] = dict(same)
        row["heldout"] = {**same, "state": "not requested: the best is the seed"}
        row["hda"] = {"search_gain": 0.0, "heldout_gain": 0.0, "gap": 0.0}
        return row
    statistics = evaluation_compare(
        reference=seed.validation_evaluation, candidate=best.validation_evaluation
    ).statistics
    row["validation"] = _paired(statistics.as_dict())
    row["heldout"], row["hda"] = _heldout(request)
    return row


def _paired(comparison: dict[str, Any]) -> dict[str, Any]:
    interval = comparison.get("interval") or {}
    return {
        "difference": comparison.get("difference"),
        "low": interval.get("low"),
        "high": interval.get("high"),
        "p_value": comparison.get("p_value"),
        "significant": bool(comparison.get("significant")),
        "tasks": comparison.get("tasks"),
    }


def _heldout(request: PromotionRequest | None) -> tuple[dict[str, Any], dict[str, Any]]:
    none = {"search_gain": None, "heldout_gain": None, "gap": None}
    if request is None:
        return {"difference": None, "state": "no promotion requested"}, none
    request.refresh_from_db()
    evidence = request.evidence or {}
    comparison = evidence.get("comparison")
    if not comparison:
        state = f"{request.state}: {request.state_detail}"[:300]
        return {"difference": None, "state": state, "request": str(request.id)}, none
    heldout = _paired(comparison) | {"state": request.state, "request": str(request.id)}
    generalization = evidence.get("generalization") or {}
    hda = {key: generalization.get(key) for key in ("search_gain", "heldout_gain", "gap")}
    return heldout, hda


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} points"

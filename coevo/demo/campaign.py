"""The demo's campaign: config search on a slice of TextWorld, from a deliberately naive seed.

``examples/textworld-naive`` keeps the game's own command order and lists up to 60 commands;
a small base model that mostly answers "1" then plays whatever the game lists first and wins
nothing. The good setting (``order = "priority"``, a short list) is in the search space, so
the campaign has something to find, and the summary shows what it found (issue 19: started
from ``textworld-basic``, which already holds that setting, every demo campaign ended with
the seed as its best).

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from typing import Any

from django.db import transaction

from coevo.campaigns.models import PROPOSAL_OPEN_STATES, Campaign, ProposalState, ProposerKind
from coevo.campaigns.selectors import campaign_progress
from coevo.campaigns.services import campaign_advance_enqueue, campaign_create, campaign_start
from coevo.config import BASE_DIR
from coevo.demo.campaign_start import DEMO_NAME_PREFIX, CampaignStart, demo_campaign_start
from coevo.demo.processes import Services, say
from coevo.demo.progress import HEARTBEAT_S, progress_step
from coevo.errors import CoevoError
from coevo.evaluations.selectors import evaluation_progress
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite, Task
from coevo.suites.textworld import suite_import_textworld
from harness_store.services import candidate_import_directory

TEXTWORLD_HARNESS = BASE_DIR / "examples" / "textworld-naive"
# The knobs the demo's campaign searches. list_commands is left out: free-text commands are
# known to score nothing with a 270M base model (docs/architecture.md, "Shipped suites"), so a short demo budget is better
# spent elsewhere. temperature is left out too: sampling only adds noise to a 270M model's
# choice of a number, and each draw spent on it is one not spent on what matters (``order``).
CAMPAIGN_KNOBS = ["order", "max_listed", "history"]
# Seconds between the demo's own nudges of the campaign (what beat does in production): the
# evaluation_finished signal drives it, this only covers a lost message.
CAMPAIGN_NUDGE_S = 30
# The levels of the demo's slice, taken in turn (easy first: with one game a split, the good
# setting wins it within a few steps and the naive seed does not; the medium games show more).
SLICE_LEVELS = ("cooking-easy-", "cooking-medium-")


def demo_campaign(
    *, project: Project, user: Any, games: int, max_steps: int, proposals: int, seed: int | None
) -> Campaign:
    """The demo's config campaign; ``seed`` None: coevo.demo.campaign_start picks it (and
    where a second run starts)."""
    start = demo_start_choose(project=project, user=user, seed=seed)
    suite = demo_textworld_suite(project=project, games=games, max_steps=max_steps)
    number = project.campaigns.count() + 1
    campaign = campaign_create(
        project=project,
        name=f"{DEMO_NAME_PREFIX}{number}: TextWorld config search (seed {start.seed})",
        seed_candidate=start.candidate,
        policy_version=policy_version_get_default(),
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": CAMPAIGN_KNOBS}}],
        max_proposals=proposals,
        seed=start.seed,
        created_by=user,
    )
    return campaign_start(campaign=campaign)


def demo_start_choose(*, project: Project, user: Any, seed: int | None) -> CampaignStart:
    """The naive seed imported, and where the next demo campaign starts, said in the output."""
    naive, created = naive_seed_import(project=project, user=user, author="coevo demo")
    say(
        f"TextWorld seed harness (examples/textworld-naive) "
        f"{'imported as' if created else 'already imported:'} {naive.short_sha}"
    )
    start = demo_campaign_start(project=project, naive=naive, seed=seed)
    say(f"campaign start: {start.reason}")
    return start


def naive_seed_import(*, project: Project, user: Any, author: str) -> tuple[Any, bool]:
    """``examples/textworld-naive`` as a candidate of ``project`` (the same tree: the same one)."""
    return candidate_import_directory(
        project=project,
        directory=TEXTWORLD_HARNESS,
        message="Seed harness: the naive first attempt (the game's command order, 60 listed)",
        author_name=author,
        author_email=f"{user.username}@localhost",
        created_by=user,
    )


def demo_textworld_suite(
    *, project: Project, games: int, max_steps: int, heldout_games: int | None = None
) -> Suite:
    """A small TextWorld suite for the demo (also used by tests/integration/test_policy_step_gemma.py
    and benchmarks/evolution.py): ``games`` games of the search and validation splits of the
    full suite and ``heldout_games`` (default ``games``) of its held-out split, easy and medium
    cooking games in turn.

    The campaign evaluates whole splits, and the full suite's 36 search games would take Gemma
    on two cores most of an hour per proposal. The held-out games are what the demo's promotion
    is judged on; the campaign never sees them. The subset is content-hashed like any suite (the
    full suite's hash plus the chosen keys), so a second run with the same flags reuses it.
    """
    full, _ = suite_import_textworld(project=project, max_steps=max_steps)
    chosen = []
    heldout = games if heldout_games is None else heldout_games
    for split, wanted in (
        (Split.SEARCH, games),
        (Split.VALIDATION, games),
        (Split.HELDOUT, heldout),
    ):
        in_split = list(full.tasks.filter(split=split).order_by("position"))
        levels = [[task for task in in_split if task.key.startswith(lv)] for lv in SLICE_LEVELS]
        # The demo's levels in turn while both last, then the rest of them, then the split's
        # other levels in suite order: the full suite has 1 easy and 2 medium held-out games,
        # and a benchmark that asks for more held-out games (heldout_games) gets the others.
        paired = [t for pair in itertools.zip_longest(*levels) for t in pair if t is not None]
        ordered = paired + [task for task in in_split if task not in paired]
        picked = ordered[:wanted]
        if len(picked) < wanted:
            raise CoevoError(
                f"The TextWorld suite has only {len(picked)} {split} games; ask for "
                f"{len(picked)} or fewer."
            )
        chosen += picked
    keys = ",".join(task.key for task in chosen)
    # Held-out games are sealed (docs/architecture.md, "The held-out seal"): the description, shown wherever the suite is,
    # names the games a proposer may know of and only counts the held-out ones.
    open_keys = ", ".join(task.key for task in chosen if task.split != Split.HELDOUT)
    description = (
        f"The demo's slice of {full.name}: {games} search and {games} validation games "
        f"({open_keys}) and {heldout} sealed held-out games. {full.description}"
    )
    content_hash = hashlib.sha256(f"{full.content_hash}\x00{keys}".encode()).hexdigest()
    name = f"textworld-demo-{games}x{max_steps}" + (f"-h{heldout}" if heldout != games else "")
    with transaction.atomic():
        suite, created = Suite.objects.get_or_create(
            project=project,
            name=name,
            content_hash=content_hash,
            split_seed=full.split_seed,
            defaults={
                "kind": full.kind,
                "version": full.version,
                "scorer": full.scorer,
                # A slice of the full suite: a promotion judged on the full suite finds the
                # campaign's search and validation scores on this one (suite_family).
                "source": full,
                "description": description,
            },
        )
        if suite.description != description:
            # A slice made when the description still named its held-out games.
            Suite.objects.filter(id=suite.id).update(description=description)
            suite.description = description
        if suite.source_id is None:
            # A slice made before slices named their source.
            Suite.objects.filter(id=suite.id).update(source=full)
            suite.source = full
        if created:
            Task.objects.bulk_create(
                Task(
                    suite=suite,
                    key=task.key,
                    split=task.split,
                    position=position,
                    inputs=task.inputs,
                    verifier=task.verifier,
                )
                for position, task in enumerate(chosen)
            )
    say(f"TextWorld suite {name} {'imported' if created else 'already imported'}")
    return suite


def wait_for_campaign(
    campaign: Campaign, services: Services, *, every_s: float = HEARTBEAT_S
) -> None:
    nudged = time.monotonic()
    with progress_step("campaign", waiting_on="waiting for the worker", every_s=every_s) as step:
        while True:
            services.check_alive()
            campaign.refresh_from_db()
            step.update(campaign_status(campaign))
            if campaign.is_final:
                return
            if time.monotonic() - nudged > CAMPAIGN_NUDGE_S:
                campaign_advance_enqueue(campaign_id=campaign.id)
                nudged = time.monotonic()
            time.sleep(1)


def campaign_status(campaign: Campaign) -> str:
    """One line: proposals ended, the best validation score, and what the open proposal waits
    on (its games played so far: a game can take minutes, hence the heartbeats)."""
    # Counted as the stop rule counts them: policy steps have their own quota.
    proposals = campaign.proposals.exclude(kind__in=[ProposerKind.SEED, ProposerKind.POLICY])
    ended = proposals.exclude(state__in=PROPOSAL_OPEN_STATES).count()
    line = f"{ended}/{campaign.max_proposals} proposals ended, {best_validation_text(campaign)}"
    current = campaign.proposals.filter(state__in=PROPOSAL_OPEN_STATES).first()
    if current is not None:
        evaluation_id = current.validation_evaluation_id or current.search_evaluation_id
        label = "seed" if current.kind == ProposerKind.SEED else f"proposal {current.sequence}"
        if evaluation_id is not None:
            evaluation = current.validation_evaluation or current.search_evaluation
            progress = evaluation_progress(evaluation=evaluation)
            split = "validation" if current.validation_evaluation_id else "search"
            line += f"; {label}: {split} {progress.done}/{progress.total} games played"
        elif current.kind == ProposerKind.POLICY:
            line += f"; {label}: {policy_step_progress(current)}"
        else:
            line += f"; {label}: starting"
    return line


def best_validation_text(campaign: Campaign) -> str:
    """The best validation score so far and whose it is; before any validation evaluation has
    finished there is none, and a bare number (or "0.0%") would read as a result."""
    best = campaign.best_validation_score
    if best is None or campaign.best_candidate_id is None:
        return "best validation: nothing evaluated on validation yet"
    whose = (
        "the seed"
        if campaign.best_candidate_id == campaign.seed_candidate_id
        else campaign.best_candidate.short_sha
    )
    return f"best validation {best:.1%} ({whose})"


def policy_step_progress(proposal: Any) -> str:
    """Where a policy step is before its evaluations: exporting, or training (the trainer's
    last log line: its step and loss)."""
    run = proposal.training_run
    if run is None:
        return "policy step: exporting the best candidate's search games"
    last = next((line for line in reversed(run.log_tail.splitlines()) if line.strip()), "")
    return f"policy step: training ({run.state}) {last.strip()[:120]}"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def campaign_summary(campaign: Campaign, elapsed_s: float) -> list[str]:
    seed = campaign.proposals.filter(kind=ProposerKind.SEED).first()
    progress = campaign_progress(campaign=campaign)
    evaluated = progress.by_state.get(ProposalState.EVALUATED, 0)
    best = campaign.best_candidate
    best_label = "n/a"
    if best is not None:
        best_label = "the seed" if best.id == campaign.seed_candidate_id else best.short_sha
    lines = [
        f"Campaign {campaign.state}: {campaign.stop_reason}",
        f"Campaign summary: seed score {pct(seed and seed.search_score)} search, "
        f"{pct(seed and seed.validation_score)} validation"
        f" · best validation {pct(campaign.best_validation_score)} ({best_label})"
        f" · {progress.proposals} proposals ({evaluated} evaluated)"
        f" · {progress.budget.spent_rollouts} rollouts · {_minutes(elapsed_s)}",
    ]
    winner = campaign.proposals.filter(candidate=best).exclude(kind=ProposerKind.SEED).first()
    if winner is not None and winner.params:
        changed = ", ".join(f"{name} = {value!r}" for name, value in sorted(winner.params.items()))
        lines.append(f"Best candidate {best_label}: {changed}")
    return lines


def _minutes(elapsed_s: float) -> str:
    minutes, seconds = divmod(int(elapsed_s), 60)
    return f"{minutes}m{seconds:02d}s"

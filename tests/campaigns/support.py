"""A tiny harness whose ``style`` knob decides the answer, and a JSONL suite with a marker
string planted in its validation and held-out tasks."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from django.db.models import Q
from kombu import Queue

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import CAMPAIGN_DRAFT_TASK, campaign_create, campaign_start
from coevo.celery import app
from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    RolloutState,
)
from coevo.evaluations.services import rollout_claim, rollout_finish
from coevo.policies.client import normalize_base_url
from coevo.policies.models import EndpointKind, PolicyEndpoint
from harness_store.services import candidate_import_directory
from tests.support.factories import make_jsonl_suite
from workers.outcomes import RolloutOutcome

MARKER = "ZZ-SEALED-MARKER-ZZ"

MANIFEST = """# A harness whose answer depends on a knob.
[harness]
name = "styled"
entrypoint = "agent:run"
policy_api = "completions"
components = ["agent.py", "harness.toml"]

[knobs.style]
# "good" makes the scripted policy answer right.
type = "choice"
default = "bad"
choices = ["bad", "good"]

[knobs.temperature]
type = "float"
default = 0.0
min = 0.0
max = 1.0

[limits]
max_model_calls = 2
max_tokens = 100
wall_time_s = 30
"""

AGENT = """
def run(task, ctx):
    prompt = "style=" + ctx.knobs["style"] + " " + task["input"]
    return ctx.llm.complete(prompt, max_tokens=4, temperature=ctx.knobs["temperature"]).texts[0].strip()
"""


def styled_seed(project, tmp_path: Path):
    directory = tmp_path / "styled"
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST)
    (directory / "agent.py").write_text(AGENT)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="styled seed", author_name="Owner"
    )
    return candidate


def marked_suite(project):
    rows = [
        {"id": f"s{i}", "input": f"q{i}", "expected": "yes", "split": "search"} for i in range(4)
    ]
    rows += [
        {"id": f"v{i}", "input": f"{MARKER} v{i}", "expected": "yes", "split": "validation"}
        for i in range(2)
    ]
    rows += [
        {"id": f"h{i}", "input": f"{MARKER} h{i}", "expected": "yes", "split": "heldout"}
        for i in range(2)
    ]
    return make_jsonl_suite(project, rows, name="styled")


def finish_open_rollouts(evaluation: Evaluation, passed: bool) -> None:
    for rollout in Rollout.objects.filter(evaluation=evaluation, state=RolloutState.PENDING):
        if not rollout.enqueued_at:
            continue
        claimed = rollout_claim(rollout_id=rollout.id, worker="test")
        if claimed is None:
            continue
        outcome = RolloutOutcome.PASSED if passed else RolloutOutcome.TASK_FAILURE
        rollout_finish(
            rollout=claimed, outcome=outcome, score=float(passed), detail=outcome, prompt_tokens=5
        )


def drive(campaign: Campaign, passes, max_rounds: int = 60) -> Campaign:
    """Advance the campaign, finishing its rollouts by hand: ``passes(proposal) -> bool``."""
    for _ in range(max_rounds):
        campaign_advance(campaign_id=campaign.id)
        campaign.refresh_from_db()
        if campaign.is_final:
            return campaign
        proposal = Proposal.objects.filter(
            campaign=campaign, state__in=[ProposalState.PROPOSED, ProposalState.EVALUATING]
        ).first()
        if proposal is None:
            continue
        for evaluation_id in (proposal.search_evaluation_id, proposal.validation_evaluation_id):
            if evaluation_id:
                finish_open_rollouts(Evaluation.objects.get(id=evaluation_id), passes(proposal))
    raise AssertionError(f"campaign still {campaign.state} after {max_rounds} rounds")


def proposer_endpoint(url: str, *, name: str = "proposer") -> PolicyEndpoint:
    """Register the server at ``url`` as a policy endpoint, as an operator would: the only
    kind of address an llm-patch proposer may be sent to."""
    return PolicyEndpoint.objects.create(
        name=name, base_url=normalize_base_url(url), kind=EndpointKind.OPENAI_COMPATIBLE
    )


# The raced-round harness: four styles; the seed's ("bad") and three more a random proposer
# draws without replacement, so a round of three drafts holds each of them once.
RACED_MANIFEST = MANIFEST.replace(
    'choices = ["bad", "good"]', 'choices = ["bad", "good", "okay", "meh"]'
)


def raced_seed(project, tmp_path: Path):
    directory = tmp_path / "raced"
    directory.mkdir()
    (directory / "harness.toml").write_text(RACED_MANIFEST)
    (directory / "agent.py").write_text(AGENT)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="raced seed", author_name="Owner"
    )
    return candidate


def raced_suite(project, *, search: int = 16):
    """Search tasks t00..; the scripted rules in ``raced_rules`` decide who passes which."""
    rows = [
        {"id": f"t{i:02d}", "input": f"<t{i:02d}>", "expected": "yes", "split": "search"}
        for i in range(search)
    ]
    rows += [
        {"id": f"v{i}", "input": f"{MARKER} <v{i}>", "expected": "yes", "split": "validation"}
        for i in range(2)
    ]
    rows += [
        {"id": f"h{i}", "input": f"{MARKER} <h{i}>", "expected": "yes", "split": "heldout"}
        for i in range(2)
    ]
    return make_jsonl_suite(project, rows, name="raced")


def raced_passes(style: str, task_key: str) -> bool:
    """good and okay pass everything, meh nothing; the seed (bad) every other search task and
    no validation task, so that no racer is clearly better or worse than the reference before
    the race tells them apart."""
    if style in ("good", "okay"):
        return True
    if style == "meh" or not task_key.startswith("t"):
        return False
    return int(task_key[1:]) % 2 == 0


def raced_rules(search: int = 16) -> list[tuple[str, str]]:
    rules = [("style=good", "yes"), ("style=okay", "yes"), ("style=meh", "no")]
    for i in range(search):
        rules.append((f"style=bad <t{i:02d}>", "yes" if i % 2 == 0 else "no"))
    rules += [(f"style=bad {MARKER} <v{i}>", "no") for i in range(2)]
    return rules


def drive_round(
    campaign: Campaign, max_steps: int = 200, *, until: Callable[[Campaign], bool] | None = None
) -> Campaign:
    """Advance a raced campaign, finishing by hand the rollouts it sent, one task at a time
    (the oldest sent first, as a worker would), with ``raced_passes``; until it is final, or
    ``until(campaign)`` holds."""
    for _ in range(max_steps):
        campaign_advance(campaign_id=campaign.id)
        campaign.refresh_from_db()
        if campaign.is_final or (until is not None and until(campaign)):
            return campaign
        sent = Rollout.objects.filter(
            evaluation__in=Evaluation.objects.filter(
                id__in=Proposal.objects.filter(campaign=campaign).values("search_evaluation")
            )
            | Evaluation.objects.filter(
                id__in=Proposal.objects.filter(campaign=campaign).values("validation_evaluation")
            ),
            state=RolloutState.PENDING,
            enqueued_at__isnull=False,
        ).order_by("enqueued_at")
        rollout = sent.first()
        if rollout is None:
            continue
        claimed = rollout_claim(rollout_id=rollout.id, worker="test")
        if claimed is None:
            continue
        passed = raced_passes(_style_of(claimed.evaluation_id), claimed.task.key)
        outcome = RolloutOutcome.PASSED if passed else RolloutOutcome.TASK_FAILURE
        rollout_finish(
            rollout=claimed, outcome=outcome, score=float(passed), detail=outcome, prompt_tokens=5
        )
    raise AssertionError(f"campaign still {campaign.state} after {max_steps} steps")


# A patch's added line that fixes the style (an llm-patch or agentic proposal of
# ``patched_style``): '+    prompt = "style=good " + task["input"]'.
_PATCHED_STYLE = re.compile(r'^\+.*"style=(\w+) "', re.MULTILINE)


def patched_style(style: str) -> str:
    """The agent.py line of a harness that always uses ``style`` (what a patch writes)."""
    return f'    prompt = "style={style} " + task["input"]\n'


def _style_of(evaluation_id) -> str:
    """The style a proposal's harness answers with: its knob (random), else its patch's."""
    proposal = Proposal.objects.filter(
        Q(search_evaluation_id=evaluation_id) | Q(validation_evaluation_id=evaluation_id)
    ).first()
    if "style" in (proposal.params or {}):
        return proposal.params["style"]
    patched = _PATCHED_STYLE.search(proposal.patch or "")
    return patched.group(1) if patched else "bad"


def queued_drafts() -> list[tuple[str, int, str]]:
    """Take the ``campaign_draft`` messages waiting in the broker's default queue (no worker
    consumes it): (campaign id, sequence, drafting_at) each, for the test to run by hand or
    drop (a worker that died). Other messages there (advances) are dropped: the test
    advances by hand."""
    drafts = []
    with app.connection_for_read() as conn:
        queue = Queue("default", channel=conn.default_channel)
        while (message := queue.get(no_ack=True)) is not None:
            if message.headers.get("task") == CAMPAIGN_DRAFT_TASK:
                campaign_id, sequence, drafting_at = message.decode()[0]
                drafts.append((campaign_id, int(sequence), drafting_at))
    return drafts


def raced_campaign(project, tmp_path: Path, policy_version, **options) -> Campaign:
    """A started campaign of rounds of three random proposals over ``style`` (good, okay and
    meh, in the order the campaign's seed draws them), three proposals in all."""
    campaign = campaign_create(
        project=project,
        name="raced",
        seed_candidate=raced_seed(project, tmp_path),
        policy_version=policy_version,
        suite=raced_suite(project),
        strategy=[{"kind": "random", "options": {"knobs": ["style"]}}],
        max_proposals=options.pop("max_proposals", 3),
        batch_size=options.pop("batch_size", 3),
        **options,
    )
    return campaign_start(campaign=campaign)


def started_campaign(project, tmp_path, policy_version) -> Campaign:
    """A running campaign (rounds of four) with its seed's proposal evaluated and nothing
    else: tests add proposals (tests.support.factories.make_proposals)."""
    seed = styled_seed(project, tmp_path)
    campaign = campaign_create(
        project=project,
        name="big",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=marked_suite(project),
        max_proposals=5000,
        batch_size=4,
    )
    Proposal.objects.create(
        campaign=campaign,
        sequence=0,
        kind="seed",
        candidate=seed,
        state=ProposalState.EVALUATED,
        search_score=0.25,
        validation_score=0.25,
        tokens_per_task=30.0,
        improved=True,
    )
    Campaign.objects.filter(id=campaign.id).update(state=CampaignState.RUNNING)
    campaign.refresh_from_db()
    return campaign


def set_best(campaign: Campaign) -> None:
    """Record the best-scoring proposal on validation as the campaign's best, as the runner
    does."""
    best = (
        Proposal.objects.filter(campaign=campaign, validation_score__isnull=False)
        .order_by("-validation_score", "sequence")
        .first()
    )
    Campaign.objects.filter(id=campaign.id).update(
        best_candidate=best.candidate, best_validation_score=best.validation_score
    )

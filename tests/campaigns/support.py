"""A tiny harness whose ``style`` knob decides the answer, and a JSONL suite with a marker
string planted in its validation and held-out tasks."""

from __future__ import annotations

from pathlib import Path

from coevo.campaigns.models import Campaign, Proposal, ProposalState
from coevo.campaigns.runner import campaign_advance
from coevo.evaluations.models import Evaluation, Outcome, Rollout, RolloutState
from coevo.evaluations.services import rollout_claim, rollout_finish
from coevo.policies.client import normalize_base_url
from coevo.policies.models import EndpointKind, PolicyEndpoint
from harness_store.services import candidate_import_directory
from tests.support.factories import make_jsonl_suite

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
        outcome = Outcome.PASSED if passed else Outcome.TASK_FAILURE
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

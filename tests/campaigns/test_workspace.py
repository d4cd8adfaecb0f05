"""The llm-patch workspace: raw search-split material within a budget, nothing sealed."""

from __future__ import annotations

import json
import tomllib

import pytest

from coevo.campaigns.models import Proposal, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create
from coevo.campaigns.workspace import workspace_build
from coevo.evaluations.models import TraceStep
from coevo.evaluations.services import evaluation_create
from harness_store.manifest import parse_manifest
from harness_store.selectors import candidate_read_file
from tests.campaigns.support import MARKER, marked_suite, styled_seed
from tests.conftest import wait_until_final


@pytest.fixture
def evaluated(celery_worker_thread, project, tmp_path, policy_version, scripted_policy):
    """A campaign whose seed ran on every split (its rollouts all fail: the policy says no)."""
    scripted_policy.default = "no"
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    runs = {
        split: wait_until_final(
            evaluation_create(
                candidate=seed,
                suite=suite,
                split=split,
                policy_version=policy_version,
                purpose="promotion" if split == "heldout" else "evaluation",
            )
        )
        for split in ("search", "validation", "heldout")
    }
    campaign = campaign_create(
        project=project,
        name="ws",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[{"kind": "llm-patch"}],
    )
    Proposal.objects.create(
        campaign=campaign,
        sequence=0,
        kind=ProposerKind.SEED,
        candidate=seed,
        search_evaluation=runs["search"],
        validation_evaluation=runs["validation"],
        search_score=0.0,
        validation_score=0.0,
        state=ProposalState.EVALUATED,
    )
    manifest = parse_manifest(
        tomllib.loads(candidate_read_file(candidate=seed, path="harness.toml").decode())
    )
    return campaign, seed, manifest, runs


def test_it_shows_code_search_results_and_failed_search_traces_but_nothing_sealed(evaluated):
    campaign, seed, manifest, runs = evaluated
    # The sealed material exists, with the marker, in inputs and traces.
    for split in ("validation", "heldout"):
        assert TraceStep.objects.filter(
            rollout__evaluation=runs[split], payload__icontains=MARKER
        ).exists()
    # A mis-wired proposal pointing its "search" evaluation at the validation run: still unseen.
    Proposal.objects.create(
        campaign=campaign,
        sequence=1,
        kind=ProposerKind.MANUAL,
        candidate=seed,
        search_evaluation=runs["validation"],
        state=ProposalState.FAILED,
    )

    workspace = workspace_build(campaign=campaign, parent=seed, manifest=manifest)

    text = workspace.text
    assert MARKER not in text and MARKER not in json.dumps(workspace.shown)
    assert 'ctx.knobs["style"]' in text  # the parent's editable code, whole
    assert "components (the only paths you may edit): agent.py, harness.toml" in text
    assert "per-task search scores: s0=0.00, s1=0.00, s2=0.00, s3=0.00" in text
    assert "[model call] prompt (tail): style=bad q0" in text and "[model said] no" in text
    assert "validation score" not in text.lower()
    assert workspace.shown["task_keys"] == ["s0", "s1", "s2", "s3"]
    shown_traces = set(workspace.shown["trace_ids"])
    assert shown_traces and shown_traces <= {
        str(r) for r in runs["search"].rollouts.values_list("id", flat=True)
    }
    assert workspace.shown["parent"] == seed.sha and workspace.shown["chars"] == len(text)


def test_it_cuts_traces_to_the_character_budget_and_keeps_the_files(evaluated):
    campaign, seed, manifest, runs = evaluated

    big = workspace_build(campaign=campaign, parent=seed, manifest=manifest, budget_chars=50_000)
    small = workspace_build(campaign=campaign, parent=seed, manifest=manifest, budget_chars=3_500)

    assert len(big.shown["trace_ids"]) == 4
    assert len(small.text) <= 3_500 + 100
    assert len(small.shown["trace_ids"]) < 4
    assert 'ctx.knobs["style"]' in small.text


def test_it_shows_the_attempt_that_ended_a_rollout_not_one_its_worker_died_in(evaluated):
    campaign, seed, manifest, runs = evaluated
    rollout = runs["search"].rollouts.order_by("task__position").first()
    # Its one attempt becomes the second; the first was killed after a model call.
    TraceStep.objects.filter(rollout=rollout).update(attempt=2)
    type(rollout).objects.filter(id=rollout.id).update(attempts=2)
    TraceStep.objects.create(
        rollout=rollout,
        attempt=1,
        index=0,
        kind="model_call",
        payload={"prompt": "style=bad q0", "completion": "killed-attempt-said-this"},
    )

    text = workspace_build(campaign=campaign, parent=seed, manifest=manifest).text

    assert "killed-attempt-said-this" not in text
    assert "[model call] prompt (tail): style=bad q0" in text and "[model said] no" in text

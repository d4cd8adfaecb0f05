"""Creating a gate: resolving the baseline, validating the policy, starting two evaluations,
and advancing when an evaluation ends."""

from __future__ import annotations

import pytest

from coevo.errors import InvalidInput, NotFound, PermissionDenied
from coevo.evaluations.lifecycle import evaluation_cancel
from coevo.gates.models import GateState
from coevo.policies.models import PolicyEndpoint, PolicyVersion
from coevo.reviews.services import channel_get_or_create, channel_move
from coevo.suites.models import Split
from tests.gates.conftest import validation_keys

pytestmark = pytest.mark.django_db


def test_it_gates_against_the_channel_holder(make_gate, project, seed_candidate, owner):
    production = channel_get_or_create(project=project, name="production")
    channel_move(channel=production, candidate=seed_candidate, policy_version=None, moved_by=owner)

    gate = make_gate(against="production", min_score=0.5)

    assert gate.against == "production"
    assert gate.baseline == seed_candidate
    assert gate.state == GateState.PENDING and gate.verdict == ""


def test_it_uses_the_channels_policy_version_when_none_is_given(
    project, seed_candidate, child_candidate, humaneval_suite, owner, policy_version
):
    from coevo.gates.services import gate_create

    other = PolicyVersion.objects.create(
        name="tuned",
        base_model="scripted",
        served_name="tuned",
        endpoint=PolicyEndpoint.objects.first(),
    )
    production = channel_get_or_create(project=project, name="production")
    channel_move(channel=production, candidate=seed_candidate, policy_version=other, moved_by=owner)

    gate = gate_create(
        project=project,
        candidate=child_candidate,
        against="production",
        suite=humaneval_suite,
        min_score=0.5,
    )

    assert gate.policy_version == other
    assert gate.baseline_evaluation.policy_version == other
    assert gate.candidate_evaluation.policy_version == other


def test_it_gates_against_a_sha_prefix(make_gate, seed_candidate):
    gate = make_gate(against=seed_candidate.sha[:10], min_score=0.5)
    assert gate.baseline == seed_candidate


def test_it_runs_both_evaluations_on_the_same_terms(make_gate, child_candidate, seed_candidate):
    gate = make_gate(min_score=0.5, epochs=2, seed=11)

    base, cand = gate.baseline_evaluation, gate.candidate_evaluation
    assert (base.candidate, cand.candidate) == (seed_candidate, child_candidate)
    for field in ("suite_id", "split", "policy_version_id", "epochs", "seed"):
        assert getattr(base, field) == getattr(cand, field), field
    assert (cand.split, cand.epochs, cand.seed) == (Split.VALIDATION, 2, 11)
    assert cand.reference_id == base.id
    assert base.rollouts.count() == cand.rollouts.count() > 0
    assert gate.policy == {
        "min_score": 0.5,
        "max_regression": None,
        "confidence": 0.95,
        "critical_tasks": [],
        "max_error_rate": None,
    }


def test_it_explains_an_empty_channel(make_gate, project):
    channel_get_or_create(project=project, name="production")
    with pytest.raises(InvalidInput, match="holds no candidate yet.*channel_move"):
        make_gate(against="production", min_score=0.5)


def test_it_refuses_an_unknown_baseline(make_gate):
    with pytest.raises(NotFound, match="no channel 'prod'.*candidate SHA"):
        make_gate(against="prod", min_score=0.5)
    with pytest.raises(NotFound, match="No candidate matches"):
        make_gate(against="deadbeef00", min_score=0.5)


def test_it_refuses_the_heldout_split(make_gate):
    with pytest.raises(PermissionDenied, match="held-out"):
        make_gate(split=Split.HELDOUT, min_score=0.5)


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({}, "at least one rule"),
        ({"min_score": 1.5}, "min_score must be a number between 0 and 1"),
        ({"max_regression": -0.1}, "max_regression"),
        ({"max_error_rate": float("nan")}, "max_error_rate"),
        ({"min_score": 0.5, "confidence": 1.0}, "confidence"),
        ({"critical_tasks": ["HumanEval/nope"]}, "HumanEval/nope.*not in the validation split"),
    ],
)
def test_it_validates_the_policy(make_gate, rules, message):
    with pytest.raises(InvalidInput, match=message):
        make_gate(**rules)


def test_it_accepts_critical_tasks_of_the_split(make_gate, humaneval_suite):
    keys = validation_keys(humaneval_suite)[:2]
    gate = make_gate(critical_tasks=keys + keys[:1])
    assert gate.policy["critical_tasks"] == keys


def test_it_advances_its_gates_when_an_evaluation_ends(
    make_gate, monkeypatch, django_capture_on_commit_callbacks
):
    gate = make_gate(min_score=0.5)
    make_gate(min_score=0.5)  # a gate on other evaluations
    sent = []
    monkeypatch.setattr(
        "coevo.gates.services.task_enqueue",
        lambda name, gate_id, **options: sent.append((name, gate_id)),
    )

    with django_capture_on_commit_callbacks(execute=True):
        evaluation_cancel(evaluation=gate.candidate_evaluation)

    assert sent == [("coevo.gates.tasks.gate_advance", str(gate.id))]  # by name, not unrelated

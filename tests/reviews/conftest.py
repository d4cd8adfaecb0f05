"""Promotion test data: a tiny arithmetic suite with search, validation and held-out tasks, a
harness that guesses (the holder) and one that asks the model (its child, the candidate),
a second reviewer, and the production channel holding the guesser."""

from __future__ import annotations

import time

import pytest

from coevo.evaluations.models import Rollout, TraceStep
from coevo.projects.models import Role
from coevo.reviews.models import PromotionRequest, PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.services import channel_get_or_create, channel_move
from tests.support.browser import browser, page  # noqa: F401  (the evidence's browser test)
from tests.support.factories import (
    ASKS_THE_MODEL,
    GUESSES,
    finish_evaluation,
    jsonl_rows,
    make_agent_candidate,
    make_jsonl_suite,
    make_member,
)

# Planted in held-out task keys, inputs and traces: a page or answer that shows it to someone
# who is not reviewing has broken the seal (test_heldout_sealed.py).
MARKER = "sealed-heldout-marker-7f3a"

# (key, question, answer, split)
TASKS = [
    ("s-mul", "2 * 3 =", "6", "search"),
    ("s-add", "2 + 3 =", "5", "search"),
    ("v-mul", "3 * 3 =", "9", "validation"),
    ("v-add", "3 + 4 =", "7", "validation"),
    ("h-mul", "6 * 7 =", "42", "heldout"),
    ("h-add", "1 + 1 =", "2", "heldout"),
    ("h-sub", "9 - 4 =", "5", "heldout"),
]
HELDOUT_KEYS = [key for key, _, _, split in TASKS if split == "heldout"]


@pytest.fixture
def second_reviewer(project):
    return make_member(project, "reviewer2", Role.REVIEWER)


@pytest.fixture
def arith_suite(project):
    return make_jsonl_suite(project, jsonl_rows(TASKS), name="arith", scorer="numeric")


@pytest.fixture
def guesser(project, tmp_path):
    return make_agent_candidate(project, tmp_path, "guesser", GUESSES)


@pytest.fixture
def asker(project, tmp_path, guesser):
    return make_agent_candidate(project, tmp_path, "asker", ASKS_THE_MODEL, parent=guesser)


@pytest.fixture
def production(project, owner, guesser, policy_version):
    """The production channel, holding the guesser."""
    channel = channel_get_or_create(project=project, name="production")
    channel_move(channel=channel, candidate=guesser, policy_version=policy_version, moved_by=owner)
    channel.refresh_from_db()
    return channel


def wait_for_state(request: PromotionRequest, states, timeout_s: float = 90) -> PromotionRequest:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        request.refresh_from_db()
        if request.state in states:
            return request
        time.sleep(0.2)
    raise AssertionError(f"promotion still {request.state} ({request.state_detail}) after wait")


@pytest.fixture
def marked_promotion(project, owner, seed_candidate, policy_version, tmp_path):
    """A ready promotion request on a suite whose held-out task *keys* carry the marker too,
    with a flipped task and traces: the per-task evidence a reviewer reads."""
    rows = [
        {"id": "s1", "input": "1 + 1 =", "expected": "2", "split": "search"},
        {"id": f"h1-{MARKER}", "input": f"{MARKER} 5 + 5 =", "expected": "10", "split": "heldout"},
        {"id": f"h2-{MARKER}", "input": f"{MARKER} 6 + 6 =", "expected": "12", "split": "heldout"},
    ]
    suite = make_jsonl_suite(project, rows, name="leaky-keys")
    child = make_agent_candidate(project, tmp_path, "child", ASKS_THE_MODEL, parent=seed_candidate)
    production = channel_get_or_create(project=project, name="production")
    channel_move(
        channel=production, candidate=seed_candidate, policy_version=policy_version, moved_by=owner
    )
    request = promotion_request_create(
        channel=production,
        candidate=child,
        policy_version=policy_version,
        requester=owner,
        suite=suite,
    )
    finish_evaluation(request.candidate_evaluation, passed=[f"h1-{MARKER}"])
    finish_evaluation(request.holder_evaluation)
    for rollout in Rollout.objects.filter(
        evaluation__in=[request.candidate_evaluation, request.holder_evaluation]
    ).select_related("task"):
        TraceStep.objects.create(
            rollout=rollout,
            attempt=1,
            index=0,
            kind="model_call",
            payload={"api": "completions", "prompt": rollout.task.inputs["input"]},
        )
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY, request.state_detail
    return request

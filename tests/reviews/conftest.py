"""Promotion test data: a tiny arithmetic suite with search, validation and held-out tasks, a
harness that guesses (the holder) and one that asks the model (its child, the candidate),
a second reviewer, and the production channel holding the guesser."""

from __future__ import annotations

import time

import pytest

from coevo.projects.models import Role
from coevo.reviews.models import PromotionRequest
from coevo.reviews.services import channel_get_or_create, channel_move
from tests.support.browser import browser, page  # noqa: F401  (the evidence's browser test)
from tests.support.factories import (
    ASKS_THE_MODEL,
    GUESSES,
    jsonl_rows,
    make_agent_candidate,
    make_jsonl_suite,
    make_member,
)

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

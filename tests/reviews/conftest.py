"""Promotion test data: a tiny arithmetic suite with search, validation and held-out tasks, a
harness that guesses (the holder) and one that asks the model (its child, the candidate),
a researcher, and helpers that finish evaluations the way workers leave them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.reviews.models import PromotionRequest
from coevo.reviews.services import channel_get_or_create, channel_move
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from harness_store.services import candidate_import_directory
from tests.conftest import PASSWORD

MANIFEST = """
[harness]
name = "{name}"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 2
wall_time_s = 30
"""

ASKS_THE_MODEL = """
def run(task, ctx):
    return ctx.llm.complete(task["input"], max_tokens=8).texts[0].strip()
"""

GUESSES = """
def run(task, ctx):
    return "0"
"""

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


def harness(project, tmp_path: Path, name: str, agent: str, parent=None):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST.format(name=name))
    (directory / "agent.py").write_text(agent)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message=name, author_name="Tester", parent=parent
    )
    return candidate


@pytest.fixture
def second_reviewer(project):
    user = get_user_model().objects.create_user("reviewer2", "r2@example.com", PASSWORD)
    membership_set(project=project, user=user, role=Role.REVIEWER)
    return user


@pytest.fixture
def arith_suite(project):
    rows = [
        {"id": key, "input": question, "expected": answer, "split": split}
        for key, question, answer, split in TASKS
    ]
    suite, _ = suite_import_jsonl(
        project=project,
        name="arith",
        data="\n".join(json.dumps(row) for row in rows).encode(),
        scorer=scorer_spec_build(kind="numeric"),
    )
    return suite


@pytest.fixture
def guesser(project, tmp_path):
    return harness(project, tmp_path, "guesser", GUESSES)


@pytest.fixture
def asker(project, tmp_path, guesser):
    return harness(project, tmp_path, "asker", ASKS_THE_MODEL, parent=guesser)


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

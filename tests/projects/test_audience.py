"""Sealed by default (issue 34, item 4): every selector that can return held-out rows takes a
required ``audience`` with no default, and only ``Audience.REVIEWER`` reads held-out rows
through it (docs/architecture.md, "The held-out seal")."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from coevo.errors import NotFound
from coevo.evaluations.selectors import (
    evaluation_get,
    evaluation_list,
    evaluation_summaries,
    rollout_get,
)
from coevo.projects.audience import Audience, audience_for_review
from coevo.projects.models import Role
from coevo.reviews.selectors import promotion_review_get
from coevo.suites.models import Split
from coevo.suites.selectors import task_catalogue
from tests.support.factories import make_evaluation, make_jsonl_suite, make_member, make_rollout

SEALING_SELECTORS = [
    evaluation_list,
    evaluation_get,
    evaluation_summaries,
    rollout_get,
    task_catalogue,
    promotion_review_get,
]
COEVO = Path(__file__).resolve().parents[2] / "coevo"


@pytest.mark.parametrize("selector", SEALING_SELECTORS, ids=lambda f: f.__name__)
def test_a_selector_that_can_return_heldout_rows_asks_who_reads_them(selector):
    audience = inspect.signature(selector).parameters["audience"]
    assert audience.kind is inspect.Parameter.KEYWORD_ONLY
    assert audience.default is inspect.Parameter.empty
    assert audience.annotation in (Audience, "Audience")


def test_no_function_takes_a_heldout_switch_with_a_default():
    """The switches the audience replaced (``include_heldout=True`` and the like: a parameter
    about held-out data with a true-or-false default) are gone: a new one would bring a
    default that lets held-out rows through back."""
    found = []
    for path in COEVO.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            positional = [*node.args.posonlyargs, *node.args.args]
            defaults = list(
                zip(
                    positional[len(positional) - len(node.args.defaults) :],
                    node.args.defaults,
                    strict=True,
                )
            )
            defaults += [
                (a, d)
                for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
                if d is not None
            ]
            for arg, default in defaults:
                about_heldout = "heldout" in arg.arg.replace("_", "").lower()
                switch = isinstance(default, ast.Constant) and isinstance(default.value, bool)
                if about_heldout and switch:
                    found.append(f"{path.relative_to(COEVO.parent)}:{node.name}({arg.arg})")
    assert found == [], found


@pytest.fixture
def split_suite(project):
    rows = [
        {"id": "s1", "input": "search input", "expected": "1", "split": "search"},
        {"id": "h1", "input": "held-out input", "expected": "2", "split": "heldout"},
    ]
    return make_jsonl_suite(project, rows, name="split")


@pytest.fixture
def evaluations(seed_candidate, split_suite, policy_version):
    made = {}
    for split in (Split.SEARCH, Split.HELDOUT):
        evaluation = make_evaluation(
            candidate=seed_candidate, suite=split_suite, policy_version=policy_version, split=split
        )
        make_rollout(evaluation, split_suite.tasks.get(split=split), outcome="passed", score=1.0)
        made[split] = evaluation
    return made


@pytest.mark.django_db
def test_a_member_never_reads_a_heldout_evaluation_or_rollout(project, evaluations):
    heldout = evaluations[Split.HELDOUT]
    with pytest.raises(NotFound):
        evaluation_get(project=project, evaluation_id=heldout.id, audience=Audience.MEMBER)
    with pytest.raises(NotFound):
        rollout_get(project=project, rollout_id=heldout.rollouts.get().id, audience=Audience.MEMBER)
    assert list(evaluation_list(project=project, audience=Audience.MEMBER)) == [
        evaluations[Split.SEARCH]
    ]
    summaries = evaluation_summaries(project=project, audience=Audience.MEMBER)
    assert [s.evaluation for s in summaries] == [evaluations[Split.SEARCH]]


@pytest.mark.django_db
def test_a_reviewer_reads_them(project, evaluations):
    heldout = evaluations[Split.HELDOUT]
    assert evaluation_get(project=project, evaluation_id=heldout.id, audience=Audience.REVIEWER)
    rollout = heldout.rollouts.get()
    assert rollout_get(project=project, rollout_id=rollout.id, audience=Audience.REVIEWER)
    assert set(evaluation_list(project=project, audience=Audience.REVIEWER)) == set(
        evaluations.values()
    )


@pytest.mark.django_db
def test_the_task_catalogue_lists_heldout_tasks_without_their_inputs_for_a_member(split_suite):
    listed = {
        task.key: task.listed_inputs
        for task in task_catalogue(suite=split_suite, audience=Audience.MEMBER)
    }
    assert listed["h1"] is None
    assert listed["s1"]["input"] == "search input"
    reviewed = {
        task.key: task.listed_inputs
        for task in task_catalogue(suite=split_suite, audience=Audience.REVIEWER)
    }
    assert reviewed["h1"]["input"] == "held-out input"


@pytest.mark.django_db
def test_the_review_audience_follows_the_role(project, reviewer, owner):
    assert audience_for_review(project=project, user=reviewer) is Audience.REVIEWER
    assert audience_for_review(project=project, user=owner) is Audience.REVIEWER  # an admin
    for role in (Role.RESEARCHER, Role.VIEWER):
        member = make_member(project, f"m-{role.value}", role)
        assert audience_for_review(project=project, user=member) is Audience.MEMBER

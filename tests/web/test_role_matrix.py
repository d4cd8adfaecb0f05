"""Every dashboard URL × every role: the expected status, as data.

The matrix is checked against the URL resolver, so a new URL without an entry here fails
``test_it_has_an_entry_for_every_dashboard_url``. Roles, in the order of each expectation
tuple: project admin (owner), reviewer, researcher, viewer, outsider (logged in, not a
member), anonymous. Requests run from the least to the most privileged, so a POST that one
role may make changes state only after every role that must be refused was refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLResolver, get_resolver, reverse

from coevo.accounts.services import token_create
from coevo.audit.models import WebhookDelivery
from coevo.audit.webhooks import webhook_create
from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.reviews.services import channel_get_or_create
from tests.conftest import PASSWORD

ROLES = ("admin", "reviewer", "researcher", "viewer", "outsider", "anonymous")
NAMESPACES = ("web", "accounts", "ops")
MISSING = uuid.UUID(int=1)  # an id no object has: members get 404 like outsiders

LOGIN = 302  # anonymous users are sent to the login form
OK, FOUND, FORBIDDEN, GONE = 200, 302, 403, 404
SAME = -1  # whatever the admin gets, provided it is no redirect, 403 or 404


@dataclass(frozen=True)
class Entry:
    kwargs: Callable[[Any], dict[str, Any]]  # from the scenario to URL kwargs
    expected: tuple[int, int, int, int, int, int]  # one status per role, in ROLES order
    method: str = "get"
    data: dict[str, Any] | None = None


def _p(**extra: Any) -> Callable[[Any], dict[str, Any]]:
    return lambda s: {"slug": "demo", **{k: (v(s) if callable(v) else v) for k, v in extra.items()}}


MEMBER_PAGE = (OK, OK, OK, OK, GONE, LOGIN)
REVIEWER_PAGE = (OK, OK, FORBIDDEN, FORBIDDEN, GONE, LOGIN)
ADMIN_PAGE = (OK, FORBIDDEN, FORBIDDEN, FORBIDDEN, GONE, LOGIN)
MISSING_OBJECT = (GONE, GONE, GONE, GONE, GONE, LOGIN)
ANY_USER = (OK, OK, OK, OK, OK, LOGIN)

MATRIX: dict[str, Entry] = {
    "web:home": Entry(lambda s: {}, ANY_USER),
    "web:project": Entry(_p(), MEMBER_PAGE),
    "web:candidate": Entry(_p(sha=lambda s: s.sha), MEMBER_PAGE),
    "web:candidate_file": Entry(_p(sha=lambda s: s.sha, path="agent.py"), MEMBER_PAGE),
    "web:candidate_diff": Entry(_p(sha=lambda s: s.sha), MEMBER_PAGE),
    "web:evaluation": Entry(_p(evaluation_id=lambda s: s.evaluation.id), MEMBER_PAGE),
    "web:evaluation_action": Entry(
        _p(evaluation_id=lambda s: s.evaluation.id, action="cancel"),
        (FOUND, FOUND, FOUND, FORBIDDEN, GONE, LOGIN),
        method="post",
    ),
    # Without the two evaluations to compare there is nothing to show.
    "web:comparison": Entry(_p(), MISSING_OBJECT),
    "web:gate": Entry(_p(gate_id=MISSING), MISSING_OBJECT),
    "web:rollout": Entry(_p(rollout_id=lambda s: s.rollout.id), MEMBER_PAGE),
    "web:suites": Entry(_p(), MEMBER_PAGE),
    "web:suite_import": Entry(_p(), (OK, OK, OK, FORBIDDEN, GONE, LOGIN)),
    "web:suite": Entry(_p(suite_id=lambda s: s.suite.id), MEMBER_PAGE),
    "web:campaigns": Entry(_p(), MEMBER_PAGE),
    "web:campaign_new": Entry(_p(), (OK, OK, OK, FORBIDDEN, GONE, LOGIN)),
    "web:campaign": Entry(_p(campaign_id=MISSING), MISSING_OBJECT),
    "web:matrices": Entry(_p(), MEMBER_PAGE),
    "web:matrix": Entry(_p(matrix_id=MISSING), MISSING_OBJECT),
    # The role is checked before the object is looked up: viewers are refused outright.
    "web:campaign_action": Entry(
        _p(campaign_id=MISSING, action="pause"), (GONE, GONE, GONE, FORBIDDEN, GONE, LOGIN), "post"
    ),
    "web:exports": Entry(_p(), MEMBER_PAGE),
    "web:training_runs": Entry(_p(), MEMBER_PAGE),
    "web:training_run": Entry(_p(run_id=MISSING), MISSING_OBJECT),
    "web:training_run_log": Entry(_p(run_id=MISSING), MISSING_OBJECT),
    # The role is checked before the object is looked up: viewers are refused outright.
    "web:training_run_cancel": Entry(
        _p(run_id=MISSING), (GONE, GONE, GONE, FORBIDDEN, GONE, LOGIN), "post"
    ),
    "web:export_download": Entry(_p(export_id=MISSING), MISSING_OBJECT),
    "web:channels": Entry(_p(), MEMBER_PAGE),
    "web:channel_create": Entry(
        _p(),
        (FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, GONE, LOGIN),
        "post",
        {"name": "canary"},
    ),
    "web:channel_rollback": Entry(
        _p(name="production"), (FOUND, FOUND, FORBIDDEN, FORBIDDEN, GONE, LOGIN), "post"
    ),
    "web:promotions": Entry(_p(), MEMBER_PAGE),
    "web:promotion_new": Entry(_p(), (OK, OK, OK, FORBIDDEN, GONE, LOGIN)),
    "web:promotion": Entry(_p(request_id=MISSING), MISSING_OBJECT),
    # Held-out traces: reviewers only, refused before the lookup.
    "web:promotion_rollout": Entry(
        _p(request_id=MISSING, rollout_id=MISSING), (GONE, GONE, FORBIDDEN, FORBIDDEN, GONE, LOGIN)
    ),
    "web:promotion_action": Entry(
        _p(request_id=MISSING, action="approve"), MISSING_OBJECT, method="post"
    ),
    "web:global_audit": Entry(
        lambda s: {}, (FORBIDDEN, FORBIDDEN, FORBIDDEN, FORBIDDEN, FORBIDDEN, LOGIN)
    ),
    "web:audit": Entry(_p(), REVIEWER_PAGE),
    "web:members": Entry(_p(), ADMIN_PAGE),
    "web:member_action": Entry(
        _p(action="role"),
        (FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, GONE, LOGIN),
        method="post",
        data={"username": "viewer", "role": "researcher"},
    ),
    "web:webhooks": Entry(_p(), ADMIN_PAGE),
    "web:webhook_action": Entry(
        _p(webhook_id=lambda s: s.webhook.id, action="pause"),
        (FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, GONE, LOGIN),
        method="post",
    ),
    "web:webhook_redeliver": Entry(
        _p(delivery_id=lambda s: s.delivery.id),
        (FOUND, FORBIDDEN, FORBIDDEN, FORBIDDEN, GONE, LOGIN),
        method="post",
    ),
    "accounts:tokens": Entry(lambda s: {}, ANY_USER),
    # Only the token's owner (the admin here) can revoke it; to everyone else it does not exist.
    "accounts:token_revoke": Entry(
        lambda s: {"token_id": s.token.id}, (FOUND, GONE, GONE, GONE, GONE, LOGIN), "post"
    ),
    "accounts:password_change": Entry(lambda s: {}, ANY_USER),
    "accounts:password_change_done": Entry(lambda s: {}, ANY_USER),
    # Probes answer without a login (load balancers).
    "ops:healthz": Entry(lambda s: {}, (OK,) * 6),
    # Its status reflects the dependencies' health here, never the caller's role.
    "ops:readyz": Entry(lambda s: {}, (SAME,) * 6),
    # No role opens metrics: without COEVO_METRICS_TOKEN (or COEVO_METRICS_PUBLIC) they are
    # served to nobody, logged in or not (tests/ops/test_metrics.py).
    "ops:metrics": Entry(lambda s: {}, (FORBIDDEN,) * 6),
    # Staff only; to everyone else the page does not exist.
    "ops:system": Entry(lambda s: {}, (GONE,) * 5 + (LOGIN,)),
}


def _names(resolver: URLResolver, namespace: str | None = None) -> set[str]:
    names = set()
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            inner = pattern.namespace or namespace
            names |= _names(pattern, inner)
        elif pattern.name and namespace in NAMESPACES:
            names.add(f"{namespace}:{pattern.name}")
    return names


def test_it_has_an_entry_for_every_dashboard_url():
    urls = _names(get_resolver())
    assert urls - MATRIX.keys() == set(), "add these URLs to the role matrix"
    assert MATRIX.keys() - urls == set(), "these matrix entries name no URL"


@dataclass
class Scenario:
    webhook: Any
    delivery: Any
    token: Any
    # Only for the URLs that need them (a finished evaluation costs a git import and a suite).
    sha: str = ""
    evaluation: Any = None
    rollout: Any = None
    suite: Any = None


NEEDS_EVALUATION = {
    "web:candidate",
    "web:candidate_file",
    "web:candidate_diff",
    "web:evaluation",
    "web:evaluation_action",
    "web:rollout",
    "web:suite",
}


@pytest.fixture
def scenario(request, project, owner, reviewer, monkeypatch) -> Scenario:
    monkeypatch.setattr("coevo.audit.webhooks._delivery_enqueue", lambda pk, countdown=0: None)
    users = get_user_model().objects
    for role in (Role.RESEARCHER, Role.VIEWER):
        membership_set(
            project=project, user=users.create_user(str(role), f"{role}@e.com", PASSWORD), role=role
        )
    channel_get_or_create(project=project, name="production")
    webhook, _ = webhook_create(
        project=project, url="https://ci.example.com/hook", events=["*"], created_by=owner
    )
    delivery = WebhookDelivery.objects.create(webhook=webhook, event="channel.moved", payload={})
    token, _ = token_create(
        user=owner, name="ci", kind="personal", scopes=["read"], created_by=owner
    )
    scenario = Scenario(webhook=webhook, delivery=delivery, token=token)
    if request.node.callspec.params.get("name") in NEEDS_EVALUATION:
        finished = request.getfixturevalue("finished_evaluation")
        scenario.evaluation = finished.evaluation
        scenario.sha = finished.evaluation.candidate.sha
        scenario.rollout = finished.passed
        scenario.suite = finished.evaluation.suite
    return scenario


def _client(role: str) -> Client:
    client = Client()
    username = {"admin": "owner"}.get(role, role)
    if role != "anonymous":
        if role == "outsider":
            get_user_model().objects.create_user("outsider", "o@e.com", PASSWORD)
        client.force_login(get_user_model().objects.get(username=username))
    return client


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_it_answers_each_role_as_the_matrix_says(name, scenario):
    entry = MATRIX[name]
    url = reverse(name, kwargs=entry.kwargs(scenario))
    actual = {}
    for role in reversed(ROLES):  # least privileged first
        response = getattr(_client(role), entry.method)(url, entry.data or {})
        actual[role] = response.status_code
        if role == "anonymous" and response.status_code == LOGIN:
            assert "/login/" in response["Location"]
    expected = tuple(
        actual["admin"] if e == SAME and actual["admin"] not in (FOUND, FORBIDDEN, GONE) else e
        for e in entry.expected
    )
    assert tuple(actual[r] for r in ROLES) == expected, f"{name}: {actual}"

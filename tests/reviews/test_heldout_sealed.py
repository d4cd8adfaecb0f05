"""The held-out split is sealed (docs/architecture.md, "The held-out seal"; issue 5): a marker string planted in held-out
task inputs and traces never appears on a dashboard page a researcher or viewer can reach, nor
in an API answer to a non-reviewer token (a researcher's, a reviewer's CI token); a reviewer
sees it on the promotion pages only.

Pages and endpoints are not listed by hand: the test walks every GET URL pattern of the
dashboard and the API and fills its parameters from the planted data, so a page added later is
checked too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from coevo.accounts.models import SCOPES, TokenKind
from coevo.accounts.services import token_create
from coevo.evaluations.models import (
    Evaluation,
    Outcome,
    Rollout,
    TraceStep,
)
from coevo.projects.models import Role
from coevo.suites.models import Split, Task
from tests.conftest import PASSWORD
from tests.support.factories import (
    ASKS_THE_MODEL,
    add_steps,
    finish_evaluation,
    make_agent_candidate,
    make_evaluation,
    make_jsonl_suite,
    make_member,
    make_rollout,
)

pytestmark = pytest.mark.django_db

MARKER = "sealed-heldout-marker-7f3a"
# Parameters no GET page takes from planted data (actions are POST-only; files have a path).
SKIPPED_PARAMETERS = {"action"}


@pytest.fixture
def leaky_suite(project):
    rows = [
        {"id": "s1", "input": "1 + 1 =", "expected": "2", "split": "search"},
        {"id": "v1", "input": "2 + 2 =", "expected": "4", "split": "validation"},
        {"id": "h1", "input": f"{MARKER} 3 + 3 =", "expected": "6", "split": "heldout"},
        {"id": "h2", "input": f"{MARKER} 4 + 4 =", "expected": "8", "split": "heldout"},
    ]
    return make_jsonl_suite(project, rows, name="leaky")


def _evaluation(candidate, suite, policy_version, split: str) -> Evaluation:
    """Every task of ``split`` failed, each trace naming the task's input."""
    evaluation = make_evaluation(
        candidate=candidate, suite=suite, policy_version=policy_version, split=split, seed=7
    )
    for task in Task.objects.filter(suite=suite, split=split):
        rollout = make_rollout(
            evaluation, task, outcome=Outcome.TASK_FAILURE, score=0.0, detail="wrong"
        )
        prompt = json.dumps(task.inputs)
        # Steps only: make_rollout would count these calls (and want their token counts).
        add_steps(
            rollout,
            [
                ("model_call", {"api": "completions", "prompt": prompt, "completion": "7"}, {}),
                ("log", {"message": f"thinking about {prompt}"}, {}),
            ],
        )
    return evaluation


@pytest.fixture
def promotion(project, owner, seed_candidate, policy_version, tmp_path):
    """A ready promotion request on a suite whose held-out task *keys* carry the marker too,
    with a flipped task and traces: the per-task evidence a reviewer reads."""
    from coevo.reviews.models import PromotionState
    from coevo.reviews.promotions.create import promotion_request_create
    from coevo.reviews.promotions.refresh import promotion_evidence_refresh
    from coevo.reviews.services import channel_get_or_create, channel_move

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


@pytest.fixture
def planted(project, seed_candidate, leaky_suite, policy_version, promotion) -> dict[str, Any]:
    heldout = _evaluation(seed_candidate, leaky_suite, policy_version, Split.HELDOUT)
    search = _evaluation(seed_candidate, leaky_suite, policy_version, Split.SEARCH)
    rollout = heldout.rollouts.first()
    assert MARKER in json.dumps(
        list(TraceStep.objects.filter(rollout=rollout).values_list("payload", flat=True))
    )
    return {
        "slug": project.slug,
        "sha": seed_candidate.sha,
        "path": "agent.py",
        "suite_id": leaky_suite.id,
        "evaluation_id": heldout.id,
        "rollout_id": rollout.id,
        "name": "production",
        "request_id": promotion.id,
        "search_evaluation": search,
        "heldout_evaluation": heldout,
        "promotion": promotion,
    }


def _get_patterns(resolver: URLResolver, namespace: str = "") -> list[tuple[str, list[str]]]:
    found = []
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            for name, params in _get_patterns(pattern, inner):
                found.append((name, list(pattern.pattern.converters) + params))
        elif isinstance(pattern, URLPattern) and pattern.name:
            found.append((f"{namespace}{pattern.name}", list(pattern.pattern.converters)))
    return found


def _urls(values: dict[str, Any], *, prefix: str) -> list[str]:
    """Every named GET URL under ``prefix`` whose parameters the planted data fills."""
    urls = set()
    for name, params in _get_patterns(get_resolver()):
        if SKIPPED_PARAMETERS & set(params) or not set(params) <= set(values):
            continue
        try:
            url = reverse(name, kwargs={param: values[param] for param in params})
        except Exception:  # noqa: BLE001 - a pattern the planted values do not fit
            continue
        if url.startswith(prefix):
            urls.add(url)
    return sorted(urls)


def _extra_urls(planted: dict[str, Any]) -> list[str]:
    slug = planted["slug"]
    heldout, search = planted["heldout_evaluation"], planted["search_evaluation"]
    return [
        reverse("web:comparison", args=[slug]) + f"?reference={heldout.id}&candidate={heldout.id}",
        reverse("web:rollout", args=[slug, planted["rollout_id"]]) + f"?q={MARKER}",
        reverse("web:evaluation", args=[slug, search.id]),
        *_promotion_rollout_urls(planted["promotion"]),
    ]


def _promotion_rollout_urls(promotion) -> list[str]:
    """The reviewer path to each flipped task's two traces."""
    slug = promotion.project.slug
    return [
        reverse("web:promotion_rollout", args=[slug, promotion.id, row[side]])
        for row in promotion.evidence["comparison"]["flipped_tasks"]
        for side in ("candidate_rollout", "reference_rollout")
    ]


def _login(user) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


def _api(user, kind: str) -> APIClient:
    scopes = [s for s in SCOPES if s != "promotions:approve"]
    _, raw = token_create(user=user, name="leak", kind=kind, scopes=scopes, created_by=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.parametrize("role", [Role.RESEARCHER, Role.VIEWER])
def test_it_never_shows_heldout_inputs_or_traces_on_a_dashboard_page(project, planted, role):
    client = _login(make_member(project, f"u-{role.value}", role))
    urls = _urls(planted, prefix=f"/p/{project.slug}/") + _extra_urls(planted)
    assert len(urls) >= 10, urls  # the walk found the project's pages
    for url in urls:
        response = client.get(url)
        assert response.status_code < 500, url
        assert MARKER not in response.content.decode(errors="replace"), url


@pytest.mark.parametrize("who", ["researcher", "reviewer-ci"])
def test_it_never_returns_heldout_inputs_or_traces_to_a_non_reviewer_token(
    project, planted, reviewer, who
):
    if who == "researcher":
        client = _api(make_member(project, "r-api", Role.RESEARCHER), TokenKind.PERSONAL)
    else:
        client = _api(reviewer, TokenKind.CI)
    urls = _urls(planted, prefix="/api/v1/projects/")
    assert len(urls) >= 5, urls
    for url in urls:
        response = client.get(url)
        assert response.status_code < 500, url
        assert MARKER not in response.content.decode(errors="replace"), url


def test_the_reviewer_rollout_path_is_refused_to_a_researcher_and_to_foreign_rollouts(
    project, planted, reviewer
):
    """The promotion path unseals a rollout only for reviewers and only for the request's
    own evaluations; a made-up request id is a 404 either way."""
    import uuid

    url = reverse("web:promotion_rollout", args=[project.slug, uuid.uuid4(), planted["rollout_id"]])
    researcher = _login(make_member(project, "r-web", Role.RESEARCHER))
    assert researcher.get(url).status_code == 403
    response = _login(reviewer).get(url)
    assert response.status_code == 404
    assert MARKER not in response.content.decode()


def test_the_held_out_rollout_page_is_not_found_even_for_a_reviewer(project, planted, reviewer):
    """Outside its promotion request a held-out rollout is not found: its outcome, score and
    detail are held-out results as much as its trace is."""
    response = _login(reviewer).get(
        reverse("web:rollout", args=[project.slug, planted["rollout_id"]])
    )
    assert response.status_code == 404
    assert MARKER not in response.content.decode()


def test_a_reviewer_sees_heldout_details_on_the_promotion_pages_and_nowhere_else(
    project, planted, reviewer
):
    client = _login(reviewer)
    promotion = planted["promotion"]
    urls = _urls(planted, prefix=f"/p/{project.slug}/") + _extra_urls(planted)
    shown = set()
    for url in urls:
        response = client.get(url)
        assert response.status_code < 500, url
        if MARKER in response.content.decode(errors="replace"):
            shown.add(url)
    # The request page (its flipped task) and the reviewer path to that task's two traces.
    assert shown == {
        reverse("web:promotion", args=[project.slug, promotion.id]),
        *_promotion_rollout_urls(promotion),
    }


def test_a_reviewers_personal_token_reads_the_flipped_heldout_tasks(project, planted, reviewer):
    _, raw = token_create(
        user=reviewer, name="mine", kind=TokenKind.PERSONAL, scopes=["read"], created_by=reviewer
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.get(reverse("api:promotion", args=[project.slug, planted["promotion"].id]))
    assert response.status_code == 200
    assert response.json()["evidence"]["comparison"]["flips"]["fixed"] == [f"h1-{MARKER}"]

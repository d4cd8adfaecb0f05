"""Promotions API: scopes and roles of every endpoint (request: ``promotions:request`` and the
researcher role; approve/reject: ``promotions:approve``, which only reviewers' personal tokens
hold, and never the requester's own), 202 + status URL, and evidence without held-out per-task
results for everyone but reviewers' personal tokens."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from coevo.accounts.models import TokenKind
from coevo.accounts.services import token_create
from coevo.errors import PermissionDenied
from coevo.projects.models import Role
from coevo.projects.services import membership_set, project_get_or_create
from coevo.reviews.models import Approval, PromotionRequest, PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.selectors import channel_holder
from coevo.reviews.services import channel_move
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from tests.conftest import PASSWORD
from tests.support.factories import GUESSES, finish_evaluation, make_agent_candidate, make_member

pytestmark = pytest.mark.django_db

REQUEST = ["read", "promotions:request"]
APPROVE = ["read", "promotions:approve"]
SEALED = ("flips", "flipped_tasks", "dropped")


@pytest.fixture
def arith(arith_suite):
    return arith_suite


def make_ready(*, requester, channel, candidate, suite, policy_version) -> PromotionRequest:
    request = promotion_request_create(
        channel=channel,
        candidate=candidate,
        policy_version=policy_version,
        requester=requester,
        suite=suite,
    )
    finish_evaluation(request.candidate_evaluation, passed=["h-mul", "h-add"])
    finish_evaluation(request.holder_evaluation)
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY, request.state_detail
    return request


@pytest.fixture
def ready(researcher, production, asker, arith, policy_version) -> PromotionRequest:
    return make_ready(
        requester=researcher,
        channel=production,
        candidate=asker,
        suite=arith,
        policy_version=policy_version,
    )


def list_url(project) -> str:
    return reverse("api:promotions", args=[project.slug])


def detail_url(request) -> str:
    return reverse("api:promotion", args=[request.project.slug, request.id])


def decide_url(request, decision: str) -> str:
    return reverse(f"api:promotion_{decision}", args=[request.project.slug, request.id])


# -- create -----------------------------------------------------------------------------------


def test_it_creates_a_request_and_answers_202_with_a_status_url(
    project, make_client, researcher, asker, guesser, production, arith
):
    client = make_client(researcher, scopes=REQUEST)

    response = client.post(
        list_url(project), {"candidate": asker.sha, "suite": "arith"}, format="json"
    )

    assert response.status_code == 202, response.json()
    body = response.json()
    request = PromotionRequest.objects.get()
    assert body["id"] == str(request.id) and body["state"] == "evaluating"
    assert body["status_url"].endswith(detail_url(request))
    assert response["Location"] == body["status_url"]
    assert body["dashboard_url"].endswith(reverse("web:promotion", args=[project.slug, request.id]))
    assert (request.candidate, request.holder_candidate) == (asker, guesser)
    assert request.channel == production and request.requester == researcher

    status = client.get(body["status_url"])
    assert status.status_code == 200
    assert status.json()["state"] == "evaluating" and status.json()["stale"] is False
    assert (
        status.json()["candidate"] == asker.sha
        and status.json()["suite"] == f"arith@{arith.version}"
    )

    # Asking again while it is open returns the same request (no second held-out look).
    again = client.post(list_url(project), {"candidate": asker.sha}, format="json")
    assert again.status_code == 202 and again.json()["id"] == body["id"]
    assert PromotionRequest.objects.count() == 1


def test_a_ci_token_may_request_a_promotion(project, make_client, owner, asker, production, arith):
    client = make_client(owner, scopes=REQUEST, kind=TokenKind.CI)
    response = client.post(list_url(project), {"candidate": asker.sha[:12]}, format="json")
    assert response.status_code == 202, response.json()


def test_requesting_needs_the_promotions_request_scope(
    project, make_client, researcher, asker, production, arith
):
    client = make_client(researcher, scopes=["read", "evaluations:run"])
    response = client.post(list_url(project), {"candidate": asker.sha}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "scope_missing"
    assert not PromotionRequest.objects.exists()


def test_requesting_needs_the_researcher_role(
    project, make_client, viewer, outsider, asker, production, arith
):
    response = make_client(viewer, scopes=REQUEST).post(
        list_url(project), {"candidate": asker.sha}, format="json"
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    response = make_client(outsider, scopes=REQUEST).post(
        list_url(project), {"candidate": asker.sha}, format="json"
    )
    assert response.status_code == 404
    assert not PromotionRequest.objects.exists()


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"candidate": "f" * 40}, 404, "not_found"),
        ({"candidate": "not-a-sha"}, 400, "invalid_input"),
        ({"suite": "nope"}, 404, "not_found"),
        ({"policy_version": "nope"}, 404, "not_found"),
        ({"channel": "channels"}, 400, "invalid_input"),
        ({"epochs": 0}, 400, "invalid_input"),
    ],
)
def test_it_refuses_bad_requests_with_a_clear_error(
    project, make_client, researcher, asker, production, arith, body, status, code
):
    response = make_client(researcher, scopes=REQUEST).post(
        list_url(project), {"candidate": asker.sha, **body}, format="json"
    )
    assert response.status_code == status, response.json()
    assert response.json()["error"]["code"] == code
    assert not PromotionRequest.objects.exists()


def test_it_asks_which_suite_when_several_have_held_out_tasks(
    project, make_client, researcher, asker, production, arith
):
    suite_import_jsonl(
        project=project,
        name="other",
        data=b'{"id": "h", "input": "1", "expected": "1", "split": "heldout"}',
        scorer=scorer_spec_build(kind="exact"),
    )
    client = make_client(researcher, scopes=REQUEST)
    response = client.post(list_url(project), {"candidate": asker.sha}, format="json")
    assert response.status_code == 400
    assert "arith, other" in response.json()["error"]["message"]


def test_a_suite_without_held_out_tasks_cannot_decide_a_promotion(
    project, make_client, researcher, asker, production
):
    suite_import_jsonl(
        project=project,
        name="open",
        data=b'{"id": "v", "input": "1", "expected": "1", "split": "validation"}',
        scorer=scorer_spec_build(kind="exact"),
    )
    response = make_client(researcher, scopes=REQUEST).post(
        list_url(project), {"candidate": asker.sha, "suite": "open"}, format="json"
    )
    assert response.status_code == 400
    assert "no held-out tasks" in response.json()["error"]["message"]


def test_it_compares_an_empty_channel_with_a_picked_baseline(
    project, make_client, researcher, asker, guesser, arith
):
    client = make_client(researcher, scopes=REQUEST)

    response = client.post(
        list_url(project),
        {"candidate": asker.sha, "channel": "staging", "baseline": guesser.sha[:10]},
        format="json",
    )

    assert response.status_code == 202, response.json()
    request = PromotionRequest.objects.get()
    assert (request.baseline_candidate, request.baseline_kind) == (guesser, "picked")
    status = client.get(response.json()["status_url"]).json()
    assert (status["baseline"], status["baseline_kind"]) == (guesser.sha, "picked")


@pytest.mark.parametrize(
    ("channel", "baseline", "message"),
    [
        ("staging", "abcdef1234", "Baseline: No candidate abcdef1234"),
        ("staging", "asker", "the candidate itself"),
        ("production", "guesser", "A baseline is only for an empty channel"),
    ],
)
def test_it_refuses_a_baseline_it_cannot_use(
    project, make_client, researcher, asker, guesser, production, arith, channel, baseline, message
):
    sha = {"asker": asker.sha, "guesser": guesser.sha}.get(baseline, baseline)
    response = make_client(researcher, scopes=REQUEST).post(
        list_url(project),
        {"candidate": asker.sha, "channel": channel, "baseline": sha},
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == "invalid_input"
    assert message in response.json()["error"]["message"]
    assert not PromotionRequest.objects.exists()


def test_a_baseline_of_another_project_is_refused(
    project, make_client, researcher, asker, arith, tmp_path
):
    other = project_get_or_create(slug="other", name="Other")
    foreign = make_agent_candidate(other, tmp_path, "foreign", GUESSES)
    response = make_client(researcher, scopes=REQUEST).post(
        list_url(project),
        {"candidate": asker.sha, "channel": "staging", "baseline": foreign.sha},
        format="json",
    )
    assert response.status_code == 400
    assert f"No candidate {foreign.sha}" in response.json()["error"]["message"]


# -- read -------------------------------------------------------------------------------------


def test_evidence_keeps_held_out_tasks_for_reviewers_personal_tokens(
    ready, make_client, researcher, viewer, reviewer
):
    sealed_clients = {
        "researcher": make_client(researcher, scopes=["read"]),
        "viewer": make_client(viewer, scopes=["read"]),
        "reviewer-ci": make_client(reviewer, scopes=["read"], kind=TokenKind.CI),
    }
    for who, client in sealed_clients.items():
        for url in (detail_url(ready), list_url(ready.project)):
            response = client.get(url)
            assert response.status_code == 200, who
            body = response.json()
            promotion = body if url == detail_url(ready) else body["results"][0]
            comparison = promotion["evidence"]["comparison"]
            assert not set(SEALED) & set(comparison), who
            assert comparison["difference"] == pytest.approx(2 / 3)  # aggregates stay
            assert comparison["flip_counts"]["fixed"] == 2
            assert "h-mul" not in response.content.decode(), who

            assert "heldout_tasks" not in promotion["evidence"], who
            assert promotion["evidence"]["reference"]["kind"] == "holder"  # not sealed

    response = make_client(reviewer, scopes=["read"]).get(detail_url(ready))
    listed = response.json()["evidence"]["heldout_tasks"]["tasks"]
    assert [row["task"] for row in listed] == ["h-mul", "h-add", "h-sub"]
    comparison = response.json()["evidence"]["comparison"]
    assert sorted(comparison["flips"]["fixed"]) == ["h-add", "h-mul"]
    assert {row["task"] for row in comparison["flipped_tasks"]} == {"h-add", "h-mul"}


def test_a_list_carries_each_evidence_summary_even_to_a_reviewer(ready, make_client, reviewer):
    """Lists leave the per-task results, the diff and the lineage in the database (a page of 40
    whole evidences was megabytes); the request's own URL has them for whom they are meant."""
    whole = make_client(reviewer, scopes=["read"]).get(detail_url(ready)).json()["evidence"]
    assert {"heldout_tasks", "diff", "lineage"} <= set(whole)

    body = make_client(reviewer, scopes=["read"]).get(list_url(ready.project))
    [listed] = body.json()["results"]
    summary = listed["evidence"]
    assert not {"heldout_tasks", "diff", "lineage"} & set(summary)
    assert not set(SEALED) & set(summary["comparison"])
    assert "h-mul" not in body.content.decode()
    # Everything else is the evidence as stored.
    kept = {key: value for key, value in whole.items() if key not in summary}
    assert set(kept) == {"heldout_tasks", "diff", "lineage"}
    assert {key: whole[key] for key in summary if key != "comparison"} == {
        key: value for key, value in summary.items() if key != "comparison"
    }
    assert summary["comparison"] == {
        key: value for key, value in whole["comparison"].items() if key not in SEALED
    }
    assert listed["url"].endswith(detail_url(ready))


def test_an_outsider_reads_no_promotion(ready, make_client, outsider):
    client = make_client(outsider, scopes=["read"])
    assert client.get(detail_url(ready)).status_code == 404
    assert client.get(list_url(ready.project)).status_code == 404


def test_a_promotion_of_another_project_is_not_found(ready, make_client, owner):
    other = project_get_or_create(slug="other", name="Other")
    membership_set(project=other, user=owner, role=Role.ADMIN)
    url = reverse("api:promotion", args=[other.slug, ready.id])
    assert make_client(owner, scopes=["read"]).get(url).status_code == 404


# -- decide -----------------------------------------------------------------------------------


def test_a_reviewer_approves_with_a_personal_token_and_the_channel_moves(
    project, ready, make_client, reviewer, asker
):
    response = make_client(reviewer, scopes=APPROVE).post(
        decide_url(ready, "approve"), {"comment": "generalizes"}, format="json"
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["state"] == "approved"
    assert body["approvals"][0]["reviewer"] == "reviewer"
    assert body["approvals"][0]["comment"] == "generalizes"
    assert "flipped_tasks" in body["evidence"]["comparison"]
    assert channel_holder(project=project, name="production") == asker


def test_a_reviewer_rejects(project, ready, make_client, reviewer, guesser):
    response = make_client(reviewer, scopes=APPROVE).post(
        decide_url(ready, "reject"), {"comment": "not enough tasks"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["state"] == "rejected"
    assert channel_holder(project=project, name="production") == guesser


def test_a_ci_token_can_never_hold_the_approve_scope(reviewer):
    with pytest.raises(PermissionDenied):
        token_create(
            user=reviewer, name="ci", kind=TokenKind.CI, scopes=APPROVE, created_by=reviewer
        )


def test_a_researcher_cannot_get_the_approve_scope(researcher):
    with pytest.raises(PermissionDenied):
        token_create(
            user=researcher,
            name="mine",
            kind=TokenKind.PERSONAL,
            scopes=APPROVE,
            created_by=researcher,
        )


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_deciding_needs_the_approve_scope(ready, make_client, reviewer, owner, decision):
    for client in (
        make_client(reviewer, scopes=["read", "promotions:request", "evaluations:run"]),
        make_client(owner, kind=TokenKind.CI),  # every scope a CI token may hold
    ):
        response = client.post(decide_url(ready, decision), {}, format="json")
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "scope_missing"
    assert not Approval.objects.exists()


def test_deciding_needs_the_reviewer_role_on_this_project(
    ready, make_client, reviewer, project, researcher
):
    # Reviewer elsewhere, researcher here: the scope is theirs, the role on this project is not.
    elsewhere = get_user_model().objects.create_user("dual", "d@example.com", PASSWORD)
    other = project_get_or_create(slug="other", name="Other")
    membership_set(project=other, user=elsewhere, role=Role.REVIEWER)
    membership_set(project=project, user=elsewhere, role=Role.RESEARCHER)
    response = make_client(elsewhere, scopes=APPROVE).post(
        decide_url(ready, "approve"), {}, format="json"
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert not Approval.objects.exists()


def test_the_requesters_own_token_cannot_approve(
    project, make_client, reviewer, second_reviewer_api, production, asker, arith, policy_version
):
    request = make_ready(
        requester=reviewer,
        channel=production,
        candidate=asker,
        suite=arith,
        policy_version=policy_version,
    )
    response = make_client(reviewer, scopes=APPROVE).post(
        decide_url(request, "approve"), {}, format="json"
    )
    assert response.status_code == 403
    assert "another reviewer" in response.json()["error"]["message"]
    assert not Approval.objects.exists()

    response = second_reviewer_api.post(decide_url(request, "approve"), {}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "approved"


@pytest.fixture
def second_reviewer_api(project, make_client):
    return make_client(make_member(project, "reviewer2", Role.REVIEWER), scopes=APPROVE)


def test_a_request_still_evaluating_cannot_be_approved(
    project, make_client, researcher, reviewer, production, asker, arith, policy_version
):
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith,
    )
    response = make_client(reviewer, scopes=APPROVE).post(
        decide_url(request, "approve"), {}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "invalid_state"


def test_stale_evidence_cannot_be_approved(
    project, ready, make_client, reviewer, owner, tmp_path, policy_version
):
    other = make_agent_candidate(project, tmp_path, "other", GUESSES.replace('"0"', '"1"'))
    channel_move(
        channel=ready.channel, candidate=other, policy_version=policy_version, moved_by=owner
    )
    client = make_client(reviewer, scopes=APPROVE)
    assert client.get(detail_url(ready)).json()["stale"] is True

    response = client.post(decide_url(ready, "approve"), {}, format="json")

    assert response.status_code == 409
    assert "refresh the evidence" in response.json()["error"]["message"]
    assert channel_holder(project=project, name="production") == other

"""The promotion pages with real promotion requests: channels (history, rollback), the request
form, the request page's evidence, and the review forms (the requester cannot decide, even by
crafting the POST; another reviewer approves and the channel moves; stale evidence blocks
approval until refreshed); held-out per-task results and traces for reviewers only.

Evaluations are finished the way workers leave them (``record``): the worker path itself is
tested in test_promotions.py and the browser test."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from coevo.audit.models import AuditEvent
from coevo.evaluations.models import (
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.reviews.models import Approval, ChannelMove, PromotionRequest, PromotionState
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.promotions.refresh import promotion_evidence_refresh
from coevo.reviews.selectors import channel_holder
from coevo.reviews.services import channel_move
from tests.conftest import PASSWORD
from tests.support.factories import GUESSES, finish_evaluation, make_agent_candidate
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


def login(user) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


def html(response) -> str:
    return response.content.decode()


def make_ready(*, requester, channel, candidate, suite, policy_version) -> PromotionRequest:
    """A request whose held-out runs finished: the candidate solves h-mul and crashes on h-sub,
    the holder solves nothing; the candidate spent more tokens and time."""
    search = evaluation_create(
        candidate=candidate, suite=suite, split="search", policy_version=policy_version
    )
    finish_evaluation(search, passed=["s-mul", "s-add"])
    request = promotion_request_create(
        channel=channel,
        candidate=candidate,
        policy_version=policy_version,
        requester=requester,
        suite=suite,
    )
    finish_evaluation(
        request.candidate_evaluation,
        passed=["h-mul"],
        outcomes={"h-sub": RolloutOutcome.HARNESS_ERROR},
    )
    if request.holder_evaluation_id:
        holder_search = evaluation_create(
            candidate=request.holder_candidate,
            suite=suite,
            split="search",
            policy_version=policy_version,
        )
        finish_evaluation(holder_search)
        finish_evaluation(request.holder_evaluation)
        Rollout.objects.filter(evaluation=request.holder_evaluation).update(
            prompt_tokens=10, completion_tokens=0, latency_ms=100
        )
    Rollout.objects.filter(evaluation=request.candidate_evaluation).update(
        prompt_tokens=30, completion_tokens=10, latency_ms=200
    )
    request = promotion_evidence_refresh(request=request)
    assert request.state == PromotionState.READY, request.state_detail
    return request


@pytest.fixture
def ready(researcher, production, asker, arith_suite, policy_version) -> PromotionRequest:
    return make_ready(
        requester=researcher,
        channel=production,
        candidate=asker,
        suite=arith_suite,
        policy_version=policy_version,
    )


def page_url(request: PromotionRequest) -> str:
    return reverse("web:promotion", args=[request.project.slug, request.id])


def action_url(request: PromotionRequest, action: str) -> str:
    return reverse("web:promotion_action", args=[request.project.slug, request.id, action])


# -- channels ---------------------------------------------------------------------------------


def test_it_shows_the_channel_history_and_offers_rollback_to_reviewers_only(
    project, owner, reviewer, researcher, production, guesser, asker, policy_version
):
    channel_move(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        moved_by=owner,
        reason="ship the asker",
    )
    url = reverse("web:channels", args=[project.slug])

    as_researcher = html(login(researcher).get(url))
    assert asker.short_sha in as_researcher and "ship the asker" in as_researcher
    assert "channels/production/0002" in as_researcher
    assert 'id="rollback-production"' not in as_researcher

    as_reviewer = html(login(reviewer).get(url))
    assert 'id="rollback-production"' in as_reviewer
    assert f"Roll back to {guesser.short_sha}" in as_reviewer


def test_it_refuses_a_rollback_posted_by_a_researcher(
    project, owner, researcher, production, asker, guesser, policy_version
):
    channel_move(channel=production, candidate=asker, policy_version=policy_version, moved_by=owner)
    url = reverse("web:channel_rollback", args=[project.slug, "production"])

    response = login(researcher).post(url, {"reason": "I want to"})

    assert response.status_code == 403
    assert channel_holder(project=project, name="production") == asker


def test_a_reviewer_rolls_a_channel_back_and_the_page_shows_it(
    project, owner, reviewer, production, asker, guesser, policy_version
):
    channel_move(channel=production, candidate=asker, policy_version=policy_version, moved_by=owner)
    client = login(reviewer)
    url = reverse("web:channel_rollback", args=[project.slug, "production"])

    # A rollback without a reason is refused: the reason goes into the history.
    response = client.post(url, {"reason": " "}, follow=True)
    assert "Say why you roll the channel back" in html(response)
    assert channel_holder(project=project, name="production") == asker

    response = client.post(url, {"reason": "asker regressed"}, follow=True)

    assert channel_holder(project=project, name="production") == guesser
    body = html(response)
    assert "Channel production rolled back." in body
    assert "rollback of move 2: asker regressed" in body
    holder = re.search(r'<dd class="holder">(.*?)</dd>', body, re.S).group(1)
    assert guesser.short_sha in holder
    assert ChannelMove.objects.filter(channel=production).count() == 3
    # Nothing is left to roll back to (the guesser was the first holder): no button, rather
    # than one offering the holder just undone.
    assert 'id="rollback-production"' not in body


def test_the_rollback_button_names_the_holder_a_rollback_restores(
    project, owner, reviewer, production, asker, guesser, policy_version, tmp_path
):
    other = make_agent_candidate(project, tmp_path, "other", GUESSES.replace('"0"', '"1"'))
    channel_move(channel=production, candidate=asker, policy_version=policy_version, moved_by=owner)
    channel_move(channel=production, candidate=other, policy_version=policy_version, moved_by=owner)
    client = login(reviewer)
    url = reverse("web:channels", args=[project.slug])
    assert f"Roll back to {asker.short_sha}" in html(client.get(url))

    client.post(reverse("web:channel_rollback", args=[project.slug, "production"]), {"reason": "x"})

    assert channel_holder(project=project, name="production") == asker
    # A second rollback walks further back (to the guesser), and the button says so.
    assert f"Roll back to {guesser.short_sha}" in html(client.get(url))


# -- the request form -------------------------------------------------------------------------


def test_the_request_form_is_for_researchers_and_above(project, viewer, researcher):
    url = reverse("web:promotion_new", args=[project.slug])
    assert login(viewer).get(url).status_code == 403
    assert login(viewer).post(url, {}).status_code == 403
    assert login(researcher).get(url).status_code == 200
    promotions = html(login(viewer).get(reverse("web:promotions", args=[project.slug])))
    assert 'id="new-promotion"' not in promotions


def test_the_request_form_shows_its_errors_inline(
    project, researcher, arith_suite, asker, production
):
    client = login(researcher)
    url = reverse("web:promotion_new", args=[project.slug])
    values = {
        "candidate": asker.sha,
        "policy_version": "",
        "channel": "production",
        "suite": str(arith_suite.id),
        "epochs": "0",
    }

    response = client.post(url, values)
    assert response.status_code == 400
    assert 'id="form-error"' in html(response) and "Epochs is a whole number" in html(response)
    # What was typed is kept.
    assert f'<option value="{asker.sha}" selected>' in html(response)

    response = client.post(url, {**values, "epochs": "1", "candidate": "ab" * 20})
    assert response.status_code == 400 and 'id="form-error"' in html(response)

    response = client.post(url, {**values, "epochs": "1", "channel": "Not A Channel"})
    assert response.status_code == 400 and "not a valid channel name" in html(response)
    assert not PromotionRequest.objects.exists()


def test_the_request_form_creates_a_request(
    project, researcher, arith_suite, asker, guesser, production, policy_version
):
    response = login(researcher).post(
        reverse("web:promotion_new", args=[project.slug]),
        {
            "candidate": asker.sha,
            "policy_version": policy_version.name,
            "channel": "production",
            "suite": str(arith_suite.id),
            "epochs": "2",
        },
    )

    request = PromotionRequest.objects.get()
    assert response.status_code == 302 and response.url == page_url(request)
    assert (request.candidate, request.holder_candidate) == (asker, guesser)
    assert request.epochs == 2 and request.requester == researcher
    assert request.candidate_evaluation.split == "heldout"
    page = html(login(researcher).get(page_url(request)))
    assert 'id="promotion-state">evaluating' in page
    assert 'hx-trigger="every 2s"' in page  # the page polls until the evidence is ready


# -- the request page -------------------------------------------------------------------------


def test_the_request_page_renders_the_evidence(ready, researcher, asker, guesser):
    body = html(login(researcher).get(page_url(ready)))

    assert 'id="promotion-state">ready' in body
    assert 'hx-trigger="every 2s"' not in body  # settled: no more polling
    scores = re.search(r'<table class="table" id="scores">(.*?)</table>', body, re.S).group(1)
    # The candidate: search 100%, held-out 1/3 with a Wilson interval; the holder: 0%.
    assert "100.0%" in scores and "33.3%" in scores and 'class="interval"' in scores
    assert re.search(
        r'33\.3% <span class="interval" title="95% Wilson interval">\[\d+\.\d%, \d+\.\d%\]',
        scores,
    )
    assert asker.sha[:12] in scores and guesser.sha[:12] in scores
    # Error counts: the candidate's harness error on h-sub.
    assert re.search(r'<td class="num">1</td><td class="num">0</td></tr>', scores)
    comparison = re.search(r'id="comparison">(.*?)</dl>', body, re.S).group(1)
    assert "+33.3 pts" in comparison and "pass rate over 3 held-out tasks" in comparison
    # The exact test decides and is named; three tasks are too few for an interval.
    assert "verdict of the exact McNemar: p = 1.0000" in comparison
    assert "too few tasks (n=3) for an interval" in comparison
    assert "pass rate difference" in comparison
    assert "1 fixed" in comparison
    gap = re.search(r'id="gap">(.*?)</dl>', body, re.S).group(1)
    assert "+100.0 pts" in gap and "+33.3 pts" in gap and "+66.7 pts" in gap
    assert "66.7% of the search gain did not carry over" in gap
    cost = re.search(r'id="cost">(.*?)</dl>', body, re.S).group(1)
    assert "40 vs 10 · Δ 30 (×4.00)" in cost
    assert "200 ms vs 100 ms · Δ 100 ms (×2.00)" in cost
    diff_link = reverse("web:candidate_diff", args=[ready.project.slug, asker.sha])
    assert f'{diff_link}?base={guesser.sha}"' in body
    assert "<code>agent.py</code>" in body
    lineage = re.search(r'<ol id="lineage">(.*?)</ol>', body, re.S).group(1)
    assert asker.sha[:12] in lineage and guesser.sha[:12] not in lineage
    assert 'id="heldout-looks">2 in this project' in body


def test_held_out_flips_and_their_traces_are_for_reviewers_only(
    ready, researcher, reviewer, viewer
):
    [flip] = ready.evidence["comparison"]["flipped_tasks"]
    trace_url = reverse(
        "web:promotion_rollout",
        args=[ready.project.slug, ready.id, flip["candidate_rollout"]],
    )

    for user in (researcher, viewer):
        client = login(user)
        body = html(client.get(page_url(ready)))
        assert 'id="flips-sealed"' in body and 'id="heldout-tasks"' not in body
        assert "h-mul" not in body and "h-add" not in body
        assert client.get(trace_url).status_code == 403

    client = login(reviewer)
    body = html(client.get(page_url(ready)))
    flips = re.search(r'<table class="table" id="heldout-tasks">(.*?)</table>', body, re.S)
    flips = flips.group(1)
    # Every held-out task is listed, the flipped one highlighted, each with its traces.
    assert all(key in flips for key in ("h-mul", "h-add", "h-sub"))
    assert '<tr class="flipped flip-fixed"><td>h-mul</td>' in flips
    assert flips.count('class="task-trace"') == 6
    assert trace_url in flips
    holder_trace = reverse(
        "web:promotion_rollout", args=[ready.project.slug, ready.id, flip["reference_rollout"]]
    )
    assert holder_trace in flips
    # The reviewer's rollout path unseals the held-out trace (the model saw "6 * 7 =").
    TraceStep.objects.create(
        rollout_id=flip["candidate_rollout"],
        attempt=1,
        index=0,
        kind="model_call",
        payload={"api": "completions", "prompt": "6 * 7 =", "completion": " 42"},
    )
    response = client.get(trace_url)
    assert response.status_code == 200
    assert "6 * 7 =" in html(response)
    assert 'id="sealed"' not in html(response)
    # The ordinary rollout page keeps it sealed, even for the reviewer.
    sealed = client.get(
        reverse("web:rollout", args=[ready.project.slug, flip["candidate_rollout"]])
    )
    assert "6 * 7 =" not in html(sealed)


def test_the_requester_cannot_approve_even_by_crafting_the_post(
    project, reviewer, second_reviewer, production, asker, arith_suite, policy_version
):
    # A reviewer may request a promotion; then another reviewer has to decide it.
    request = make_ready(
        requester=reviewer,
        channel=production,
        candidate=asker,
        suite=arith_suite,
        policy_version=policy_version,
    )
    client = login(reviewer)
    body = html(client.get(page_url(request)))
    assert 'id="cannot-decide"' in body and "You requested this promotion" in body
    assert 'id="approve"' not in body

    response = client.post(action_url(request, "approve"), {"comment": "lgtm"}, follow=True)

    assert "another reviewer must approve or reject it" in html(response)
    assert not Approval.objects.exists()
    request.refresh_from_db()
    assert request.state == PromotionState.READY
    assert channel_holder(project=project, name="production") != asker


def test_a_researcher_cannot_decide_and_the_page_says_why(ready, researcher):
    client = login(researcher)
    body = html(client.get(page_url(ready)))
    assert 'id="cannot-decide"' in body and "You requested this promotion" in body
    assert client.post(action_url(ready, "approve")).status_code == 403
    assert client.post(action_url(ready, "reject")).status_code == 403
    assert not Approval.objects.exists()


def test_another_reviewer_approves_and_the_channel_moves(project, ready, reviewer, asker):
    client = login(reviewer)
    body = html(client.get(page_url(ready)))
    assert 'id="approve"' in body and 'id="approve" formaction' in body
    assert re.search(r'id="approve"[^>]*disabled', body) is None

    response = client.post(action_url(ready, "approve"), {"comment": "real gain"}, follow=True)

    body = html(response)
    assert "Approved." in body
    assert 'id="promotion-state">approved' in body
    assert "real gain" in body and "<strong>reviewer</strong>" in body
    assert 'id="decision-form"' not in body  # final: no more decisions
    # The channel moved: said as the success it is, not in the error box.
    detail = re.search(r'<p class="alert ([a-z ]*)" id="promotion-detail">([^<]*)', body)
    assert detail and detail.group(1) == "success" and "production moved" in detail.group(2)
    assert channel_holder(project=project, name="production") == asker
    channels = html(client.get(reverse("web:channels", args=[project.slug])))
    assert f"promotion {ready.id}" in channels


def test_a_reviewer_rejects_with_a_reason(project, ready, reviewer, guesser):
    response = login(reviewer).post(
        action_url(ready, "reject"), {"comment": "the gain did not generalize"}, follow=True
    )
    ready.refresh_from_db()
    assert ready.state == PromotionState.REJECTED
    assert "the gain did not generalize" in html(response)
    if ready.state_detail:
        assert '<p class="alert error" id="promotion-detail">' in html(response)
    assert channel_holder(project=project, name="production") == guesser


def test_comments_are_for_researchers_and_shown_on_the_page(ready, researcher, viewer):
    response = login(researcher).post(
        action_url(ready, "comment"), {"comment": "see the h-sub crash"}, follow=True
    )
    assert "Comment added." in html(response) and "see the h-sub crash" in html(response)
    assert login(viewer).post(action_url(ready, "comment"), {"comment": "x"}).status_code == 403
    response = login(researcher).post(action_url(ready, "comment"), {"comment": " "}, follow=True)
    assert "the comment is empty" in html(response)


def test_stale_evidence_blocks_approval_until_it_is_refreshed(
    project, owner, ready, reviewer, researcher, tmp_path, policy_version
):
    other = make_agent_candidate(project, tmp_path, "other", GUESSES.replace('"0"', '"1"'))
    channel_move(
        channel=ready.channel, candidate=other, policy_version=policy_version, moved_by=owner
    )
    client = login(reviewer)
    body = html(client.get(page_url(ready)))
    assert 'id="stale"' in body and "approval is blocked until it is refreshed" in body
    assert re.search(r'id="approve"[^>]*disabled', body)

    # A crafted approval is refused too.
    response = client.post(action_url(ready, "approve"), follow=True)
    assert "refresh the evidence" in html(response)
    assert not Approval.objects.exists()

    response = login(researcher).post(action_url(ready, "refresh"), follow=True)

    assert "Evidence refreshed" in html(response)
    ready.refresh_from_db()
    assert ready.state == PromotionState.EVALUATING
    assert ready.holder_candidate == other
    # The audit log names who re-targeted it.
    retargeted = AuditEvent.objects.get(action="promotion.retargeted")
    assert retargeted.actor == researcher
    assert 'id="stale"' not in html(response)
    assert 'id="promotion-state">evaluating' in html(response)


def test_the_poll_that_brings_ready_evidence_also_enables_the_review_forms(ready, reviewer):
    response = login(reviewer).get(page_url(ready), HTTP_HX_REQUEST="true")
    body = html(response)
    assert body.lstrip().startswith('<section id="evidence"')
    assert "<html" not in body
    assert "HX-Request" in response["Vary"]
    # Settled: the review section comes along out of band, its approve button enabled.
    assert '<section class="card" id="review" hx-swap-oob="true">' in body
    assert 'id="approve"' in body and re.search(r'id="approve"[^>]*disabled', body) is None


def test_polls_while_evaluating_leave_the_review_section_alone(
    project, researcher, reviewer, production, asker, arith_suite, policy_version
):
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    body = html(login(reviewer).get(page_url(request), HTTP_HX_REQUEST="true"))
    assert 'hx-trigger="every 2s"' in body
    assert 'id="review"' not in body
    page = html(login(reviewer).get(page_url(request)))
    assert re.search(r'id="approve"[^>]*disabled', page)
    assert "Approval opens once the evidence is ready." in page


def test_an_outsider_sees_no_promotion_page(ready, outsider):
    client = login(outsider)
    assert client.get(page_url(ready)).status_code == 404
    assert client.get(reverse("web:channels", args=[ready.project.slug])).status_code == 404

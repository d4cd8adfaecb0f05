"""What a new user tripped over on the pages (issue 38, item 5), in a real headless Chromium
against a live server: a channel move's promotion is a link, a passing HumanEval rollout's
verifier output reads as words, the trace search box shows its whole placeholder, the
campaigns page's two buttons stand apart, and the demo project says what it covers."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import Page, expect  # noqa: E402

from coevo.demo.users import demo_project  # noqa: E402
from coevo.evaluations.models import EvaluationState  # noqa: E402
from coevo.reviews.models import PromotionRequest, PromotionState  # noqa: E402
from coevo.reviews.services import channel_get_or_create, channel_move  # noqa: E402
from coevo.suites.humaneval import humaneval_problems  # noqa: E402
from coevo.suites.models import Split, Task  # noqa: E402
from tests.conftest import PASSWORD  # noqa: E402
from tests.support.browser import log_in  # noqa: E402
from tests.support.factories import make_evaluation, make_rollout  # noqa: E402
from tests.web.conftest import start_step  # noqa: E402
from workers.environments import humaneval  # noqa: E402
from workers.outcomes import RolloutOutcome  # noqa: E402

pytestmark = [pytest.mark.browser]


def _box(page: Page, selector: str) -> dict[str, float]:
    box = page.locator(selector).bounding_box()
    assert box, selector
    return box


def test_a_channel_move_links_to_the_promotion_that_made_it(
    transactional_db,
    live_server,
    page,
    owner,
    project,
    seed_candidate,
    child_candidate,
    humaneval_suite,
    policy_version,
):
    channel = channel_get_or_create(project=project, name="production")
    channel_move(channel=channel, candidate=seed_candidate, policy_version=None, moved_by=owner)
    channel.refresh_from_db()
    request_id = PromotionRequest._meta.get_field("id").default()
    move = channel_move(
        channel=channel,
        candidate=child_candidate,
        policy_version=policy_version,
        moved_by=owner,
        reason=f"promotion {request_id}",
    )
    PromotionRequest.objects.create(
        id=request_id,
        project=project,
        channel=channel,
        candidate=child_candidate,
        policy_version=policy_version,
        suite=humaneval_suite,
        requester=owner,
        state=PromotionState.APPROVED,
        holder_generation=1,
        holder_candidate=seed_candidate,
        holder_evaluation=make_evaluation(
            candidate=seed_candidate,
            suite=humaneval_suite,
            policy_version=policy_version,
            split=Split.HELDOUT,
        ),
        candidate_evaluation=make_evaluation(
            candidate=child_candidate,
            suite=humaneval_suite,
            policy_version=policy_version,
            split=Split.HELDOUT,
        ),
        channel_move=move,
    )
    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(f"{live_server.url}/p/{project.slug}/channels/")

    history = page.locator("#channel-production table.history")
    expect(history.locator("a.move-promotion")).to_have_count(1)  # the first move had none
    history.get_by_role("link", name=f"promotion {request_id}").click()
    expect(page).to_have_url(re.compile(rf"/p/{project.slug}/promotions/{request_id}/$"))
    expect(page.locator("h1")).to_contain_text("production")


def test_a_passing_humaneval_rollout_says_what_its_verifier_output_means(
    transactional_db,
    live_server,
    page,
    owner,
    project,
    seed_candidate,
    humaneval_suite,
    policy_version,
):
    task = Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).order_by("position")[0]
    [problem] = [p for p in humaneval_problems()[0] if p.task_id == task.key]
    verdict = humaneval.verify(
        inputs=task.inputs, verifier=task.verifier, answer=problem.canonical_solution
    )
    assert verdict.passed, verdict.detail
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.FINISHED,
    )
    steps = [
        start_step(task),
        ("answer", {"answer": problem.canonical_solution}, {}),
        ("verdict", dataclasses.asdict(verdict), {}),
    ]
    rollout = make_rollout(evaluation, task, outcome=RolloutOutcome.PASSED, score=1.0, steps=steps)
    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(f"{live_server.url}/p/{project.slug}/r/{rollout.id}/")

    output = page.locator("pre.output")
    expect(output).to_have_text(humaneval.PASSED_LINE)
    assert not re.search(r"\b[0-9a-f]{32}\b", output.inner_text())


def test_the_trace_search_box_shows_its_whole_placeholder(
    transactional_db,
    live_server,
    page,
    owner,
    project,
    seed_candidate,
    humaneval_suite,
    policy_version,
):
    task = Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).first()
    evaluation = make_evaluation(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, score=1.0, steps=[start_step(task)]
    )
    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(f"{live_server.url}/p/{project.slug}/r/{rollout.id}/")

    box = page.locator(".trace-search input[type=search]")
    expect(box).to_have_attribute("placeholder", re.compile("any text$"))
    # The placeholder's width in the box's own font, against the room inside its padding.
    text_px, room_px = box.evaluate(
        """input => {
            const style = getComputedStyle(input);
            const context = document.createElement("canvas").getContext("2d");
            context.font = style.font;
            const room = input.clientWidth - parseFloat(style.paddingLeft)
                - parseFloat(style.paddingRight);
            return [context.measureText(input.placeholder).width, room];
        }"""
    )
    assert text_px <= room_px, (text_px, room_px)


def test_the_campaigns_page_buttons_stand_apart(
    transactional_db, live_server, page, owner, project
):
    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(f"{live_server.url}/p/{project.slug}/campaigns/")

    training, start = _box(page, "#training-runs-link"), _box(page, "#new-campaign")
    assert start["x"] - (training["x"] + training["width"]) >= 6, (training, start)
    for selector in ("#training-runs-link", "#new-campaign"):
        padding, border = page.locator(selector).evaluate(
            "link => [getComputedStyle(link).paddingLeft, getComputedStyle(link).borderLeftWidth]"
        )
        assert padding != "0px" and border != "0px", (selector, padding, border)


def test_the_demo_project_says_every_kind_of_task_it_covers(
    transactional_db, live_server, page, owner, project
):
    demo_project()  # the project fixture is the demo's slug, made without a description
    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(f"{live_server.url}/p/{project.slug}/")

    description = page.locator("header.page-head p.muted")
    for words in ("HumanEval", "TextWorld", "workspace tasks"):
        expect(description).to_contain_text(words)

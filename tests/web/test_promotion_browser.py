"""A promotion in a real headless Chromium (Debian's, driven by playwright) against a live
server with a real Celery worker and the scripted policy: a researcher requests a promotion,
watches its held-out runs finish, logs out; a reviewer logs in, inspects the evidence and
approves; ``production`` changes on the channels page.

Screenshots of every step go to ``var/test-artifacts/screenshots/`` (CI keeps the folder as an
artifact; README.md names it)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the test makes while
# it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import Page, expect  # noqa: E402

from coevo.reviews.models import PromotionRequest, PromotionState  # noqa: E402
from coevo.reviews.selectors import channel_holder  # noqa: E402
from coevo.reviews.services import channel_get_or_create, channel_move  # noqa: E402
from tests.conftest import PASSWORD, REPO_ROOT  # noqa: E402
from tests.reviews.conftest import TASKS  # noqa: E402
from tests.support.factories import (  # noqa: E402
    ASKS_THE_MODEL,
    GUESSES,
    jsonl_rows,
    make_agent_candidate,
    make_jsonl_suite,
)

SCREENSHOTS = REPO_ROOT / "var" / "test-artifacts" / "screenshots"

pytestmark = [pytest.mark.browser]


@pytest.fixture
def screenshot(page: Page):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    taken: list[Path] = []

    def take(name: str) -> None:
        path = SCREENSHOTS / f"promotion-{len(taken) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        taken.append(path)

    return take


def log_in(page: Page, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Projects")


def test_a_researcher_requests_and_a_reviewer_approves_a_promotion(
    transactional_db,
    live_server,
    celery_worker_thread,
    page,
    screenshot,
    project,
    owner,
    reviewer,
    researcher,
    policy_version,
    scripted_policy,
    tmp_path,
):
    suite = make_jsonl_suite(project, jsonl_rows(TASKS), name="arith", scorer="numeric")
    guesser = make_agent_candidate(project, tmp_path, "guesser", GUESSES)
    asker = make_agent_candidate(project, tmp_path, "asker", ASKS_THE_MODEL, parent=guesser)
    channel_move(
        channel=channel_get_or_create(project=project, name="production"),
        candidate=guesser,
        policy_version=policy_version,
        moved_by=owner,
    )
    scripted_policy.rules.extend((question, f" {answer}") for _, question, answer, _ in TASKS)
    base = live_server.url

    # The researcher requests the promotion through the form.
    log_in(page, base, "researcher")
    page.goto(f"{base}/p/{project.slug}/promotions/")
    page.locator("#new-promotion").click()
    expect(page.locator("h1")).to_have_text("Request a promotion")
    page.select_option("#candidate", asker.sha)
    page.select_option("#suite", str(suite.id))
    expect(page.locator("#channel")).to_have_value("production")
    screenshot("request-form")
    page.locator("#request-promotion").click()
    expect(page.locator("h1")).to_contain_text(f"Promote {asker.short_sha} to production")
    request = PromotionRequest.objects.get()
    screenshot("evaluating")

    # The page polls until the held-out runs are done and the evidence is in.
    expect(page.locator("#promotion-state")).to_have_text("ready", timeout=90_000)
    expect(page.locator("#scores")).to_contain_text("100.0%")
    expect(page.locator("#flips-sealed")).to_be_visible()  # per-task results: reviewers only
    page.reload()
    expect(page.locator("#cannot-decide")).to_contain_text("You requested this promotion")
    screenshot("ready-as-requester")
    page.get_by_role("button", name="log out").click()

    # The reviewer inspects the evidence: scores, the held-out flips with their traces, the gap,
    # the cost and the diff.
    log_in(page, base, "reviewer")
    page.goto(f"{base}/p/{project.slug}/promotions/")
    page.get_by_role("link", name=str(request.id)[:8]).click()
    expect(page.locator("#promotion-state")).to_have_text("ready")
    expect(page.locator("#scores")).to_contain_text(asker.short_sha)
    expect(page.locator("#comparison")).to_contain_text("+100.0 pts")
    expect(page.locator("#heldout-tasks tbody tr.flipped")).to_have_count(3)
    expect(page.locator("#gap")).to_be_visible()
    expect(page.locator("#cost")).to_be_visible()
    expect(page.locator("#diff-files")).to_contain_text("agent.py")
    expect(page.locator("#heldout-looks")).to_contain_text("2 in this project")
    screenshot("evidence-as-reviewer")
    page.locator("#heldout-tasks a.task-trace").first.click()  # the candidate's
    expect(page.locator("h1")).to_contain_text("h-")
    expect(page.locator(".step-model_call").first).to_be_visible()
    screenshot("heldout-trace-as-reviewer")
    page.go_back()

    page.fill("#decision-comment", "All three held-out tasks fixed.")
    page.locator("#approve").click()
    expect(page.locator("#promotion-state")).to_have_text("approved")
    expect(page.locator("#approvals")).to_contain_text("reviewer")
    screenshot("approved")

    # production changed.
    page.locator("#promotion-meta").get_by_role("link", name="production").click()
    holder = page.locator("#channel-production dd.holder")
    expect(holder).to_contain_text(asker.short_sha)
    expect(page.locator("#channel-production table.history tbody tr").first).to_contain_text(
        f"promotion {request.id}"
    )
    expect(page.locator("#rollback-production")).to_have_text(
        re.compile(f"Roll back to {guesser.short_sha}")
    )
    screenshot("channels-after")
    assert channel_holder(project=project, name="production") == asker
    request.refresh_from_db()
    assert request.state == PromotionState.APPROVED
    assert len(list(SCREENSHOTS.glob("promotion-*.png"))) >= 7

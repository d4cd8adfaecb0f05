"""The comparison page in a real headless Chromium (issue 38): the verdict is the exact test's,
named beside it, and a two-task comparison shows no interval, only why."""

from __future__ import annotations

import os

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from tests.conftest import PASSWORD  # noqa: E402
from tests.web.test_comparison_page import comparison_url, two_task_pair  # noqa: E402

pytestmark = [pytest.mark.browser]


def test_it_shows_the_verdict_with_its_test_and_no_interval_on_two_tasks(
    transactional_db,
    live_server,
    page,
    owner,
    project,
    seed_candidate,
    humaneval_suite,
    policy_version,
):
    reference, candidate = two_task_pair(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(live_server.url + comparison_url(project, reference, candidate))
    summary = page.locator("#comparison-summary")
    expect(summary.locator("#comparison-verdict")).to_have_text("no significant difference")
    expect(summary).to_contain_text("verdict of the exact sign test: p = 0.5000")
    expect(summary.locator("#comparison-difference")).to_have_text("+62.5 pts")
    expect(summary).to_contain_text("mean per-task score difference")
    expect(summary.locator("#comparison-interval")).to_have_text(
        "too few tasks (n=2) for an interval"
    )
    expect(summary.locator("#comparison-score")).to_contain_text("mean per-task score")

"""The promotion request's evidence in a real headless Chromium (issue 38): the held-out
comparison's verdict is the exact test's, named beside it; three tasks show no interval, only
why; the score every figure is of is named."""

from __future__ import annotations

import os

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from tests.conftest import PASSWORD  # noqa: E402
from tests.reviews.test_promotion_pages import make_ready, page_url  # noqa: E402

pytestmark = [pytest.mark.browser]


def test_the_evidence_shows_one_verdict_and_names_its_score(
    transactional_db,
    live_server,
    page,
    reviewer,
    researcher,
    production,
    asker,
    arith_suite,
    policy_version,
):
    request = make_ready(
        requester=researcher,
        channel=production,
        candidate=asker,
        suite=arith_suite,
        policy_version=policy_version,
    )
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", reviewer.get_username())
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(live_server.url + page_url(request))

    comparison = page.locator("#comparison")
    expect(comparison.locator("#comparison-verdict")).to_have_text("no significant difference")
    expect(comparison).to_contain_text("verdict of the exact McNemar: p = 1.0000")
    expect(comparison.locator("#comparison-difference")).to_have_text("+33.3 pts")
    expect(comparison).to_contain_text("pass rate difference")
    expect(comparison.locator("#comparison-interval")).to_have_text(
        "too few tasks (n=3) for an interval"
    )
    expect(comparison.locator(".interval")).to_have_count(0)
    expect(comparison.locator("#comparison-score")).to_contain_text("pass rate")
    expect(page.locator("#scores-note")).to_contain_text("mean per-task score")
    expect(page.locator("#scores .interval").first).to_have_attribute(
        "title", "95% Wilson interval"
    )
    expect(page.locator("#gap-score")).to_contain_text("mean per-task score")

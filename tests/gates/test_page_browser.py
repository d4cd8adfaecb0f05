"""The gate page in a real headless Chromium (issue 38): the verdict is the rules', each figure
says which rule is judged on it, the exact test is labelled as not this gate's verdict, and a
paired interval over two tasks is replaced by why none is shown."""

from __future__ import annotations

import os

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from tests.conftest import PASSWORD  # noqa: E402
from tests.gates.test_page import two_task_gate, url  # noqa: E402

pytestmark = [pytest.mark.browser]


def test_it_shows_the_rules_verdict_and_labels_every_statistic(
    transactional_db, live_server, page, owner, make_gate, humaneval_suite
):
    gate = two_task_gate(make_gate, humaneval_suite)
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(live_server.url + url(gate))

    expect(page.locator("#gate-verdict")).to_have_text("inconclusive")
    expect(page.locator("#gate-reasons")).to_contain_text(
        "too few tasks for the interval this rule is judged on"
    )
    expect(page.locator("#gate-score")).to_have_text("pass rate")
    delta = page.locator("#gate-delta")
    expect(delta).to_contain_text("pass rate difference +100.0 pts")
    expect(page.locator("#gate-delta-interval")).to_have_text("too few tasks (n=2) for an interval")
    expect(delta).to_contain_text("max_regression is judged on its interval")
    expect(delta.locator(".interval")).to_have_count(0)
    expect(page.locator("#gate-test")).to_have_text(
        "no significant difference (p = 0.5000) · the comparison page's verdict; "
        "no rule of this gate uses it"
    )
    expect(page.locator("#gate-candidate")).to_contain_text("95% Wilson interval")

"""The program trace's overview in a real headless Chromium against a live server."""

from __future__ import annotations

import os
import re

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from coevo.evaluations.models import EvaluationState  # noqa: E402
from coevo.suites.models import Split, Task  # noqa: E402
from tests.conftest import PASSWORD  # noqa: E402
from tests.support.factories import make_evaluation, make_rollout  # noqa: E402
from tests.web.test_trace_program import program_steps, url  # noqa: E402
from workers.outcomes import RolloutOutcome  # noqa: E402

pytestmark = [pytest.mark.browser]


def test_it_follows_the_overview_to_a_call_and_back_to_its_parent(
    transactional_db,
    live_server,
    page,
    owner,
    project,
    seed_candidate,
    humaneval_suite,
    policy_version,
):
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    task = Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).first()
    program = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=program_steps(task)
    )
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(live_server.url + url(project, program))
    overview = page.locator("#call-overview")
    expect(overview).to_be_visible()
    overview.get_by_role("link", name="#4", exact=True).click()
    expect(page).to_have_url(re.compile(r"#step-1-5$"))
    step = page.locator("#step-1-5")
    expect(step).to_be_in_viewport()
    place = step.locator(".call-place")
    expect(place).to_have_text(re.compile(r"call #4 · session 1 · branches from #0"))
    place.get_by_role("link", name="#0").click()
    expect(page).to_have_url(re.compile(r"#step-1-1$"))
    expect(page.locator("#step-1-1")).to_be_in_viewport()
    # Opened, a call shows the tool call it got back and, next, the tool's result.
    page.locator("#step-1-1 details.model-call > summary").click()
    expect(page.locator("#step-1-1 .tool-call").first).to_contain_text("calls add")
    page.locator("#step-1-2 details.model-call > summary").click()
    expect(page.locator("#step-1-2")).to_contain_text("tool result for add (call_1_0)")
    page.screenshot(path="/tmp/coevo-trace-program.png", full_page=True)

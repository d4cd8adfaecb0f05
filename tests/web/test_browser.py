"""The dashboard in a real headless Chromium (Debian's, driven by playwright) against a live
server: log in, browse a candidate, watch an evaluation finish by polling, read a trace."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the test makes while
# it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from coevo.evaluations.models import EvaluationState  # noqa: E402
from tests.conftest import PASSWORD  # noqa: E402
from tests.web.conftest import (  # noqa: E402
    CHILD_MARKER,
    COMPLETION,
    finish_rollout,
    make_mixed_evaluation,
)

SCREENSHOT = Path("/tmp/coevo-eval.png")

pytestmark = [
    pytest.mark.browser,
]


def test_it_walks_from_login_to_a_model_call_and_watches_an_evaluation_finish(
    transactional_db,
    live_server,
    page,
    owner,
    project,
    seed_candidate,
    clamped_child,
    humaneval_suite,
    policy_version,
):
    data = make_mixed_evaluation(
        project=project,
        candidate=clamped_child,
        suite=humaneval_suite,
        policy_version=policy_version,
        running=True,
    )

    # Log in through the form; the login page sends us back where we started.
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Projects")
    assert page.evaluate("typeof htmx") == "object", "vendored htmx did not load"

    # Project → candidate.
    page.get_by_role("link", name="Demo agent").click()
    expect(page.locator("h1")).to_have_text("Demo agent")
    page.locator(f"#candidates a[href$='/c/{clamped_child.sha}/']").first.click()
    expect(page.locator("code.full-sha")).to_have_text(clamped_child.sha)

    # A file, highlighted.
    page.get_by_role("link", name="agent.py", exact=True).click()
    expect(page.locator("h1.path")).to_have_text("agent.py")
    expect(page.locator(".highlight .k").first).to_be_visible()
    expect(page.locator(".highlight")).to_contain_text("def run(task, ctx):")
    page.go_back()

    # The diff against the parent.
    page.get_by_role("link", name=f"diff against parent {seed_candidate.short_sha}").click()
    expect(page.locator(".diff .gi").filter(has_text=CHILD_MARKER)).to_be_visible()
    expect(page.locator(".diff .gd").first).to_be_visible()
    page.go_back()

    # The running evaluation polls its progress every 2 s.
    polls: list[float] = []
    page.on(
        "request",
        lambda request: (
            polls.append(time.monotonic())
            if request.headers.get("hx-request") and "/e/" in request.url
            else None
        ),
    )
    page.locator("table.evaluations a[href*='/e/']").first.click()
    expect(page.locator("#evaluation-state")).to_have_text("running")
    expect(page.locator(".bar-label")).to_contain_text("4/6")
    expect(page.locator("#evaluation-score")).to_contain_text("25.0% [4.6%, 69.9%] over 4 tasks")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    with page.expect_request(lambda request: bool(request.headers.get("hx-request"))):
        pass
    assert polls, "the running evaluation did not poll"

    # Finish it behind the page's back; the page catches up by itself, without a reload.
    page.evaluate("window.__not_reloaded = true")
    for rollout in data.unfinished:
        finish_rollout(rollout)
    data.evaluation.state = EvaluationState.FINISHED
    data.evaluation.save(update_fields=["state"])
    expect(page.locator("#evaluation-state")).to_have_text("finished", timeout=6_000)
    expect(page.locator(".bar-label")).to_contain_text("6/6")
    expect(page.locator("#evaluation-score")).to_contain_text("50.0% [18.8%, 81.2%] over 6 tasks")
    assert page.evaluate("window.__not_reloaded") is True

    # ... and then stops polling.
    assert page.locator("#evaluation-progress[hx-trigger]").count() == 0
    settled = len(polls)
    page.wait_for_timeout(4_500)
    assert len(polls) == settled, "polling went on after the evaluation finished"

    # A rollout: the model call's prompt and completion.
    task = data.passed.task
    page.get_by_role("link", name=task.key, exact=True).click()
    expect(page.locator("h1")).to_contain_text(task.key)
    model_call = page.locator(".step-model_call")
    first_line = next(line for line in task.inputs["prompt"].splitlines() if line.strip())
    expect(model_call.locator("pre.prompt")).to_contain_text(first_line.strip())
    expect(model_call.locator("pre.completion")).to_contain_text(COMPLETION.strip())
    expect(model_call).to_contain_text("120 prompt tokens")

"""A workspace rollout's page in a real headless Chromium against a live server: the Workspace
section above the trace, with the final diff and the hidden tests' output. Its screenshot goes
to ``var/test-artifacts/screenshots/workspace-rollout.png``."""

from __future__ import annotations

import os

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from coevo.evaluations.models import EvaluationState  # noqa: E402
from coevo.suites.models import Split, Task  # noqa: E402
from tests.conftest import PASSWORD, REPO_ROOT  # noqa: E402
from tests.support.factories import make_evaluation, make_rollout  # noqa: E402
from tests.web.test_workspace_trace import url, workspace_steps  # noqa: E402
from workers.outcomes import RolloutOutcome  # noqa: E402

SCREENSHOT = REPO_ROOT / "var" / "test-artifacts" / "screenshots" / "workspace-rollout.png"

pytestmark = [pytest.mark.browser]


def test_it_shows_the_workspace_diff_and_test_output_above_the_trace(
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
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, score=1.0, steps=workspace_steps(task)
    )
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(live_server.url + url(project, rollout))
    section = page.locator("#workspace")
    expect(section).to_be_visible()
    expect(section.get_by_role("heading", name="Workspace")).to_be_visible()
    expect(section).to_contain_text("3 files changed: 1 added, 1 modified, 1 deleted")
    expect(section.locator(".diff .gi", has_text="NEW-LINE-MARKER")).to_be_visible()
    expect(section.locator(".diff .gd", has_text="OLD-LINE-MARKER")).to_be_visible()
    expect(section.locator("#workspace-test-output")).to_be_visible()
    expect(section.locator("#workspace-test-output")).to_contain_text("TEST-OUTPUT-MARKER")
    # Above the steps, where a reviewer sees it without paging through the trace.
    section_box, steps_box = section.bounding_box(), page.locator("#trace-steps").bounding_box()
    assert section_box and steps_box and section_box["y"] < steps_box["y"]
    # In the trace, a command's long output opens on demand.
    output = page.locator("#step-1-4 details.exec-output")
    expect(output.locator("pre")).to_be_hidden()
    output.locator("summary").click()
    expect(output.locator("pre")).to_contain_text("line-30")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)

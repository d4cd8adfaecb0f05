"""The training run page in a real headless Chromium against a live server: the log streams
in while the trainer runs (htmx polling), the produced policy version shows when it ends, and
polling stops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the test makes while
# it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from tests.conftest import PASSWORD  # noqa: E402
from tests.training.support import execute_in_thread, make_run, make_trainer  # noqa: E402

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts" / "screenshots"

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_run_page_streams_the_log_and_shows_the_new_policy_version(
    live_server,
    page,
    owner,
    project,
    export,
    base_policy,  # noqa: F811
):
    trainer = make_trainer("--epochs", "3", "--sleep", "1.5")
    run = make_run(project, owner, export, base_policy, trainer)
    page.goto(f"{live_server.url}/p/{project.slug}/training/{run.id}/")
    page.fill("#id_username", owner.username)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#training-state")).to_have_text("pending")

    thread, result = execute_in_thread(run.id)
    # The page was loaded before the trainer printed anything: each line arrives by polling.
    expect(page.locator("#training-state")).to_have_text("running", timeout=15_000)
    expect(page.locator("#training-log")).to_contain_text("epoch 1/3", timeout=15_000)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "training-run-live.png"), full_page=True)

    expect(page.locator("#training-state")).to_have_text("succeeded", timeout=30_000)
    thread.join(timeout=30)
    assert not isinstance(result[0], BaseException), result[0]
    expect(page.locator("#training-log")).to_contain_text("saved adapter")
    expect(page.locator("#training-produced")).to_contain_text(f"base-tiny-lora-{run.id.hex[:8]}")
    expect(page.locator("#training-exit-code")).to_have_text("0")
    # Final: the live part no longer polls.
    assert page.locator("#training-live[hx-trigger]").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "training-run-done.png"), full_page=True)

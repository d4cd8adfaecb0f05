"""The campaign page in a real headless Chromium against a live server: the SVG plots show,
the live part polls while the campaign runs and stops when it ends, and a lineage node opens
its candidate's page."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the test makes while
# it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from coevo.campaigns.models import Campaign, CampaignState  # noqa: E402
from tests.campaigns.test_pages import add_cheaper_tie, make_campaign_data  # noqa: E402
from tests.conftest import PASSWORD  # noqa: E402

SCREENSHOT = Path("/tmp/coevo-campaign.png")

pytestmark = [pytest.mark.browser]


def test_it_shows_the_plots_and_opens_a_candidate_from_the_lineage(
    transactional_db, live_server, page, owner, project, tmp_path, policy_version
):
    data = make_campaign_data(project, tmp_path, policy_version)
    url = f"{live_server.url}/p/demo/campaigns/{data.campaign.id}/"

    page.goto(url)
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("h1")).to_have_text("Campaign paged")

    for plot in ("#plot-scores", "#plot-pareto", "#plot-lineage"):
        expect(page.locator(plot)).to_be_visible()
    box = page.locator("#plot-scores").bounding_box()
    assert box and box["width"] > 300 and box["height"] > 150, box
    expect(page.locator("#plot-pareto circle.front")).to_have_count(2)
    expect(page.locator("#proposal-2")).to_contain_text("✗ imports")
    page.screenshot(path=str(SCREENSHOT), full_page=True)

    # While running, the live part (plots included) is swapped in by polling ...
    with page.expect_response(lambda r: bool(r.request.headers.get("hx-request"))):
        pass
    expect(page.locator("#plot-lineage g.node")).to_have_count(4)
    # ... and once the campaign ends, the next poll renders it final and polling stops.
    Campaign.objects.filter(id=data.campaign.id).update(state=CampaignState.FINISHED)
    expect(page.locator("#campaign-state")).to_have_text("finished", timeout=8_000)
    assert page.locator("#campaign-live[hx-trigger]").count() == 0

    # The merge node sits below both parents; clicking it opens the candidate page.
    merge = page.locator(f"#plot-lineage a[href$='/c/{data.merge.sha}/']")
    parent = page.locator(f"#plot-lineage a[href$='/c/{data.knob_child.sha}/']")
    assert merge.bounding_box()["y"] > parent.bounding_box()["y"]
    merge.click()
    expect(page).to_have_url(re.compile(rf"/p/demo/c/{data.merge.sha}/$"))
    expect(page.locator("code.full-sha")).to_have_text(data.merge.sha)


def test_the_front_table_shows_the_chosen_best_with_why_it_is_off_the_front(
    transactional_db, live_server, page, owner, project, tmp_path, policy_version
):
    data = make_campaign_data(project, tmp_path, policy_version)
    add_cheaper_tie(data)
    page.goto(f"{live_server.url}/p/demo/campaigns/{data.campaign.id}/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()

    front = page.locator("#campaign-front")
    expect(front.locator("tbody tr")).to_have_count(3)
    best = front.locator("tr.front-best")
    expect(best).to_have_count(1)
    expect(best).to_contain_text(data.knob_child.short_sha)
    expect(best).to_contain_text("chosen best")
    expect(best.locator(".front-note")).to_contain_text(
        "#5 (20.0 tokens/task) tied its validation score later with fewer tokens; the campaign "
        "keeps the first candidate to reach its best validation score"
    )
    expect(page.locator("#campaign-best")).to_contain_text(data.knob_child.short_sha)

"""The API docs page in a real headless Chromium: Swagger UI loads the schema from this server
and shows one section per resource, each with its description."""

from __future__ import annotations

import os

import pytest

# playwright's sync API runs an event loop in this thread.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from django.conf import settings  # noqa: E402
from playwright.sync_api import expect  # noqa: E402

pytestmark = [pytest.mark.browser]


def test_the_docs_page_shows_a_described_section_per_resource(transactional_db, live_server, page):
    page.goto(f"{live_server.url}/api/v1/docs/")

    sections = page.locator(".opblock-tag-section")
    tags = settings.SPECTACULAR_SETTINGS["TAGS"]
    expect(sections).to_have_count(len(tags), timeout=20_000)
    for tag in tags:
        heading = page.locator(f'.opblock-tag[data-tag="{tag["name"]}"]')
        expect(heading).to_be_visible()
        # Markdown: `production` shows as code, without its backticks.
        expect(heading).to_contain_text(tag["description"].replace("`", "")[:60])

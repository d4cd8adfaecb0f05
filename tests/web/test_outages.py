"""Dashboard pages while a dependency is down: a small 503 page with Retry-After that names the
dependency (never a traceback, never an address), and pages again once it is back. Outages
are real: PostgreSQL and Redis on ports nothing listens on."""

from __future__ import annotations

import logging

import pytest

from coevo.outages import RETRY_AFTER_S
from tests.conftest import PASSWORD
from tests.support.outages import cache_down, database_down


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    from coevo import outages

    monkeypatch.setattr(outages, "_warnings", outages._Warnings())


def assert_outage_page(response, words: str) -> str:
    assert response.status_code == 503, response.content[:300]
    assert response["Retry-After"] == str(RETRY_AFTER_S)
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert words in page
    for leak in ("127.0.0.1", "Traceback", "psycopg", "redis://", "postgres://"):
        assert leak not in page
    return page


@pytest.mark.django_db(transaction=True)
def test_it_answers_pages_with_503_while_postgresql_is_down(client, owner, project, caplog):
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    client.force_login(owner)
    with database_down(), caplog.at_level(logging.WARNING):
        home = client.get("/")
        project_page = client.get(f"/p/{project.slug}/")
        poll = client.get("/system/", headers={"HX-Request": "true"})
    for response in (home, project_page, poll):
        assert_outage_page(response, "The database is unavailable right now")
    # One warning for the three, and no per-request ERROR from Django's request logger.
    assert [r.levelno for r in caplog.records if r.name == "coevo.outages"] == [logging.WARNING]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert client.get(f"/p/{project.slug}/").status_code == 200


def test_it_serves_pages_and_refuses_logins_with_503_while_redis_is_down(
    client, owner, project, settings
):
    cache_down(settings)
    client.force_login(owner)
    # Pages read no cache: they go on.
    assert client.get(f"/p/{project.slug}/").status_code == 200
    client.logout()
    # A login needs Redis: the failure counter that stops password guessing lives there, and
    # it is not skipped while Redis is down.
    response = client.post("/login/", {"username": owner.username, "password": PASSWORD})
    assert_outage_page(response, "Redis (the cache) is unavailable right now")
    assert "_auth_user_id" not in client.session

"""The dashboard's suite import bounds its upload before and while reading the body (Django
streams a large file to disk whole before any view runs), and still checks CSRF."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from coevo.suites.models import Suite

pytestmark = pytest.mark.django_db

MIB = 1024**2


@pytest.fixture
def small_limit(settings):
    settings.COEVO_API_MAX_UPLOAD_MB = 1


def jsonl_of(size: int) -> bytes:
    """A valid suite file of about ``size`` bytes."""
    pad = "x" * 1000
    lines, total, n = [], 0, 0
    while total < size:
        line = json.dumps({"id": f"t{n}", "input": pad, "expected": "y"}) + "\n"
        lines.append(line)
        total += len(line)
        n += 1
    return "".join(lines).encode()


def form(data: bytes) -> dict:
    return {
        "kind": "jsonl",
        "name": "big",
        "scorer": "exact",
        "split_seed": "0",
        "file": SimpleUploadedFile("big.jsonl", data, content_type="application/jsonl"),
    }


def csrf_client(user) -> tuple[Client, str]:
    """A client that enforces CSRF as a browser meets it (the middleware reads the form)."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(reverse("web:suite_import", args=["demo"]))
    return client, page.context["csrf_token"]


def test_it_refuses_a_declared_length_over_the_limit_without_reading_the_body(
    researcher, small_limit
):
    client, token = csrf_client(researcher)

    # The body is small but claims a gigabyte: reading it would fail (the test client's input
    # refuses reads past what it holds), so a 413 shows nothing was read.
    response = client.post(
        reverse("web:suite_import", args=["demo"]),
        {"csrfmiddlewaretoken": token, **form(b"")},
        CONTENT_LENGTH=str(1024**3),
    )

    assert response.status_code == 413
    assert "file: the upload is 1024.0 MiB, over the 1 MiB limit on uploads" in (
        response.content.decode()
    )
    assert not Suite.objects.exists()


def test_it_refuses_a_file_over_the_limit(researcher, small_limit):
    client, token = csrf_client(researcher)

    response = client.post(
        reverse("web:suite_import", args=["demo"]),
        {"csrfmiddlewaretoken": token, **form(jsonl_of(MIB + MIB // 2))},
    )

    assert response.status_code == 413
    assert "over the 1 MiB limit on uploads; split it into several suites" in (
        response.content.decode()
    )
    assert not Suite.objects.exists()


def test_it_stops_reading_files_that_pass_the_limit_within_the_envelope_slack(
    researcher, small_limit
):
    client, token = csrf_client(researcher)
    # Over the file limit, under the limit plus the multipart slack: the declared length passes,
    # and the upload handler stops the file as it grows past the limit. The CSRF field comes
    # last, after the file, where the stopped parse never reaches it: the limit still answers.
    data = {**form(jsonl_of(MIB + 20 * 1024)), "csrfmiddlewaretoken": token}

    response = client.post(reverse("web:suite_import", args=["demo"]), data)

    assert response.status_code == 413
    assert "file: its files pass 1 MiB, over the 1 MiB limit on uploads" in (
        response.content.decode()
    )
    assert not Suite.objects.exists()


def test_it_still_checks_csrf_and_imports_a_file_under_the_limit(researcher, small_limit):
    client, token = csrf_client(researcher)
    url = reverse("web:suite_import", args=["demo"])

    refused = client.post(url, form(jsonl_of(10 * 1024)))
    assert refused.status_code == 403 and not Suite.objects.exists()

    imported = client.post(url, {"csrfmiddlewaretoken": token, **form(jsonl_of(10 * 1024))})

    assert imported.status_code == 302, imported.content.decode()[:2000]
    assert Suite.objects.filter(name="big").count() == 1

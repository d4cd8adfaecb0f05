"""API test fixtures: tokens with chosen scopes, a client per token (users: tests/conftest.py)."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from coevo.accounts.models import SCOPES, TokenKind
from coevo.accounts.services import token_create
from tests.conftest import SEED_HARNESS

# The promotion fixtures of the reviews tests (a JSONL suite with held-out tasks, two harnesses,
# production holding one), shared with tests/api/test_promotions.py.
from tests.reviews.conftest import arith_suite, asker, guesser, production  # noqa: F401

ALL_BUT_APPROVE = [scope for scope in SCOPES if scope != "promotions:approve"]


@pytest.fixture
def make_client(db) -> Callable[..., APIClient]:
    """``make_client(user, scopes=[...], kind=...)``: a client sending a fresh token."""

    def make(user, scopes=None, kind: str = TokenKind.PERSONAL) -> APIClient:
        token, raw = token_create(
            user=user,
            name="test",
            kind=kind,
            scopes=list(scopes) if scopes is not None else ALL_BUT_APPROVE,
            created_by=user,
        )
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        client.token = token
        client.raw_token = raw
        return client

    return make


@pytest.fixture
def researcher_api(make_client, researcher) -> APIClient:
    return make_client(researcher)


def tar_of(directory: Path, extra: dict[str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def seed_tarball(extra: dict[str, bytes] | None = None) -> bytes:
    return tar_of(SEED_HARNESS, extra)


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    return body["error"]

"""The real Docker engine for the container tests: started the way scripts/lib.sh starts it
(as root) when nothing answers on COEVO_DOCKER_HOST, with the local Debian base image built
once (cached under ~/.cache/coevo/images). No test here mocks the engine."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest
from django.conf import settings
from django.test import override_settings

from tests.conftest import REPO_ROOT
from tests.support.browser import browser, page  # noqa: F401  (the container rollout's page)
from workers.containers import ContainerUnavailable, EngineInfo, engine_ping, image_for_task
from workers.containers.engine import LABEL_ROLLOUT, engine_client

BASE_IMAGE = "local/debian:bookworm"
# What the tests' Dockerfiles name in FROM, as a Harbor task would; COEVO_IMAGE_MAP makes it the
# local base image, since image registries are unreachable here.
TASK_BASE = "python:3.11-slim-bookworm"
IMAGE_MAP = {TASK_BASE: BASE_IMAGE}


def _lib(*commands: str) -> None:
    script = "source scripts/lib.sh && " + " && ".join(commands)
    env = {**os.environ, "COEVO_DOCKER_HOST": settings.COEVO_DOCKER_HOST}
    subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, check=True, timeout=900)


@pytest.fixture(scope="session")
def engine() -> EngineInfo:
    try:
        return engine_ping()
    except ContainerUnavailable as exc:
        # CI runs as root and starts the engine (scripts/test): there, no engine is a failure.
        if os.geteuid() != 0 and not os.environ.get("CI"):
            pytest.skip(f"no Docker engine answers and starting one needs root: {exc}")
    _lib("ensure_docker_engine")
    return engine_ping()


# The internet this machine reaches: the package registries (through a proxy at a
# documentation-range address here, which the egress network's rules would otherwise drop).
REGISTRY = ("pypi.org", 443)


@pytest.fixture(scope="session")
def egress_network(engine) -> str:
    """The egress-only network (scripts/lib.sh, ensure_egress_network), its rules letting the
    registries' addresses through as scripts/test does."""
    _lib('COEVO_EGRESS_ALLOW="$(registry_addresses)" ensure_egress_network')
    return settings.COEVO_CONTAINER_EGRESS_NETWORK


@pytest.fixture(scope="session")
def base_image(engine) -> str:
    _lib(f"ensure_base_images {BASE_IMAGE.rpartition(':')[2]}")
    return BASE_IMAGE


# The image most tests share (builds are slow on 2 cores): a Debian package from Debian's mirror
# and a pure-Python package from PyPI over HTTPS, which needs the operator's CA certificates
# behind this machine's TLS-inspecting proxy. The session's nonce comes before the RUN steps, so
# each session builds them for real instead of taking the engine's cached layers.
SHARED_DOCKERFILE = """\
FROM {base}
ENV DEBIAN_FRONTEND=noninteractive COEVO_TEST_SESSION={nonce}
RUN apt-get update && apt-get install -y --no-install-recommends jq python3-pip
RUN pip install --break-system-packages six==1.16.0
WORKDIR /app
COPY . /app
"""
SHARED_CONTEXT = {
    "hello.txt": {"text": "hello\n"},
    "bin/tool.sh": {"text": "#!/bin/sh\necho tool\n", "executable": True},
}


@pytest.fixture(scope="session")
def shared_dockerfile() -> str:
    return SHARED_DOCKERFILE.format(base=TASK_BASE, nonce=secrets.token_hex(8))


@pytest.fixture(scope="session")
def task_image(base_image, shared_dockerfile):
    with override_settings(COEVO_IMAGE_MAP=IMAGE_MAP):
        image = image_for_task(
            dockerfile=shared_dockerfile, context=SHARED_CONTEXT, build_timeout_s=900
        )
    yield image
    # The session's image and the layers only it used; the CA base stays (a cache).
    engine_client().api.remove_image(image.image, force=True)


@pytest.fixture
def image_map(settings):
    settings.COEVO_IMAGE_MAP = IMAGE_MAP
    return IMAGE_MAP


@pytest.fixture
def rollout() -> str:
    """A rollout id of the test's own: its containers are found by their label."""
    return f"test-{secrets.token_hex(6)}"


def containers_of(rollout: str) -> list[dict]:
    return engine_client().api.containers(all=True, filters={"label": f"{LABEL_ROLLOUT}={rollout}"})

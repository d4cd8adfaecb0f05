"""The real embedded policy: llama.cpp serving Gemma 3 270M, started once per test session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from coevo.policies.embedded import (
    DEFAULT_MODEL_ALIAS,
    assemble_default_model,
    llama_server_command,
    wait_until_serving,
)

# The demo's browser test takes `page` from here.
from tests.support.browser import browser, page  # noqa: F401
from tests.support.net import free_port


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    model = assemble_default_model(Path(settings.COEVO_HOME) / "models")
    port = free_port()
    log = open(tmp_path_factory.mktemp("llama") / "server.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(llama_server_command(model, port=port), stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()

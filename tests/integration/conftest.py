"""The real embedded policy: the coevo llama.cpp host serving Gemma 3 270M (and any adapter
installed under COEVO_ADAPTER_DIR), started once per test session."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from coevo.policies.embedded import (
    DEFAULT_MODEL_ALIAS,
    base_model_gguf,
    llamacpp_host_command,
    wait_until_serving,
)

# The demo's browser test takes `page` from here.
from tests.support.browser import browser, page  # noqa: F401
from tests.support.net import free_port


@pytest.fixture(autouse=True)
def _llamacpp_kind(settings):
    """The endpoint these tests register is the llama.cpp host: its kind's request table
    (coevo/policies/request_tables.py) sends llama.cpp's own knobs at their neutral values,
    as the demo's endpoint does."""
    settings.COEVO_POLICY_KIND = "llamacpp"


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory):
    model = base_model_gguf(DEFAULT_MODEL_ALIAS)
    port = free_port()
    logs = tmp_path_factory.mktemp("llama")
    adapter_root = Path(settings.COEVO_ADAPTER_DIR)
    adapter_root.mkdir(parents=True, exist_ok=True)
    command = llamacpp_host_command(
        model, port=port, adapter_root=adapter_root, log_dir=logs / "models"
    )
    log = open(logs / "host.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(command, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()

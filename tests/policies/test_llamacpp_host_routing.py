"""Policy versions with LoRA adapters on a llama.cpp endpoint, served by the coevo llama.cpp host
(scripted children): coevo's adapter path works as it does on vLLM."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from coevo.errors import AdapterLoadFailed, PolicyUnavailable
from coevo.policies.client import Sampling
from coevo.policies.models import EndpointKind, LoadedAdapter, PolicyEndpoint
from coevo.policies.services import (
    policy_adapter_ensure,
    policy_adapters_unload_idle,
    policy_client_for,
    policy_version_create,
)
from tests.support.llamacpp_host import make_gguf_adapter, running_host
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy


@pytest.fixture
def host(tmp_path):
    with running_host(tmp_path) as host:
        yield host


@pytest.fixture
def adapter_version(db, host, settings):
    settings.COEVO_POLICY_RETRIES = 0
    endpoint = PolicyEndpoint.objects.create(
        name="cpu-1", base_url=host.url, kind=EndpointKind.LLAMACPP
    )
    base = policy_version_create(name="base", endpoint=endpoint, base_model="base-model")
    return policy_version_create(
        name="base-ft1",
        endpoint=endpoint,
        parent=base,
        adapter_name="ft1",
        adapter_path=str(make_gguf_adapter(host.adapter_root, "ft1")),
    )


def served(host) -> list[str]:
    return [m["id"] for m in httpx.get(f"{host.url}/models").json()["data"]]


def ask(version, prompt: str = "hello") -> str:
    with policy_client_for(version=version) as client:
        return client.complete(prompt, Sampling(max_tokens=4)).text


def test_a_version_with_an_adapter_is_loaded_and_answered_through_the_host(adapter_version, host):
    assert ask(adapter_version.parent) == "from base-model"
    assert served(host) == ["base-model"]  # the base version loads nothing

    assert ask(adapter_version) == "from ft1 + adapter.gguf"

    assert served(host) == ["base-model", "ft1"]
    assert LoadedAdapter.objects.filter(endpoint=adapter_version.endpoint, adapter_name="ft1")


def test_an_adapter_the_host_evicted_is_loaded_again_mid_rollout(adapter_version, host):
    with policy_client_for(version=adapter_version) as client:
        client.complete("first", Sampling(max_tokens=4))
        httpx.post(
            host.url + "/unload_lora_adapter", json={"lora_name": "ft1"}
        ).raise_for_status()  # evicted behind the rollout's back
        completion = client.complete("second", Sampling(max_tokens=4))

    assert completion.text == "from ft1 + adapter.gguf"
    assert served(host) == ["base-model", "ft1"]


def test_the_idle_unloader_unloads_adapters_from_the_host(adapter_version, host, settings):
    settings.COEVO_ADAPTER_IDLE_S = 600
    assert policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)
    LoadedAdapter.objects.update(last_used_at=timezone.now() - timedelta(seconds=601))

    assert policy_adapters_unload_idle() == ["ft1@cpu-1"]

    assert served(host) == ["base-model"]


def test_an_adapter_the_host_refuses_is_an_infra_error_naming_the_reason(adapter_version, host):
    (host.adapter_root / "ft1" / "adapter.gguf").unlink()  # a PEFT-only install

    with pytest.raises(PolicyUnavailable) as failure:
        ask(adapter_version)

    message = str(failure.value)
    assert "'ft1'" in message and "needs its GGUF conversion, adapter.gguf" in message
    adapter_version.endpoint.refresh_from_db()
    assert adapter_version.endpoint.healthy  # an adapter that will not load is no outage


def test_a_plain_llama_cpp_server_is_told_to_serve_adapters_through_the_host(db, tmp_path):
    """llama_cpp.server has no /v1/load_lora_adapter (404): the error says what to run."""
    with ScriptedOpenAIServer(ScriptedPolicy(model="base-model")) as plain:
        endpoint = PolicyEndpoint.objects.create(
            name="plain", base_url=plain.url, kind=EndpointKind.LLAMACPP
        )
        base = policy_version_create(name="base", endpoint=endpoint, base_model="base-model")
        version = policy_version_create(
            name="base-ft1",
            endpoint=endpoint,
            parent=base,
            adapter_name="ft1",
            adapter_path=str(make_gguf_adapter(tmp_path, "ft1")),
        )

        with pytest.raises(AdapterLoadFailed) as failure:
            policy_adapter_ensure(endpoint=endpoint, version=version)

    message = str(failure.value)
    assert "HTTP 404" in message
    assert "through the coevo llama.cpp host" in message
    assert "python -m coevo.policies.llamacpp_host" in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in message

"""LoRA adapters on vLLM: load then verify, skip when loaded, clear failures, idle unload —
against a test server speaking vLLM's runtime LoRA endpoints."""

from __future__ import annotations

from datetime import timedelta

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
from tests.support.vllm_server import VLLMPolicy, VLLMTestServer, make_adapter


@pytest.fixture
def vllm():
    policy = VLLMPolicy(model="base-model")
    with VLLMTestServer(policy) as server:
        policy.url = server.url
        yield policy


@pytest.fixture
def adapter_version(db, vllm, tmp_path, settings):
    settings.COEVO_POLICY_RETRIES = 0
    endpoint = PolicyEndpoint.objects.create(
        name="gpu-1", base_url=vllm.url, kind=EndpointKind.VLLM
    )
    base = policy_version_create(name="base", endpoint=endpoint, base_model="base-model")
    return policy_version_create(
        name="base-ft1",
        endpoint=endpoint,
        parent=base,
        adapter_name="ft1",
        adapter_path=str(make_adapter(tmp_path / "ft1")),
        provenance={"export": "exp-1", "trainer_command": ["python", "train.py"]},
    )


def lora_calls(vllm) -> list[tuple[str, str]]:
    return [(r["path"], r["lora_name"]) for r in vllm.requests if "lora_name" in r]


def test_it_registers_an_adapter_version_with_parent_and_provenance(adapter_version):
    assert adapter_version.served_name == "ft1"
    assert adapter_version.base_model == "base-model"
    assert adapter_version.parent.name == "base"
    assert adapter_version.provenance["export"] == "exp-1"
    assert "created_at" in adapter_version.provenance


def test_it_loads_the_adapter_and_verifies_it_before_the_first_request(adapter_version, vllm):
    with policy_client_for(version=adapter_version) as client:
        completion = client.complete("hello", Sampling(max_tokens=4))

    assert lora_calls(vllm) == [("/v1/load_lora_adapter", "ft1")]
    assert vllm.adapters == {"ft1": adapter_version.adapter_path}
    assert vllm.requests[-1]["model"] == "ft1"  # the request went to the adapter
    assert completion.endpoint == adapter_version.endpoint.base_url
    assert LoadedAdapter.objects.filter(adapter_name="ft1").exists()


def test_an_adapter_unloaded_mid_rollout_is_loaded_again_not_blamed_on_the_harness(
    adapter_version, vllm
):
    """The idle unloader (or a vLLM restart) removed the adapter between two model calls of
    one rollout: the 404 that follows reloads it and the call is answered."""
    with policy_client_for(version=adapter_version) as client:
        client.complete("first", Sampling(max_tokens=4))
        vllm.adapters.clear()  # unloaded behind the rollout's back
        completion = client.complete("second", Sampling(max_tokens=4))

    assert completion.text
    assert lora_calls(vllm) == [("/v1/load_lora_adapter", "ft1")] * 2
    assert vllm.requests[-1]["model"] == "ft1"


def test_an_adapter_that_will_not_come_back_is_an_infra_error(adapter_version, vllm):
    """The reload after the 404 fails (the server no longer lists what it accepts): a policy
    outage (infra_error, the attempt forgiven), never the harness's fault."""
    vllm.adapters["ft1"] = adapter_version.adapter_path  # listed at the first check only
    with policy_client_for(version=adapter_version) as client:
        client.complete("first", Sampling(max_tokens=4))
        vllm.forget_loads = True
        vllm.adapters.clear()
        with pytest.raises(PolicyUnavailable, match="does not list it"):
            client.complete("second", Sampling(max_tokens=4))


def test_it_skips_loading_an_adapter_that_is_already_listed(adapter_version, vllm):
    vllm.adapters["ft1"] = adapter_version.adapter_path

    loaded = policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)

    assert loaded is False
    assert lora_calls(vllm) == []


def test_it_never_loads_again_an_adapter_the_server_lists_from_its_path(adapter_version, vllm):
    """vLLM answers 400 to a second load of a name it serves: coevo asks /v1/models first, for
    every route's first request and after an unloaded adapter's 404 alike."""
    with policy_client_for(version=adapter_version) as client:
        client.complete("first", Sampling(max_tokens=4))
    with policy_client_for(version=adapter_version) as client:
        client.complete("second", Sampling(max_tokens=4))

    assert lora_calls(vllm) == [("/v1/load_lora_adapter", "ft1")]
    loads = [r for r in vllm.requests if r["path"] == "/v1/load_lora_adapter"]
    assert "load_inplace" not in loads[0]


def test_it_loads_new_weights_in_place_of_a_name_listed_from_another_path(adapter_version, vllm):
    """The server serves the name from another path (the version's adapter was installed
    again elsewhere): a plain load would get vLLM's 400 and leave the old weights answering."""
    vllm.adapters["ft1"] = "/adapters/old/ft1"

    loaded = policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)

    assert loaded is True
    loads = [r for r in vllm.requests if r["path"] == "/v1/load_lora_adapter"]
    assert loads == [
        {
            "path": "/v1/load_lora_adapter",
            "lora_name": "ft1",
            "lora_path": adapter_version.adapter_path,
            "load_inplace": True,
        }
    ]
    assert vllm.adapters == {"ft1": adapter_version.adapter_path}


def test_a_load_refused_because_another_worker_just_loaded_it_is_no_failure(adapter_version, vllm):
    vllm.race = True

    loaded = policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)

    assert loaded is False
    assert vllm.adapters == {"ft1": adapter_version.adapter_path}
    assert lora_calls(vllm) == [("/v1/load_lora_adapter", "ft1")]


def test_it_fails_with_the_adapter_name_and_the_servers_message(adapter_version, vllm):
    adapter_version.adapter_path = "/nowhere/ft1"

    with pytest.raises(AdapterLoadFailed) as failure:
        policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)

    message = str(failure.value)
    assert "'ft1'" in message and "No adapter found for /nowhere/ft1" in message
    # vLLM's own words, not its JSON body.
    assert '{"error"' not in message
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in message and "--enable-lora" in message


def test_it_tells_how_to_enable_runtime_lora_when_the_server_lacks_it(adapter_version, vllm):
    vllm.runtime_lora = False

    with (
        policy_client_for(version=adapter_version) as client,
        pytest.raises(PolicyUnavailable) as failure,
    ):
        client.complete("hello", Sampling(max_tokens=4))

    assert "ft1" in str(failure.value) and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in str(failure.value)
    # An adapter that will not load does not make the server unhealthy.
    adapter_version.endpoint.refresh_from_db()
    assert adapter_version.endpoint.healthy


def test_it_refuses_an_adapter_the_server_accepts_but_does_not_list(adapter_version, vllm):
    vllm.forget_loads = True

    with pytest.raises(AdapterLoadFailed, match="does not list it"):
        policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)


def test_it_unloads_adapters_idle_longer_than_the_setting(
    adapter_version, vllm, settings, tmp_path
):
    settings.COEVO_ADAPTER_IDLE_S = 600
    busy = policy_version_create(
        name="base-ft2",
        endpoint=adapter_version.endpoint,
        parent=adapter_version.parent,
        adapter_name="ft2",
        adapter_path=str(make_adapter(tmp_path / "ft2")),
    )
    policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)
    policy_adapter_ensure(endpoint=busy.endpoint, version=busy)
    LoadedAdapter.objects.filter(adapter_name="ft1").update(
        last_used_at=timezone.now() - timedelta(seconds=601)
    )

    unloaded = policy_adapters_unload_idle()

    assert unloaded == ["ft1@gpu-1"]
    assert set(vllm.adapters) == {"ft2"}
    assert ("/v1/unload_lora_adapter", "ft1") in lora_calls(vllm)
    assert list(LoadedAdapter.objects.values_list("adapter_name", flat=True)) == ["ft2"]
    # Used again later, it is loaded again.
    assert policy_adapter_ensure(endpoint=adapter_version.endpoint, version=adapter_version)

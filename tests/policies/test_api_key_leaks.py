"""A planted API key is nowhere a member or a harness can read: a program harness's rollout
through the real sandbox and boundary onto a hosted-style endpoint (the local provider server)
reads its environment, its files under /proc and what the boundary answers it; the key must not
be in any of that, nor in the trace, the rollout's detail, the logs (captured), the metrics or
the pages that show endpoints."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse

from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.services import (
    policy_client_for,
    policy_endpoint_api_key_set,
    policy_version_create,
)
from tests.support.provider_server import ProviderPolicy, ProviderServer
from workers.environments.base import Verdict
from workers.rollout import RolloutInputs, execute_rollout

KEY = "sk-planted-6f1c0e9a4b2d48c7a3e5f9d1b7c2a6e4"

# Everything a harness can read of its own process and its model: its environment (also as
# /proc/self/environ and its parent's), the boundary's model list and a chat reply, and the
# boundary's error for a bad request; all written into its answer.
SNOOP = """
import json, os, urllib.request, urllib.error

base = os.environ["OPENAI_BASE_URL"]
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
        "Content-Type": "application/json"}
def call(path, body=None):
    request = urllib.request.Request(base + path, headers=auth,
                                     data=None if body is None else json.dumps(body).encode())
    try:
        return urllib.request.urlopen(request).read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()
seen = {"env": dict(os.environ)}
for path in ("/proc/self/environ", "/proc/1/environ", f"/proc/{os.getppid()}/environ"):
    try:
        seen[path] = open(path, "rb").read().decode(errors="replace")
    except OSError as exc:
        seen[path] = str(exc)
seen["models"] = call("/models")
seen["chat"] = call("/chat/completions", {"model": "x", "messages": [
    {"role": "user", "content": "capital?"}]})
seen["bad"] = call("/chat/completions", {"model": "x", "messages": [
    {"role": "user", "content": "refuse me"}], "temperature": 1.9})
print(json.dumps(seen))
json.dump(json.dumps(seen), open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


@pytest.fixture
def provider():
    # It answers "refuse me" with its 401, quoting the key it got, as a careless gateway might.
    policy = ProviderPolicy(api_key=KEY, rules=[("capital", "Paris")])
    with ProviderServer(policy) as server:
        yield server


def test_a_planted_key_reaches_no_harness_trace_log_metric_or_page(
    db, settings, provider, tmp_path, caplog, client, operator, owner
):
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    settings.COEVO_POLICY_RETRIES = 0
    endpoint = PolicyEndpoint.objects.create(
        name="hosted", base_url=provider.url, kind=EndpointKind.OPENAI
    )
    policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
    version = policy_version_create(
        name="hosted-v", endpoint=endpoint, base_model="gpt-test", served_name="gpt-test"
    )
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "snoop"\ncommand = ["python3", "snoop.py"]\n'
    )
    (harness / "snoop.py").write_text(textwrap.dedent(SNOOP))
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="q1",
        task_view={"question": "?"},
        knob_overrides={},
        seed=1,
        wall_time_s=60,
        policy_version=version.name,
    )

    with caplog.at_level(logging.DEBUG), policy_client_for(version=version) as policy:
        result = execute_rollout(
            inputs, policy=policy, verify=lambda answer: Verdict(True, 1.0, "seen")
        )
        # A request the provider refuses for its key: its error quotes the key back.
        provider.policy.api_key, provider.policy.echo_key_in_errors = "rotated", True
        with policy_client_for(version=version) as refused:
            try:
                refused.chat([{"role": "user", "content": "x"}], _sampling())
            except Exception as exc:  # noqa: BLE001 - what it says is what is checked
                refused_error = str(exc)

    seen = json.loads(result.answer)
    assert seen["chat"] and "Paris" in seen["chat"]  # the harness did reach the model
    readable = {
        "the harness's environment and /proc": json.dumps(seen),
        "the trace": json.dumps([step.payload for step in result.steps], default=str),
        "the rollout's detail": result.detail,
        "the logs": caplog.text,
        "a refused request's error": refused_error,
    }
    client.force_login(operator)
    for name, url in [
        ("the endpoint's admin page", reverse("admin:policies_policyendpoint_change", args=[endpoint.id])),
        ("the endpoints' admin list", reverse("admin:policies_policyendpoint_changelist")),
        ("the system page", reverse("ops:system")),
    ]:  # fmt: skip
        response = client.get(url)
        assert response.status_code == 200, name
        readable[name] = response.content.decode()
    settings.COEVO_METRICS_PUBLIC = True
    readable["the metrics"] = client.get(reverse("ops:metrics")).content.decode()
    client.force_login(owner)
    readable["the campaign form's endpoint choice"] = client.get("/").content.decode()

    for name, text in readable.items():
        assert KEY not in text, f"the API key is in {name}"
    stored = PolicyEndpoint.objects.values_list("api_key_encrypted", flat=True).get()
    assert KEY not in stored


def _sampling():
    from coevo.policies.client import Sampling

    return Sampling(max_tokens=4)


def test_the_key_is_not_in_the_workers_environment_that_sandboxes_start_from(
    db, settings, provider
):
    """Decrypted only into the policy client's header, never into os.environ, where a
    subprocess or a sandbox built from the worker's environment could read it."""
    import os

    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    endpoint = PolicyEndpoint.objects.create(
        name="hosted", base_url=provider.url, kind=EndpointKind.OPENAI
    )
    policy_endpoint_api_key_set(endpoint=endpoint, api_key=KEY, actor=None)
    version = policy_version_create(
        name="hosted-v", endpoint=endpoint, base_model="gpt-test", served_name="gpt-test"
    )
    with policy_client_for(version=version) as policy:
        policy.chat([{"role": "user", "content": "capital?"}], _sampling())
        assert all(KEY not in value for value in os.environ.values())
    assert Path("/proc/self/environ").read_bytes().find(KEY.encode()) == -1

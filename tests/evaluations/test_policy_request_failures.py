"""A request the policy server fails on is that rollout's failure, not the endpoint's: a real
Celery worker over the real broker runs two rollouts side by side against the scripted server,
one whose harness sends a request the server answers HTTP 500 (as vLLM answered
``tool_choice: "required"``), one ordinary."""

from __future__ import annotations

import json

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.policies.models import PolicyEndpoint
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.models import Split
from coevo.suites.services import suite_import_jsonl
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from workers.outcomes import ErrorKind, RolloutOutcome

AGENT = """
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def run(task, ctx):
    messages = [{"role": "user", "content": task["input"]}]
    if "tool" in task["input"]:
        return ctx.llm.chat(messages, tools=[TOOL], tool_choice="required", max_tokens=8).text
    return ctx.llm.chat(messages, max_tokens=8).text
"""

ROWS = [
    {"id": "needs-a-tool", "input": "use the tool: is the sky blue?", "expected": "yes"},
    {"id": "ordinary", "input": "is the sky blue?", "expected": "yes"},
]


@pytest.fixture
def candidate(project, tmp_path):
    harness = tmp_path / "tool-asker"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "tool-asker"\nentrypoint = "agent:run"\npolicy_api = "chat"\n'
    )
    (harness / "agent.py").write_text(AGENT)
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="asks for a tool", author_name="t"
    )
    return candidate


@pytest.fixture
def suite(project):
    data = "\n".join(json.dumps({**row, "split": "search"}) for row in ROWS).encode()
    suite, _ = suite_import_jsonl(
        project=project, name="two", data=data, scorer=scorer_spec_build(kind="exact")
    )
    return suite


def test_a_request_the_server_fails_on_ends_its_rollout_alone_and_the_endpoint_stays_healthy(
    celery_worker_threads, candidate, suite, policy_version, scripted_policy, settings
):
    scripted_policy.default = "yes"
    scripted_policy.fails_on = {"tool_choice": "required"}
    settings.COEVO_POLICY_RETRIES = 2  # 5xx are still retried: three tries, then judged
    settings.COEVO_ROLLOUT_RETRY_BASE_S = 0

    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        use_cache=False,
    )
    evaluation = wait_until_final(evaluation, timeout_s=120)

    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollouts = {r.task.key: r for r in Rollout.objects.filter(evaluation=evaluation)}
    ordinary, failing = rollouts["ordinary"], rollouts["needs-a-tool"]
    assert ordinary.outcome == RolloutOutcome.PASSED, ordinary.detail
    assert (failing.outcome, failing.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.POLICY)
    assert "HTTP 500" in failing.detail, failing.detail
    assert failing.score == 0.0 and failing.attempts == 1  # the harness's fault: not retried
    (error,) = TraceStep.objects.filter(rollout=failing, kind="error")
    assert "HTTP 500" in error.payload["message"]
    tool_requests = [r for r in scripted_policy.requests if r.get("tool_choice") == "required"]
    assert len(tool_requests) == 3
    endpoint = PolicyEndpoint.objects.get(id=policy_version.endpoint_id)
    assert endpoint.healthy and endpoint.failed_at is None and endpoint.consecutive_failures == 0
    assert "unhealthy" not in ordinary.detail + failing.detail
    assert evaluation.policy_outages == 0

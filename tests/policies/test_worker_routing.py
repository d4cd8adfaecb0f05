"""A real evaluation on a real worker with one of two endpoints down: every rollout is answered
by the live one, and every recorded model call names the version and endpoint that answered."""

from __future__ import annotations

from coevo.evaluations.models import EvaluationState, Rollout, TraceStep
from coevo.evaluations.services import evaluation_create
from coevo.evaluations.traces import trace_step_payload
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.suites.models import Split
from tests.conftest import wait_until_final
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy


def test_it_finishes_an_evaluation_with_one_endpoint_down(
    celery_worker_thread, seed_candidate, humaneval_suite, policy_version, settings
):
    settings.COEVO_POLICY_RETRIES = 0
    with ScriptedOpenAIServer(ScriptedPolicy()) as dead:
        pass  # stopped on the way out: a port nothing listens on
    down = PolicyEndpoint.objects.create(
        name="down", base_url=dead.url, kind=EndpointKind.OPENAI_COMPATIBLE
    )
    # The dead server is the primary, and beat has not noticed yet: failover must cope.
    live = policy_version.endpoint
    policy_version.endpoint = down
    policy_version.save(update_fields=["endpoint"])
    policy_version.replicas.add(live)

    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=3,
    )
    wait_until_final(evaluation)

    assert evaluation.state == EvaluationState.FINISHED
    rollouts = list(Rollout.objects.filter(evaluation=evaluation))
    assert len(rollouts) == 3
    assert all(r.outcome != "infra_error" and r.attempts == 1 for r in rollouts)
    assert not PolicyEndpoint.objects.get(name="down").healthy
    steps = TraceStep.objects.filter(rollout__evaluation=evaluation, kind="model_call")
    payloads = [trace_step_payload(s) for s in steps]
    assert len(payloads) == 3
    assert {p["policy_version"] for p in payloads} == {policy_version.name}
    assert {p["endpoint"] for p in payloads} == {live.base_url}

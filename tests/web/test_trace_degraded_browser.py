"""Tools the policy server could not pass to its model, end to end: the coevo llama.cpp host
serving a GGUF whose chat template has no place for tools (as the shipped Gemma's), a program
that offers a tool on every call (examples/node-agent) evaluated by a real worker, and the
rollout page in headless Chromium saying, on each call's step, that the model never saw them."""

from __future__ import annotations

import os
import shutil

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from coevo.evaluations.models import EvaluationState, Rollout  # noqa: E402
from coevo.policies.models import EndpointKind  # noqa: E402
from coevo.policies.services import policy_version_get_default  # noqa: E402
from tests.conftest import PASSWORD  # noqa: E402
from tests.evaluations.test_program_worker import (  # noqa: E402
    evaluate,
    import_example,
    tool_arithmetic_suite,
    trace_payloads,
)
from tests.policies.test_llamacpp_features import GEMMA_LIKE, gguf  # noqa: E402
from tests.support.browser import log_in  # noqa: E402
from tests.support.llamacpp_host import running_host  # noqa: E402
from tests.web.test_trace_program import url  # noqa: E402
from workers.outcomes import RolloutOutcome  # noqa: E402

# Under CI (which installs Node.js) it always runs.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        shutil.which("node") is None and not os.environ.get("CI"), reason="needs Node.js"
    ),
]

NOT_PASSED = "tools were not passed to the model: its chat template"


@pytest.fixture
def degrading_policy(db, settings, tmp_path):
    """The default policy version on the llama.cpp host (scripted children: every reply is
    "from base-model"), whose GGUF's template renders messages only."""
    with running_host(tmp_path, model=gguf(tmp_path / "base.gguf", GEMMA_LIKE)) as host:
        settings.COEVO_POLICY_URL = host.url
        settings.COEVO_POLICY_MODEL = "base-model"
        settings.COEVO_POLICY_KIND = EndpointKind.LLAMACPP
        yield policy_version_get_default()


def test_a_rollout_whose_tools_the_policy_server_dropped_says_so_on_its_page(
    celery_worker_thread,
    live_server,
    page,
    owner,
    project,
    degrading_policy,
):
    suite = tool_arithmetic_suite(project)
    evaluation = evaluate(
        import_example(project, "node-agent"), suite, degrading_policy, task_limit=1
    )
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollout = Rollout.objects.get(evaluation=evaluation)
    # The model answered in words; the agent took that as its answer.
    assert rollout.outcome == RolloutOutcome.TASK_FAILURE, rollout.detail
    (call,) = trace_payloads(rollout, "model_call")
    assert [tool["function"]["name"] for tool in call["tools"]] == ["calculate"]
    (degraded,) = call["degraded"]
    assert degraded["field"] == "tools" and degraded["why"].startswith(NOT_PASSED)

    log_in(page, live_server.url, "owner", PASSWORD)
    page.goto(live_server.url + url(project, rollout))
    step = page.locator("li.step-model_call")
    notice = step.locator("p.degraded[data-field='tools']")
    # Said on the step itself, not inside the call's folded details.
    expect(notice).to_be_visible()
    expect(notice).to_have_text(degraded["why"])
    expect(step.locator("details.model-call p.degraded")).to_have_count(0)

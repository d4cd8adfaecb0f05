"""The rollout page says, on the model call's step, what of its request the policy server could
not honour (tools the model never saw), outside the call's folded details, so a reviewer sees
why an agent that offered tools got none back."""

from __future__ import annotations

import pytest

from coevo.evaluations.models import (
    EvaluationState,
)
from coevo.suites.models import Split, Task
from tests.support.factories import make_evaluation, make_rollout
from tests.web.test_pages import text
from tests.web.test_trace_program import TOOLS, boundary_call, plain_text, start, step_html, url
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db

WHY = (
    "tools were not passed to the model: its GGUF has no chat template, and llama-cpp-python's "
    "fallback format (llama-2) has no place for tools"
)


def test_it_shows_on_the_step_that_the_tools_were_not_passed_to_the_model(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    task = Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).first()
    ask = [{"role": "user", "content": "add 2 and 3"}]
    steps = [
        start(task),
        boundary_call(
            0, ask, session=0, tools=TOOLS, content="5", degraded=[{"field": "tools", "why": WHY}]
        ),
        boundary_call(1, ask, session=1, tools=TOOLS, content="5"),
    ]
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.TASK_FAILURE, score=0.0, steps=steps
    )
    client.force_login(owner)

    page = text(client.get(url(project, rollout)))

    degraded, honoured = step_html(page, "1-1"), step_html(page, "1-2")
    notice = degraded.split('<details class="model-call"', 1)[0]  # before the folded details
    assert 'class="error-text degraded" data-field="tools"' in notice
    assert WHY in plain_text(notice).replace("&#x27;", "'")
    assert "degraded" not in honoured

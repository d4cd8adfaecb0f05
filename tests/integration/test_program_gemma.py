"""A program harness (the unmodified OpenAI SDK, as a program) on real HumanEval tasks, against
the real llama.cpp server with Gemma 3 270M behind the boundary, executed by a real Celery
worker: nothing scripted."""

from __future__ import annotations

import textwrap

import pytest

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    TraceStep,
)
from coevo.evaluations.services import evaluation_create
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS
from coevo.suites.models import Split
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.llm

AGENT = """
import json, os
from openai import OpenAI

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
reply = OpenAI().completions.create(
    model="gpt-3.5-turbo-instruct", prompt=task["prompt"], max_tokens=96, temperature=0,
    stop=["\\ndef ", "\\nclass ", "\\nif __name__"])
json.dump(reply.choices[0].text, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def test_a_program_harness_is_evaluated_with_gemma_through_the_boundary(
    llama_server, celery_worker_thread, project, humaneval_suite, settings, tmp_path
):
    from coevo.policies.services import policy_version_get_default

    settings.COEVO_POLICY_URL = llama_server
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    harness = tmp_path / "program"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "sdk-completions"\ncommand = ["python", "agent.py"]\n'
        "[limits]\nmax_model_calls = 2\nwall_time_s = 120\n"
    )
    (harness / "agent.py").write_text(textwrap.dedent(AGENT))
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="SDK program", author_name="t"
    )
    evaluation = evaluation_create(
        candidate=candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version_get_default(),
        task_limit=2,
    )
    wait_until_final(evaluation, timeout_s=300)

    assert evaluation.state == EvaluationState.FINISHED
    for rollout in Rollout.objects.filter(evaluation=evaluation):
        # The model may be wrong; the pipeline may not: no errors of any kind.
        assert rollout.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), (
            rollout.detail
        )
        (call,) = TraceStep.objects.filter(rollout=rollout, kind="model_call")
        assert call.payload["via"] == "boundary" and call.payload["api"] == "completions"
        assert call.payload["model"] == DEFAULT_MODEL_ALIAS  # not the name the SDK asked for
        assert call.prompt_tokens > 20 and call.completion_tokens > 0
        assert call.payload["completion"].strip()

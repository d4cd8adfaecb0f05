"""Exports of real rollouts: evaluations run by a real Celery worker (sandboxed harnesses, the
scripted policy server), then the export built by the same worker from the default queue."""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone

from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.services import evaluation_create
from coevo.exports.models import ExportState, TrajectoryExport
from coevo.exports.services import trajectory_export_create, trajectory_exports_resend
from coevo.projects.models import Project
from tests.conftest import wait_until_final
from tests.exports.conftest import lines, wait_ready

BELOW_ZERO = (
    "    balance = 0\n    for op in operations:\n        balance += op\n"
    "        if balance < 0:\n            return True\n    return False\n"
)
CHAT_AGENT = """
def run(task, ctx):
    reply = ctx.llm.chat(
        [{"role": "system", "content": "Complete the function."},
         {"role": "user", "content": task["prompt"]}],
        max_tokens=128,
    )
    return reply.text
"""


def evaluate(candidate, suite, policy_version):
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split="search",
        policy_version=policy_version,
        task_limit=4,
    )
    return wait_until_final(evaluation)


def test_it_exports_real_completion_and_chat_rollouts_with_provenance(
    celery_worker_thread,
    project,
    owner,
    seed_candidate,
    humaneval_suite,
    policy_version,
    scripted_policy,
    tmp_path,
):
    from harness_store.services import candidate_import_directory

    scripted_policy.rules.append(("def below_zero", BELOW_ZERO))
    completions_evaluation = evaluate(seed_candidate, humaneval_suite, policy_version)
    chat_dir = tmp_path / "chat-harness"
    chat_dir.mkdir()
    (chat_dir / "harness.toml").write_text(
        '[harness]\nname = "chat"\nentrypoint = "agent:run"\npolicy_api = "chat"\n'
    )
    (chat_dir / "agent.py").write_text(CHAT_AGENT)
    chat_candidate, _ = candidate_import_directory(
        project=project,
        directory=chat_dir,
        message="Chat harness",
        author_name="Owner",
        author_email="owner@example.com",
        created_by=owner,
    )
    chat_evaluation = evaluate(chat_candidate, humaneval_suite, policy_version)

    # Harness-matched, successful only: the seed's one passed rollout, built by the worker.
    matched = wait_ready(
        trajectory_export_create(
            project=project,
            format="prompt_completion",
            candidate=seed_candidate,
            successful_only=True,
            created_by=owner,
        )
    )
    assert matched.celery_task_id
    (row,) = lines(matched)
    rollout = Rollout.objects.get(evaluation=completions_evaluation, outcome="passed")
    step = TraceStep.objects.get(rollout=rollout, kind="model_call")
    assert row["prompt"] == step.payload["prompt"] == rollout.task.inputs["prompt"]
    assert row["completion"] == step.payload["completion"] == BELOW_ZERO
    assert row["weight"] == 1
    provenance = row["provenance"]
    assert (provenance["harness_sha"], provenance["task"], provenance["outcome"]) == (
        seed_candidate.sha,
        rollout.task.key,
        "passed",
    )
    assert provenance["policy_version"] == policy_version.name
    assert provenance["suite"] == {"name": humaneval_suite.name, "version": humaneval_suite.version}
    assert provenance["rollout"] == str(rollout.id) and provenance["score"] == 1.0

    # Chat format of the chat harness: its messages plus the assistant's reply.
    chat = wait_ready(
        trajectory_export_create(
            project=project, format="chat", candidate=chat_candidate, created_by=owner
        )
    )
    rows = lines(chat)
    assert len(rows) == 4 == chat.rollouts
    for row in rows:
        system, user, assistant = row["messages"]
        assert system == {"role": "system", "content": "Complete the function."}
        assert user["role"] == "user" and "def " in user["content"]
        assert assistant["role"] == "assistant"
        assert row["provenance"]["harness_sha"] == chat_candidate.sha
        assert row["provenance"]["evaluation"] == str(chat_evaluation.id)
    replies = {row["provenance"]["task"]: row["messages"][2]["content"] for row in rows}
    assert replies["HumanEval/3"] == BELOW_ZERO
    assert {r["weight"] for r in rows if r["provenance"]["outcome"] == "passed"} == {1}


def test_a_pending_export_whose_message_was_lost_is_built_after_the_resend(
    celery_worker_thread, settings
):
    """The beat job sends a lost build again; the worker builds it."""
    project = Project.objects.create(slug="lost-export", name="lost export")
    export = TrajectoryExport.objects.create(project=project, format="chat", filters={})
    # Not old enough: left alone.
    assert trajectory_exports_resend(older_than_s=300) == 0
    TrajectoryExport.objects.filter(id=export.id).update(
        updated_at=timezone.now() - timedelta(minutes=10)
    )
    assert trajectory_exports_resend(older_than_s=300) == 1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        export.refresh_from_db()
        if export.is_final:
            break
        time.sleep(0.2)
    assert export.state == ExportState.READY, export.state_detail
    assert export.rows == 0
    assert settings.CELERY_BEAT_SCHEDULE["exports-resend"]["task"] == (
        "coevo.exports.tasks.trajectory_exports_resend"
    )

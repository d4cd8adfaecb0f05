"""Export contents, provenance, weights and filters, on rollouts finished through the real
claim/finish services with recorded model-call steps."""

from __future__ import annotations

import pytest

from coevo.audit.models import AuditEvent
from coevo.errors import InvalidInput
from coevo.evaluations.retention import protected_evaluations
from coevo.exports.models import ExportState
from coevo.exports.services import export_path, trajectory_export_build, trajectory_export_create
from tests.exports.conftest import build, lines, run_evaluation

pytestmark = pytest.mark.django_db(transaction=True)

PASS, FAIL = ("passed", 1.0), ("task_failure", 0.0)


def create(project, owner, **kwargs):
    kwargs.setdefault("format", "prompt_completion")
    return trajectory_export_create(project=project, created_by=owner, **kwargs)


def test_it_writes_prompt_completion_lines_with_provenance_and_weights(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    evaluation = run_evaluation(
        seed_candidate, humaneval_suite, policy_version, results=[PASS, FAIL]
    )
    export = build(create(project, owner))

    rows = lines(export)
    assert export.rows == len(rows) == 4 and export.rollouts == 2
    assert export.size_bytes == export_path(sha256=export.sha256).stat().st_size
    first = rows[0]
    rollout = evaluation.rollouts.order_by("task__position").first()
    assert first["prompt"] == f"task {rollout.task.key} call 0"
    assert first["completion"] == f"reply 0 to {rollout.task.key}"
    assert first["provenance"] == {
        "harness_sha": seed_candidate.sha,
        "policy_version": policy_version.name,
        "model": "scripted",
        "suite": {"name": humaneval_suite.name, "version": humaneval_suite.version},
        "split": "search",
        "task": rollout.task.key,
        "epoch": 0,
        "score": 1.0,
        "outcome": "passed",
        "evaluation": str(evaluation.id),
        "rollout": str(rollout.id),
        "trace_rollout": str(rollout.id),
        "turn": 0,
        "turns": 2,
    }
    # Model turns of the passed rollout are learned; the failed one's are kept with weight 0.
    assert [(r["provenance"]["outcome"], r["weight"]) for r in rows] == [
        ("passed", 1),
        ("passed", 1),
        ("task_failure", 0),
        ("task_failure", 0),
    ]
    assert AuditEvent.objects.filter(action="export.created").count() == 1
    assert evaluation.id in set(protected_evaluations().values_list("id", flat=True))


def test_it_writes_chat_lines_for_chat_calls_and_for_prompts(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS], api="chat")
    export = build(create(project, owner, format="chat"))
    row = lines(export)[0]
    assert row["messages"][:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": row["messages"][1]["content"]},
    ]
    assert row["messages"][2]["role"] == "assistant"
    assert row["messages"][2]["weight"] == 1 == row["weight"]
    assert row["messages"][2]["content"].startswith("reply 0 to ")

    completions = build(create(project, owner, format="prompt_completion"))
    conversational = lines(completions)[0]
    assert conversational["prompt"] == row["messages"][:2]
    assert conversational["completion"] == [
        {"role": "assistant", "content": row["messages"][2]["content"]}
    ]


def test_it_keeps_only_successful_rollouts_or_those_above_a_minimum_score(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        results=[PASS, FAIL, ("task_failure", 0.5), ("harness_error", 0.0)],
        calls=1,
    )
    everything = build(create(project, owner))
    assert [r["provenance"]["outcome"] for r in lines(everything)] == [
        "passed",
        "task_failure",
        "task_failure",
        "harness_error",
    ]
    successful = build(create(project, owner, successful_only=True))
    assert [r["provenance"]["outcome"] for r in lines(successful)] == ["passed"]
    scored = build(create(project, owner, min_score=0.5))
    assert sorted(r["provenance"]["score"] for r in lines(scored)) == [0.5, 1.0]


def test_it_exports_only_rollouts_of_the_matched_harness(
    project, owner, seed_candidate, other_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS, PASS])
    run_evaluation(other_candidate, humaneval_suite, policy_version, results=[PASS])
    assert {r["provenance"]["harness_sha"] for r in lines(build(create(project, owner)))} == {
        seed_candidate.sha,
        other_candidate.sha,
    }
    matched = build(create(project, owner, candidate=other_candidate))
    assert matched.filters["candidate"] == other_candidate.sha
    assert {r["provenance"]["harness_sha"] for r in lines(matched)} == {other_candidate.sha}
    assert matched.rollouts == 1


def test_it_refuses_held_out_rollouts_and_never_writes_them(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS])
    heldout = run_evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        split="heldout",
        results=[PASS, PASS],
        marker="SEALED-HELDOUT-MARKER ",
    )
    with pytest.raises(InvalidInput, match="never exportable"):
        create(project, owner, splits=["search", "heldout"])
    with pytest.raises(InvalidInput, match="held-out"):
        create(project, owner, evaluations=[heldout])

    for splits in (None, ["search", "validation"]):
        export = build(create(project, owner, splits=splits))
        data = export_path(sha256=export.sha256).read_text()
        assert export.rows == 2
        assert "SEALED-HELDOUT-MARKER" not in data
        assert not export.evaluations.filter(id=heldout.id).exists()


def test_it_exports_validation_rollouts_only_when_chosen(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS])
    run_evaluation(
        seed_candidate, humaneval_suite, policy_version, split="validation", results=[PASS]
    )
    default = build(create(project, owner))
    assert {r["provenance"]["split"] for r in lines(default)} == {"search"}
    chosen = build(create(project, owner, splits=["search", "validation"]))
    assert {r["provenance"]["split"] for r in lines(chosen)} == {"search", "validation"}
    with pytest.raises(InvalidInput, match="Unknown split"):
        create(project, owner, splits=["train"])


def test_it_gives_identical_exports_one_file_and_one_hash(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS, FAIL])
    first = build(create(project, owner))
    second = build(create(project, owner))
    assert first.id != second.id
    assert first.sha256 == second.sha256
    files = list(export_path(sha256=first.sha256).parent.iterdir())
    assert files == [export_path(sha256=first.sha256)]  # no temporary file left behind
    other = build(create(project, owner, format="chat"))
    assert other.sha256 != first.sha256


def test_it_builds_a_ready_export_only_once(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS])
    export = build(create(project, owner))
    # A redelivered build task changes nothing: ready exports are immutable.
    assert trajectory_export_build(export_id=export.id) is None
    export.refresh_from_db()
    assert export.state == ExportState.READY


def test_it_learns_only_the_last_turns_when_asked(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    run_evaluation(seed_candidate, humaneval_suite, policy_version, results=[PASS], calls=4)
    export = build(create(project, owner, last_turns=1))
    assert [r["weight"] for r in lines(export)] == [0, 0, 0, 1]
    assert [r["provenance"]["turn"] for r in lines(export)] == [0, 1, 2, 3]

"""Export fixtures: finished evaluations whose rollouts carry model-call trace steps, driven
through the real claim/finish services (no sandbox), and a per-test export directory."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from coevo.evaluations.models import Evaluation, Rollout, TraceStep
from coevo.evaluations.services import evaluation_create, rollout_claim, rollout_finish
from coevo.exports.models import TrajectoryExport
from coevo.exports.services import export_path, trajectory_export_build
from tests.api.conftest import make_client  # noqa: F401  (fixture)
from tests.conftest import SEED_HARNESS


@pytest.fixture(autouse=True)
def _export_dir(settings, tmp_path):
    settings.COEVO_EXPORT_DIR = str(tmp_path / "exports")


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    yield


@pytest.fixture
def other_candidate(project, owner, tmp_path):
    """A second harness (a different commit) of the same project."""
    import shutil

    from harness_store.services import candidate_import_directory

    directory = tmp_path / "other-harness"
    shutil.copytree(SEED_HARNESS, directory)
    (directory / "NOTES.md").write_text("another harness\n")
    candidate, _ = candidate_import_directory(
        project=project,
        directory=directory,
        message="Another harness",
        author_name="Owner",
        author_email="owner@example.com",
        created_by=owner,
    )
    return candidate


def run_evaluation(
    candidate,
    suite,
    policy_version,
    *,
    split: str = "search",
    results: list[tuple[str, float | None]],
    calls: int = 2,
    api: str = "completions",
    marker: str = "",
) -> Evaluation:
    """An evaluation of ``len(results)`` tasks, each rollout finished with (outcome, score)
    after ``calls`` recorded model calls whose prompts name the task (and ``marker``)."""
    kwargs = {"purpose": "promotion"} if split == "heldout" else {}
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=split,
        policy_version=policy_version,
        task_limit=len(results),
        **kwargs,
    )
    rollouts = list(Rollout.objects.filter(evaluation=evaluation).select_related("task"))
    assert len(rollouts) == len(results)
    for rollout, (outcome, score) in zip(rollouts, results, strict=True):
        claimed = rollout_claim(rollout_id=rollout.id, worker="test")
        assert claimed is not None
        for i in range(calls):
            text = f"{marker}task {rollout.task.key} call {i}"
            request = (
                {"prompt": text}
                if api == "completions"
                else {
                    "messages": [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": text},
                    ]
                }
            )
            TraceStep.objects.create(
                rollout=rollout,
                attempt=claimed.attempts,
                index=i + 1,
                kind="model_call",
                payload={
                    "api": api,
                    "model": "scripted",
                    "policy_version": policy_version.name,
                    **request,
                    "completion": f"reply {i} to {rollout.task.key}",
                },
            )
        assert rollout_finish(
            rollout=claimed, outcome=outcome, score=score, detail=outcome, model_calls=calls
        )
    evaluation.refresh_from_db()
    assert evaluation.is_final, evaluation.state
    return evaluation


def build(export: TrajectoryExport) -> TrajectoryExport:
    """Build in this process (the on-commit enqueue went to a broker no worker reads here)."""
    built = trajectory_export_build(export_id=export.id)
    assert built is not None and built.state == "ready", built and built.state_detail
    return built


def lines(export: TrajectoryExport) -> list[dict]:
    path: Path = export_path(sha256=export.sha256)
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_ready(export: TrajectoryExport, timeout_s: float = 60) -> TrajectoryExport:
    """The export once a worker has built it (it must become ready, not failed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        export.refresh_from_db()
        if export.is_final:
            assert export.state == "ready", export.state_detail
            return export
        time.sleep(0.2)
    raise AssertionError(f"export still {export.state} after {timeout_s}s")

"""Fixtures of the training tests: their own directories, a vLLM-kind base policy, and a
ready export of real (hand-finished) rollouts to train on."""

from __future__ import annotations

import pytest

from coevo.exports.services import trajectory_export_create
from tests.exports.conftest import build, run_evaluation
from tests.support.browser import browser, page  # noqa: F401  (the run page's browser test)

PASS = ("passed", 1.0)


@pytest.fixture(autouse=True)
def dirs(settings, tmp_path):
    settings.COEVO_TRAINING_DIR = tmp_path / "training"
    settings.COEVO_ADAPTER_DIR = tmp_path / "adapters"
    settings.COEVO_EXPORT_DIR = tmp_path / "exports"
    return tmp_path


@pytest.fixture
def export(project, owner, seed_candidate, humaneval_suite, base_policy):
    """A ready chat export of the seed's rollouts under the base policy (2 passed rollouts,
    2 model calls each: 4 rows)."""
    run_evaluation(seed_candidate, humaneval_suite, base_policy, results=[PASS, PASS])
    built = build(
        trajectory_export_create(
            project=project,
            format="chat",
            created_by=owner,
            candidate=seed_candidate,
            policy_version=base_policy,
        )
    )
    assert built.rows == 4
    return built


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    yield

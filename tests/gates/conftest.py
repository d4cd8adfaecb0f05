"""Gate test data: a gate of the child candidate against the seed (results are written
straight to the database with tests/support/factories.py's finish_evaluation, so each verdict
rule is tested on known numbers)."""

from __future__ import annotations

import pytest

from coevo.gates.models import Gate
from coevo.gates.services import gate_create
from coevo.suites.models import Split, Task
from tests.support.browser import browser, page  # noqa: F401  (the gate page's browser test)


def validation_keys(suite) -> list[str]:
    return list(
        Task.objects.filter(suite=suite, split=Split.VALIDATION)
        .order_by("position")
        .values_list("key", flat=True)
    )


@pytest.fixture
def make_gate(project, seed_candidate, child_candidate, humaneval_suite, policy_version, owner):
    """``make_gate(**rules)``: the child gated against the seed (by SHA) on validation."""

    def make(**kwargs) -> Gate:
        kwargs.setdefault("against", seed_candidate.sha)
        kwargs.setdefault("candidate", child_candidate)
        return gate_create(
            project=project,
            suite=humaneval_suite,
            policy_version=policy_version,
            created_by=owner,
            **kwargs,
        )

    return make

"""Property-based fuzzing of the whole API against its own OpenAPI schema (schemathesis).

Every operation gets generated path, query and body values (with the project, candidate,
evaluation and suite fixed to seeded objects so requests reach the code behind the checks) and
must answer without a 5xx and with a response that matches the schema, errors included.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from coevo.campaigns.services import campaign_create
from coevo.evaluations.services import evaluation_create
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.services import channel_get_or_create
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl

EXAMPLES_PER_OPERATION = 30


@pytest.fixture
def keep_test_connection():
    """The WSGI handler closes DB connections after each request; the test's transaction lives
    on that connection (Django's own test client disconnects these signals the same way)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def seeded(seed_candidate, policy_version, owner):
    data = (
        b'{"id": "a", "input": "1", "expected": "1"}\n{"id": "b", "input": "2", "expected": "2"}\n'
    )
    suite, _ = suite_import_jsonl(
        project=seed_candidate.project,
        name="sums",
        data=data,
        scorer=scorer_spec_build(kind="exact"),
    )
    evaluation = evaluation_create(
        candidate=seed_candidate,
        suite=suite,
        split=suite.tasks.first().split,
        policy_version=policy_version,
        created_by=owner,
    )
    # A campaign on a suite with both splits, so campaign operations reach their code.
    rows = [(key, split) for split in ("search", "validation") for key in ("c1", "c2")]
    campaign_suite, _ = suite_import_jsonl(
        project=seed_candidate.project,
        name="campaign-sums",
        data="\n".join(
            f'{{"id": "{key}-{split}", "input": "1", "expected": "1", "split": "{split}"}}'
            for key, split in rows
        ).encode(),
        scorer=scorer_spec_build(kind="exact"),
    )
    campaign = campaign_create(
        project=seed_candidate.project,
        name="fuzzed",
        seed_candidate=seed_candidate,
        policy_version=policy_version,
        suite=campaign_suite,
    )
    # A promotion request (an empty channel: one held-out evaluation), so promotion operations
    # reach their code.
    promotion_suite, _ = suite_import_jsonl(
        project=seed_candidate.project,
        name="promotion-sums",
        data=b'{"id": "h1", "input": "1", "expected": "1", "split": "heldout"}',
        scorer=scorer_spec_build(kind="exact"),
    )
    promotion = promotion_request_create(
        channel=channel_get_or_create(project=seed_candidate.project, name="staging"),
        candidate=seed_candidate,
        policy_version=policy_version,
        requester=owner,
        suite=promotion_suite,
    )
    # A trajectory export (pending: no worker here), so export operations reach their code.
    from coevo.exports.services import trajectory_export_create

    export = trajectory_export_create(
        project=seed_candidate.project, format="chat", created_by=owner
    )
    # A compatibility matrix (one cell), so matrix operations reach their code.
    from coevo.matrices.services import matrix_create

    matrix = matrix_create(
        project=seed_candidate.project,
        candidates=[seed_candidate],
        policy_versions=[policy_version],
        suite=campaign_suite,
        split="search",
        created_by=owner,
    )
    # A trainer and a training run (pending: no worker here), so training operations reach
    # their code.
    from coevo.training.models import TrainingRun
    from coevo.training.trainers import trainer_register

    run = TrainingRun.objects.create(
        project=seed_candidate.project,
        trainer=trainer_register(name="fuzz-lora", command=["true"], time_limit_s=60),
        export=export,
        parent_policy=policy_version,
        time_limit_s=60,
        created_by=owner,
    )
    return {
        "slug": "demo",
        "sha": seed_candidate.sha,
        "evaluation_id": str(evaluation.id),
        "name": suite.name,
        "campaign_id": str(campaign.id),
        "request_id": str(promotion.id),
        "matrix_id": str(matrix.id),
        "export_id": str(export.id),
        "run_id": str(run.id),
    }


def test_it_finds_no_server_error_and_no_schema_violation(
    settings, keep_test_connection, seeded, make_client, owner
):
    settings.COEVO_API_RATE = "100000/min"
    raw = make_client(owner).raw_token
    schema = schemathesis.openapi.from_wsgi("/api/v1/schema/?format=json", get_wsgi_application())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 17
    for operation in operations:
        names = {p.name for p in operation.path_parameters}
        strategy = operation.as_strategy(
            path_parameters={k: v for k, v in seeded.items() if k in names},
            headers={"Authorization": f"Bearer {raw}"},
        )

        @hypothesis_settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def fuzz(case) -> None:
            case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])

        fuzz()

"""Training runs (list, detail with the log tail, cancel), trainers (never their command or
environment), and the alternation fields of campaigns; the scope and role each needs."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from coevo.campaigns.models import Campaign, Proposal, ProposalState
from coevo.projects.models import Role
from coevo.projects.services import membership_set, project_get_or_create
from coevo.training.models import TrainingRun, TrainingState
from coevo.training.services import training_run_create
from coevo.training.trainers import trainer_register
from tests.api.conftest import assert_error
from tests.campaigns.support import marked_suite, styled_seed
from tests.web.test_training_pages import (
    ALTERNATION,
    LEGACY_COMMAND_LINE,
    alternating_campaign,
    make_training_data,
    start_run,
)

RUNS = "/api/v1/projects/demo/training-runs/"
CAMPAIGNS = "/api/v1/projects/demo/campaigns/"


@pytest.fixture
def training(project, owner):
    return make_training_data(project, owner)


def run_url(run, suffix: str = "") -> str:
    return f"{RUNS}{run.id}/{suffix}"


# --- training runs ----------------------------------------------------------------------------


def test_it_lists_runs_newest_first_in_cursor_pages_without_their_logs(
    make_client, viewer, training, owner, project
):
    start_run(training.run)
    later = [
        training_run_create(
            project=project,
            trainer=training.trainer,
            export=training.export,
            parent_policy=training.base,
            time_limit_s=60,
            created_by=owner,
        )
        for _ in range(2)
    ]
    client = make_client(viewer, ["read"])

    first = client.get(RUNS, {"limit": 2}).json()
    second = client.get(first["next"]).json()

    ids = [r["id"] for r in first["results"] + second["results"]]
    assert ids == [str(later[1].id), str(later[0].id), str(training.run.id)]
    assert second["next"] is None
    oldest = second["results"][0]
    assert "log_tail" not in oldest and "command" not in oldest
    assert oldest["state"] == "running" and oldest["trainer"] == "tiny-lora"
    assert oldest["parent_policy"] == "base" and oldest["policy_version"] is None
    assert oldest["export"] == str(training.export.id)
    assert oldest["export_url"].endswith(f"/api/v1/projects/demo/exports/{training.export.id}/")
    assert oldest["url"].endswith(run_url(training.run))
    assert oldest["dashboard_url"].endswith(f"/p/demo/training/{training.run.id}/")
    assert oldest["created_by"] == "owner" and oldest["log_bytes"] > 0
    assert first["results"][0]["time_limit_s"] == 60


def test_the_detail_has_the_log_tail_and_never_the_command(make_client, viewer, training):
    start_run(training.run)

    body = make_client(viewer, ["read"]).get(run_url(training.run)).json()

    assert body["state"] == "running" and body["exit_code"] is None
    # The argv is the operator's: the API never shows it (operators read it in the admin).
    assert "command" not in body and "train.py" not in str(body)
    assert body["log_tail"].startswith("epoch 1 loss 0.93\n")
    assert body["duration_s"] >= 0 and body["started_at"] and body["finished_at"] is None
    assert "HF_TOKEN" not in str(body) and "secret-env-marker" not in str(body)


def test_the_log_tail_of_an_older_run_drops_its_argv_line(make_client, viewer, training):
    # Runs started before the argv left the log have it as their log's first line.
    start_run(training.run, log=f"{LEGACY_COMMAND_LINE}epoch 1 loss 0.93\n")

    body = make_client(viewer, ["read"]).get(run_url(training.run)).json()

    assert body["log_tail"] == "epoch 1 loss 0.93\n"


def test_reading_needs_the_read_scope_and_membership(
    make_client, viewer, outsider, training, project
):
    assert_error(
        make_client(viewer, ["campaigns:run"]).get(run_url(training.run)), 403, "scope_missing"
    )
    assert_error(make_client(outsider, ["read"]).get(RUNS), 404, "not_found")
    assert_error(make_client(outsider, ["read"]).get(run_url(training.run)), 404, "not_found")
    assert_error(APIClient().get(RUNS), 401, "not_authenticated")
    # A run is found only under its own project.
    other = project_get_or_create(slug="other", name="Other")
    membership_set(project=other, user=viewer, role=Role.VIEWER)
    elsewhere = f"/api/v1/projects/other/training-runs/{training.run.id}/"
    assert_error(make_client(viewer, ["read"]).get(elsewhere), 404, "not_found")


def test_it_cancels_a_pending_run_with_202_and_refuses_a_second_cancel(
    make_client, researcher, training
):
    client = make_client(researcher, ["campaigns:run"])

    response = client.post(run_url(training.run, "cancel/"))

    assert response.status_code == 202, response.content
    body = response.json()
    assert response["Location"] == body["status_url"]
    assert body["status_url"].endswith(run_url(training.run))
    assert body["dashboard_url"].endswith(f"/p/demo/training/{training.run.id}/")
    assert (body["state"], body["cancel_requested"]) == ("cancelled", False)
    training.run.refresh_from_db()
    assert training.run.state == TrainingState.CANCELLED
    assert_error(client.post(run_url(training.run, "cancel/")), 409, "invalid_state")


def test_cancelling_a_running_run_asks_its_worker_to_stop(make_client, researcher, training):
    start_run(training.run)

    body = make_client(researcher, ["campaigns:run"]).post(run_url(training.run, "cancel/")).json()

    assert (body["state"], body["cancel_requested"]) == ("running", True)
    training.run.refresh_from_db()
    assert training.run.cancel_requested and training.run.state == TrainingState.RUNNING


def test_cancelling_needs_the_scope_and_the_role(
    make_client, researcher, viewer, outsider, training
):
    url = run_url(training.run, "cancel/")
    assert_error(make_client(researcher, ["read"]).post(url), 403, "scope_missing")
    assert_error(make_client(viewer, ["campaigns:run"]).post(url), 403, "permission_denied")
    assert_error(make_client(outsider, ["campaigns:run"]).post(url), 404, "not_found")
    assert_error(APIClient().post(url), 401, "not_authenticated")
    missing = f"{RUNS}00000000-0000-0000-0000-000000000001/cancel/"
    assert_error(make_client(researcher, ["campaigns:run"]).post(missing), 404, "not_found")
    training.run.refresh_from_db()
    assert training.run.state == TrainingState.PENDING and not training.run.cancel_requested
    assert TrainingRun.objects.count() == 1


# --- trainers ---------------------------------------------------------------------------------


def test_members_list_trainers_without_their_command_or_environment(make_client, viewer, training):
    trainer_register(
        name="big-lora",
        command=["/opt/train-secret-path", "{export}"],
        env={"WANDB_API_KEY": "another-secret"},
        time_limit_s=7200,
    )
    training.trainer.enabled = False
    training.trainer.save()

    # Trainers are not per project: a member of any project sees them all.
    response = make_client(viewer, ["read"]).get("/api/v1/trainers/")

    assert response.status_code == 200
    by_name = {t["name"]: t for t in response.json()["results"]}
    assert by_name == {
        "tiny-lora": {
            "name": "tiny-lora",
            "description": "A tiny LoRA trainer",
            "time_limit_s": 600,
            "enabled": False,
        },
        "big-lora": {"name": "big-lora", "description": "", "time_limit_s": 7200, "enabled": True},
    }
    raw = response.content.decode()
    for secret in ("train.py", "train-secret-path", "HF_TOKEN", "secret-env-marker", "WANDB"):
        assert secret not in raw
    assert_error(APIClient().get("/api/v1/trainers/"), 401, "not_authenticated")
    assert_error(
        make_client(viewer, ["campaigns:run"]).get("/api/v1/trainers/"), 403, "scope_missing"
    )


def test_a_user_of_no_project_gets_no_trainers_and_staff_do(make_client, outsider, training):
    response = make_client(outsider, ["read"]).get("/api/v1/trainers/")

    error = assert_error(response, 403, "permission_denied")
    assert "tiny-lora" not in response.content.decode()
    assert "Trainers are listed to project members" in error["message"]
    outsider.is_staff = True
    outsider.save()
    staff = make_client(outsider, ["read"]).get("/api/v1/trainers/")
    assert [t["name"] for t in staff.json()["results"]] == ["tiny-lora"]


# --- campaigns --------------------------------------------------------------------------------


@pytest.fixture
def start_body(project, tmp_path, training):
    seed = styled_seed(project, tmp_path)
    marked_suite(project)
    return {
        "seed_candidate": seed.sha,
        "suite": "styled",
        "policy_version": "base",
        "max_proposals": 4,
        "patience": 3,
    }


def test_it_starts_an_alternating_campaign_and_reports_its_phase_and_policies(
    make_client, researcher, start_body, training
):
    alternation = {
        "trainer": "tiny-lora",
        "switch": "patience",
        "patience": 2,
        "time_limit_s": 300,
        "export": {"format": "prompt_completion", "min_score": 0.5},
    }
    response = make_client(researcher, ["campaigns:run"]).post(
        CAMPAIGNS, {**start_body, "alternation": alternation}, format="json"
    )

    assert response.status_code == 202, response.content
    campaign = Campaign.objects.get()
    assert campaign.alternation["switch"] == "patience" and campaign.alternation["patience"] == 2
    status = make_client(researcher, ["read"]).get(response.json()["status_url"]).json()
    assert status["alternation"] == campaign.alternation
    assert status["alternation"]["export"] == {
        "format": "prompt_completion",
        "successful_only": True,
        "min_score": 0.5,
        "last_turns": None,
    }
    assert status["alternation"]["max_policy_steps"] == 3  # the default, filled in
    assert status["current_policy_version"] == "base"
    assert status["best_policy_version"] is None
    assert status["phase"] == {
        "name": "harness",
        "steps": 0,
        "stale": 0,
        "policy_steps": 0,
        "reason": "a campaign starts with harness steps",
    }


@pytest.mark.parametrize(
    ("alternation", "message"),
    [
        ({"trainer": "tiny-lora", "harness_step": 2}, "harness_step"),
        ({"trainer": "tiny-lora", "export": {"split": "validation"}}, "split"),
        ({"trainer": "nope"}, "No trainer named 'nope'"),
        ({"trainer": "tiny-lora", "switch": "sometimes"}, "sometimes"),
        ({"trainer": "tiny-lora", "policy_steps": 0}, "policy_steps"),
        ({"trainer": "tiny-lora", "time_limit_s": 601}, "trainer tiny-lora's own limit"),
        ({"trainer": "tiny-lora", "switch": "patience", "patience": 3}, "campaign's patience"),
        ({"switch": "fixed"}, "trainer"),
    ],
)
def test_it_refuses_a_bad_alternation_without_creating_anything(
    make_client, researcher, start_body, alternation, message
):
    response = make_client(researcher, ["campaigns:run"]).post(
        CAMPAIGNS, {**start_body, "alternation": alternation}, format="json"
    )
    error = assert_error(response, 400, "invalid_input")
    assert message in str(error), error
    assert not Campaign.objects.exists()


def test_it_refuses_to_alternate_under_a_policy_no_vllm_endpoint_serves(
    make_client, researcher, start_body, policy_version
):
    body = {**start_body, "policy_version": policy_version.name, "alternation": ALTERNATION}
    error = assert_error(
        make_client(researcher, ["campaigns:run"]).post(CAMPAIGNS, body, format="json"),
        400,
        "invalid_input",
    )
    assert "only a vLLM endpoint or the coevo llama.cpp host loads" in error["message"]
    assert not Campaign.objects.exists()


def test_a_campaign_without_alternation_reports_no_phase(
    make_client, researcher, start_body, training
):
    response = make_client(researcher, ["campaigns:run"]).post(CAMPAIGNS, start_body, format="json")
    status = make_client(researcher, ["read"]).get(response.json()["status_url"]).json()
    assert (status["alternation"], status["phase"]) == ({}, None)
    assert status["current_policy_version"] == "base"


def test_proposals_carry_their_policy_export_and_training_run(
    make_client, viewer, project, tmp_path, training
):
    campaign = alternating_campaign(project, tmp_path, training.base)
    seed = campaign.seed_candidate
    Proposal.objects.create(
        campaign=campaign,
        sequence=0,
        kind="seed",
        candidate=seed,
        state=ProposalState.EVALUATED,
        policy_version=training.base,
        improved=True,
    )
    Proposal.objects.create(
        campaign=campaign,
        sequence=1,
        kind="policy",
        parent_shas=[seed.sha],
        candidate=seed,
        export=training.export,
        training_run=training.run,
        state=ProposalState.PROPOSED,
    )

    results = (
        make_client(viewer, ["read"]).get(f"{CAMPAIGNS}{campaign.id}/proposals/").json()["results"]
    )

    by_sequence = {p["sequence"]: p for p in results}
    assert by_sequence[0]["policy_version"] == "base" and by_sequence[0]["improved"] is True
    assert (by_sequence[0]["export"], by_sequence[0]["training_run"]) == (None, None)
    step = by_sequence[1]
    assert step["kind"] == "policy" and step["improved"] is False
    assert step["policy_version"] is None  # set once its training run registers a version
    assert step["export"] == str(training.export.id)
    assert step["training_run"] == str(training.run.id)

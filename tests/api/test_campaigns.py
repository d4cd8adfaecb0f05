"""Campaign resources: start (202 + status URL), status, proposals, pause/resume/stop, manual
candidates; the scope and the role each endpoint needs."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from coevo.campaigns.models import Campaign, CampaignState, Proposal
from coevo.projects.services import project_get_or_create
from harness_store.derive import candidate_derive
from tests.api.conftest import assert_error
from tests.campaigns.support import (
    AGENT,
    drive_round,
    marked_suite,
    proposer_endpoint,
    raced_campaign,
    styled_seed,
)
from tests.campaigns.test_agentic_proposer import proposer_program
from tests.campaigns.test_pages import make_campaign_data

BASE = "/api/v1/projects/demo/campaigns/"
PROMPT = "You are improving a harness. prompt-marker"


@pytest.fixture
def data(project, tmp_path, policy_version):
    data = make_campaign_data(project, tmp_path, policy_version)
    Proposal.objects.filter(campaign=data.campaign, sequence=3).update(
        prompt=PROMPT,
        response="HYPOTHESIS: strip twice",
        proposer_tokens=321,
        proposer_wall_ms=4_321,
        patch="--- a",
    )
    return data


@pytest.fixture
def start_body(project, tmp_path, policy_version):
    (tmp_path / "start").mkdir()
    seed = styled_seed(project, tmp_path / "start")
    marked_suite(project)
    return {"seed_candidate": seed.sha, "suite": "styled", "max_proposals": 3}


def test_it_starts_a_campaign_with_202_and_a_status_url(
    make_client, researcher, start_body, policy_version
):
    body = {
        **start_body,
        "name": "ci campaign",
        "strategy": [{"kind": "config"}],
        "patience": 2,
        "target_score": 0.9,
        "epochs": 2,
        "seed": 5,
        "budget": {
            "rollouts": 100,
            "wall_s": 600,
            "proposer_tokens": 10_000,
            "proposer_wall_s": 60,
        },
    }
    response = make_client(researcher, ["campaigns:run"]).post(BASE, body, format="json")

    assert response.status_code == 202, response.content
    out = response.json()
    assert response["Location"] == out["status_url"]
    assert out["status_url"].endswith(f"{BASE}{out['id']}/")
    assert out["dashboard_url"].endswith(f"/p/demo/campaigns/{out['id']}/")
    campaign = Campaign.objects.get(id=out["id"])
    assert out["state"] == campaign.state == CampaignState.RUNNING
    assert campaign.created_by == researcher and campaign.name == "ci campaign"
    assert (campaign.patience, campaign.target_score, campaign.epochs, campaign.seed) == (
        2,
        0.9,
        2,
        5,
    )
    assert (campaign.budget.limit_rollouts, campaign.budget.limit_tokens) == (100, None)
    assert (campaign.budget.limit_proposer_tokens, campaign.budget.limit_proposer_wall_ms) == (
        10_000,
        60_000,
    )
    assert campaign.policy_version == policy_version

    status = make_client(researcher, ["read"]).get(out["status_url"]).json()
    assert status["state"] == "running" and status["best"] is None
    assert status["spend"]["rollouts"] == {"spent": 0, "reserved": 0, "limit": 100}
    assert status["stop_rules"]["max_proposals"] == 3
    # Proposer spend apart from the policy's, its wall time (and limit) in milliseconds.
    assert status["spend"]["proposer_tokens"] == {"spent": 0, "reserved": 0, "limit": 10_000}
    assert status["spend"]["proposer_wall_ms"] == {"spent": 0, "reserved": 0, "limit": 60_000}


def test_it_sends_the_llm_patch_proposer_only_to_a_registered_endpoint(
    make_client, researcher, start_body
):
    client = make_client(researcher, ["campaigns:run"])
    for options in (
        {"base_url": "http://169.254.169.254/latest/meta-data/"},
        {"base_url": "http://127.0.0.1:6379"},
        {"endpoint": "nope"},
    ):
        strategy = [{"kind": "llm-patch", "options": options}]
        error = assert_error(
            client.post(BASE, {**start_body, "strategy": strategy}, format="json"),
            400,
            "invalid_input",
        )
        assert "registered policy endpoint" in error["message"]
    assert not Campaign.objects.exists()

    proposer_endpoint("http://10.0.0.7:8000/v1", name="big-model")
    strategy = [{"kind": "llm-patch", "options": {"endpoint": "big-model"}}]
    response = client.post(BASE, {**start_body, "strategy": strategy}, format="json")
    assert response.status_code == 202, response.content
    assert Campaign.objects.get().strategy[0]["options"]["endpoint"] == "big-model"


def test_it_names_an_unnamed_campaign_by_its_proposers_and_seed_as_the_dashboard_does(
    make_client, researcher, start_body
):
    proposer_endpoint("http://10.0.0.7:8000/v1", name="big-model")
    strategy = [{"kind": "config"}, {"kind": "llm-patch", "options": {"endpoint": "big-model"}}]
    response = make_client(researcher, ["campaigns:run"]).post(
        BASE, {**start_body, "name": "", "strategy": strategy}, format="json"
    )
    assert response.status_code == 202, response.content
    campaign = Campaign.objects.get()
    assert campaign.name == f"config+llm-patch {campaign.seed_candidate.short_sha}"


def test_it_refuses_bad_starts_without_creating_anything(make_client, researcher, start_body):
    client = make_client(researcher, ["campaigns:run"])
    assert_error(
        client.post(BASE, {**start_body, "strategy": [{"kind": "seed"}]}, format="json"),
        400,
        "invalid_input",
    )
    assert_error(
        client.post(
            BASE,
            {**start_body, "strategy": [{"kind": "config", "options": {"knobs": ["nope"]}}]},
            format="json",
        ),
        400,
        "invalid_input",
    )
    assert_error(
        client.post(BASE, {**start_body, "suite": "nope"}, format="json"), 404, "not_found"
    )
    assert_error(
        client.post(BASE, {**start_body, "seed_candidate": "0" * 40}, format="json"),
        404,
        "not_found",
    )
    assert_error(
        client.post(BASE, {**start_body, "max_proposals": 0}, format="json"), 400, "invalid_input"
    )
    assert not Campaign.objects.exists()


def test_it_refuses_an_agentic_program_of_another_project(
    make_client, researcher, start_body, tmp_path
):
    foreign = proposer_program(project_get_or_create(slug="other", name="Other"), tmp_path)
    strategy = [{"kind": "agentic", "options": {"program": foreign.sha}}]

    error = assert_error(
        make_client(researcher, ["campaigns:run"]).post(
            BASE, {**start_body, "strategy": strategy}, format="json"
        ),
        400,
        "invalid_input",
    )

    expected = f"program {foreign.sha}: no candidate of this project has that commit"
    assert expected in error["message"]
    assert not Campaign.objects.exists()


def test_it_refuses_proposer_limits_that_are_not_positive_integers(
    make_client, researcher, start_body
):
    client = make_client(researcher, ["campaigns:run"])
    for budget, field in (
        ({"proposer_tokens": 0}, "proposer_tokens"),
        ({"proposer_tokens": -5}, "proposer_tokens"),
        ({"proposer_tokens": "many"}, "proposer_tokens"),
        ({"proposer_wall_s": 1.5}, "proposer_wall_s"),
        ({"proposer_wall_s": 0}, "proposer_wall_s"),
    ):
        error = assert_error(
            client.post(BASE, {**start_body, "budget": budget}, format="json"),
            400,
            "invalid_input",
        )
        assert field in str(error), error
    # A misspelt limit is refused, not dropped (the campaign would run unlimited).
    error = assert_error(
        client.post(BASE, {**start_body, "budget": {"max_proposer_tokens": 10}}, format="json"),
        400,
        "invalid_input",
    )
    assert "max_proposer_tokens" in str(error), error
    assert not Campaign.objects.exists()


def test_starting_needs_the_scope_and_the_role(
    make_client, researcher, viewer, outsider, start_body
):
    assert_error(
        make_client(researcher, ["read", "evaluations:run"]).post(BASE, start_body, format="json"),
        403,
        "scope_missing",
    )
    assert_error(
        make_client(viewer, ["campaigns:run"]).post(BASE, start_body, format="json"),
        403,
        "permission_denied",
    )
    assert_error(
        make_client(outsider, ["campaigns:run"]).post(BASE, start_body, format="json"),
        404,
        "not_found",
    )
    assert_error(APIClient().post(BASE, start_body, format="json"), 401, "not_authenticated")
    assert not Campaign.objects.exists()


def test_it_reports_status_with_the_best_candidate_and_its_gap(make_client, viewer, data):
    client = make_client(viewer, ["read"])
    listed = client.get(BASE).json()["results"]
    assert [c["id"] for c in listed] == [str(data.campaign.id)]
    assert listed[0]["best_candidate"] == data.knob_child.sha

    status = client.get(f"{BASE}{data.campaign.id}/").json()
    assert status["best"]["candidate"] == data.knob_child.sha
    assert (status["best"]["search_score"], status["best"]["validation_score"]) == (1.0, 0.75)
    assert status["best"]["gap"] == pytest.approx(0.25)
    assert status["proposals"] == {
        "total": 4,
        "by_state": {"evaluated": 3, "invalid": 1},
    }
    assert status["dashboard_url"].endswith(f"/p/demo/campaigns/{data.campaign.id}/")
    assert status["proposals_url"].endswith(f"{BASE}{data.campaign.id}/proposals/")
    assert_error(client.get(f"{BASE}00000000-0000-0000-0000-000000000000/"), 404, "not_found")


def test_reading_needs_the_read_scope_and_membership(make_client, researcher, outsider, data):
    url = f"{BASE}{data.campaign.id}/"
    for path in (BASE, url, f"{url}proposals/"):
        assert_error(make_client(researcher, ["campaigns:run"]).get(path), 403, "scope_missing")
        assert_error(make_client(outsider, ["read"]).get(path), 404, "not_found")


def test_it_pages_proposals_and_shows_prompts_only_on_request(make_client, viewer, data):
    client = make_client(viewer, ["read"])
    url = f"{BASE}{data.campaign.id}/proposals/"

    page = client.get(url, {"limit": 2}).json()
    assert len(page["results"]) == 2 and page["next"]
    walked = [p["sequence"] for p in page["results"]]
    while page["next"]:
        page = client.get(page["next"]).json()
        walked += [p["sequence"] for p in page["results"]]
    assert sorted(walked) == [0, 1, 2, 3, 4]
    everything = client.get(url, {"limit": 50}).json()["results"]
    by_sequence = {p["sequence"]: p for p in everything}
    assert sorted(by_sequence) == [0, 1, 2, 3, 4]
    merge = by_sequence[4]
    assert merge["kind"] == "merge"
    assert merge["parents"] == [data.knob_child.sha, data.code_child.sha]
    assert merge["candidate"] == data.merge.sha
    assert merge["diff_url"].endswith(f"/p/demo/c/{data.merge.sha}/diff/")
    invalid = by_sequence[2]
    assert invalid["candidate"] is None and invalid["state"] == "invalid"
    assert invalid["stages"][-1]["ok"] is False and "SyntaxError" in invalid["stages"][-1]["reason"]
    assert "prompt" not in by_sequence[3] and "response" not in by_sequence[3]
    assert (by_sequence[3]["proposer_tokens"], by_sequence[3]["proposer_wall_ms"]) == (321, 4_321)

    detailed = client.get(url, {"detail": "1", "limit": 50}).json()["results"]
    patch = next(p for p in detailed if p["sequence"] == 3)
    assert patch["prompt"] == PROMPT and patch["response"].startswith("HYPOTHESIS")
    assert patch["patch"] == "--- a" and patch["shown"] == {}


def test_it_pauses_resumes_and_stops_with_202(make_client, researcher, data):
    client = make_client(researcher, ["campaigns:run"])
    url = f"{BASE}{data.campaign.id}/"

    paused = client.post(f"{url}pause/")
    assert paused.status_code == 202 and paused.json()["state"] == "paused"
    assert paused["Location"] == paused.json()["status_url"]
    assert_error(client.post(f"{url}pause/"), 409, "invalid_state")
    assert client.post(f"{url}resume/").json()["state"] == "running"
    stopped = client.post(f"{url}stop/")
    assert stopped.status_code == 202 and stopped.json()["state"] == "stopped"
    data.campaign.refresh_from_db()
    assert data.campaign.stop_reason == "stopped through the API by researcher"
    assert_error(client.post(f"{url}resume/"), 409, "invalid_state")


def test_acting_needs_the_scope_and_the_role(make_client, researcher, viewer, outsider, data):
    url = f"{BASE}{data.campaign.id}/"
    body = {"sha": data.code_child.sha}
    for action in ("pause/", "resume/", "stop/", "candidates/"):
        assert_error(
            make_client(researcher, ["read"]).post(f"{url}{action}", body, format="json"),
            403,
            "scope_missing",
        )
        assert_error(
            make_client(viewer, ["campaigns:run"]).post(f"{url}{action}", body, format="json"),
            403,
            "permission_denied",
        )
        assert_error(
            make_client(outsider, ["campaigns:run"]).post(f"{url}{action}", body, format="json"),
            404,
            "not_found",
        )
    data.campaign.refresh_from_db()
    assert data.campaign.state == CampaignState.RUNNING


def test_it_submits_a_manual_candidate(make_client, researcher, data, project):
    manual, _ = candidate_derive(
        project=project,
        parents=[data.knob_child],
        changes={"agent.py": ("# a human's fix\n" + AGENT).encode()},
        message="a human's fix",
        author_name="Researcher",
    )
    client = make_client(researcher, ["campaigns:run"])
    url = f"{BASE}{data.campaign.id}/candidates/"

    response = client.post(url, {"sha": manual.sha[:12]}, format="json")

    assert response.status_code == 202, response.content
    out = response.json()
    assert out["kind"] == "manual" and out["candidate"] == manual.sha
    assert out["status_url"].endswith(f"{BASE}{data.campaign.id}/")
    proposal = Proposal.objects.get(id=out["id"])
    assert (proposal.kind, proposal.candidate, proposal.campaign) == (
        "manual",
        manual,
        data.campaign,
    )
    assert [s["stage"] for s in proposal.stages][:3] == ["applies", "manifest", "imports"]
    # An ended campaign takes no more candidates.
    client.post(f"{BASE}{data.campaign.id}/stop/")
    assert_error(client.post(url, {"sha": manual.sha}, format="json"), 409, "invalid_state")
    assert_error(client.post(url, {"sha": "0" * 40}, format="json"), 404, "not_found")
    assert_error(client.post(url, {"sha": "xyz"}, format="json"), 400, "invalid_input")


@pytest.mark.django_db(transaction=True)
def test_it_shows_a_races_eliminations_and_the_rollouts_it_saved(
    make_client, viewer, project, tmp_path, policy_version
):
    campaign = drive_round(raced_campaign(project, tmp_path, policy_version))
    meh = Proposal.objects.get(campaign=campaign, params__style="meh")
    client = make_client(viewer, ["read"])

    detail = client.get(f"{BASE}{campaign.id}/").json()
    proposals = client.get(f"{BASE}{campaign.id}/proposals/").json()["results"]

    assert detail["batch_size"] == 3
    assert detail["rollouts_saved_by_racing"] == meh.rollouts_saved > 0
    by_sequence = {p["sequence"]: p for p in proposals}
    out = by_sequence[meh.sequence]
    assert out["batch"] == 1
    assert out["eliminated_by"] == meh.eliminated_by.sequence
    assert out["eliminated_after_tasks"] == meh.eliminated_after_tasks
    assert out["eliminated_at"] is not None
    assert out["elimination"]["kind"] in ("evidence", "out_of_reach")
    assert 0 <= out["elimination"]["p_value"] <= 1 and out["elimination"]["reason"]
    assert out["rollouts_saved"] == meh.rollouts_saved
    seed = by_sequence[0]
    assert seed["batch"] is None and seed["eliminated_by"] is None and seed["elimination"] is None


@pytest.mark.parametrize("size", [0, 17, "three"])
def test_it_refuses_a_batch_size_out_of_range(make_client, researcher, start_body, size):
    response = make_client(researcher, ["campaigns:run"]).post(
        BASE, {**start_body, "batch_size": size}, format="json"
    )

    error = assert_error(response, 400, "invalid_input")
    assert "batch_size" in str(error)

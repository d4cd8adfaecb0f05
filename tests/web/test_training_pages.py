"""Training run pages (list, run with its live log part, full log, cancel) and what an
alternating campaign adds to the campaign page and its start form. Runs are created by the
real service (no worker: its enqueue waits for a commit these tests never make) and moved
along in the database, shaped as the training worker records them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState
from coevo.campaigns.services import campaign_create
from coevo.exports.models import ExportState, TrajectoryExport
from coevo.policies.models import PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.training.models import Trainer, TrainingRun, TrainingState
from coevo.training.services import training_run_create
from coevo.training.trainers import trainer_register
from tests.campaigns.support import marked_suite, styled_seed
from tests.support.factories import make_user, make_vllm_policy

pytestmark = pytest.mark.django_db

LOG = "epoch 1 loss 0.93\nepoch 2 loss 0.41 <script>alert(1)</script>\n"
# What runs started before the argv left the log wrote first (start_run's command).
LEGACY_COMMAND_LINE = "$ python train.py --data /exports/a b.jsonl --out /runs/x/output\n"


@dataclass
class TrainingData:
    trainer: Trainer
    base: PolicyVersion
    export: TrajectoryExport
    run: TrainingRun


def make_training_data(project, owner) -> TrainingData:
    """A registered trainer, a vLLM-served base policy, a ready export and a pending run."""
    trainer = trainer_register(
        name="tiny-lora",
        command=["python", "train.py", "--data", "{export}", "--out", "{output_dir}"],
        env={"HF_TOKEN": "secret-env-marker"},
        time_limit_s=600,
        description="A tiny LoRA trainer",
    )
    base = make_vllm_policy()
    export = TrajectoryExport.objects.create(
        project=project,
        format="chat",
        filters={"splits": ["search"]},
        state=ExportState.READY,
        sha256="a" * 64,
        rows=12,
        rollouts=4,
        created_by=owner,
    )
    run = training_run_create(
        project=project, trainer=trainer, export=export, parent_policy=base, created_by=owner
    )
    return TrainingData(trainer, base, export, run)


def start_run(run: TrainingRun, *, log: str = LOG) -> None:
    """What the training worker writes once the command runs."""
    now = timezone.now()
    TrainingRun.objects.filter(id=run.id).update(
        state=TrainingState.RUNNING,
        started_at=now,
        heartbeat_at=now,
        command=["python", "train.py", "--data", "/exports/a b.jsonl", "--out", "/runs/x/output"],
        run_dir="/nonexistent/run-dir",
        log_tail=log,
        log_bytes=len(log),
    )
    run.refresh_from_db()


@pytest.fixture
def training(project, owner) -> TrainingData:
    return make_training_data(project, owner)


def as_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def run_url(run: TrainingRun, suffix: str = "") -> str:
    return f"/p/demo/training/{run.id}/{suffix}"


# --- the run page -----------------------------------------------------------------------------


def test_it_shows_a_running_run_with_its_log_and_polls_every_two_seconds(viewer, training):
    start_run(training.run)

    response = as_user(viewer).get(run_url(training.run))

    assert response.status_code == 200
    content = response.content.decode()
    assert "tiny-lora" in content and "A tiny LoRA trainer" in content
    assert 'id="training-state">running<' in content
    assert 'id="training-policy">base <' in content
    assert 'id="training-produced"><span class="muted">not yet</span>' in content
    assert f"/p/demo/exports/#export-{training.export.id}" in content
    assert f"/p/demo/exports/{training.export.id}/download" in content
    # The argv is the operator's: a member sees neither it nor its row.
    assert "train.py" not in content and 'id="training-command"' not in content
    assert "epoch 1 loss 0.93" in content
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content and "<script>alert" not in content
    assert f'hx-get="{run_url(training.run)}" hx-trigger="every 2s"' in content
    # A viewer may watch, not cancel; the environment is never shown.
    assert 'id="cancel-training"' not in content
    assert "secret-env-marker" not in content


def test_operators_see_the_argv_as_run_and_members_do_not(viewer, training):
    start_run(training.run, log=f"{LEGACY_COMMAND_LINE}{LOG}")
    operator = make_user("operator")
    operator.is_staff = True
    operator.save()
    operator.user_permissions.add(Permission.objects.get(codename="view_trainer"))
    # Staff without the trainers' permission are not operators (they cannot read a trainer in
    # the admin either).
    helpdesk = make_user("helpdesk")
    helpdesk.is_staff = True
    helpdesk.save()

    seen = as_user(operator).get(run_url(training.run)).content.decode()
    hidden = {
        user.username: as_user(user).get(run_url(training.run)).content.decode()
        for user in (viewer, helpdesk)
    }

    # The argv as run, quoted as a shell would need it; and the log as written.
    assert "python train.py --data &#x27;/exports/a b.jsonl&#x27; --out /runs/x/output" in seen
    assert 'id="training-log">$ python train.py --data /exports/a b.jsonl' in seen
    for name, content in hidden.items():
        # Nor in an older run's log, whose first line was the argv.
        assert "train.py" not in content and "/exports/a b.jsonl" not in content, name
        assert 'id="training-log">epoch 1 loss 0.93' in content, name


def test_the_poll_gets_the_live_part_alone_and_stops_once_the_run_is_final(viewer, training):
    start_run(training.run)
    client = as_user(viewer)

    live = client.get(run_url(training.run), HTTP_HX_REQUEST="true")
    assert live.status_code == 200
    assert live.content.decode().startswith('<section id="training-live"')
    assert "<html" not in live.content.decode() and 'hx-trigger="every 2s"' in live.content.decode()
    assert live["Vary"] and "HX-Request" in live["Vary"]

    TrainingRun.objects.filter(id=training.run.id).update(
        state=TrainingState.FAILED,
        state_detail="the command exited with status 3; the log's end says why",
        exit_code=3,
        finished_at=timezone.now(),
        log_tail=LOG + "Traceback: out of memory\n",
    )
    final = client.get(run_url(training.run), HTTP_HX_REQUEST="true").content.decode()
    assert 'id="training-state">failed<' in final
    assert "exited with status 3" in final and 'id="training-exit-code">3<' in final
    assert "Traceback: out of memory" in final
    assert "hx-get" not in final and "hx-trigger" not in final


def test_it_shows_the_produced_policy_version_of_a_succeeded_run(viewer, training):
    start_run(training.run)
    trained = policy_version_create(
        name="base-tiny-lora-1",
        endpoint=training.base.endpoint,
        adapter_name="base-tiny-lora-1",
        adapter_path="/adapters/base-tiny-lora-1",
        parent=training.base,
    )
    TrainingRun.objects.filter(id=training.run.id).update(
        state=TrainingState.SUCCEEDED,
        policy_version=trained,
        exit_code=0,
        adapter_sha256="b" * 64,
        finished_at=timezone.now(),
    )

    content = as_user(viewer).get(run_url(training.run)).content.decode()

    assert 'id="training-produced"><strong>base-tiny-lora-1</strong>' in content
    assert 'id="training-exit-code">0<' in content and "adapter bbbbbbbbbbbb" in content
    assert "hx-trigger" not in content
    assert "child of <strong>" + training.base.name + "</strong>" in content
    assert 'id="training-gguf"' not in content  # a vLLM adapter: no GGUF conversion


def test_it_shows_the_llama_cpp_conversion_a_policy_version_was_registered_with(viewer, training):
    start_run(training.run)
    gguf = {"tensors": 144, "modules": ["attn_q", "attn_v"], "rank": 8, "alpha": 16.0,
            "size_bytes": 2_959_072, "sha256": "c" * 64, "base_gguf_sha256": "d" * 64,
            "architecture": "gemma3", "base_gguf": "/models/gemma.gguf"}  # fmt: skip
    trained = policy_version_create(
        name="base-cpu-lora-1",
        endpoint=training.base.endpoint,
        adapter_name="base-cpu-lora-1",
        adapter_path="/adapters/base-cpu-lora-1",
        parent=training.base,
        provenance={"export_sha256": "e" * 64, "adapter_rank": 8, "adapter_gguf": gguf},
    )
    TrainingRun.objects.filter(id=training.run.id).update(
        state=TrainingState.SUCCEEDED, policy_version=trained, finished_at=timezone.now()
    )

    content = as_user(viewer).get(run_url(training.run)).content.decode()

    gguf_line = content.split('id="training-gguf">')[1].split("</span>\n")[0]
    assert "GGUF 144 tensors (attn_q, attn_v), rank 8" in gguf_line
    assert "cccccccccccc" in gguf_line and "dddddddddddd" in gguf_line and "gemma3" in gguf_line
    assert "eeeeeeeeeeee" in content
    assert "/models/gemma.gguf" not in content  # paths on the worker are the operators' business


def test_it_links_the_campaign_whose_policy_step_started_the_run(
    owner, project, tmp_path, training
):
    campaign = alternating_campaign(project, tmp_path, training.base)
    Proposal.objects.create(
        campaign=campaign,
        sequence=1,
        kind="policy",
        export=training.export,
        training_run=training.run,
        state=ProposalState.PROPOSED,
    )

    content = as_user(owner).get(run_url(training.run)).content.decode()

    assert f"/p/demo/campaigns/{campaign.id}/#proposal-1" in content
    assert "policy step #1" in content


def test_it_streams_the_full_log_while_it_is_on_this_machine(viewer, training, tmp_path):
    start_run(training.run)
    assert as_user(viewer).get(run_url(training.run, "log")).status_code == 404

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text("coevo: run starts\n" + "line\n" * 10_000)
    TrainingRun.objects.filter(id=training.run.id).update(run_dir=str(tmp_path / "run"))
    page = as_user(viewer).get(run_url(training.run)).content.decode()
    assert 'id="training-full-log"' in page

    response = as_user(viewer).get(run_url(training.run, "log"))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"].startswith("text/plain")
    body = b"".join(response.streaming_content)
    assert body.startswith(b"coevo: run starts\n") and body.count(b"line\n") == 10_000


def test_the_full_log_of_an_older_run_drops_its_argv_line_for_members(
    viewer, operator, training, tmp_path
):
    start_run(training.run)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train.log").write_text(LEGACY_COMMAND_LINE + "line\n" * 3)
    TrainingRun.objects.filter(id=training.run.id).update(run_dir=str(tmp_path / "run"))

    member = as_user(viewer).get(run_url(training.run, "log"))
    operators = as_user(operator).get(run_url(training.run, "log"))

    assert b"".join(member.streaming_content) == b"line\n" * 3
    assert int(member["Content-Length"]) == len(b"line\n" * 3)
    assert b"".join(operators.streaming_content) == (LEGACY_COMMAND_LINE + "line\n" * 3).encode()


def test_the_list_shows_the_project_runs_and_polls_while_one_is_open(viewer, training):
    client = as_user(viewer)
    content = client.get("/p/demo/training/").content.decode()
    assert run_url(training.run) in content
    assert "tiny-lora" in content and "pending" in content and "12 rows" in content
    assert 'hx-trigger="every 3s"' in content

    TrainingRun.objects.filter(id=training.run.id).update(state=TrainingState.CANCELLED)
    assert "hx-trigger" not in client.get("/p/demo/training/").content.decode()
    # Reached from the campaigns page (policy steps start runs).
    campaigns = client.get("/p/demo/campaigns/").content.decode()
    assert 'id="training-runs-link" href="/p/demo/training/"' in campaigns


def test_outsiders_get_404_and_anonymous_users_the_login_form(outsider, training):
    client = as_user(outsider)
    for url in ("/p/demo/training/", run_url(training.run), run_url(training.run, "log")):
        assert client.get(url).status_code == 404, url
        response = Client().get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    assert client.post(run_url(training.run, "cancel/")).status_code == 404
    training.run.refresh_from_db()
    assert training.run.state == TrainingState.PENDING


def test_a_run_of_another_project_is_not_found(viewer, training, owner):
    from coevo.projects.services import project_get_or_create

    other = project_get_or_create(slug="other", name="Other")
    membership_set(project=other, user=viewer, role=Role.VIEWER)
    assert as_user(viewer).get(f"/p/other/training/{training.run.id}/").status_code == 404


# --- cancel -----------------------------------------------------------------------------------


def test_researchers_cancel_a_pending_run_at_once(researcher, training):
    client = as_user(researcher)
    page = client.get(run_url(training.run)).content.decode()
    assert 'id="cancel-training"' in page and f'action="{run_url(training.run, "cancel/")}"' in page

    response = client.post(run_url(training.run, "cancel/"), follow=True)

    assert response.redirect_chain == [(run_url(training.run), 302)]
    training.run.refresh_from_db()
    assert training.run.state == TrainingState.CANCELLED
    assert training.run.state_detail == "cancelled before it started"
    assert "Training run cancelled." in response.content.decode()
    # A second cancel is refused with the reason, and changes nothing.
    again = client.post(run_url(training.run, "cancel/"), follow=True).content.decode()
    assert "nothing to cancel" in again


def test_cancelling_a_running_run_asks_its_worker_to_stop_it(researcher, training):
    start_run(training.run)

    response = as_user(researcher).post(run_url(training.run, "cancel/"), follow=True)

    training.run.refresh_from_db()
    assert training.run.state == TrainingState.RUNNING and training.run.cancel_requested
    content = response.content.decode()
    assert "Cancel requested" in content and "Cancelling…" in content


def test_a_viewer_cannot_cancel_even_with_a_crafted_post(viewer, training):
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    client.get(run_url(training.run))  # sets the CSRF cookie
    token = client.cookies["csrftoken"].value

    response = client.post(run_url(training.run, "cancel/"), {"csrfmiddlewaretoken": token})

    assert response.status_code == 403
    training.run.refresh_from_db()
    assert training.run.state == TrainingState.PENDING and not training.run.cancel_requested


def test_a_cancel_without_the_csrf_token_is_refused(researcher, training):
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)

    assert client.post(run_url(training.run, "cancel/")).status_code == 403
    assert client.get(run_url(training.run, "cancel/")).status_code == 405
    training.run.refresh_from_db()
    assert training.run.state == TrainingState.PENDING


# --- an alternating campaign ------------------------------------------------------------------

ALTERNATION = {
    "trainer": "tiny-lora",
    "switch": "fixed",
    "harness_steps": 1,
    "policy_steps": 1,
    "max_policy_steps": 2,
}


def alternating_campaign(project, tmp_path, base: PolicyVersion, **alternation) -> Campaign:
    (tmp_path / "seed").mkdir(exist_ok=True)
    return campaign_create(
        project=project,
        name="alternating",
        seed_candidate=styled_seed(project, tmp_path / "seed"),
        policy_version=base,
        suite=marked_suite(project),
        max_proposals=6,
        alternation={**ALTERNATION, **alternation},
    )


def test_the_campaign_page_shows_alternation_phase_and_policies(
    viewer, project, tmp_path, training
):
    campaign = alternating_campaign(project, tmp_path, training.base)
    trained = policy_version_create(
        name="base-tiny-lora-1",
        endpoint=training.base.endpoint,
        adapter_name="base-tiny-lora-1",
        adapter_path="/adapters/base-tiny-lora-1",
        parent=training.base,
    )
    seed = campaign.seed_candidate
    common = {"candidate": seed, "state": ProposalState.EVALUATED, "parent_shas": [seed.sha]}
    Proposal.objects.create(
        campaign=campaign, sequence=0, kind="seed", policy_version=training.base, **common
    )
    Proposal.objects.create(
        campaign=campaign, sequence=1, kind="config", policy_version=training.base, **common
    )
    Proposal.objects.create(
        campaign=campaign,
        sequence=2,
        kind="policy",
        policy_version=trained,
        export=training.export,
        training_run=training.run,
        improved=True,
        validation_score=0.75,
        **common,
    )
    Campaign.objects.filter(id=campaign.id).update(
        state=CampaignState.RUNNING,
        current_policy_version=trained,
        best_policy_version=trained,
        best_candidate=seed,
        best_validation_score=0.75,
    )

    client = as_user(viewer)
    content = client.get(f"/p/demo/campaigns/{campaign.id}/").content.decode()

    alternation = content.split('id="campaign-alternation">')[1].split("</dd>")[0]
    assert "<code>tiny-lora</code>" in alternation
    assert "fixed: 1 harness step, then 1 policy step" in alternation
    assert "at most 2 policy steps" in alternation and "successful only" in alternation
    policy = content.split('id="campaign-policy">')[1].split("</p>")[0]
    assert "now <strong>base-tiny-lora-1</strong>" in policy
    assert "under <strong>base-tiny-lora-1</strong>" in policy
    # One harness step then one policy step ended: the fixed schedule turns to harness steps.
    phase = content.split('id="campaign-phase">')[1].split("</p>")[0]
    assert ">harness<" in phase and "1 policy step(s) taken (fixed schedule)" in phase
    assert "(1/2 policy steps taken)" in phase
    rows = {n: content.split(f'id="proposal-{n}"')[1].split("</tr>")[0] for n in (0, 1, 2)}
    assert '<td class="policy">base' in rows[1] and "training-link" not in rows[1]
    assert '<td class="policy">base-tiny-lora-1' in rows[2]
    assert f'href="/p/demo/exports/#export-{training.export.id}"' in rows[2]
    assert f'href="{run_url(training.run)}"' in rows[2]

    # The live part (polled) carries the phase and the policy column too.
    live = client.get(f"/p/demo/campaigns/{campaign.id}/", HTTP_HX_REQUEST="true")
    assert 'id="campaign-phase"' in live.content.decode()
    assert 'class="training-link"' in live.content.decode()


def test_a_campaign_that_does_not_alternate_shows_no_phase(
    viewer, project, tmp_path, policy_version
):
    campaign = campaign_create(
        project=project,
        name="plain",
        seed_candidate=styled_seed(project, tmp_path),
        policy_version=policy_version,
        suite=marked_suite(project),
    )
    content = as_user(viewer).get(f"/p/demo/campaigns/{campaign.id}/").content.decode()
    assert "campaign-alternation" not in content and "campaign-phase" not in content
    assert f"now <strong>{policy_version.name}</strong>" in content


# --- the start form ---------------------------------------------------------------------------


def start_form(seed, suite, policy_version, **overrides) -> dict:
    values = {
        "seed_candidate": seed.sha,
        "policy_version": str(policy_version.pk),
        "suite": str(suite.pk),
        "proposers": ["config"],
        "llm_api": "completions",
        "max_proposals": "5",
        "patience": "4",
        "epochs": "1",
        "random_seed": "0",
    }
    values.update(overrides)
    return values


def test_the_start_form_offers_alternation_only_with_an_enabled_trainer(
    researcher, project, training
):
    client = as_user(researcher)
    form = client.get("/p/demo/campaigns/new/").content.decode()
    assert 'id="alternation-fields"' in form and '<option value="tiny-lora">' in form

    Trainer.objects.update(enabled=False)
    assert 'id="alternation-fields"' not in client.get("/p/demo/campaigns/new/").content.decode()


def test_it_starts_an_alternating_campaign_from_the_form(researcher, project, tmp_path, training):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)

    response = as_user(researcher).post(
        "/p/demo/campaigns/new/",
        start_form(
            seed,
            suite,
            training.base,
            alternation_trainer="tiny-lora",
            alternation_switch="patience",
            alternation_patience="2",
            alternation_max_policy_steps="1",
        ),
    )

    campaign = Campaign.objects.get()
    assert response.status_code == 302, response.content.decode()[:2000]
    assert campaign.alternation["trainer"] == "tiny-lora"
    assert (campaign.alternation["switch"], campaign.alternation["patience"]) == ("patience", 2)
    assert campaign.alternation["max_policy_steps"] == 1
    assert campaign.alternation["harness_steps"] == 3  # blank: the default
    assert campaign.current_policy_version == training.base


def test_without_a_trainer_the_form_starts_a_harness_only_campaign(
    researcher, project, tmp_path, training
):
    seed = styled_seed(project, tmp_path)
    response = as_user(researcher).post(
        "/p/demo/campaigns/new/",
        start_form(seed, marked_suite(project), training.base, alternation_harness_steps="2"),
    )
    assert response.status_code == 302
    assert Campaign.objects.get().alternation == {}


def test_the_form_shows_what_the_alternation_check_refused(
    researcher, project, tmp_path, training, policy_version
):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    client = as_user(researcher)

    # The default (scripted, OpenAI-compatible) policy cannot load an adapter.
    refused = client.post(
        "/p/demo/campaigns/new/",
        start_form(seed, suite, policy_version, alternation_trainer="tiny-lora"),
    )
    assert refused.status_code == 400
    errors = refused.content.decode().split('id="form-errors"')[1].split("</div>")[0]
    assert "only a vLLM endpoint or the coevo llama.cpp host loads" in errors

    # A switch patience the campaign's own patience would cut short.
    refused = client.post(
        "/p/demo/campaigns/new/",
        start_form(
            seed,
            suite,
            training.base,
            alternation_trainer="tiny-lora",
            alternation_switch="patience",
            alternation_patience="4",
        ),
    )
    assert refused.status_code == 400
    assert "must be below the campaign&#x27;s patience" in refused.content.decode()

    out_of_range = client.post(
        "/p/demo/campaigns/new/",
        start_form(
            seed,
            suite,
            training.base,
            alternation_trainer="tiny-lora",
            alternation_policy_steps="0",
        ),
    )
    assert out_of_range.status_code == 400
    assert 'id="error-alternation_policy_steps"' in out_of_range.content.decode()
    assert not Campaign.objects.exists()

"""The agentic proposer (Meta-Harness) with a real worker: a proposer program, itself a
candidate of the project, runs in the sandbox with the parent's tree at /app and the campaign's
history at /history, asks the proposer endpoint through its own model boundary, and what it
leaves in /app becomes the proposal, judged by the campaign's stages. Validation and held-out
material never reaches its history, its requests or its record."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from coevo.campaigns.models import Campaign, CampaignState, ProposalState, ProposerKind
from coevo.campaigns.proposers import strategy_validate
from coevo.campaigns.proposers.agentic import agentic_history_write
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.errors import InvalidInput
from coevo.evaluations.models import TraceStep
from coevo.projects.services import project_get_or_create
from harness_store.services import candidate_import_directory
from tests.campaigns.support import (
    MARKER,
    drive,
    marked_suite,
    proposer_endpoint,
    styled_seed,
)
from tests.conftest import wait_until_final
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy

# A proposer program with no dependencies: reads the history, asks the model which style to
# use, writes it into the working copy's harness.toml, and states its hypothesis. Its second
# run edits a file outside the components (rejected at "applies").
PROGRAM = """
import glob, json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
record = open("/history/record.md").read()
assert task["workspace"] == "/app" and "agent.py" in task["components"], task
assert "per-task search scores" in record
assert glob.glob("/history/candidates/*/agent.py")
body = {"model": "proposer-model", "messages": [
    {"role": "user", "content": task["instruction"] + "\\n\\n" + record[-2000:]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"].strip()
if reply == "stray":
    open("/app/notes.txt", "w").write("a file outside the components")
else:
    manifest = open("/app/harness.toml").read()
    open("/app/harness.toml", "w").write(manifest.replace('default = "bad"', f'default = "{reply}"'))
json.dump(f"the {reply} style answers right", open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


class QueuedProposer(ScriptedPolicy):
    def __init__(self, answers: list[str]) -> None:
        super().__init__()
        self.answers = list(answers)

    def reply_for(self, text: str) -> str:
        return self.answers.pop(0) if self.answers else "bad"


@pytest.fixture
def proposer_server():
    policy = QueuedProposer(["stray", "good"])
    policy.model = "proposer-model"
    with ScriptedOpenAIServer(policy) as server:
        proposer_endpoint(server.url)
        yield policy


def proposer_program(project, tmp_path, *, source: str = PROGRAM):
    directory = tmp_path / "proposer"
    directory.mkdir()
    (directory / "harness.toml").write_text(
        '[harness]\nname = "proposer"\ncommand = ["python", "propose.py"]\n'
        "[limits]\nmax_model_calls = 4\nwall_time_s = 120\n"
    )
    (directory / "propose.py").write_text(textwrap.dedent(source))
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="proposer", author_name="Owner"
    )
    return candidate


def test_the_agents_edits_become_proposals_judged_by_the_campaigns_stages(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy, proposer_server
):
    from coevo.evaluations.services import evaluation_create

    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.default = "no"
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    heldout = evaluation_create(
        candidate=seed, suite=suite, split="heldout", policy_version=policy_version,
        purpose="promotion",
    )  # fmt: skip
    program = proposer_program(project, tmp_path)
    campaign = campaign_create(
        project=project,
        name="agentic",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[
            {
                "kind": "agentic",
                "options": {"program": program.sha[:12], "endpoint": "proposer"},
            }
        ],
        max_proposals=2,
    )
    campaign_start(campaign=campaign)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason

    stray, good = campaign.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence")
    assert (stray.kind, stray.state) == (ProposerKind.AGENTIC, ProposalState.INVALID)
    assert "'notes.txt' is outside the declared components" in stray.stages[0]["reason"]
    assert good.state == ProposalState.EVALUATED, (good.stages, good.state_detail)
    assert good.validation_score == 1.0 and campaign.best_candidate_id == good.candidate_id
    assert good.candidate.message.startswith("agentic: the good style answers right\n")
    assert good.candidate.parent_shas == [seed.sha]
    assert '+default = "good"' in good.patch
    assert good.proposer_tokens > 0 and good.proposer_wall_ms > 0
    assert good.params["program"] == program.sha and good.params["model_calls"] == 1
    assert "[model] good" in good.response
    assert seed.sha in good.shown["history_candidates"]

    # The seal: the marker is in validation and held-out traces, never in what the agent got.
    wait_until_final(heldout)
    for split in ("validation", "heldout"):
        assert TraceStep.objects.filter(
            rollout__task__split=split, payload__icontains=MARKER
        ).exists()
    assert len(proposer_server.requests) == 2
    for request in proposer_server.requests:
        assert MARKER not in json.dumps(request)
    for p in (stray, good):
        assert MARKER not in json.dumps([p.prompt, p.shown, p.response])


# Its hypothesis (the answer) and the model's reply (the transcript) hold a NUL, which
# PostgreSQL's text and jsonb refuse.
NUL_PROGRAM = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
body = {"model": "proposer-model", "messages": [{"role": "user", "content": task["instruction"]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
manifest = open("/app/harness.toml").read()
open("/app/harness.toml", "w").write(manifest.replace('default = "bad"', 'default = "good"'))
json.dump("the good\\u0000 style: " + reply, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


@pytest.mark.django_db(transaction=True)
def test_it_records_an_answer_and_transcript_holding_characters_the_database_refuses(
    project, tmp_path, policy_version
):
    policy = QueuedProposer(["go\u0000od"])
    policy.model = "proposer-model"
    with ScriptedOpenAIServer(policy) as server:
        proposer_endpoint(server.url)
        program = proposer_program(project, tmp_path, source=NUL_PROGRAM)
        campaign = campaign_create(
            project=project,
            name="nul",
            seed_candidate=styled_seed(project, tmp_path),
            policy_version=policy_version,
            suite=marked_suite(project),
            strategy=[
                {"kind": "agentic", "options": {"program": program.sha, "endpoint": "proposer"}}
            ],
            max_proposals=1,
        )
        campaign_start(campaign=campaign)
        drive(campaign, lambda proposal: False)

    proposal = campaign.proposals.get(sequence=1)
    assert proposal.params["hypothesis"] == "the good\ufffd style: go\ufffdod"
    assert proposal.candidate.message.startswith("agentic: the good\ufffd style: go\ufffdod\n")
    assert "[model] go\ufffdod" in proposal.response
    assert all(stage["ok"] for stage in proposal.stages), proposal.stages
    assert '+default = "good"' in proposal.patch


def test_its_history_holds_no_sealed_material(project, tmp_path, policy_version):
    """The files the agent greps, written from a campaign whose validation and held-out
    evaluations carry the marker in their inputs and traces."""
    from coevo.evaluations.services import evaluation_create, rollout_claim, rollout_finish

    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    for split in ("search", "validation", "heldout"):
        evaluation = evaluation_create(
            candidate=seed,
            suite=suite,
            split=split,
            policy_version=policy_version,
            **({"purpose": "promotion"} if split == "heldout" else {}),
        )
        for rollout in evaluation.rollouts.select_related("task"):
            claimed = rollout_claim(rollout_id=rollout.id, worker="t")
            TraceStep.objects.create(
                rollout=claimed,
                index=0,
                kind="model_call",
                payload={"prompt": f"{rollout.task.inputs['input']}", "completion": "no"},
            )
            rollout_finish(rollout=claimed, outcome="task_failure", score=0.0, detail="wrong")
    campaign = campaign_create(
        project=project,
        name="history",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[{"kind": "config"}],
    )
    from harness_store.manifest import load_manifest

    directory = tmp_path / "history"
    directory.mkdir()
    manifest = load_manifest(_export(seed, tmp_path / "seed"))
    shown = agentic_history_write(
        campaign=campaign, parent=seed, manifest=manifest, directory=directory
    )
    files = [p for p in directory.rglob("*") if p.is_file()]
    assert {"record.md", "shown.json"} <= {p.name for p in files}
    assert (directory / "candidates" / seed.sha / "agent.py").is_file()
    for path in files:
        assert MARKER not in path.read_text(errors="replace"), path
    assert MARKER not in json.dumps(shown)
    assert oct(directory.stat().st_mode & 0o777) == "0o755"


def _export(candidate, destination):
    from harness_store.selectors import candidate_export

    destination.mkdir()
    candidate_export(candidate=candidate, destination=destination)
    return destination


def test_it_validates_agentic_options(project, tmp_path):
    from harness_store.manifest import load_manifest

    manifest = load_manifest(_export(styled_seed(project, tmp_path), tmp_path / "seed"))
    program = proposer_program(project, tmp_path)
    (entry,) = strategy_validate(
        strategy=[{"kind": "agentic", "options": {"program": program.sha[:10].upper()}}],
        manifest=manifest,
        project=project,
    )
    # Kept whole: a candidate imported later cannot make the prefix name two programs.
    assert entry["options"]["program"] == program.sha
    assert entry["options"]["timeout_s"] == 240 and entry["options"]["history_candidates"] == 12
    for options, message in [
        ({"program": "abcdef1"}, "program abcdef1: no candidate of this project has that commit"),
        ({}, "program must be the SHA"),
        ({"program": "xyz"}, "program must be the SHA"),
        ({"program": "abcdef1", "timeout_s": 600}, "timeout_s must be at most 270"),
        ({"program": "abcdef1", "knobs": []}, "knobs must be an object"),
        ({"program": "abcdef1", "history_candidates": 99}, "history_candidates must be"),
        ({"program": "abcdef1", "endpoint": "nowhere"}, "not a registered policy endpoint"),
        ({"program": "abcdef1", "temperature": 1}, "unknown options ['temperature']"),
    ]:
        with pytest.raises(InvalidInput, match="agentic proposer") as caught:
            strategy_validate(
                strategy=[{"kind": "agentic", "options": options}],
                manifest=manifest,
                project=project,
            )
        assert message in str(caught.value), (options, caught.value)


def test_it_refuses_a_program_of_another_project_when_the_campaign_is_created(
    project, tmp_path, policy_version
):
    """It used to be accepted, and every draft then failed with "not a candidate"."""
    other = project_get_or_create(slug="other", name="Other")
    foreign = proposer_program(other, tmp_path)
    seed = styled_seed(project, tmp_path)

    with pytest.raises(InvalidInput) as caught:
        campaign_create(
            project=project,
            name="agentic",
            seed_candidate=seed,
            policy_version=policy_version,
            suite=marked_suite(project),
            strategy=[{"kind": "agentic", "options": {"program": foreign.sha}}],
        )

    assert f"program {foreign.sha}: no candidate of this project has that commit" in str(
        caught.value
    )
    assert not Campaign.objects.exists()

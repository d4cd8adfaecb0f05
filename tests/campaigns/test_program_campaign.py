"""A config campaign on a program harness, run by a real worker against the scripted policy:
the proposer edits the program's knob defaults in harness.toml, each proposal passes the
import stage and is evaluated through the boundary, and the campaign keeps the best on
validation."""

from __future__ import annotations

import textwrap
import time

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from harness_store.services import candidate_import_directory
from tests.campaigns.support import marked_suite

MANIFEST = """
[harness]
name = "styled-program"
command = ["python", "main.py"]
components = ["main.py", "harness.toml"]

[knobs.style]
type = "choice"
default = "bad"
choices = ["bad", "good"]

[limits]
max_model_calls = 2
wall_time_s = 60
"""

PROGRAM = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
body = {"model": "m", "messages": [
    {"role": "user", "content": f"style={os.environ['COEVO_KNOB_STYLE']} {task['input']}"}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request))
json.dump(reply["choices"][0]["message"]["content"], open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def test_a_config_campaign_improves_a_program_harness_on_a_real_worker(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy
):
    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.default = "no"
    directory = tmp_path / "program"
    directory.mkdir()
    (directory / "harness.toml").write_text(textwrap.dedent(MANIFEST))
    (directory / "main.py").write_text(textwrap.dedent(PROGRAM))
    seed, _ = candidate_import_directory(
        project=project, directory=directory, message="styled program", author_name="Owner"
    )
    campaign = campaign_create(
        project=project,
        name="program",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=marked_suite(project),
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
        max_proposals=2,
        seed=3,
    )
    campaign_start(campaign=campaign)

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    proposals = list(campaign.proposals.order_by("sequence"))
    assert proposals[0].kind == ProposerKind.SEED and proposals[0].validation_score == 0.0
    good = [p for p in proposals if p.state == ProposalState.EVALUATED and p.kind == "config"]
    assert good, [(p.params, p.state, p.state_detail) for p in proposals]
    assert good[0].params == {"style": "good"}
    assert good[0].validation_score == 1.0
    assert 'default = "good"' in good[0].patch
    assert campaign.best_candidate_id == good[0].candidate_id

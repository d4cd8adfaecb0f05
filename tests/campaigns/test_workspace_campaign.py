"""A config campaign on a workspace suite (Harbor tasks), run by a real worker against the
scripted policy: proposals pass the import stage, every evaluation works in real workspaces
verified by each task's test.sh, failure patterns come from the test output, and the campaign
keeps the best on validation."""

from __future__ import annotations

import json
import textwrap
import time

from coevo.campaigns.models import CampaignState, FailurePattern, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.evaluations.models import (
    Rollout,
)
from coevo.exports.services import export_path, trajectory_export_build, trajectory_export_create
from coevo.suites.harbor import suite_import_harbor
from coevo.suites.models import Split
from coevo.suites.splits import split_for
from harness_store.services import candidate_import_directory
from workers.outcomes import RolloutOutcome

MANIFEST = """
[harness]
name = "word-writer"
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

# Asks the model whether to do the task; writes the instruction's word to answer.txt if so.
PROGRAM = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
body = {"model": "m", "messages": [
    {"role": "user", "content": f"style={os.environ['COEVO_KNOB_STYLE']} {task['instruction']}"}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
if reply == "yes":
    word = task["instruction"].split()[1]
    open(os.path.join(os.environ["COEVO_WORKSPACE"], "answer.txt"), "w").write(word + "\\n")
"""

TEST_SH = """#!/bin/bash
cd /app
python -m pytest -q -p no:cacheprovider /tests/test_answer.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def harbor_tasks(root, count: int = 12):
    for i in range(count):
        task = root / f"word-{i:02d}"
        (task / "environment" / "workspace").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "instruction.md").write_text(f"Write word{i} to answer.txt.\n")
        (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
        (task / "environment" / "Dockerfile").write_text(
            "FROM python:3.11-slim\nWORKDIR /app\nCOPY workspace/ /app/\n"
        )
        (task / "environment" / "workspace" / "README.md").write_text("answer.txt goes here\n")
        (task / "tests" / "test.sh").write_text(TEST_SH)
        (task / "tests" / "test_answer.py").write_text(
            "def test_the_answer():\n"
            f"    assert open('/app/answer.txt').read().strip() == 'word{i}'\n"
        )
    return root


def test_a_config_campaign_improves_a_harness_on_a_workspace_suite(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy, settings
):
    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.default = "no"
    keys = [f"word-{i:02d}" for i in range(12)]
    # A seed that puts tasks in every split (the split is a hash of seed and key).
    seed_value = next(
        str(s) for s in range(100) if len({split_for(k, seed=str(s)) for k in keys}) == 3
    )
    suite, _, report = suite_import_harbor(
        project=project,
        name="words",
        directory=harbor_tasks(tmp_path / "tasks"),
        split_seed=seed_value,
    )
    assert len(report.taken) == 12
    splits = set(suite.tasks.values_list("split", flat=True))
    assert {Split.SEARCH, Split.VALIDATION} <= splits
    directory = tmp_path / "program"
    directory.mkdir()
    (directory / "harness.toml").write_text(textwrap.dedent(MANIFEST))
    (directory / "main.py").write_text(textwrap.dedent(PROGRAM))
    seed, _ = candidate_import_directory(
        project=project, directory=directory, message="word writer", author_name="Owner"
    )
    campaign = campaign_create(
        project=project,
        name="words",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": ["style"]}}],
        max_proposals=2,
        seed=3,
    )
    campaign_start(campaign=campaign)

    deadline = time.monotonic() + 300
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
    assert good[0].params == {"style": "good"} and good[0].validation_score == 1.0
    assert campaign.best_candidate_id == good[0].candidate_id
    # The seed's failures are grouped by what the hidden tests said.
    names = list(FailurePattern.objects.filter(campaign=campaign).values_list("name", flat=True))
    assert names and any("hidden tests failed" in name for name in names), names

    # The best candidate's search trajectories export, harness-matched, as on any suite.
    settings.COEVO_EXPORT_DIR = str(tmp_path / "exports")
    export = trajectory_export_create(
        project=project,
        format="chat",
        created_by=None,
        splits=["search"],
        candidate=good[0].candidate,
        suite=suite,
        successful_only=True,
    )
    built = trajectory_export_build(export_id=export.id)
    assert built is not None and built.state == "ready", built and built.state_detail
    rows = [json.loads(line) for line in export_path(sha256=built.sha256).read_text().splitlines()]
    passed = Rollout.objects.filter(
        evaluation__candidate=good[0].candidate,
        evaluation__split=Split.SEARCH,
        evaluation__suite=suite,
        outcome=RolloutOutcome.PASSED,
    ).count()
    assert passed and len(rows) == passed
    assert all("Write word" in json.dumps(row["messages"]) for row in rows)

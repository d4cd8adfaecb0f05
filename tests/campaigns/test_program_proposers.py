"""llm-patch and merge on a program harness: its manifest names a command, not an entrypoint,
and declares components (a file and a directory). The proposer's workspace describes the
program's contract, its edits stay inside the components, and the imports stage checks the
command (the program is there, its script parses) instead of importing an entrypoint."""

from __future__ import annotations

import json
import time

import pytest

from coevo.campaigns.edits import EditRejected, answer_parse, edits_apply
from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start, campaign_submit_candidate
from harness_store.selectors import candidate_read_file
from harness_store.services import candidate_import_directory
from tests.campaigns.merge_support import drive_tasks, human_commit, make_campaign, passing
from tests.campaigns.support import MARKER, marked_suite, proposer_endpoint
from tests.campaigns.test_llm_patch import QueuedProposer, block
from tests.support.openai_server import ScriptedOpenAIServer

MANIFEST = """[harness]
name = "prog"
command = ["python3", "agent.py"]
components = ["agent.py", "prompts/"]

[limits]
max_model_calls = 4
max_tokens = 400
wall_time_s = 30
"""

# The unmodified openai SDK: the prompt file decides the style, a tool is offered, and a tool
# call is answered before the final reply.
AGENT = """import json, os
from openai import OpenAI

client = OpenAI()
task = json.load(open(os.environ["COEVO_TASK_FILE"]))
style = open("prompts/style.txt").read().strip()
tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]
messages = [{"role": "user", "content": style + " " + task["input"]}]
reply = client.chat.completions.create(
    model="m", messages=messages, tools=tools, max_tokens=8).choices[0].message
if reply.tool_calls:
    messages.append(reply.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "nothing found"}
                 for c in reply.tool_calls]
    reply = client.chat.completions.create(
        model="m", messages=messages, tools=tools, max_tokens=8).choices[0].message
json.dump((reply.content or "").strip(), open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""
STYLE_LINE = 'style = open("prompts/style.txt").read().strip()\n'


def program_seed(project, tmp_path):
    directory = tmp_path / "prog"
    (directory / "prompts").mkdir(parents=True)
    (directory / "harness.toml").write_text(MANIFEST)
    (directory / "agent.py").write_text(AGENT)
    (directory / "prompts" / "style.txt").write_text("style=bad\n")
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="program seed", author_name="Owner"
    )
    return candidate


ANSWERS = [
    # 1 the manifest is not a component: widening the components is refused before anything
    "HYPOTHESIS: more room\n"
    + block(
        "harness.toml",
        'components = ["agent.py", "prompts/"]\n',
        'components = ["agent.py", "prompts/", "bin/"]\n',
    ),
    # 2 the program's script no longer parses: rejected at imports, never run
    "HYPOTHESIS: broken\n" + block("agent.py", STYLE_LINE, "style = (\n"),
    # 3 good: a file inside the prompts/ component
    "HYPOTHESIS: the good style answers right\n"
    + block("prompts/style.txt", "style=bad\n", "style=good\n"),
]


def test_llm_patch_edits_a_program_harness_and_checks_its_command(
    celery_worker_thread, project, tmp_path, policy_version, scripted_policy
):
    scripted_policy.rules.append(("style=good", "yes"))
    scripted_policy.tool_rules.append(("style=bad", [("lookup", {"q": "sky"})]))
    scripted_policy.default = "no"
    seed = program_seed(project, tmp_path)
    suite = marked_suite(project)
    proposer = QueuedProposer(ANSWERS)
    with ScriptedOpenAIServer(proposer) as server:
        proposer_endpoint(server.url)
        campaign = campaign_create(
            project=project,
            name="program",
            seed_candidate=seed,
            policy_version=policy_version,
            suite=suite,
            strategy=[{"kind": "llm-patch", "options": {"endpoint": "proposer"}}],
            max_proposals=len(ANSWERS),
        )
        campaign_start(campaign=campaign)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            campaign.refresh_from_db()
            if campaign.is_final:
                break
            time.sleep(0.5)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason

    widen, broken, good = campaign.proposals.exclude(kind=ProposerKind.SEED).order_by("sequence")
    assert [s["stage"] for s in widen.stages] == ["applies"] and widen.state == "invalid"
    assert "harness.toml is not a declared component" in widen.stages[0]["reason"]
    assert [(s["stage"], s["ok"]) for s in broken.stages] == [
        ("applies", True),
        ("manifest", True),
        ("imports", False),
    ]
    assert "agent.py does not parse: SyntaxError" in broken.stages[-1]["reason"]
    assert broken.search_evaluation_id is None

    assert good.state == ProposalState.EVALUATED, (good.stages, good.state_detail)
    assert all(s["ok"] for s in good.stages), good.stages
    assert [s["stage"] for s in good.stages] == [
        "applies", "manifest", "imports", "duplicate", "smoke",
    ]  # fmt: skip
    assert "python3 is there and agent.py parses" in good.stages[2]["reason"]
    assert good.search_score == 1.0 and campaign.best_candidate_id == good.candidate_id
    assert candidate_read_file(candidate=good.candidate, path="prompts/style.txt") == (
        b"style=good\n"
    )

    # The workspace described a program, showed its components and its tool-calling traces.
    prompt = good.prompt
    assert 'command: ["python3", "agent.py"]' in prompt and "entrypoint:" not in prompt
    assert "$COEVO_ANSWER_FILE" in prompt and "def run(task, ctx)" not in prompt
    assert "### prompts/style.txt" in prompt and "### agent.py" in prompt
    assert '[model called tools] lookup({"q": "sky"})' in prompt
    assert "[program exited with 0]" in prompt
    assert sorted(good.shown["files"]) == [
        "agent.py",
        "harness.toml (read-only)",
        "prompts/style.txt",
    ]
    # The seal holds for a program's traces as for any: no validation or held-out input.
    assert len(proposer.requests) == len(ANSWERS)
    for p in (widen, broken, good):
        assert MARKER not in json.dumps([p.prompt, p.shown])


@pytest.mark.django_db(transaction=True)
def test_merge_combines_two_program_candidates_and_checks_the_merged_command(
    project, tmp_path, policy_version, owner
):
    seed = program_seed(project, tmp_path)
    suite = marked_suite(project)
    campaign = make_campaign(
        project, seed, suite, policy_version, max_proposals=3, strategy=[{"kind": "merge"}]
    )
    prompts = human_commit(project, seed, {"prompts/hint.txt": b"think first\n"}, "human prompts")
    agent = human_commit(
        project, seed, {"agent.py": (AGENT + "# retries\n").encode()}, "human agent"
    )
    for candidate in (prompts, agent):
        proposal = campaign_submit_candidate(
            campaign=campaign, candidate=candidate, submitted_by=owner
        )
        # A submitted program harness passes the imports stage on its command.
        imports = next(s for s in proposal.stages if s["stage"] == "imports")
        assert imports["ok"] and "agent.py parses" in imports["reason"], proposal.stages
    campaign_start(campaign=campaign)

    campaign = drive_tasks(
        campaign,
        passing(
            {
                "human prompts": {"s0", "s1"},
                "human agent": {"s2"},
                "merge": {"s0", "s1", "s2", "v0", "v1"},
            }
        ),
    )
    merged = campaign.proposals.filter(kind=ProposerKind.MERGE).order_by("sequence").first()
    assert merged.state == ProposalState.EVALUATED, merged.stages
    assert merged.parent_shas == [prompts.sha, agent.sha]
    assert [s["stage"] for s in merged.stages][:3] == ["applies", "manifest", "imports"]
    assert all(s["ok"] for s in merged.stages), merged.stages
    assert "agent.py parses" in merged.stages[2]["reason"]
    assert candidate_read_file(candidate=merged.candidate, path="prompts/hint.txt")
    assert candidate_read_file(candidate=merged.candidate, path="agent.py").endswith(b"# retries\n")
    assert campaign.best_candidate == merged.candidate


def test_a_proposer_may_not_change_where_a_program_starts():
    """With the manifest itself a component, the command is as fixed as an entrypoint."""
    manifest = MANIFEST.replace('"prompts/"]', '"prompts/", "harness.toml"]')
    components = ("agent.py", "prompts/", "harness.toml")
    answer = answer_parse(
        "HYPOTHESIS: another program\n"
        + block(
            "harness.toml",
            'command = ["python3", "agent.py"]\n',
            'command = ["python3", "other.py"]\n',
        )
    )
    with pytest.raises(EditRejected, match=r"changes \[harness\] command"):
        edits_apply(answer=answer, files={"harness.toml": manifest}, components=components)
    limits = answer_parse(
        "HYPOTHESIS: more calls\n"
        + block("harness.toml", "max_model_calls = 4\n", "max_model_calls = 3\n")
    )
    changed = edits_apply(answer=limits, files={"harness.toml": manifest}, components=components)
    assert b"max_model_calls = 3" in changed["harness.toml"]

"""The merge proposer: two candidates best on different search tasks, merged with git."""

from __future__ import annotations

import json

import pytest

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.proposers.merge import NO_PAIR_REASON, merge_options_validate
from coevo.campaigns.runner import campaign_advance
from coevo.campaigns.services import campaign_start, campaign_submit_candidate
from coevo.errors import InvalidInput
from harness_store.selectors import candidate_read_file
from tests.campaigns.merge_support import drive_tasks, human_commit, make_campaign, passing
from tests.campaigns.support import AGENT, MARKER

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_merges_the_pair_best_on_different_tasks_with_two_parents(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(
        project, seed, suite, policy_version, max_proposals=3, strategy=[{"kind": "merge"}]
    )
    prompts = human_commit(project, seed, {"prompts/hint.txt": b"think\n"}, "human prompts")
    tools = human_commit(project, seed, {"tools/calc.py": b"X = 1\n"}, "human tools")
    weaker = human_commit(project, seed, {"notes/w.txt": b"w\n"}, "human weaker")
    for candidate in (prompts, tools, weaker):
        campaign_submit_candidate(campaign=campaign, candidate=candidate, submitted_by=owner)
    campaign_start(campaign=campaign)

    campaign = drive_tasks(
        campaign,
        passing(
            {
                "human prompts": {"s0", "s1"},
                "human tools": {"s2"},
                "human weaker": {"s0"},  # best on nothing the others are not
                "merge": {"s0", "s1", "s2", "v0", "v1"},
            }
        ),
    )

    merges = list(campaign.proposals.filter(kind=ProposerKind.MERGE).order_by("sequence"))
    merged = merges[0]
    assert merged.state == ProposalState.EVALUATED, merged.stages
    # Ours first: the better search score (prompts solved two tasks, tools one).
    assert merged.parent_shas == [prompts.sha, tools.sha]
    assert merged.candidate.parent_shas == [prompts.sha, tools.sha]
    assert [s["stage"] for s in merged.stages][:3] == ["applies", "manifest", "imports"]
    assert all(s["ok"] for s in merged.stages)
    assert merged.params["ours_tasks"] == ["s0", "s1"] and merged.params["theirs_tasks"] == ["s2"]
    assert "prompts/hint.txt" not in merged.patch and "tools/calc.py" in merged.patch
    for path in ("prompts/hint.txt", "tools/calc.py"):
        assert candidate_read_file(candidate=merged.candidate, path=path)
    assert merged.shown["task_keys"] == ["s0", "s1", "s2"]
    assert MARKER not in json.dumps(merged.shown)
    assert campaign.best_candidate == merged.candidate

    # Now the merge solves everything: no pair improves on different tasks. One rejection is
    # recorded; then the runner waits instead of recording the same rejection again.
    assert len(merges) == 2 and merges[1].state == ProposalState.INVALID
    assert merges[1].stages == [{"stage": "applies", "ok": False, "reason": NO_PAIR_REASON}]
    assert campaign.state == CampaignState.RUNNING
    assert campaign.state_detail.startswith("waiting: the merge proposer has " + NO_PAIR_REASON)
    count = campaign.proposals.count()
    for _ in range(3):
        campaign_advance(campaign_id=campaign.id)
    assert campaign.proposals.count() == count


def test_it_rejects_a_conflicting_pair_at_applies_and_does_not_try_it_again(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(
        project, seed, suite, policy_version, max_proposals=2, strategy=[{"kind": "merge"}]
    )
    line = '    prompt = "style=" + ctx.knobs["style"] + " " + task["input"]'
    assert line in AGENT
    left = human_commit(
        project, seed, {"agent.py": AGENT.replace(line, line + "  # left").encode()}, "left"
    )
    right = human_commit(
        project, seed, {"agent.py": AGENT.replace(line, line + "  # right").encode()}, "right"
    )
    for candidate in (left, right):
        campaign_submit_candidate(campaign=campaign, candidate=candidate, submitted_by=owner)
    campaign_start(campaign=campaign)

    campaign = drive_tasks(campaign, passing({"left": {"s0"}, "right": {"s1"}}))

    merges = list(campaign.proposals.filter(kind=ProposerKind.MERGE).order_by("sequence"))
    conflict = merges[0]
    assert conflict.state == ProposalState.INVALID and conflict.candidate is None
    assert conflict.stages[0]["stage"] == "applies" and not conflict.stages[0]["ok"]
    assert conflict.stages[0]["reason"].endswith("conflicts in agent.py")
    assert set(conflict.parent_shas) == {left.sha, right.sha}
    assert conflict.state_detail.startswith("rejected at the applies stage")
    # The pair was tried: the next merge turn finds nothing left to merge.
    assert merges[1].stages[0]["reason"] == NO_PAIR_REASON


def test_it_waits_without_a_pair_until_a_submission_brings_one(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(
        project, seed, suite, policy_version, max_proposals=5, strategy=[{"kind": "merge"}]
    )
    campaign_start(campaign=campaign)
    verdict = passing({"human a": {"s0"}, "human b": {"s1"}})

    campaign = drive_tasks(campaign, verdict)

    merges = campaign.proposals.filter(kind=ProposerKind.MERGE)
    assert merges.count() == 1 and merges.get().stages[0]["reason"] == NO_PAIR_REASON
    assert campaign.state == CampaignState.RUNNING

    for name, path in (("human a", "a.txt"), ("human b", "b.txt")):
        campaign_submit_candidate(
            campaign=campaign,
            candidate=human_commit(project, seed, {path: b"x\n"}, name),
            submitted_by=owner,
        )
    campaign = drive_tasks(campaign, verdict)

    kinds = list(campaign.proposals.order_by("sequence").values_list("kind", "state"))
    assert kinds[:4] == [
        ("seed", "evaluated"),
        ("merge", "invalid"),
        ("manual", "evaluated"),
        ("manual", "evaluated"),
    ]
    assert kinds[4] == ("merge", "evaluated")


def test_it_validates_its_options():
    assert merge_options_validate(manifest=None, options={}) == {"validated_only": False}
    assert merge_options_validate(manifest=None, options={"validated_only": True}) == {
        "validated_only": True
    }
    with pytest.raises(InvalidInput, match="unknown keys"):
        merge_options_validate(manifest=None, options={"pairs": 3})
    with pytest.raises(InvalidInput, match="true or false"):
        merge_options_validate(manifest=None, options={"validated_only": "yes"})

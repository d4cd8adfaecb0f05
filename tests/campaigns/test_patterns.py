"""Failure patterns: grouping, lifecycle, and what they may contain."""

from __future__ import annotations

import json

import pytest
from django.template.loader import render_to_string

from coevo.campaigns.models import FailurePattern, PatternStatus, ProposerKind
from coevo.campaigns.patterns import (
    failure_patterns_for_proposer,
    failure_patterns_update,
    failure_signature,
    message_normalize,
)
from coevo.campaigns.services import campaign_start, campaign_submit_candidate
from coevo.evaluations.models import (
    Evaluation,
)
from tests.campaigns.merge_support import drive_tasks, human_commit, make_campaign
from tests.campaigns.support import MARKER
from workers.outcomes import ErrorKind, RolloutOutcome

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_takes_a_fraction_for_numbers_not_for_a_path():
    # A TextWorld game's "0/4 points" was normalised to "<path> points".
    assert message_normalize("You scored 0/4 points in 12 moves") == (
        "you scored <n>/<n> points in <n> moves"
    )
    assert message_normalize("score 1.5/2 at /tmp/run-3/x/4") == "score <n>/<n> at <path>"
    assert message_normalize("see /12/abc, 2024/01/report.txt and ./a/b") == (
        "see <path>, <path> and <path>"
    )


def test_it_normalizes_messages_deterministically():
    a = message_normalize("The answer '41' is not the expected value at /tmp/run-3/agent.py:12")
    b = message_normalize('the answer "7" is not the expected value at /var/x/agent.py:980\nmore')
    assert a == b == "the answer <str> is not the expected value at <path>:<n>"
    assert message_normalize("object at 0x7f3a2b1c and commit deadbeef12 took 3.25s") == (
        "object at <hex> and commit <hex> took <n>s"
    )
    # An apostrophe is no quote: "can't" keeps its words.
    assert message_normalize("You can't go that way.") == "you can't go that way."
    first = failure_signature(
        outcome="harness_error", error_kind="exception", message="the harness raised KeyError: 3"
    )
    assert first == failure_signature(
        outcome="harness_error", error_kind="exception", message="the harness raised KeyError: 17"
    )
    assert first[0] == "harness_error | exception | the harness raised keyerror: <n>"
    assert first != failure_signature(
        outcome="task_failure", error_kind="", message="the harness raised KeyError: 3"
    )
    with_observation = failure_signature(
        outcome="task_failure",
        error_kind="",
        message="step limit of 25 reached: 0/3 points",
        observation="You can't see any such thing. The kitchen is empty.",
    )
    assert with_observation[0].endswith("| last: you can't see any such thing.")


def scripted(by_candidate):
    """Verdicts keyed by candidate subject prefix: {task: (outcome, detail)}; default fail."""

    def verdict(proposal, rollout):
        subject = proposal.candidate.subject
        table = next((t for name, t in by_candidate.items() if subject.startswith(name)), {})
        default = (
            RolloutOutcome.TASK_FAILURE,
            f"the answer 'no' for {rollout.task.inputs['input']!r} is wrong",
        )
        return table.get(rollout.task.key, default)

    return verdict


PASS = (RolloutOutcome.PASSED, "the answer equals the expected value")
CRASH = (
    RolloutOutcome.HARNESS_ERROR,
    "the harness raised ValueError: bad value 3 in /h/agent.py",
    ErrorKind.EXCEPTION,
)


def test_it_groups_failed_search_rollouts_into_patterns_once_per_evaluation(
    project, seed, suite, policy_version
):
    # The merge proposer finds no pair: only the seed is evaluated.
    campaign = make_campaign(
        project, seed, suite, policy_version, max_proposals=1, strategy=[{"kind": "merge"}]
    )
    campaign_start(campaign=campaign)
    verdict = scripted(
        {"styled seed": {"s2": CRASH, "s3": PASS, "v0": CRASH, "v1": CRASH}},
    )

    campaign = drive_tasks(campaign, verdict)

    patterns = {p.outcome: p for p in FailurePattern.objects.filter(campaign=campaign)}
    assert set(patterns) == {"task_failure", "harness_error"}
    wrong, crash = patterns["task_failure"], patterns["harness_error"]
    seed_proposal = campaign.proposals.get(kind=ProposerKind.SEED)
    assert wrong.task_keys == ["s0", "s1"] and crash.task_keys == ["s2"]
    assert wrong.first_seen == seed_proposal and wrong.status == PatternStatus.OPEN
    assert wrong.signature == "task_failure | - | the answer <str> for <str> is wrong"
    assert (
        crash.name
        == "harness error (exception): the harness raised valueerror: bad value <n> in <path>"
    )
    assert {e["task"] for e in wrong.evidence} == {"s0", "s1"}
    assert all(e["rollout"] and e["proposal"] == 0 for e in wrong.evidence)
    assert "answer 'no'" in wrong.evidence[0]["excerpt"]
    # Validation crashed too, but only the search split feeds patterns.
    assert crash.occurrences == 1 and crash.proposals == 1

    search = Evaluation.objects.get(id=seed_proposal.search_evaluation_id)
    failure_patterns_update(campaign=campaign, evaluation=search)
    wrong.refresh_from_db()
    assert wrong.occurrences == 2 and wrong.proposals == 1  # not counted twice
    validation = Evaluation.objects.get(id=seed_proposal.validation_evaluation_id)
    assert failure_patterns_update(campaign=campaign, evaluation=validation) == []
    assert FailurePattern.objects.filter(campaign=campaign).count() == 2


def test_it_marks_patterns_addressed_then_regressed_then_addressed_again(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(
        project,
        seed,
        suite,
        policy_version,
        max_proposals=1,
        strategy=[{"kind": "config", "options": {"knobs": ["temperature"]}}],
    )
    fixer = human_commit(project, seed, {"fix.txt": b"1\n"}, "fixer")
    forgetter = human_commit(project, seed, {"forget.txt": b"2\n"}, "forgetter")
    refixer = human_commit(project, seed, {"refix.txt": b"3\n"}, "refixer")
    for candidate in (fixer, forgetter, refixer):
        campaign_submit_candidate(campaign=campaign, candidate=candidate, submitted_by=owner)
    campaign_start(campaign=campaign)
    all_search = {key: PASS for key in ("s0", "s1", "s2", "s3")}
    verdict = scripted(
        {
            # The seed fails s0 and s1 alike: one open pattern.
            "styled seed": {"s2": PASS, "s3": PASS},
            # Solves the pattern's tasks (validation 0.5: the first best after the seed).
            "fixer": {**all_search, "v0": PASS},
            # Better on validation (the new best) but fails s0 and s1 again.
            "forgetter": {"s2": PASS, "s3": PASS, "v0": PASS, "v1": PASS},
            # Solves them again (not a new best: validation 0).
            "refixer": all_search,
            "config": all_search,
        }
    )

    seen = []

    def recording(proposal, rollout):
        pattern = FailurePattern.objects.filter(campaign=campaign, task_keys=["s0", "s1"]).first()
        if pattern and (not seen or seen[-1][0] != proposal.sequence):
            seen.append((proposal.sequence, pattern.status))
        return verdict(proposal, rollout)

    campaign = drive_tasks(campaign, recording)

    by_sequence = dict(seen)
    assert by_sequence[1] == PatternStatus.OPEN  # while the fixer was evaluated
    assert by_sequence[2] == PatternStatus.ADDRESSED  # addressed by the fixer
    assert by_sequence[3] == PatternStatus.REGRESSED  # the forgetter became best
    pattern = FailurePattern.objects.get(campaign=campaign, task_keys=["s0", "s1"])
    assert pattern.status == PatternStatus.ADDRESSED
    assert pattern.addressed_by == refixer and pattern.addressed_in.sequence == 3
    assert pattern.regressed_in.sequence == 2
    assert "solved 2 of the pattern's 2 task(s)" in pattern.status_detail
    assert campaign.best_candidate == forgetter
    # What llm-patch is offered mirrors it.
    offered = failure_patterns_for_proposer(campaign=campaign)
    mine = next(p for p in offered if p["tasks"] == ["s0", "s1"])
    assert mine["status"] == "addressed" and mine["addressed_by"] == refixer.sha


def test_it_never_puts_validation_or_heldout_material_in_patterns(
    project, seed, suite, policy_version, owner
):
    campaign = make_campaign(project, seed, suite, policy_version, max_proposals=1)
    campaign_start(campaign=campaign)
    # Every failure's message quotes the task's input: the marker is planted in validation and
    # held-out inputs, so it would surface if any such rollout fed a pattern.
    campaign = drive_tasks(campaign, scripted({}))

    patterns = list(FailurePattern.objects.filter(campaign=campaign))
    assert patterns
    stored = json.dumps(
        [[p.name, p.signature, p.task_keys, p.evidence, p.status_detail] for p in patterns]
    )
    offered = json.dumps(failure_patterns_for_proposer(campaign=campaign))
    for text in (stored, offered):
        assert MARKER not in text
        assert '"v0"' not in text and '"h0"' not in text
    assert "q0" in stored  # the search tasks' own inputs are evidence

    html = render_to_string("campaigns/_patterns.html", {"campaign": campaign, "project": project})
    assert "Failure patterns" in html and "task failure" in html and MARKER not in html

"""Raced rounds of slow proposers (llm-patch, agentic): each of a round's drafts is a
``campaign_draft`` task with a ticket in ``drafting_batch``. They are written in parallel, each
recorded once and charged once; a ticket whose worker died is redrafted once it is stale, and
the late answer of the stale draft is discarded (but charged: the model was paid); drafts that
come back while the campaign is paused are drafted again on resume, as is one whose proposer
call failed at the next advance; a stop discards what is still out. Drafts here run by hand from the broker's queue (no worker), unless a test says
otherwise; the proposer model answers from a scripted server."""

from __future__ import annotations

import textwrap
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.db import connection

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState, ProposerKind
from coevo.campaigns.runner import DRAFT_STALE_S, campaign_advance, campaign_draft
from coevo.campaigns.services import (
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_start,
    campaign_stop,
)
from coevo.errors import PolicyUnavailable
from coevo.evaluations.models import Budget, Evaluation, LedgerEntry, Rollout
from harness_store.services import candidate_import_directory
from tests.campaigns.support import (
    drive_round,
    patched_style,
    proposer_endpoint,
    queued_drafts,
    raced_rules,
    raced_seed,
    raced_suite,
)
from tests.campaigns.test_llm_patch import STYLE_LINE, block
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH_TASKS = 16


def answer(style: str) -> str:
    return f"HYPOTHESIS: the {style} style\n" + block("agent.py", STYLE_LINE, patched_style(style))


GOOD, OKAY, MEH = answer("good"), answer("okay"), answer("meh")
INVALID = "I think the prompt could be better."  # no hypothesis: rejected at "applies"


class TurnProposer(ScriptedPolicy):
    """Answers each request with the answer of its turn (arrival order). A turn the test
    ``hold``s waits for its release: a draft still in flight while the test pauses, stops or
    redrafts. ``asked_at_first_reply``: the requests received when the first reply was given."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[str] = []
        self.held: dict[int, threading.Event] = {}
        self.asked_at_first_reply: int | None = None
        self._turns = threading.Lock()
        self._turn = 0

    def hold(self, turn: int) -> threading.Event:
        self.held[turn] = threading.Event()
        return self.held[turn]

    def reply_for(self, text: str) -> str:
        with self._turns:
            turn = self._turn
            self._turn += 1
        if turn in self.held:
            assert self.held[turn].wait(60), f"turn {turn} never released"
        with self._turns:
            if self.asked_at_first_reply is None:
                self.asked_at_first_reply = len(self.requests)
        return self.answers[turn] if turn < len(self.answers) else "HYPOTHESIS: nothing left"


@pytest.fixture
def proposer():
    policy = TurnProposer()
    policy.model = "proposer-model"
    with ScriptedOpenAIServer(policy) as server:
        proposer_endpoint(server.url)
        yield policy


def round_campaign(project, tmp_path, policy_version, *, strategy=None) -> Campaign:
    """Rounds of three slow drafts over the raced harness and suite (16 search tasks)."""
    campaign = campaign_create(
        project=project,
        name="raced drafts",
        seed_candidate=raced_seed(project, tmp_path),
        policy_version=policy_version,
        suite=raced_suite(project, search=SEARCH_TASKS),
        strategy=strategy
        or [{"kind": "llm-patch", "options": {"endpoint": "proposer", "model": "proposer-model"}}],
        max_proposals=3,
        batch_size=3,
    )
    return campaign_start(campaign=campaign)


def until_drafting(campaign: Campaign) -> list[tuple[str, int, str]]:
    """Evaluate the seed by hand up to the round's proposal: its three tickets are out and
    their tasks queued (returned, in sequence order)."""
    campaign = drive_round(campaign, until=lambda c: bool(c.drafting_batch))
    assert sorted(campaign.drafting_batch) == ["1", "2", "3"], campaign.drafting_batch
    drafts = sorted(d for d in queued_drafts() if d[0] == str(campaign.id))
    assert [d[1] for d in drafts] == [1, 2, 3]
    return drafts


def run_draft(draft: tuple[str, int, str]) -> None:
    """What a worker does with a ``campaign_draft`` message."""
    campaign_id, sequence, drafting_at = draft
    campaign_draft(campaign_id=campaign_id, sequence=sequence, drafting_at=drafting_at)


def in_thread(draft: tuple[str, int, str]) -> tuple[threading.Thread, list]:
    errors: list = []

    def target() -> None:
        try:
            run_draft(draft)
        except BaseException as exc:  # reported to the test
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, errors


def wait_asked(proposer: TurnProposer, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(proposer.requests) < count:
        assert time.monotonic() < deadline, f"the proposer was asked {len(proposer.requests)}x"
        time.sleep(0.05)


def round_of(campaign: Campaign) -> dict[int, Proposal]:
    return {p.sequence: p for p in Proposal.objects.filter(campaign=campaign, batch=1)}


def proposer_charges(campaign: Campaign) -> list[tuple[str, int]]:
    """The ledger's proposer entries on the campaign's budget: (note, tokens), oldest first."""
    return list(
        LedgerEntry.objects.filter(budget_id=campaign.budget_id, proposer_tokens__gt=0)
        .order_by("created_at", "id")
        .values_list("note", "proposer_tokens")
    )


def assert_ledger_consistent(campaign: Campaign) -> None:
    """Every recorded draft charged once, with its own tokens; the budget's proposer spend is
    those plus the discarded drafts', nothing left reserved."""
    charges = proposer_charges(campaign)
    recorded = [(n, t) for n, t in charges if not n.endswith(", discarded")]
    proposals = Proposal.objects.filter(campaign=campaign, proposer_tokens__gt=0)
    assert sorted(recorded) == sorted(
        (f"proposal {p.sequence} ({p.kind})", p.proposer_tokens) for p in proposals
    )
    budget = Budget.objects.get(id=campaign.budget_id)
    assert budget.spent_proposer_tokens == sum(t for _, t in charges)
    assert budget.reserved_proposer_tokens == 0


def test_a_round_of_llm_patch_drafts_is_written_in_parallel_and_raced_on_a_real_worker(
    celery_worker_threads, project, tmp_path, policy_version, scripted_policy, proposer
):
    scripted_policy.rules.extend(raced_rules(SEARCH_TASKS))
    scripted_policy.default = "no"
    proposer.answers = [GOOD, MEH, INVALID]
    proposer.latency_s = 3.0  # a model call long enough that parallel drafts overlap
    campaign = round_campaign(project, tmp_path, policy_version)

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        if campaign.is_final:
            break
        time.sleep(0.5)

    assert campaign.state == CampaignState.FINISHED, (campaign.state, campaign.stop_reason)
    # In parallel: all three drafts had asked the model before it answered the first.
    assert proposer.asked_at_first_reply == 3
    assert len(proposer.requests) == 3  # each drafted once
    round_ = {p.response: p for p in round_of(campaign).values()}
    assert set(round_) == {GOOD, MEH, INVALID}
    assert sorted(p.sequence for p in round_.values()) == [1, 2, 3]
    good, meh, invalid = round_[GOOD], round_[MEH], round_[INVALID]
    assert all(p.kind == ProposerKind.LLM_PATCH for p in round_.values())
    # The invalid draft was rejected at its stage and never evaluated; the others raced.
    assert invalid.state == ProposalState.INVALID
    assert (invalid.stages[0]["stage"], invalid.stages[0]["ok"]) == ("applies", False)
    assert invalid.search_evaluation_id is None
    assert meh.eliminated_by_id == good.id and meh.eliminated_at is not None
    assert meh.validation_evaluation_id is None and meh.rollouts_saved > 0
    assert Evaluation.objects.get(id=meh.search_evaluation_id).paced
    assert good.eliminated_at is None and good.validation_score == 1.0
    assert campaign.best_candidate_id == good.candidate_id
    # Each draft charged its proposer tokens once, none discarded.
    charges = proposer_charges(campaign)
    assert sorted(charges) == sorted(
        (f"proposal {p.sequence} (llm-patch)", p.proposer_tokens) for p in round_.values()
    )
    assert all(tokens > 0 for _, tokens in charges)
    assert_ledger_consistent(campaign)
    assert campaign.drafting_batch == {}


@pytest.mark.parametrize("late", ["before the redraft", "after the redraft"])
def test_a_stale_draft_is_redrafted_once_and_its_late_answer_is_discarded_but_charged(
    project, tmp_path, policy_version, proposer, late
):
    # Turns: drafts 1 and 2, the stale draft of 3 (held, then late), its redraft.
    proposer.answers = [GOOD, OKAY, MEH, INVALID]
    late_answer = proposer.hold(2)
    campaign = round_campaign(project, tmp_path, policy_version)
    one, two, three = until_drafting(campaign)
    run_draft(one)
    run_draft(two)
    # Draft 3's worker took its task long ago and is still (or was last seen) writing it.
    stale_at = datetime.fromisoformat(three[2]) - timedelta(seconds=DRAFT_STALE_S + 1)
    tickets = dict(Campaign.objects.get(id=campaign.id).drafting_batch)
    tickets["3"] = {**tickets["3"], "at": stale_at.isoformat()}
    Campaign.objects.filter(id=campaign.id).update(drafting_batch=tickets)
    stale = (three[0], 3, stale_at.isoformat())
    thread, errors = in_thread(stale)
    wait_asked(proposer, 3)

    campaign_advance(campaign_id=campaign.id)
    campaign_advance(campaign_id=campaign.id)  # a second look: the fresh ticket is waited on

    [redraft] = queued_drafts()
    assert redraft[1] == 3 and redraft[2] != stale_at.isoformat()
    assert Campaign.objects.get(id=campaign.id).drafting_batch["3"]["at"] == redraft[2]
    if late == "after the redraft":
        run_draft(redraft)
        assert round_of(campaign)[3].response == INVALID
    late_answer.set()
    thread.join(60)
    assert not errors, errors
    if late == "before the redraft":
        assert 3 not in round_of(campaign)  # the late answer was not recorded
        run_draft(redraft)

    round_ = round_of(campaign)
    assert sorted(round_) == [1, 2, 3]
    assert round_[3].response == INVALID  # the redraft's, not the late one's
    assert len(proposer.requests) == 4
    # The late draft was charged (the model was paid) and noted as discarded: once each.
    late_tokens = [t for note, t in proposer_charges(campaign) if note.endswith("discarded")]
    assert proposer_charges(campaign) == [
        ("proposal 1 (llm-patch)", round_[1].proposer_tokens),
        ("proposal 2 (llm-patch)", round_[2].proposer_tokens),
        *(
            [("proposal 3 (llm-patch), discarded", late_tokens[0])]
            if late == "before the redraft"
            else [("proposal 3 (llm-patch)", round_[3].proposer_tokens)]
        ),
        *(
            [("proposal 3 (llm-patch)", round_[3].proposer_tokens)]
            if late == "before the redraft"
            else [("proposal 3 (llm-patch), discarded", late_tokens[0])]
        ),
    ]
    assert late_tokens[0] > 0
    assert_ledger_consistent(campaign)
    # The round goes on: the two valid drafts race, the invalid one is out.
    campaign = drive_round(campaign)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert round_of(campaign)[3].state == ProposalState.INVALID
    assert {p.validation_score for p in round_of(campaign).values() if p.sequence < 3} == {1.0}


def test_drafts_that_come_back_while_paused_are_drafted_again_on_resume(
    project, tmp_path, policy_version, proposer
):
    # Turns: draft 1, draft 3 (in flight across the pause), then the redrafts of 2 and 3.
    proposer.answers = [GOOD, OKAY, MEH, OKAY]
    in_flight = proposer.hold(1)
    campaign = round_campaign(project, tmp_path, policy_version)
    one, two, three = until_drafting(campaign)
    run_draft(one)
    thread, errors = in_thread(three)
    wait_asked(proposer, 2)

    campaign_pause(campaign=campaign)
    run_draft(two)  # delivered while paused: not drafted now
    in_flight.set()  # comes back while paused: not recorded
    thread.join(60)
    assert not errors, errors

    assert sorted(round_of(campaign)) == [1]
    assert len(proposer.requests) == 2
    assert proposer_charges(campaign)[-1][0] == "proposal 3 (llm-patch), discarded"
    assert not Evaluation.objects.filter(
        id__in=Proposal.objects.filter(campaign=campaign, batch=1).values("search_evaluation")
    ).exists()

    campaign_resume(campaign=campaign)
    campaign_advance(campaign_id=campaign.id)  # what the resume enqueued

    again = sorted(queued_drafts())
    assert [d[1] for d in again] == [2, 3]
    for draft in again:
        run_draft(draft)
    round_ = round_of(campaign)
    assert sorted(round_) == [1, 2, 3]  # each recorded once
    assert len(proposer.requests) == 4
    assert [note for note, _ in proposer_charges(campaign)][-4:] == [
        "proposal 1 (llm-patch)",
        "proposal 3 (llm-patch), discarded",
        "proposal 2 (llm-patch)",
        "proposal 3 (llm-patch)",
    ]
    assert_ledger_consistent(campaign)
    campaign = drive_round(campaign)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    round_ = round_of(campaign)
    assert [round_[n].response for n in (1, 2, 3)] == [GOOD, MEH, OKAY]  # the redrafts' answers
    assert round_[2].eliminated_at is not None
    assert round_[1].validation_score == round_[3].validation_score == 1.0
    assert campaign.drafting_batch == {}


def test_a_stop_mid_drafting_discards_the_pending_drafts_and_starts_no_rollout(
    project, tmp_path, policy_version, proposer
):
    proposer.answers = [GOOD, MEH, OKAY]
    in_flight = proposer.hold(1)
    campaign = round_campaign(project, tmp_path, policy_version)
    one, two, three = until_drafting(campaign)
    seed_rollouts = Rollout.objects.count()
    run_draft(one)
    thread, errors = in_thread(two)
    wait_asked(proposer, 2)

    campaign_stop(campaign=campaign, reason="enough")
    in_flight.set()
    thread.join(60)
    assert not errors, errors
    run_draft(three)  # delivered after the stop
    campaign_advance(campaign_id=campaign.id)

    campaign.refresh_from_db()
    assert campaign.state == CampaignState.STOPPED
    assert campaign.drafting_batch == {}  # nothing left out: no draft is wanted any more
    round_ = round_of(campaign)
    assert sorted(round_) == [1]
    assert round_[1].state == ProposalState.FAILED and round_[1].search_evaluation_id is None
    assert Rollout.objects.count() == seed_rollouts
    assert len(proposer.requests) == 2  # the third was never asked
    assert [note for note, _ in proposer_charges(campaign)] == [
        "proposal 1 (llm-patch)",
        "proposal 2 (llm-patch), discarded",
    ]
    assert_ledger_consistent(campaign)
    assert queued_drafts() == []


def test_a_stop_clears_the_tickets_of_drafts_no_worker_took(
    project, tmp_path, policy_version, proposer
):
    proposer.answers = [GOOD, MEH, OKAY]
    campaign = round_campaign(project, tmp_path, policy_version)
    until_drafting(campaign)  # three draft tasks queued; their messages are never delivered

    campaign_stop(campaign=campaign, reason="enough")

    campaign.refresh_from_db()
    assert campaign.drafting_batch == {}
    assert campaign.state_detail == ""
    assert proposer.requests == []


def test_a_draft_whose_proposer_call_failed_is_sent_again_by_the_next_advance(
    project, tmp_path, policy_version, proposer
):
    proposer.answers = [GOOD, OKAY, MEH]
    campaign = round_campaign(project, tmp_path, policy_version)
    one, two, three = until_drafting(campaign)
    run_draft(one)
    proposer.fail_next = 100  # 503s: unavailable after the client's retries

    with pytest.raises(PolicyUnavailable):
        run_draft(two)

    proposer.fail_next = 0
    assert Campaign.objects.get(id=campaign.id).drafting_batch["2"]["at"] is None
    run_draft(three)  # the round's last draft out advances: draft 2 is sent again
    [again] = queued_drafts()
    assert again[1] == 2
    assert not Proposal.objects.filter(campaign=campaign, search_evaluation__isnull=False).exclude(
        kind=ProposerKind.SEED
    )  # the round waits for it
    run_draft(again)
    round_ = round_of(campaign)
    assert [round_[n].response for n in (1, 2, 3)] == [GOOD, MEH, OKAY]
    assert_ledger_consistent(campaign)
    campaign = drive_round(campaign)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    assert round_of(campaign)[2].eliminated_at is not None


# An agentic proposer program with no dependencies: asks the model for a style and writes it
# into the working copy's agent.py (the same edit as the llm-patch answers above).
AGENT_PROGRAM = """
import json, os, urllib.request

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
body = {"model": "proposer-model", "messages": [{"role": "user", "content": task["instruction"]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
style = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"].strip()
agent = open("/app/agent.py").read()
open("/app/agent.py", "w").write(agent.replace(
    '"style=" + ctx.knobs["style"] + " "', '"style=' + style + ' "'))
json.dump(f"the {style} style", open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def agentic_program(project, tmp_path):
    directory = tmp_path / "proposer"
    directory.mkdir()
    (directory / "harness.toml").write_text(
        '[harness]\nname = "proposer"\ncommand = ["python", "propose.py"]\n'
        "[limits]\nmax_model_calls = 2\nwall_time_s = 60\n"
    )
    (directory / "propose.py").write_text(textwrap.dedent(AGENT_PROGRAM))
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="proposer", author_name="Owner"
    )
    return candidate


def test_an_agentic_round_takes_the_same_path(project, tmp_path, policy_version, proposer):
    proposer.answers = ["good", "meh", "okay"]
    program = agentic_program(project, tmp_path)
    campaign = round_campaign(
        project,
        tmp_path,
        policy_version,
        strategy=[
            {"kind": "agentic", "options": {"program": program.sha[:12], "endpoint": "proposer"}}
        ],
    )
    drafts = until_drafting(campaign)
    assert round_of(campaign) == {}  # nothing drafted in the locked step

    for draft in drafts:
        run_draft(draft)

    round_ = round_of(campaign)
    assert sorted(round_) == [1, 2, 3]
    assert {p.kind for p in round_.values()} == {ProposerKind.AGENTIC}
    assert len(proposer.requests) == 3
    assert sorted(note for note, _ in proposer_charges(campaign)) == [
        f"proposal {n} (agentic)" for n in (1, 2, 3)
    ]
    campaign = drive_round(campaign)
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    by_style = {p.params["hypothesis"]: p for p in round_of(campaign).values()}
    meh = by_style["the meh style"]
    assert meh.eliminated_at is not None and meh.validation_evaluation_id is None
    assert {by_style[f"the {s} style"].validation_score for s in ("good", "okay")} == {1.0}
    assert_ledger_consistent(campaign)

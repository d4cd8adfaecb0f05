"""The random proposer: uniform draws over the manifest's knobs, seeded by the campaign, never
a setting twice, and a clear rejection once a small space is exhausted."""

from __future__ import annotations

import random
import tomllib

import pytest

from coevo.campaigns.models import CampaignState, Proposal, ProposalState, ProposerKind
from coevo.campaigns.proposers import random_search, strategy_validate
from coevo.campaigns.proposers.config import search_space
from coevo.campaigns.proposers.random_search import (
    RandomProposer,
    point_draw,
    random_options_validate,
    space_size,
)
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.errors import InvalidInput
from coevo.projects.models import Project
from harness_store.manifest import MANIFEST_NAME, parse_manifest
from harness_store.selectors import candidate_read_file
from tests.campaigns.support import drive

KNOBS = """
[harness]
name = "knobs"
entrypoint = "agent:run"

[knobs.depth]
type = "int"
default = 2
min = 1
max = 4

[knobs.temperature]
type = "float"
default = 0.2
min = 0.1
max = 0.7000001

[knobs.mode]
type = "choice"
default = "a"
choices = ["a", "b", "c"]

[knobs.verbose]
type = "bool"
default = false

[knobs.scale]
type = "float"
default = 1.0
"""

MANIFEST = parse_manifest(tomllib.loads(KNOBS))
# The random proposer's options name no row: the campaign's project is never read.
UNSAVED_PROJECT = Project(slug="unsaved")
SEED_POINT = {"depth": 2, "mode": "a", "verbose": False}


def point(params):
    return tuple(sorted(params.items()))


def test_it_draws_every_knob_within_its_declared_type_and_range():
    space = search_space(MANIFEST)
    assert set(space) == {"depth", "temperature", "mode", "verbose"}  # scale has no range
    rng = random.Random(0)
    taken: set = set()
    seen = {name: set() for name in space}
    for _ in range(300):
        params, reason = point_draw(space, taken, rng)
        assert params is not None, reason
        taken.add(point(params))
        assert type(params["depth"]) is int and 1 <= params["depth"] <= 4
        assert type(params["temperature"]) is float
        assert 0.1 <= params["temperature"] <= 0.7000001
        assert params["mode"] in ("a", "b", "c")
        assert type(params["verbose"]) is bool
        for name, value in params.items():
            seen[name].add(value)
    # Uniform over the whole range: every value of the finite knobs comes up.
    assert seen["depth"] == {1, 2, 3, 4}
    assert seen["mode"] == {"a", "b", "c"}
    assert seen["verbose"] == {False, True}


def test_it_never_repeats_a_setting_and_says_when_the_space_is_exhausted():
    space = search_space(MANIFEST, ["depth", "mode", "verbose"])
    assert space_size(space) == 24
    rng = random.Random(1)
    taken = {point(SEED_POINT)}
    drawn = []
    for _ in range(23):
        params, _ = point_draw(space, taken, rng)
        assert params is not None and point(params) not in taken
        taken.add(point(params))
        drawn.append(params)
    assert SEED_POINT not in drawn

    params, reason = point_draw(space, taken, rng)

    assert params is None
    assert reason.startswith("the search space is exhausted: all 24 setting(s) of depth, mode, ")
    assert "widen" in reason


def test_it_gives_up_after_so_many_draws_on_a_space_too_large_to_list(monkeypatch):
    monkeypatch.setattr(random_search, "ENUMERATE_LIMIT", 0)
    monkeypatch.setattr(random_search, "MAX_DRAWS", 50)
    space = search_space(MANIFEST, ["verbose"])
    params, reason = point_draw(space, {point({"verbose": False})}, random.Random(2))
    assert params == {"verbose": True}

    params, reason = point_draw(
        space, {point({"verbose": False}), point({"verbose": True})}, random.Random(2)
    )

    assert params is None
    assert reason.startswith("no new setting of verbose in 50 random draws")


def test_it_draws_the_same_settings_from_the_same_rng_seed():
    space = search_space(MANIFEST)

    def draws(seed):
        rng = random.Random(seed)
        return [point_draw(space, set(), rng)[0] for _ in range(5)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"depth": 3}, r"random proposer: unknown options \['depth'\] \(known: knobs\)"),
        ({"knobs": "depth"}, "random proposer: knobs must be a non-empty list of knob names"),
        ({"knobs": []}, "random proposer: knobs must be a non-empty list of knob names"),
        ({"knobs": ["depth", "nope"]}, r"random proposer: knobs \['nope'\] are not declared"),
        ({"knobs": ["scale"]}, r"random proposer: knobs \['scale'\] have no range to draw from"),
    ],
)
def test_it_refuses_options_naming_what_is_wrong(options, message):
    with pytest.raises(InvalidInput, match=message):
        random_options_validate(manifest=MANIFEST, options=options)


def test_it_refuses_a_seed_without_a_knob_to_search():
    manifest = parse_manifest(tomllib.loads('[harness]\nname = "x"\nentrypoint = "agent:run"\n'))
    with pytest.raises(InvalidInput, match="random proposer: the seed's harness.toml has no knob"):
        random_options_validate(manifest=manifest, options={})


def test_it_is_a_strategy_entry():
    assert strategy_validate(
        strategy=[{"kind": "random"}, {"kind": "random", "options": {"knobs": ["mode"]}}],
        manifest=MANIFEST,
        project=UNSAVED_PROJECT,
    ) == [
        {"kind": "random", "options": {}},
        {"kind": "random", "options": {"knobs": ["mode"]}},
    ]
    with pytest.raises(InvalidInput, match=r"random proposer: knobs \['nope'\]"):
        strategy_validate(
            strategy=[{"kind": "random", "options": {"knobs": ["nope"]}}],
            manifest=MANIFEST,
            project=UNSAVED_PROJECT,
        )


# --- on a campaign -------------------------------------------------------------------------


def make(project, seed_candidate, suite, policy_version, **kwargs):
    kwargs.setdefault("strategy", [{"kind": "random"}])
    return campaign_create(
        project=project,
        name="random",
        seed_candidate=seed_candidate,
        policy_version=policy_version,
        suite=suite,
        **kwargs,
    )


def good(proposal) -> bool:
    return proposal.candidate is not None and "good" in proposal.candidate.message


@pytest.mark.django_db
def test_a_campaign_seed_decides_the_settings_proposed(project, seed, suite, policy_version):
    def proposed(campaign):
        params = []
        for sequence in range(1, 4):
            draft = RandomProposer(campaign, {}).propose(history=[])
            assert not draft.failed and draft.kind == ProposerKind.RANDOM
            # As the runner records it (rejected or not, it counts as proposed).
            Proposal.objects.create(
                campaign=campaign,
                sequence=sequence,
                kind=draft.kind,
                params=draft.params,
                state=ProposalState.INVALID,
            )
            params.append(draft.params)
        return params

    first = proposed(make(project, seed, suite, policy_version, seed=7))
    again = proposed(make(project, seed, suite, policy_version, seed=7))
    other = proposed(make(project, seed, suite, policy_version, seed=8))

    assert first == again
    assert first != other
    assert len({point(p) for p in first}) == 3


@pytest.mark.django_db
def test_a_draft_changes_only_the_knob_defaults(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version, seed=3)
    draft = RandomProposer(campaign, {"knobs": ["style"]}).propose(history=[])

    # The seed's own setting (style = "bad") counts as proposed: only "good" is left.
    assert draft.params == {"style": "good"}
    assert draft.parents == [seed]
    before = candidate_read_file(candidate=seed, path=MANIFEST_NAME).decode()
    after = draft.changes[MANIFEST_NAME].decode()
    changed = [
        (a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b
    ]
    assert changed == [('default = "bad"', 'default = "good"')]
    assert draft.shown["search_space"] == {"style": {"choices": ["bad", "good"]}}
    assert draft.stages == [
        {"stage": "applies", "ok": True, "reason": "set the defaults of 1 knob(s) in harness.toml"}
    ]


@pytest.mark.django_db(transaction=True)
def test_a_random_campaign_runs_end_to_end(project, seed, suite, policy_version):
    campaign = make(project, seed, suite, policy_version, max_proposals=2, seed=5)
    campaign_start(campaign=campaign)

    campaign = drive(campaign, good)

    assert campaign.state == CampaignState.FINISHED
    assert campaign.stop_reason == "max proposals reached (2)"
    proposals = list(campaign.proposals.filter(kind=ProposerKind.RANDOM))
    assert len(proposals) == 2
    for p in proposals:
        assert p.state == ProposalState.EVALUATED, p.state_detail
        assert set(p.params) == {"style", "temperature"}
        # Only knob defaults changed: no import check in the sandbox.
        assert {
            "stage": "imports",
            "ok": True,
            "reason": "code unchanged from the parent (only knob defaults)",
        } in p.stages
    assert campaign.best_validation_score is not None


@pytest.mark.django_db(transaction=True)
def test_a_campaign_that_exhausts_its_space_says_so(project, seed, suite, policy_version):
    campaign = make(
        project,
        seed,
        suite,
        policy_version,
        strategy=[{"kind": "random", "options": {"knobs": ["style"]}}],
        max_proposals=3,
    )
    campaign_start(campaign=campaign)

    campaign = drive(campaign, good)

    assert campaign.stop_reason == "max proposals reached (3)"
    first, *rest = campaign.proposals.filter(kind=ProposerKind.RANDOM)
    assert first.params == {"style": "good"} and first.state == ProposalState.EVALUATED
    assert campaign.best_candidate_id == first.candidate_id
    for p in rest:
        assert p.state == ProposalState.INVALID and p.candidate_id is None
        assert p.state_detail == (
            "rejected at the applies stage: the search space is exhausted: all 2 setting(s) of "
            "style were proposed in this campaign (the seed's own included); widen the knobs' "
            "ranges or the knobs option, or stop the campaign"
        )

"""The held-out split runs only inside a promotion request, and every held-out run is counted
per project and per campaign (and the count is snapshotted on the request)."""

from __future__ import annotations

import pytest

from coevo.campaigns.models import Proposal, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create
from coevo.errors import PermissionDenied
from coevo.evaluations.models import Evaluation
from coevo.evaluations.services import evaluation_create
from coevo.projects.services import project_get_or_create
from coevo.reviews.promotions.create import promotion_request_create
from coevo.reviews.selectors import heldout_looks
from coevo.suites.models import Split
from tests.campaigns.support import styled_seed

pytestmark = pytest.mark.django_db


def test_it_refuses_a_held_out_evaluation_outside_a_promotion(asker, arith_suite, policy_version):
    with pytest.raises(PermissionDenied, match="only inside a promotion request"):
        evaluation_create(
            candidate=asker, suite=arith_suite, split=Split.HELDOUT, policy_version=policy_version
        )
    with pytest.raises(PermissionDenied):
        evaluation_create(
            candidate=asker,
            suite=arith_suite,
            split=Split.HELDOUT,
            policy_version=policy_version,
            purpose="campaign",
        )

    assert not Evaluation.objects.exists()
    # The other splits are unaffected.
    evaluation_create(
        candidate=asker, suite=arith_suite, split=Split.VALIDATION, policy_version=policy_version
    )


def test_it_counts_held_out_looks_per_project_and_per_campaign(
    project, researcher, owner, policy_version, arith_suite, asker, production, tmp_path
):
    campaign = campaign_create(
        project=project,
        name="evolve",
        seed_candidate=styled_seed(project, tmp_path),
        policy_version=policy_version,
        suite=arith_suite,
        created_by=owner,
    )
    Proposal.objects.create(
        campaign=campaign,
        sequence=1,
        kind=ProposerKind.CONFIG,
        state=ProposalState.EVALUATED,
        candidate=asker,
    )
    assert heldout_looks(project=project) == 0

    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )

    # Two looks in the project (the candidate's and the holder's), one of a campaign candidate.
    assert request.campaign == campaign
    assert (request.heldout_looks_project, request.heldout_looks_campaign) == (2, 1)
    assert heldout_looks(project=project) == 2
    assert heldout_looks(project=project, campaign=campaign) == 1
    # Validation runs are not looks; another project's looks are not this one's.
    evaluation_create(
        candidate=asker, suite=arith_suite, split=Split.VALIDATION, policy_version=policy_version
    )
    other = project_get_or_create(slug="other", name="Other")
    assert heldout_looks(project=other) == 0
    assert heldout_looks(project=project) == 2


def test_it_leaves_the_campaign_count_empty_for_a_hand_made_candidate(
    researcher, policy_version, arith_suite, asker, production
):
    request = promotion_request_create(
        channel=production,
        candidate=asker,
        policy_version=policy_version,
        requester=researcher,
        suite=arith_suite,
    )
    assert request.campaign is None and request.heldout_looks_campaign is None

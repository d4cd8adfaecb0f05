"""Issue 21: pages over tables that grow without bound read a keyset page at a time (the
project's candidates, an evaluation's rollouts), and a large campaign's page summarizes its
lineage and pages its proposal table instead of drawing one box and row per proposal."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from coevo.campaigns.models import Campaign, Proposal
from coevo.campaigns.plots import SCORE_BINS
from coevo.suites.models import Split, Task
from coevo.web.campaign_views import ROUNDS_SHOWN
from coevo.web.presenters import LINEAGE_MAX_NODES, PROPOSAL_TABLE_ROWS
from coevo.web.views import CANDIDATES_PER_PAGE, ROLLOUTS_PER_PAGE
from tests.campaigns.support import set_best, started_campaign
from tests.support.factories import (
    make_candidates,
    make_evaluation,
    make_proposals,
    make_rollouts,
)

pytestmark = pytest.mark.django_db


def test_it_pages_the_project_candidates_with_older_links_each_once_newest_first(
    client, owner, project
):
    made = make_candidates(project, 2 * CANDIDATES_PER_PAGE + 7)
    client.force_login(owner)
    base = reverse("web:project", args=[project.slug])
    seen = []
    url = base
    while url:
        body = client.get(url).content.decode()
        seen += re.findall(r'<a class="sha" href="/p/demo/c/([0-9a-f]{40})/">', body)
        match = re.search(r'<a href="\?([^"]+)" id="candidates-older">', body)
        url = f"{base}?{html.unescape(match.group(1))}" if match else None
    newest_first = [c.sha for c in sorted(made, key=lambda c: c.authored_at, reverse=True)]
    assert seen == newest_first
    assert f'<span class="count">{len(made)}</span>' in client.get(base).content.decode()


def test_it_answers_404_to_a_broken_candidate_page_link(client, owner, project):
    client.force_login(owner)
    response = client.get(reverse("web:project", args=[project.slug]) + "?cursor=nonsense")
    assert response.status_code == 404


def test_it_pages_an_evaluations_rollouts_and_polls_the_page_it_shows(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    tasks = list(Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH))
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        epochs=3,
        state="running",
    )
    made = make_rollouts(evaluation, tasks, epochs=3)
    assert len(made) > 2 * ROLLOUTS_PER_PAGE
    client.force_login(owner)
    base = reverse("web:evaluation", args=[project.slug, evaluation.id])
    seen, pages, url = [], 0, base
    while url:
        response = client.get(url)
        body = response.content.decode()
        pages += 1
        # The live part polls the page it shows, not the first one.
        assert f'hx-get="{html.escape(url)}"' in body
        seen += re.findall(r'href="/p/demo/r/([0-9a-f-]{36})/"', body)
        match = re.search(r'<a href="\?([^"]+)" id="rollouts-next">', body)
        url = f"{base}?{html.unescape(match.group(1))}" if match else None
    by_order = sorted(made, key=lambda r: (r.task.position, r.epoch))
    assert seen == [str(r.id) for r in by_order]
    assert pages == -(-len(made) // ROLLOUTS_PER_PAGE)


def test_it_summarizes_the_lineage_and_pages_the_proposals_of_a_large_campaign(
    client, owner, project, tmp_path, policy_version
):
    campaign = started_campaign(project, tmp_path, policy_version)
    seed = campaign.seed_candidate
    # A chain of ten to the best (each the child of the one before), under 2,000 others.
    chain, parent = [], seed
    for i in range(10):
        [parent] = make_candidates(project, 1, parent=parent, label=f"chain {i}")
        chain.append(parent)
    make_proposals(campaign, make_candidates(project, 2000, parent=seed), start=1)
    chained = make_proposals(campaign, chain, start=2001, batch_size=1)
    Proposal.objects.filter(id=chained[-1].id).update(validation_score=1.0)
    set_best(campaign)
    assert Campaign.objects.get(id=campaign.id).best_candidate_id == chain[-1].id

    client.force_login(owner)
    url = reverse("web:campaign", args=[project.slug, campaign.id])
    body = client.get(url).content.decode()
    lineage = re.search(r'<svg[^>]*id="plot-lineage".*?</svg>', body, re.S).group(0)
    drawn = set(re.findall(r'data-sha="([0-9a-f]{40})"', lineage))
    assert len(drawn) == LINEAGE_MAX_NODES
    assert {seed.sha, *(c.sha for c in chain)} <= drawn  # the path to the best
    candidates = (
        Proposal.objects.filter(campaign=campaign, candidate__isnull=False)
        .values("candidate")
        .distinct()
        .count()
    )
    left_out = candidates - LINEAGE_MAX_NODES
    assert re.search(rf'id="lineage-left-out">[^<]*{left_out} other candidates left out', body)

    # The plots summarize: the scores plot draws columns of ranges (a point only for a new
    # best), the Pareto plot its front point by point and the dominated ones in cells.
    scores = re.search(r'<svg[^>]*id="plot-scores".*?</svg>', body, re.S).group(0)
    assert 0 < scores.count('class="column ') <= 2 * SCORE_BINS
    improved = Proposal.objects.filter(campaign=campaign, improved=True).count()
    assert scores.count('class="point search"') == improved
    assert "2,011 proposals: ranges per column" in scores
    pareto = re.search(r'<svg[^>]*id="plot-pareto".*?</svg>', body, re.S).group(0)
    assert 'class="point dominated"' not in pareto
    cells = re.findall(r'class="cell dominated".*?<title>(\d+) dominated', pareto, re.S)
    front = re.findall(r'<a href="/p/demo/c/([0-9a-f]{40})/"><circle class="point front"', pareto)
    evaluated = Proposal.objects.filter(
        campaign=campaign, state="evaluated", validation_score__isnull=False
    ).count()
    assert front and sum(int(n) for n in cells) + len(front) == evaluated
    assert len(cells) < evaluated / 4
    # The rounds table lists the newest rounds only.
    rounds = (
        Proposal.objects.filter(campaign=campaign, batch__isnull=False)
        .values("batch")
        .distinct()
        .count()
    )
    assert len(re.findall(r'<tr id="round-\d+">', body)) == ROUNDS_SHOWN
    assert f"The newest {ROUNDS_SHOWN} of {rounds} rounds." in body

    rows = re.findall(r'id="proposal-(\d+)"', body)
    assert [int(r) for r in rows] == list(range(2011 - PROPOSAL_TABLE_ROWS, 2011))
    older = re.search(r'<a href="\?before=(\d+)" id="proposals-older">', body)
    assert older and int(older.group(1)) == 2011 - PROPOSAL_TABLE_ROWS
    body = client.get(f"{url}?before={older.group(1)}").content.decode()
    rows = [int(r) for r in re.findall(r'id="proposal-(\d+)"', body)]
    assert rows == list(range(2011 - 2 * PROPOSAL_TABLE_ROWS, 2011 - PROPOSAL_TABLE_ROWS))


def test_it_draws_every_candidate_of_a_small_campaign(
    client, owner, project, tmp_path, policy_version
):
    campaign = started_campaign(project, tmp_path, policy_version)
    made = make_candidates(project, 12, parent=campaign.seed_candidate)
    make_proposals(campaign, made, start=1)
    set_best(campaign)
    client.force_login(owner)
    body = client.get(reverse("web:campaign", args=[project.slug, campaign.id])).content.decode()
    lineage = re.search(r'<svg[^>]*id="plot-lineage".*?</svg>', body, re.S).group(0)
    drawn = set(re.findall(r'data-sha="([0-9a-f]{40})"', lineage))
    # Invalid proposals made no candidate: the seed and the others are all drawn.
    expected = {campaign.seed_candidate.sha} | {
        p.candidate.sha for p in Proposal.objects.filter(campaign=campaign, candidate__isnull=False)
    }
    assert drawn == expected
    assert "lineage-left-out" not in body
    assert "proposals-older" not in body

"""The campaign page (plots, lineage with a merge, proposals), the start form, and who may
see or act on them. Proposals are written straight to the database, shaped as the runner
records them; the candidates are real commits (a merge has two parents)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import pytest

from coevo.campaigns.models import Campaign, CampaignState, Proposal, ProposalState
from coevo.campaigns.selectors import campaign_best_series
from coevo.campaigns.services import campaign_create
from harness_store.derive import candidate_derive
from harness_store.models import Candidate
from tests.campaigns.support import AGENT, MANIFEST, marked_suite, proposer_endpoint, styled_seed
from tests.support.factories import make_jsonl_suite

pytestmark = pytest.mark.django_db

IMPORT_ERROR = "agent.py: SyntaxError: invalid syntax (line 3)"


@dataclass
class Data:
    campaign: Campaign
    seed: Candidate
    knob_child: Candidate
    code_child: Candidate
    merge: Candidate


def stage(name: str, ok: bool = True, reason: str = "") -> dict:
    return {"stage": name, "ok": ok, "reason": reason or ("ok" if ok else "failed")}


VALID = [stage(s) for s in ("applies", "manifest", "imports", "duplicate", "smoke")]


def make_campaign_data(project, tmp_path, policy_version) -> Data:
    seed = styled_seed(project, tmp_path)
    campaign = campaign_create(
        project=project,
        name="paged",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=marked_suite(project),
        max_proposals=8,
    )
    knob_child, _ = candidate_derive(
        project=project,
        parents=[seed],
        changes={"harness.toml": MANIFEST.replace('default = "bad"', 'default = "good"').encode()},
        message="config trial 0: style=good",
        author_name="config proposer",
    )
    code_child, _ = candidate_derive(
        project=project,
        parents=[seed],
        changes={"agent.py": ("# strip the answer twice\n" + AGENT).encode()},
        message="llm-patch: strip answers",
        author_name="llm-patch proposer",
    )
    merge, created = candidate_derive(
        project=project,
        parents=[knob_child, code_child],
        changes={},
        message="merge knob and code",
        author_name="merge proposer",
    )
    assert created and merge.parent_shas == [knob_child.sha, code_child.sha]

    def proposal(sequence, kind, **fields):
        return Proposal.objects.create(campaign=campaign, sequence=sequence, kind=kind, **fields)

    proposal(
        0,
        "seed",
        parent_shas=[],
        candidate=seed,
        state=ProposalState.EVALUATED,
        search_score=0.25,
        validation_score=0.5,
        tokens_per_task=30.0,
        improved=True,  # the first best, as the runner records it
    )
    proposal(
        1,
        "config",
        parent_shas=[seed.sha],
        params={"style": "good"},
        stages=VALID,
        candidate=knob_child,
        state=ProposalState.EVALUATED,
        search_score=1.0,
        validation_score=0.75,
        tokens_per_task=40.0,
        improved=True,
    )
    proposal(
        2,
        "llm-patch",
        parent_shas=[seed.sha],
        stages=[stage("applies"), stage("manifest"), stage("imports", False, IMPORT_ERROR)],
        state=ProposalState.INVALID,
        state_detail="rejected at imports",
    )
    proposal(
        3,
        "llm-patch",
        parent_shas=[seed.sha],
        stages=VALID,
        candidate=code_child,
        state=ProposalState.EVALUATED,
        search_score=0.0,
    )
    proposal(
        4,
        "merge",
        parent_shas=[knob_child.sha, code_child.sha],
        stages=VALID,
        candidate=merge,
        state=ProposalState.EVALUATED,
        search_score=0.75,
        validation_score=0.5,
        tokens_per_task=10.0,
    )
    Campaign.objects.filter(id=campaign.id).update(
        state=CampaignState.RUNNING, best_candidate=knob_child, best_validation_score=0.75
    )
    campaign.refresh_from_db()
    return Data(campaign, seed, knob_child, code_child, merge)


@pytest.fixture
def data(project, tmp_path, policy_version) -> Data:
    return make_campaign_data(project, tmp_path, policy_version)


def svg(content: str, element_id: str) -> ET.Element:
    match = re.search(rf'<svg[^>]*id="{element_id}".*?</svg>', content, re.S)
    assert match, f"no svg #{element_id}"
    return ET.fromstring(match.group(0))


NS = {"svg": "http://www.w3.org/2000/svg"}


def test_it_shows_plots_lineage_with_a_merge_and_proposals(client, owner, data):
    client.force_login(owner)
    page = client.get(f"/p/demo/campaigns/{data.campaign.id}/")

    assert page.status_code == 200
    content = page.content.decode()
    scores = svg(content, "plot-scores")
    assert len(scores.findall(".//svg:circle[@class='point search']", NS)) == 4
    pareto = svg(content, "plot-pareto")
    # Front: #1 (0.75 at 40 tokens) and #4 (0.5 at 10); the seed (0.5 at 30) is dominated.
    assert len(pareto.findall(".//svg:circle[@class='point front']", NS)) == 2
    assert len(pareto.findall(".//svg:circle[@class='point dominated']", NS)) == 1

    lineage = svg(content, "plot-lineage")
    hrefs = {a.get("href") for a in lineage.findall(".//svg:a", NS)}
    assert hrefs == {
        f"/p/demo/c/{c.sha}/" for c in (data.seed, data.knob_child, data.code_child, data.merge)
    }
    into_merge = lineage.findall(f".//svg:path[@data-to='{data.merge.sha}']", NS)
    assert {e.get("data-from") for e in into_merge} == {data.knob_child.sha, data.code_child.sha}
    best = lineage.find(".//svg:g[@class='node status-best']", NS)
    assert best.get("data-sha") == data.knob_child.sha

    proposals = content[content.index('id="campaign-proposals"') :]
    rows = {
        int(m.group(1)): m.group(2)
        for m in re.finditer(r'id="proposal-(\d+)">(.*?)</tr>', proposals, re.S)
    }
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert "new best" in rows[1] and "0.250" in rows[1]  # gap: search 1.0 − validation 0.75
    assert f'href="/p/demo/c/{data.knob_child.sha}/diff/"' in rows[1]
    assert "✓ applies" in rows[1] and "✗" not in rows[1]
    assert "✗ imports" in rows[2] and "SyntaxError: invalid syntax" in rows[2]
    assert "rejected at imports" in rows[2]
    assert "stopped on search" in rows[3]
    assert "no improvement" in rows[4] and "+" in rows[4]  # two parents
    assert 'id="campaign-spend"' in content and 'role="progressbar"' in content
    assert 'hx-trigger="every 3s"' in content


@pytest.fixture
def queued(data) -> Candidate:
    """A manual proposal waiting for the runner (#5), as campaign_submit records it."""
    submitted, _ = candidate_derive(
        project=data.campaign.project,
        parents=[data.knob_child],
        changes={"agent.py": ("# a person's edit\n" + AGENT).encode()},
        message="manual: a person's edit",
        author_name="someone",
    )
    Proposal.objects.create(
        campaign=data.campaign,
        sequence=5,
        kind="manual",
        parent_shas=[data.knob_child.sha],
        stages=VALID,
        candidate=submitted,
        state=ProposalState.QUEUED,
    )
    return submitted


def test_a_queued_proposal_is_waiting_in_the_table_not_stopped_on_search(
    client, owner, data, queued
):
    client.force_login(owner)
    content = client.get(f"/p/demo/campaigns/{data.campaign.id}/").content.decode()
    row = re.search(r'id="proposal-5">(.*?)</tr>', content, re.S).group(1)
    assert "queued for evaluation" in row and "stopped on search" not in row


def test_a_queued_proposal_is_open_in_the_lineage_not_pruned(client, owner, data, queued):
    client.force_login(owner)
    content = client.get(f"/p/demo/campaigns/{data.campaign.id}/").content.decode()
    node = svg(content, "plot-lineage").find(f".//svg:g[@data-sha='{queued.sha}']", NS)
    assert node.get("class") == "node status-open"


def test_a_queued_proposal_is_not_in_the_scores_series_until_it_ends(data, queued):
    assert [r["sequence"] for r in campaign_best_series(campaign=data.campaign)] == [0, 1, 2, 3, 4]


def test_a_tie_with_the_best_is_no_improvement_in_the_table_and_the_scores_plot(
    client, owner, data
):
    tie, _ = candidate_derive(
        project=data.campaign.project,
        parents=[data.knob_child],
        changes={"agent.py": ("# as good, not better\n" + AGENT).encode()},
        message="llm-patch: as good",
        author_name="llm-patch proposer",
    )
    Proposal.objects.create(
        campaign=data.campaign,
        sequence=5,
        kind="llm-patch",
        parent_shas=[data.knob_child.sha],
        stages=VALID,
        candidate=tie,
        state=ProposalState.EVALUATED,
        search_score=1.0,
        validation_score=0.75,  # #1's, the best: the runner records no improvement
    )
    client.force_login(owner)
    content = client.get(f"/p/demo/campaigns/{data.campaign.id}/").content.decode()

    row = re.search(r'id="proposal-5">(.*?)</tr>', content, re.S).group(1)
    assert "no improvement" in row
    rects = svg(content, "plot-scores").findall(".//svg:rect[@class]", NS)
    best = ["".join(r.itertext()) for r in rects if r.get("class") == "point validation best"]
    assert best == ["#0 validation 0.500", "#1 validation 0.750"]
    last = campaign_best_series(campaign=data.campaign)[-1]
    assert (last["sequence"], last["improved"], last["best_validation_score"]) == (5, False, 0.75)


def add_cheaper_tie(data: Data) -> Proposal:
    """#5: the best's validation score (0.75, #1's) at half its tokens (20 vs 40), evaluated
    later: #1 stays the campaign's best but leaves the Pareto front (issue 38)."""
    tie, _ = candidate_derive(
        project=data.campaign.project,
        parents=[data.knob_child],
        changes={"agent.py": ("# as good, cheaper\n" + AGENT).encode()},
        message="llm-patch: as good, cheaper",
        author_name="llm-patch proposer",
    )
    return Proposal.objects.create(
        campaign=data.campaign,
        sequence=5,
        kind="llm-patch",
        parent_shas=[data.knob_child.sha],
        stages=VALID,
        candidate=tie,
        state=ProposalState.EVALUATED,
        search_score=1.0,
        validation_score=0.75,
        tokens_per_task=20.0,
    )


def test_the_front_table_keeps_the_chosen_best_a_cheaper_tie_dominates(client, owner, data):
    add_cheaper_tie(data)
    client.force_login(owner)
    content = client.get(f"/p/demo/campaigns/{data.campaign.id}/").content.decode()

    table = re.search(r'<table class="table" id="campaign-front">(.*?)</table>', content, re.S)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table.group(1), re.S)
    assert [re.search(r"<td>(\d+)</td>", row).group(1) for row in rows[1:]] == ["5", "1", "4"]
    best = re.search(r'<tr class="front-best dominated">(.*?)</tr>', table.group(1), re.S)
    assert data.knob_child.short_sha in best.group(1) and "chosen best" in best.group(1)
    assert "#5 (20.0 tokens/task) tied its validation score later with fewer tokens" in best.group(
        1
    )
    # The plot's front is the front: #1 is drawn dominated.
    pareto = svg(content, "plot-pareto")
    assert len(pareto.findall(".//svg:circle[@class='point front']", NS)) == 2


def test_it_renders_the_live_part_alone_for_htmx_and_stops_polling_when_final(client, owner, data):
    client.force_login(owner)
    url = f"/p/demo/campaigns/{data.campaign.id}/"
    partial = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and 'id="plot-lineage"' in partial
    Campaign.objects.filter(id=data.campaign.id).update(state=CampaignState.FINISHED)
    assert b'hx-trigger="every 3s"' not in client.get(url, HTTP_HX_REQUEST="true").content


def test_it_renders_a_campaign_without_proposals(client, owner, project, tmp_path, policy_version):
    campaign = campaign_create(
        project=project,
        name="fresh",
        seed_candidate=styled_seed(project, tmp_path),
        policy_version=policy_version,
        suite=marked_suite(project),
    )
    client.force_login(owner)
    content = client.get(f"/p/demo/campaigns/{campaign.id}/").content.decode()
    assert "no scored proposal yet" in content and "no validated proposal yet" in content
    lineage = svg(content, "plot-lineage")
    assert [g.get("class") for g in lineage.findall(".//svg:g[@data-sha]", NS)] == [
        "node status-seed"
    ]


def test_a_viewer_sees_the_page_but_cannot_start_or_pause(client, viewer, data):
    client.force_login(viewer)
    page = client.get(f"/p/demo/campaigns/{data.campaign.id}/")
    assert page.status_code == 200 and b'id="pause-campaign"' not in page.content
    assert b'id="new-campaign"' not in client.get("/p/demo/campaigns/").content
    assert client.get("/p/demo/campaigns/new/").status_code == 403
    assert client.post("/p/demo/campaigns/new/", {}).status_code == 403
    assert client.post(f"/p/demo/campaigns/{data.campaign.id}/pause/").status_code == 403
    data.campaign.refresh_from_db()
    assert data.campaign.state == CampaignState.RUNNING


def test_an_outsider_gets_404_everywhere(client, outsider, data):
    client.force_login(outsider)
    for url in (
        f"/p/demo/campaigns/{data.campaign.id}/",
        "/p/demo/campaigns/new/",
        "/p/demo/campaigns/",
    ):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/p/demo/campaigns/{data.campaign.id}/stop/").status_code == 404


# --- the start form --------------------------------------------------------------------------


def form_data(seed, suite, policy_version, **overrides) -> dict:
    values = {
        "name": "from the form",
        "seed_candidate": seed.sha[:10],
        "policy_version": str(policy_version.pk),
        "suite": str(suite.pk),
        "proposers": ["config"],
        "llm_api": "completions",
        "max_proposals": "3",
        "patience": "2",
        "target_score": "0.9",
        "max_rollouts": "50",
        "max_tokens": "",
        "max_wall_s": "600",
        "epochs": "2",
        "random_seed": "7",
    }
    values.update(overrides)
    return values


def test_it_starts_a_campaign_from_the_form(client, researcher, project, tmp_path, policy_version):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    client.force_login(researcher)
    form = client.get(f"/p/demo/campaigns/new/?seed={seed.sha}")
    assert form.status_code == 200
    assert f'value="{seed.sha}"'.encode() in form.content  # prefilled, and in the datalist

    response = client.post(
        "/p/demo/campaigns/new/",
        form_data(
            seed,
            suite,
            policy_version,
            proposers=["config", "llm-patch"],
            max_proposer_tokens="5000",
            max_proposer_wall_s="120",
        ),
    )

    campaign = Campaign.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/p/demo/campaigns/{campaign.id}/"
    assert campaign.state == CampaignState.RUNNING and campaign.created_by == researcher
    assert (campaign.max_proposals, campaign.patience, campaign.target_score) == (3, 2, 0.9)
    assert (campaign.epochs, campaign.seed, campaign.seed_candidate) == (2, 7, seed)
    assert [e["kind"] for e in campaign.strategy] == ["config", "llm-patch"]
    assert campaign.strategy[1]["options"]["api"] == "completions"
    budget = campaign.budget
    assert (budget.limit_rollouts, budget.limit_tokens, budget.limit_wall_s) == (50, None, 600)
    assert (budget.limit_proposer_tokens, budget.limit_proposer_wall_ms) == (5000, 120_000)


def test_it_offers_the_llm_patch_proposer_registered_endpoints_and_no_url(
    client, researcher, project, tmp_path, policy_version
):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    proposer_endpoint("http://10.0.0.7:8000/v1", name="big-model")
    client.force_login(researcher)
    form = client.get("/p/demo/campaigns/new/").content.decode()
    assert '<option value="big-model">big-model</option>' in form
    assert "10.0.0.7" not in form  # an endpoint's address stays with the operators

    response = client.post(
        "/p/demo/campaigns/new/",
        form_data(
            seed,
            suite,
            policy_version,
            proposers=["llm-patch"],
            llm_endpoint="big-model",
            # The field the form had: a typed URL is no longer read.
            llm_base_url="http://169.254.169.254/latest/meta-data/",
        ),
    )
    assert response.status_code == 302
    options = Campaign.objects.get().strategy[0]["options"]
    assert options["endpoint"] == "big-model" and "base_url" not in options

    refused = client.post(
        "/p/demo/campaigns/new/",
        form_data(seed, suite, policy_version, proposers=["llm-patch"], llm_endpoint="nope"),
    )
    assert refused.status_code == 400 and 'id="error-llm_endpoint"' in refused.content.decode()
    assert Campaign.objects.count() == 1


def test_it_shows_form_errors_inline(client, researcher, project, tmp_path, policy_version):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    client.force_login(researcher)

    bad = client.post(
        "/p/demo/campaigns/new/",
        form_data(
            seed,
            suite,
            policy_version,
            seed_candidate="beef",
            max_proposals="0",
            max_proposer_tokens="0",
            max_proposer_wall_s="soon",
        ),
    )
    assert bad.status_code == 400
    content = bad.content.decode()
    assert 'id="error-seed_candidate"' in content and "No candidate beef" in content
    assert 'id="error-max_proposals"' in content
    assert 'id="error-max_proposer_tokens"' in content
    assert 'id="error-max_proposer_wall_s"' in content

    # The domain refuses what the form cannot see: a suite with no validation tasks.
    search_only = make_jsonl_suite(
        project,
        [{"id": f"s{i}", "input": "q", "expected": "yes", "split": "search"} for i in range(3)],
        name="search-only",
    )
    refused = client.post(
        "/p/demo/campaigns/new/", form_data(seed, search_only, policy_version)
    ).content.decode()
    assert 'id="form-errors"' in refused and "no tasks in the validation split" in refused
    assert not Campaign.objects.exists()


def test_it_starts_a_raced_campaign_from_the_form(
    client, researcher, project, tmp_path, policy_version
):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    client.force_login(researcher)

    response = client.post(
        "/p/demo/campaigns/new/", form_data(seed, suite, policy_version, batch_size="4")
    )

    campaign = Campaign.objects.get()
    assert response.status_code == 302 and campaign.batch_size == 4
    page = client.get(f"/p/demo/campaigns/{campaign.id}/").content.decode()
    assert "4 proposals per round" in page and "Rollouts saved by racing" in page


def test_the_form_refuses_a_batch_size_out_of_range(
    client, researcher, project, tmp_path, policy_version
):
    seed = styled_seed(project, tmp_path)
    suite = marked_suite(project)
    client.force_login(researcher)

    response = client.post(
        "/p/demo/campaigns/new/", form_data(seed, suite, policy_version, batch_size="17")
    )

    assert response.status_code == 400 and not Campaign.objects.exists()
    assert "less than or equal to 16" in response.content.decode()

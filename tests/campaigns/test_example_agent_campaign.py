"""A config campaign on the shipped OpenAI-SDK agent (examples/openai-agent, its declared
dependencies built by uv from a local wheel directory) on the shipped tool-arithmetic suite,
run by a real worker. The scripted model calls its tools only when told to (tool_choice
"required"), so the seed (tool_choice "auto") fails every task, and the campaign finds the knob
setting that wins."""

from __future__ import annotations

import time
from pathlib import Path

from coevo.campaigns.models import CampaignState, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from harness_store.services import candidate_import_directory
from tests.support.example_envs import WHEELHOUSE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CALLS = {
    "17 * 23 + 4": ("calculate", {"expression": "17 * 23 + 4"}),
    "3.5 feet": ("convert", {"value": 3.5, "from_unit": "ft", "to_unit": "cm"}),
    "(125 - 37) / 8": ("calculate", {"expression": "(125 - 37) / 8"}),
    "10 miles": ("convert", {"value": 10, "from_unit": "mi", "to_unit": "km"}),
    "2 ** 10 - 1000": ("calculate", {"expression": "2 ** 10 - 1000"}),
    "2.5 hours": ("convert", {"value": 2.5, "from_unit": "h", "to_unit": "s"}),
    "1234 + 5678 - 999": ("calculate", {"expression": "1234 + 5678 - 999"}),
    "5 pounds": ("convert", {"value": 5, "from_unit": "lb", "to_unit": "kg"}),
    "81 / 9 * 7": ("calculate", {"expression": "81 / 9 * 7"}),
    "2 kilometres and 350": ("calculate", {"expression": "2 * 1000 + 350"}),
}


def test_a_config_campaign_finds_the_tool_choice_that_makes_the_agent_win(
    celery_worker_thread, project, policy_version, scripted_policy, settings, tmp_path
):
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "envs"
    scripted_policy.tool_rules[:] = [(needle, [call]) for needle, call in CALLS.items()]
    scripted_policy.tools_when = "required"
    scripted_policy.default = "Done."
    suite, _ = suite_import_jsonl(
        project=project,
        name="tool-arithmetic",
        data=(EXAMPLES / "suites/tool-arithmetic.jsonl").read_bytes(),
        scorer=scorer_spec_build(kind="numeric", abs_tol=1e-6, rel_tol=1e-9),
    )
    seed, _ = candidate_import_directory(
        project=project, directory=EXAMPLES / "openai-agent", message="agent", author_name="t"
    )
    campaign = campaign_create(
        project=project,
        name="tool-choice",
        seed_candidate=seed,
        policy_version=policy_version,
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": ["tool_choice"]}}],
        max_proposals=2,
        seed=1,
    )
    campaign_start(campaign=campaign)

    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not campaign.is_final:
        time.sleep(1)
        campaign.refresh_from_db()
    assert campaign.state == CampaignState.FINISHED, campaign.stop_reason
    proposals = list(campaign.proposals.order_by("sequence"))
    assert proposals[0].kind == ProposerKind.SEED and proposals[0].validation_score == 0.0
    won = [p for p in proposals if p.state == ProposalState.EVALUATED and p.kind == "config"]
    assert won, [(p.params, p.state, p.state_detail) for p in proposals]
    assert won[0].params == {"tool_choice": "required"}
    assert won[0].search_score == 1.0 and won[0].validation_score == 1.0
    assert campaign.best_candidate_id == won[0].candidate_id

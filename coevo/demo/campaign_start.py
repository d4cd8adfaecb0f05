"""Where a demo campaign starts, and with which sampler seed.

The project's first demo campaign starts from the naive seed with ``DEFAULT_SEED``. A later
one (a second ``coevo demo`` in the same home) starts from the best candidate of the project's
latest demo campaign, with a seed no earlier campaign of the project used (issue 38: a second
run refused its first proposals as duplicates).

Why both: the config proposer's draws come from its sampler seed alone, and each draw sets
every searched knob, so with the same seed a campaign draws the same ``harness.toml`` as the
earlier one whatever candidate it starts from. Those trees are in the project already, and the
runner refuses a tree it holds at the duplicate stage instead of evaluating it again. A new
seed draws new points; starting from the earlier best makes the second run go on from what the
first found (the proposer tells its sampler the starting point and its score) instead of
climbing out of the naive seed's 0% again.

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

from dataclasses import dataclass

from coevo.campaigns.models import Campaign
from coevo.projects.models import Project
from harness_store.models import Candidate

# Whose first draw tries order = "priority" on the naive seed (benchmarks/README.md, "Demo
# campaign"): the first run finds the good setting within its three proposals.
DEFAULT_SEED = 6
# The demo names its campaigns "demo N: …" (coevo.demo.campaign, coevo.demo.coevolve).
DEMO_NAME_PREFIX = "demo "


@dataclass(frozen=True)
class CampaignStart:
    candidate: Candidate
    seed: int
    # The demo campaign this one goes on from, if any.
    earlier: Campaign | None
    # What the demo prints: where it starts, with which seed, and why.
    reason: str


def demo_campaign_start(*, project: Project, naive: Candidate, seed: int | None) -> CampaignStart:
    """The start of the project's next demo campaign; ``seed`` None picks one (see above), an
    explicit one is kept, and the reason says when it repeats an earlier campaign's."""
    earlier = (
        project.campaigns.filter(name__startswith=DEMO_NAME_PREFIX, best_candidate__isnull=False)
        .select_related("best_candidate")
        .order_by("-created_at")
        .first()
    )
    used = dict(project.campaigns.order_by("created_at").values_list("seed", "name"))
    chosen = seed if seed is not None else _unused_seed(set(used))
    if seed is None:
        why_seed = (
            f"seed {chosen}"
            if chosen == DEFAULT_SEED
            else f"seed {chosen}, one no earlier campaign here used (the same seed would draw "
            "the same knob settings as before, and a tree the project already holds is not "
            "evaluated again)"
        )
    elif seed in used:
        why_seed = (
            f"seed {seed}, as asked, although {used[seed]!r} used it: its draws repeat that "
            "campaign's, and those trees are refused as duplicates (leave out --campaign-seed "
            "for a new seed)"
        )
    else:
        why_seed = f"seed {seed}, as asked"
    if earlier is None:
        return CampaignStart(
            candidate=naive,
            seed=chosen,
            earlier=None,
            reason=f"the first demo campaign in this project: from the naive seed {naive.short_sha}, "
            f"{why_seed}",
        )
    best = earlier.best_candidate
    score = earlier.best_validation_score
    if best.tree_sha == naive.tree_sha:
        where = (
            f"{earlier.name!r} found nothing better than the naive seed: this campaign starts "
            f"from the naive seed {naive.short_sha} again"
        )
        best = naive
    else:
        where = (
            f"goes on from {earlier.name!r}: it starts from that campaign's best candidate "
            f"{best.short_sha} ({'n/a' if score is None else f'{score:.1%}'} validation there), "
            "not from the naive seed"
        )
    return CampaignStart(
        candidate=best, seed=chosen, earlier=earlier, reason=f"{where}; {why_seed}"
    )


def _unused_seed(used: set[int]) -> int:
    seed = DEFAULT_SEED
    while seed in used:
        seed += 1
    return seed

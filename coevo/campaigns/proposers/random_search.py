"""The ``random`` proposer: knob settings drawn uniformly at random, the baseline that config
search must beat at the same rollout budget (random search is the standard baseline of
hyperparameter optimization: Bergstra & Bengio, JMLR 2012).

It searches the knobs the config proposer would (``search_space``: every knob with a range,
or those the ``knobs`` option names) and edits a candidate the same way: only the ``default =
…`` lines of ``harness.toml`` change. The draws are seeded from the campaign's seed and the
number of random proposals so far, so a campaign replayed with the same seed proposes the same
settings, and a resumed one goes on where it stopped. A setting already proposed in the
campaign (by any proposer over the same knobs, the seed's own defaults included) is never
drawn again: a small space is sampled without replacement until it is exhausted, and then
every further turn is rejected at the applies stage saying so.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import tomllib
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from coevo.campaigns.models import Campaign, Proposal, ProposerKind
from coevo.campaigns.proposers.base import Draft, stage
from coevo.campaigns.proposers.config import (
    _describe,
    knob_defaults_draft,
    search_space,
    written_value,
)
from coevo.errors import InvalidInput
from harness_store.manifest import MANIFEST_NAME, Manifest, parse_manifest
from harness_store.selectors import candidate_read_file

OPTIONS = {"knobs"}
# A space with at most this many settings (no float knob) is listed and sampled without
# replacement; a larger one is sampled with rejection, giving up after MAX_DRAWS draws that
# were all proposed already.
ENUMERATE_LIMIT = 10_000
MAX_DRAWS = 1_000

Point = tuple[tuple[str, Any], ...]


def random_options_validate(*, manifest: Manifest, options: dict[str, Any]) -> dict[str, Any]:
    """The ``random`` strategy entry's options: ``{"knobs": [names]}`` (default: all with a range)."""
    if not isinstance(options, dict):
        raise InvalidInput("random proposer: options must be an object.")
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise InvalidInput(f"random proposer: unknown options {unknown} (known: knobs).")
    names = options.get("knobs")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not names:
            raise InvalidInput("random proposer: knobs must be a non-empty list of knob names.")
        undeclared = sorted(set(names) - set(manifest.knobs))
        if undeclared:
            raise InvalidInput(
                f"random proposer: knobs {undeclared} are not declared in the seed's "
                f"{MANIFEST_NAME} (declared: {', '.join(sorted(manifest.knobs)) or 'none'})."
            )
        unsearchable = sorted(set(names) - set(search_space(manifest, names)))
        if unsearchable:
            raise InvalidInput(
                f"random proposer: knobs {unsearchable} have no range to draw from (a knob "
                "needs type bool or choice, or a number type with both min and max, min < max)."
            )
    if not search_space(manifest, names):
        raise InvalidInput(
            f"random proposer: the seed's {MANIFEST_NAME} has no knob to search (a knob needs "
            "type bool or choice, or a number type with both min and max)."
        )
    return {"knobs": names} if names is not None else {}


class RandomProposer:
    drafts_slowly = False

    def __init__(self, campaign: Campaign, options: dict[str, Any]) -> None:
        self.campaign = campaign
        self.knob_names: list[str] | None = (options or {}).get("knobs")

    def propose(self, *, history: list[dict[str, Any]]) -> Draft:
        parent = self.campaign.seed_candidate
        text = candidate_read_file(candidate=parent, path=MANIFEST_NAME).decode()
        manifest = parse_manifest(tomllib.loads(text))
        space = search_space(manifest, self.knob_names)
        taken = self._taken(space, manifest)
        drawn = Proposal.objects.filter(campaign=self.campaign, kind=ProposerKind.RANDOM).count()
        rng = random.Random(_rng_seed(self.campaign.seed, drawn))
        params, reason = point_draw(space, taken, rng)
        shown = {
            "proposer": "random",
            "search_space": {name: _describe(dist) for name, dist in space.items()},
            "settings_proposed": len(taken),
            "candidates": history,
            "task_keys": [],
            "trace_ids": [],
        }
        if params is None:
            return Draft(
                kind=ProposerKind.RANDOM,
                parents=[parent],
                changes={},
                message="random: the search space is exhausted",
                shown=shown,
                stages=[stage("applies", False, reason)],
            )
        return knob_defaults_draft(
            kind=ProposerKind.RANDOM,
            label=f"random draw {drawn}",
            parent=parent,
            manifest_text=text,
            params=params,
            shown=shown,
        )

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None:
        """Nothing to learn: every draw is independent of the scores."""

    def _taken(self, space: dict[str, BaseDistribution], manifest: Manifest) -> set[Point]:
        """Settings of these knobs already in the campaign: the seed's defaults and every
        proposal's over the same knobs (any proposer's, rejected ones included)."""
        names = set(space)
        taken = {_point({name: manifest.knobs[name].default for name in names})}
        for params in Proposal.objects.filter(campaign=self.campaign).values_list(
            "params", flat=True
        ):
            if isinstance(params, dict) and set(params) == names:
                taken.add(_point(params))
        return taken


def point_draw(
    space: dict[str, BaseDistribution], taken: set[Point], rng: random.Random
) -> tuple[dict[str, Any] | None, str]:
    """A setting of the space's knobs not in ``taken``, uniformly at random; or None and why."""
    names = sorted(space)
    size = space_size(space)
    if size is not None and size <= ENUMERATE_LIMIT:
        values = [_values(space[name]) for name in names]
        left = [
            combo
            for combo in itertools.product(*values)
            if _point(dict(zip(names, combo, strict=True))) not in taken
        ]
        if not left:
            return None, (
                f"the search space is exhausted: all {size} setting(s) of {', '.join(names)} "
                "were proposed in this campaign (the seed's own included); widen the knobs' "
                "ranges or the knobs option, or stop the campaign"
            )
        return dict(zip(names, rng.choice(left), strict=True)), ""
    for _ in range(MAX_DRAWS):
        params = {name: _draw(space[name], rng) for name in names}
        if _point(params) not in taken:
            return params, ""
    return None, (
        f"no new setting of {', '.join(names)} in {MAX_DRAWS} random draws: the search space "
        "is (nearly) exhausted; widen the knobs' ranges or the knobs option, or stop the campaign"
    )


def space_size(space: dict[str, BaseDistribution]) -> int | None:
    """The number of settings, or None when a float knob makes it continuous."""
    sizes = []
    for dist in space.values():
        if isinstance(dist, FloatDistribution):
            return None
        sizes.append(len(_values(dist)))
    return math.prod(sizes)


def _values(dist: BaseDistribution) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution):
        return list(range(dist.low, dist.high + 1))
    raise TypeError(f"{type(dist).__name__} has no finite list of values")


def _draw(dist: BaseDistribution, rng: random.Random) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return rng.choice(list(dist.choices))
    if isinstance(dist, IntDistribution):
        return rng.randint(dist.low, dist.high)
    if isinstance(dist, FloatDistribution):
        # As the file will hold it (six significant digits), so that a repeat is recognised;
        # clamped, since rounding a bound of more digits could step past it.
        return min(max(written_value(rng.uniform(dist.low, dist.high)), dist.low), dist.high)
    raise TypeError(f"cannot draw from {type(dist).__name__}")


def _point(params: dict[str, Any]) -> Point:
    return tuple(sorted(params.items()))


def _rng_seed(campaign_seed: int, drawn: int) -> int:
    """A seed per (campaign seed, random proposals so far), hashed so that campaign seed s at
    draw k does not repeat what seed s+1 draws at k-1."""
    digest = hashlib.sha256(f"random:{campaign_seed}:{drawn}".encode()).digest()
    return int.from_bytes(digest[:8], "big")

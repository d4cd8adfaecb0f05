"""The rollout cache: identical inputs give a reusable result instead of a new run.

Identical means: the same project, the same split, the same harness tree (not commit: a rebased
or re-imported candidate with the same files reuses), the same policy version, the same task of
the same suite (its content and its split seed: the same tasks split another way are another
suite), the same seed and the same resolved knob values. Only scored results (passed,
task_failure) are reused: errors are worth running again.

The cache never crosses the held-out seal (docs/architecture.md, "The held-out seal"): a held-out rollout is never a source
and never reuses, and a result never travels between projects or between splits. A reused
rollout links to its source (its page, its trace, the trajectory exports follow that link), so a
source the reusing evaluation may not see would leak it; the key and the lookup both hold the
rule, so a key computed by older code cannot break it either.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from coevo.evaluations.models import (
    Rollout,
    RolloutState,
)
from coevo.suites.models import Split
from workers.outcomes import RolloutOutcome

# Bump when a change to the runner or the verifiers makes old results incomparable.
# 2: the key names the project, the split and the suite's split seed (issue 15).
CACHE_VERSION = 2


def cache_applies(*, split: str) -> bool:
    """Held-out rollouts are neither reused nor reusable: each held-out look is a real run that
    its promotion request counts, and its result stays on the promotion's pages."""
    return split != Split.HELDOUT


def rollout_cache_key(
    *,
    project_id: Any,
    split: str,
    tree_sha: str,
    policy_version_id: Any,
    suite_content_hash: str,
    suite_split_seed: str,
    task_key: str,
    seed: int,
    knobs: dict[str, Any],
) -> str:
    """The key of a rollout's inputs; empty for a split the cache does not serve."""
    if not cache_applies(split=split):
        return ""
    material = json.dumps(
        {
            "v": CACHE_VERSION,
            "project": str(project_id),
            "split": split,
            "tree": tree_sha,
            "policy": str(policy_version_id),
            "suite": suite_content_hash,
            "split_seed": suite_split_seed,
            "task": task_key,
            "seed": seed,
            "knobs": knobs,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()


def cache_lookup(*, project_id: Any, split: str, keys: list[str]) -> dict[str, Rollout]:
    """The earliest original (not itself reused) scored rollout for each key found, from this
    project's evaluations of this split only."""
    keys = [key for key in keys if key]
    if not cache_applies(split=split) or not keys:
        return {}
    found: dict[str, Rollout] = {}
    rows = (
        Rollout.objects.filter(
            cache_key__in=keys,
            state=RolloutState.DONE,
            reused_from__isnull=True,
            outcome__in=[RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE],
            evaluation__project_id=project_id,
            evaluation__split=split,
        )
        .exclude(evaluation__split=Split.HELDOUT)
        .only(
            "id",
            "cache_key",
            "outcome",
            "score",
            "detail",
            "answer",
            "prompt_tokens",
            "completion_tokens",
            "model_calls",
            "latency_ms",
            "cost_usd",
            "finished_at",
        )
        .order_by("finished_at")
    )
    for row in rows:
        found.setdefault(row.cache_key, row)
    return found

"""The rollout cache: identical inputs give a reusable result instead of a new run.

Identical means: the same harness tree (not commit: a rebased or re-imported candidate with the
same files reuses), the same policy version, the same task of the same suite content, the same
seed and the same resolved knob values. Only scored results (passed, task_failure) are reused:
errors are worth running again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from coevo.evaluations.models import Outcome, Rollout, RolloutState

# Bump when a change to the runner or the verifiers makes old results incomparable.
CACHE_VERSION = 1


def rollout_cache_key(
    *,
    tree_sha: str,
    policy_version_id: Any,
    suite_content_hash: str,
    task_key: str,
    seed: int,
    knobs: dict[str, Any],
) -> str:
    material = json.dumps(
        {
            "v": CACHE_VERSION,
            "tree": tree_sha,
            "policy": str(policy_version_id),
            "suite": suite_content_hash,
            "task": task_key,
            "seed": seed,
            "knobs": knobs,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()


def cache_lookup(*, keys: list[str]) -> dict[str, Rollout]:
    """The earliest original (not itself reused) scored rollout for each key found."""
    found: dict[str, Rollout] = {}
    rows = (
        Rollout.objects.filter(
            cache_key__in=keys,
            state=RolloutState.DONE,
            reused_from__isnull=True,
            outcome__in=[Outcome.PASSED, Outcome.TASK_FAILURE],
        )
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
            "finished_at",
        )
        .order_by("finished_at")
    )
    for row in rows:
        found.setdefault(row.cache_key, row)
    return found

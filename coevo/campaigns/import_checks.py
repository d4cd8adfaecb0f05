"""The ``imports`` validation stage on a stored candidate.

The check itself (workers/import_check.py) runs in the sandbox on a directory and knows
nothing of the store; here the candidate is exported by SHA to a temporary one, as a worker
would for a rollout. A harness that declares dependencies has them built first
(workers/harness_env.py), so that its first rollout finds them cached and the import sees
them; a build that fails fails the stage with the resolver's message.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness_store.models import Candidate
from harness_store.selectors import candidate_export
from workers.harness_env import harness_env_prepare
from workers.import_check import IMPORT_TIMEOUT_S, ImportCheck, import_check
from workers.outcomes import DependencyBuildFailed


def candidate_import_check(
    *, candidate: Candidate, timeout_s: float = IMPORT_TIMEOUT_S
) -> ImportCheck:
    """``import_check`` on a stored candidate, with its declared dependencies built."""
    with tempfile.TemporaryDirectory(prefix="coevo-import-check-") as tmp:
        harness_dir = Path(tmp) / "harness"
        harness_dir.mkdir()
        candidate_export(candidate=candidate, destination=harness_dir)
        try:
            harness_env = harness_env_prepare(harness_dir=harness_dir)
        except DependencyBuildFailed as exc:
            return ImportCheck(False, str(exc))
        with harness_env:
            return import_check(
                harness_dir=harness_dir, timeout_s=timeout_s, harness_env=harness_env.path
            )

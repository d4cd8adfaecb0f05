"""The escape suite again, every attack on warm sandboxes (workers/warm.py): each rollout forked
from its tree's zygote into a fresh sandbox.

test_escape.py runs on the default, cold path (a sandbox of its own per rollout); warm sandboxes
are opt-in (COEVO_WARM_SANDBOXES=1), and both paths must hold against every attack. Skipped
where a zygote cannot run: a non-root worker, or a Python installed under /tmp.
"""

from __future__ import annotations

import os

import pytest

from tests.workers.test_escape import *  # noqa: F403 (the same tests, collected again here)
from workers import warm

# Under CI (root, its environment outside /tmp: scripts/lib.sh) they always run.
pytestmark = pytest.mark.skipif(
    (os.geteuid() != 0 or not warm.warm_possible({})) and not os.environ.get("CI"),
    reason="warm sandboxes need a root worker whose Python is not under /tmp",
)


@pytest.fixture(autouse=True)
def warm_sandboxes(settings):
    settings.COEVO_WARM_SANDBOXES = True

"""The escape suite again, every attack on the cold path: a sandbox of its own per rollout.

test_escape.py runs on warm sandboxes wherever the worker can have them (root workers with
bubblewrap: this machine, CI); workers that cannot, and program and workspace harnesses
everywhere, start each sandbox cold, so both paths must hold against every attack.
"""

from __future__ import annotations

import pytest

from tests.workers.test_escape import *  # noqa: F403 (the same tests, collected again here)


@pytest.fixture(autouse=True)
def cold_sandboxes(settings):
    settings.COEVO_WARM_SANDBOXES = False

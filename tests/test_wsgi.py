"""coevo.wsgi freezes what start-up allocated, so the garbage collector's full passes do not
walk Django and the app in the middle of requests (issue 21: 80-120 ms pauses)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_importing_the_wsgi_application_loads_the_views_and_freezes_the_heap():
    probe = (
        "import gc, sys\n"
        "import coevo.wsgi\n"
        "assert 'coevo.web.campaign_views' in sys.modules, 'views not imported'\n"
        "print(gc.get_freeze_count())\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "coevo.settings"}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) > 10_000

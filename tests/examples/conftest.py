"""Fixtures the example agents' tests share."""

# The browser test of a CLI agent's rollout page (test_codex.py) takes `page` from here.
from tests.support.browser import browser, page  # noqa: F401

"""Campaign fixtures: the styled seed harness and the marked suite most campaign tests run
(tests/campaigns/support.py builds them), the optuna storages closed and the queues empty."""

import pytest

from tests.campaigns.support import marked_suite, styled_seed


@pytest.fixture
def seed(project, tmp_path):
    return styled_seed(project, tmp_path)


@pytest.fixture
def suite(project):
    return marked_suite(project)


@pytest.fixture(autouse=True)
def _close_optuna_storages():
    yield
    from coevo.campaigns.proposers.config import optuna_storages_close

    optuna_storages_close()


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    yield

import pytest


@pytest.fixture(autouse=True)
def _close_optuna_storages():
    yield
    from coevo.campaigns.proposers.config import optuna_storages_close

    optuna_storages_close()


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    yield

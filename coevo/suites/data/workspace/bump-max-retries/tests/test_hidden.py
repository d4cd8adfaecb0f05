import config
import fetcher


def test_max_retries():
    assert config.MAX_RETRIES == 5
    assert type(config.MAX_RETRIES) is int


def test_other_settings_unchanged():
    assert config.TIMEOUT_SECONDS == 10
    assert config.BACKOFF_FACTOR == 2
    assert config.USER_AGENT == "fetcher/1.0"


def test_delays():
    assert fetcher.retry_delays() == [1, 2, 4, 8, 16]

"""Tiny retry helper built on the settings in config.py."""
import config


def retry_delays():
    """Seconds to wait before each retry: BACKOFF_FACTOR ** attempt."""
    return [config.BACKOFF_FACTOR ** attempt for attempt in range(config.MAX_RETRIES)]

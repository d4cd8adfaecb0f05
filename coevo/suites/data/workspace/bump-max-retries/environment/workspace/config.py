"""Settings for the fetcher."""

MAX_RETRIES = 3
TIMEOUT_SECONDS = 10
BACKOFF_FACTOR = 2
USER_AGENT = "fetcher/1.0"

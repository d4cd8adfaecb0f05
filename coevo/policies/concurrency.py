"""A bound on concurrent requests per policy endpoint, across every worker.

vLLM and llama.cpp have no admission control: more concurrent requests than an endpoint is
sized for only queue up inside it (and time out). Workers therefore hold a slot for each
request. With Redis (``COEVO_REDIS_URL``) the slots are global: a sorted set per endpoint whose
members are leases that expire, so a worker killed mid-request gives its slot back after
``lease_s``. Without Redis (the embedded default: one worker process) the bound is a semaphore
in the process.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from coevo.errors import PolicyUnavailable

logger = logging.getLogger(__name__)

REDIS_PATIENCE_S = 120

# KEYS[1] the endpoint's set; ARGV: limit, lease in ms, token. Redis' own clock, so workers'
# clocks need not agree.
_ACQUIRE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
  return 1
end
return 0
"""


class EndpointLimiter:
    """``with limiter.slot(): ...`` holds one of ``limit`` slots of one endpoint."""

    def __init__(
        self,
        *,
        endpoint_id: str,
        limit: int,
        redis_url: str = "",
        lease_s: float = 600.0,
        poll_s: float = 0.05,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.limit = max(1, limit)
        self.lease_ms = int(lease_s * 1000)
        self.poll_s = poll_s
        self._redis = _redis_client(redis_url) if redis_url else None
        self._key = f"coevo:policy-slots:{endpoint_id}"
        self._local = None if self._redis else _local_semaphore(endpoint_id, self.limit)

    @contextmanager
    def slot(self) -> Iterator[None]:
        if self._local is not None:
            with self._local:
                yield
            return
        token = uuid.uuid4().hex
        self._acquire(token)
        try:
            yield
        finally:
            try:
                self._redis.zrem(self._key, token)
            except Exception:  # Redis is down: the lease expires by itself
                logger.warning("could not release a policy slot of %s", self.endpoint_id)

    def in_use(self) -> int:
        if self._redis is None:
            return 0
        return int(self._redis.zcard(self._key))

    def _acquire(self, token: str) -> None:
        import redis

        delay = self.poll_s
        unreachable_since: float | None = None
        while True:
            try:
                if self._script(keys=[self._key], args=[self.limit, self.lease_ms, token]):
                    return
                unreachable_since = None
            except redis.RedisError as exc:
                # A Redis restart must not fail rollouts: wait for it, within reason.
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > REDIS_PATIENCE_S:
                    raise PolicyUnavailable(
                        f"the concurrency limiter's Redis has been unreachable for "
                        f"{REDIS_PATIENCE_S}s ({exc}); check COEVO_REDIS_URL"
                    ) from exc
            # Jittered, growing waits: many waiters must not poll Redis in lockstep.
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 1.5, 1.0)

    @property
    def _script(self) -> Any:
        script = getattr(self, "_acquire_script", None)
        if script is None:
            script = self._acquire_script = self._redis.register_script(_ACQUIRE)
        return script


def limiter_slot(limiter: EndpointLimiter | None) -> AbstractContextManager[None]:
    from contextlib import nullcontext

    return limiter.slot() if limiter is not None else nullcontext()


_semaphores: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_semaphores_lock = threading.Lock()
_clients: dict[str, Any] = {}


def _local_semaphore(endpoint_id: str, limit: int) -> threading.BoundedSemaphore:
    with _semaphores_lock:
        return _semaphores.setdefault((endpoint_id, limit), threading.BoundedSemaphore(limit))


def _redis_client(url: str) -> Any:
    import redis

    with _semaphores_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url)
        return client

"""A bound on concurrent requests per policy endpoint, across every worker.

vLLM and llama.cpp have no admission control: more concurrent requests than an endpoint is
sized for only queue up inside it (and time out). Workers therefore hold a slot for each
request. Without Redis (the embedded default: one worker process) the bound is a semaphore in
the process. With Redis (``COEVO_REDIS_URL``) the slots are global, and built so that none can
leak, after the way Kubernetes leases and Temporal's activity heartbeats work:

- A slot is a member of a sorted set per endpoint, scored by when its lease ends (Redis' own
  clock, so workers' clocks need not agree). Leases are short (``COEVO_POLICY_SLOT_LEASE_S``,
  30 s) and renewed every third of that by one thread per worker process while the request
  runs, however long it runs. A holder that dies (``kill -9``, a lost machine) stops renewing:
  its slot is free within one lease, not after the longest request's timeout.
- A renewal puts the slot back if Redis no longer has it: a Redis that restarted empty learns
  its live holders again at the next renewal, and one that restarted from its append-only file
  keeps the dead ones only until their short leases end.
- A release that fails (Redis down) is retried by the same thread until it succeeds or the
  lease would have ended anyway.
- Waiting for a slot is the platform's time, not the harness's: it is wrapped in
  ``workers.policy.platform_wait``, so the rollout stops its harness's wall clock meanwhile.
- Waiting for a slot has a deadline (``COEVO_POLICY_SLOT_WAIT_S``): past it the request fails as
  an outage of the endpoint's capacity (``PolicySlotTimeout``, an infrastructure error of the
  rollout, never the harness's), naming who holds the slots.
- Who holds each slot (worker, process, rollout, since when) and who waits is kept beside the
  set, for the system page, ``/metrics`` and a waiting rollout's page (``slots_status``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from coevo.errors import PolicySlotTimeout, PolicyUnavailable
from workers.policy import platform_wait

logger = logging.getLogger(__name__)

REDIS_PATIENCE_S = 120
# The longest a wait sleeps between two tries (jittered, growing from the poll interval).
_MAX_POLL_S = 1.0

# KEYS: the endpoint's slots (sorted set: token -> lease end, ms), its holders (hash: token ->
# JSON), its waiters (hash: token -> JSON) and when each waiter last tried (sorted set: token ->
# ms; a waiter silent for 10 s is gone). ARGV: limit, lease in ms, token, holder JSON.
_ACQUIRE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
  redis.call('HDEL', KEYS[2], unpack(expired))
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ms - 10000)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ms - 10000)
  redis.call('HDEL', KEYS[3], unpack(gone))
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('HDEL', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
  for i = 1, 2 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]) * 2) end
  return 1
end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[4], ms, ARGV[3])
for i = 3, 4 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[2]) * 2) end
return 0
"""
# KEYS: slots, holders. ARGV: lease in ms, token, holder JSON. Puts a lost slot back (a Redis
# that restarted empty): the holder is alive and its request is running.
_RENEW = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[1]), ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
for i = 1, 2 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1]) * 2) end
return 1
"""


@dataclass(frozen=True)
class SlotsStatus:
    """One endpoint's slots as Redis has them now: holders and waiters, each ``{"worker",
    "pid", "holder", "since"}`` (``since``: epoch seconds)."""

    limit: int
    holders: list[dict[str, Any]] = field(default_factory=list)
    waiters: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        """How many are held, by which worker processes. Never which rollouts: this text may
        reach the detail of another project's rollout, and a rollout's id is its project's
        (a held-out one's included)."""
        held = f"{len(self.holders)}/{self.limit} held"
        names = sorted({f"{h.get('worker')} pid {h.get('pid')}" for h in self.holders})
        return (
            held
            + (f" by {', '.join(names[:4])}" if names else "")
            + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        )

    def waiting(self, holder: str) -> bool:
        """Whether ``holder`` (a limiter's ``holder`` label) is among the waiters."""
        return any(w.get("holder") == holder for w in self.waiters)


class EndpointLimiter:
    """``with limiter.slot(): ...`` holds one of ``limit`` slots of one endpoint."""

    def __init__(
        self,
        *,
        endpoint_id: str,
        limit: int,
        redis_url: str = "",
        lease_s: float = 30.0,
        wait_s: float = 600.0,
        poll_s: float = 0.05,
        holder: str = "",
    ) -> None:
        self.endpoint_id = endpoint_id
        self.limit = max(1, limit)
        self.lease_ms = max(1000, int(lease_s * 1000))
        self.wait_s = wait_s
        self.poll_s = poll_s
        # Who asks, as people read it ("rollout <id>"): shown with the slot it holds.
        self.holder = holder
        self._redis_url = redis_url
        self._redis = _redis_client(redis_url) if redis_url else None
        self._keys = slot_keys(endpoint_id)
        self._local = None if self._redis else _local_semaphore(endpoint_id, self.limit)

    @contextmanager
    def slot(self) -> Iterator[None]:
        if self._local is not None:
            if not self._local.acquire(blocking=False) and not self._wait_local():
                raise PolicySlotTimeout(
                    f"no concurrency slot of the policy endpoint came free within "
                    f"{self.wait_s:.0f}s (all {self.limit} held by this worker's other requests; "
                    "COEVO_POLICY_SLOT_WAIT_S)"
                )
            try:
                yield
            finally:
                self._local.release()
            return
        token = uuid.uuid4().hex
        holder = json.dumps(
            {
                "worker": socket.gethostname(),
                "pid": os.getpid(),
                "holder": self.holder,
                "since": round(time.time(), 3),
            }
        )
        if not self._try(token, holder, patient=False):
            with platform_wait():
                self._acquire(token, holder)
        lease = _Lease(self, token, holder)
        _renewer().hold(lease)
        try:
            yield
        finally:
            _renewer().release(lease)

    def _wait_local(self) -> bool:
        assert self._local is not None
        with platform_wait():
            return self._local.acquire(timeout=self.wait_s)

    def _try(self, token: str, holder: str, *, patient: bool) -> bool:
        """One try at a slot (a Redis error is a failed try unless ``patient``)."""
        import redis

        try:
            return bool(
                self._script(_ACQUIRE)(
                    keys=list(self._keys), args=[self.limit, self.lease_ms, token, holder]
                )
            )
        except redis.RedisError:
            if patient:
                raise
            return False

    def in_use(self) -> int:
        if self._redis is None:
            return 0
        return int(self._redis.zcard(self._keys[0]))

    def _acquire(self, token: str, holder: str) -> None:
        import redis

        delay = self.poll_s
        deadline = time.monotonic() + self.wait_s
        unreachable_since: float | None = None
        while True:
            try:
                if self._try(token, holder, patient=True):
                    return
                unreachable_since = None
            except redis.RedisError as exc:
                # A Redis restart must not fail rollouts: wait for it, within reason.
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since > REDIS_PATIENCE_S:
                    self._forget_waiter(token)
                    # The endpoint is not what failed: it must not be marked down for it.
                    raise PolicyUnavailable(
                        f"the concurrency limiter's Redis has been unreachable for "
                        f"{REDIS_PATIENCE_S}s ({exc}); check COEVO_REDIS_URL",
                        endpoint_down=False,
                    ) from exc
            if time.monotonic() >= deadline:
                self._forget_waiter(token)
                status = slots_status(
                    endpoint_id=self.endpoint_id, limit=self.limit, redis_url=self._redis_url
                )
                raise PolicySlotTimeout(
                    f"no concurrency slot of the policy endpoint came free within "
                    f"{self.wait_s:.0f}s ({status.describe()}; COEVO_POLICY_SLOT_WAIT_S)"
                )
            # Jittered, growing waits: many waiters must not poll Redis in lockstep.
            time.sleep(min(delay * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, _MAX_POLL_S)

    def _forget_waiter(self, token: str) -> None:
        try:
            pipe = self._redis.pipeline()
            pipe.hdel(self._keys[2], token)
            pipe.zrem(self._keys[3], token)
            pipe.execute()
        except Exception:  # Redis down: a silent waiter is dropped after 10 s anyway
            pass

    def _script(self, source: str) -> Any:
        scripts = self.__dict__.setdefault("_scripts", {})
        if source not in scripts:
            scripts[source] = self._redis.register_script(source)
        return scripts[source]


def slot_keys(endpoint_id: str) -> tuple[str, str, str, str]:
    """Redis keys of one endpoint's slots, holders, waiters and waiters' last tries."""
    base = f"coevo:policy-slots:{endpoint_id}"
    return base, f"{base}:holders", f"{base}:waiters", f"{base}:waiting"


def slots_status(*, endpoint_id: str, limit: int, redis_url: str) -> SlotsStatus:
    """Who holds and who waits for an endpoint's slots (empty without Redis, or when it is
    down: this is for people to read, never to decide)."""
    if not redis_url:
        return SlotsStatus(limit=limit)
    slots, holders_key, waiters_key, waiting = slot_keys(endpoint_id)
    try:
        client = _redis_client(redis_url)
        now_ms = _redis_ms(client)
        live = _tokens(client.zrangebyscore(slots, now_ms, "+inf"))
        holders = _decoded(client.hgetall(holders_key), keep=live)
        trying = _tokens(client.zrangebyscore(waiting, now_ms - 10_000, "+inf"))
        waiters = _decoded(client.hgetall(waiters_key), keep=trying)
    except Exception as exc:
        logger.warning("could not read the policy slots of %s: %s", endpoint_id, exc)
        return SlotsStatus(limit=limit)
    return SlotsStatus(limit=limit, holders=holders, waiters=waiters)


def limiter_slot(limiter: EndpointLimiter | None) -> AbstractContextManager[None]:
    return limiter.slot() if limiter is not None else nullcontext()


# --- leases held by this process ------------------------------------------------------------


@dataclass(eq=False)
class _Lease:
    limiter: EndpointLimiter
    token: str
    holder: str
    # When the lease would end by itself if never renewed again (monotonic): a release that
    # keeps failing is given up then.
    ends: float = 0.0

    def renew(self) -> None:
        limiter = self.limiter
        limiter._script(_RENEW)(
            keys=list(limiter._keys[:2]), args=[limiter.lease_ms, self.token, self.holder]
        )
        self.ends = time.monotonic() + limiter.lease_ms / 1000

    def release(self) -> None:
        slots, holders, _waiters, _waiting = self.limiter._keys
        pipe = self.limiter._redis.pipeline()
        pipe.zrem(slots, self.token)
        pipe.hdel(holders, self.token)
        pipe.execute()


class _Renewer:
    """One thread per process renewing every lease it holds, and retrying failed releases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[_Lease] = set()
        self._releasing: set[_Lease] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, lease: _Lease) -> None:
        lease.ends = time.monotonic() + lease.limiter.lease_ms / 1000
        with self._lock:
            self._held.add(lease)
            self._start()
        # The thread may be asleep for a longer lease's third (or idle): it recomputes.
        self._wake.set()

    def release(self, lease: _Lease) -> None:
        with self._lock:
            self._held.discard(lease)
        try:
            lease.release()
        except Exception:  # Redis is down: retried until the lease would have ended anyway
            logger.warning(
                "could not release a policy slot of %s: retrying", lease.limiter.endpoint_id
            )
            with self._lock:
                self._releasing.add(lease)
                self._start()
            self._wake.set()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, daemon=True, name="policy-slots")
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                held = list(self._held)
                releasing = list(self._releasing)
            if not held and not releasing:
                interval = 1.0
            else:
                interval = min(x.limiter.lease_ms for x in held + releasing) / 3000
            for lease in held:
                try:
                    lease.renew()
                except Exception as exc:
                    # Redis down: the lease may end meanwhile; it is put back once Redis answers.
                    logger.warning(
                        "could not renew a policy slot of %s: %s", lease.limiter.endpoint_id, exc
                    )
            for lease in releasing:
                try:
                    lease.release()
                except Exception:
                    if time.monotonic() < lease.ends:
                        continue
                with self._lock:
                    self._releasing.discard(lease)
            self._wake.wait(interval)
            self._wake.clear()


_renewers: dict[int, _Renewer] = {}


def _renewer() -> _Renewer:
    # One per process: a prefork child must not share its parent's (dead) thread.
    pid = os.getpid()
    with _semaphores_lock:
        renewer = _renewers.get(pid)
        if renewer is None:
            renewer = _renewers[pid] = _Renewer()
        return renewer


# --- plumbing -------------------------------------------------------------------------------


_semaphores: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_semaphores_lock = threading.Lock()
_clients: dict[tuple[int, str], Any] = {}


def _local_semaphore(endpoint_id: str, limit: int) -> threading.BoundedSemaphore:
    with _semaphores_lock:
        return _semaphores.setdefault((endpoint_id, limit), threading.BoundedSemaphore(limit))


def _redis_client(url: str) -> Any:
    import redis

    key = (os.getpid(), url)  # a forked child opens its own connections
    with _semaphores_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = redis.Redis.from_url(
                url, socket_connect_timeout=5, socket_timeout=10, health_check_interval=30
            )
        return client


def _redis_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _tokens(raw: list[Any]) -> set[str]:
    return {token.decode() if isinstance(token, bytes) else token for token in raw}


def _decoded(raw: dict[Any, Any], *, keep: set[str]) -> list[dict[str, Any]]:
    rows = []
    for token, value in raw.items():
        token = token.decode() if isinstance(token, bytes) else token
        if token not in keep:
            continue
        try:
            row = json.loads(value)
        except (TypeError, ValueError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return sorted(rows, key=lambda row: row.get("since") or 0)

"""Policy endpoint slots on the real Redis: short leases renewed while a request runs, freed
within one lease when their holder is killed, put back after Redis forgets them, a deadline on
waiting that names who holds the slots, and holders and waiters readable for people."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis

from coevo.errors import PolicySlotTimeout
from coevo.policies.concurrency import EndpointLimiter, slot_keys, slots_status
from workers.policy import platform_waits_observed

REDIS_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")


@pytest.fixture
def endpoint_id():
    """An endpoint of this test alone; its keys are gone afterwards."""
    endpoint = f"test-{uuid.uuid4().hex}"
    yield endpoint
    redis.Redis.from_url(REDIS_URL).delete(*slot_keys(endpoint))


def limiter(endpoint_id: str, **options) -> EndpointLimiter:
    options = {"limit": 1, "lease_s": 3, "wait_s": 30, "holder": "test", **options}
    return EndpointLimiter(endpoint_id=endpoint_id, redis_url=REDIS_URL, **options)


def hold_in_thread(lim: EndpointLimiter, release: threading.Event) -> threading.Event:
    held = threading.Event()

    def run() -> None:
        with lim.slot():
            held.set()
            release.wait(60)

    threading.Thread(target=run, daemon=True).start()
    assert held.wait(10)
    return held


def test_a_request_longer_than_the_lease_keeps_its_slot(endpoint_id):
    release = threading.Event()
    hold_in_thread(limiter(endpoint_id, holder="rollout long"), release)
    try:
        # Three leases later the slot is still held: a second request cannot have it.
        with (
            pytest.raises(PolicySlotTimeout, match=f"1/1 held by .* pid {os.getpid()}"),
            limiter(endpoint_id, wait_s=9).slot(),
        ):
            pass
    finally:
        release.set()


def test_a_killed_holders_slot_is_free_within_one_lease(endpoint_id):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from coevo.policies.concurrency import EndpointLimiter\n"
            f"lim = EndpointLimiter(endpoint_id={endpoint_id!r}, limit=1, lease_s=3, "
            f"redis_url={REDIS_URL!r}, holder='doomed')\n"
            "with lim.slot():\n"
            "    print('held', flush=True)\n"
            "    time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert limiter(endpoint_id).in_use() == 1
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed = time.monotonic()

        with limiter(endpoint_id, wait_s=20).slot():
            waited = time.monotonic() - killed
    finally:
        holder.kill()
        holder.wait()
    # Within one lease (3 s) and a poll, not after the longest request's timeout.
    assert waited < 3 + 2


def test_a_slot_redis_forgot_is_put_back_by_its_live_holder(endpoint_id):
    """A Redis that restarted empty: the live holder's next renewal registers it again, so
    the limit holds (and a restart from an append-only file keeps dead holders only a lease)."""
    release = threading.Event()
    hold_in_thread(limiter(endpoint_id, holder="rollout survivor"), release)
    try:
        redis.Redis.from_url(REDIS_URL).delete(*slot_keys(endpoint_id))
        assert limiter(endpoint_id).in_use() == 0
        deadline = time.monotonic() + 5
        while limiter(endpoint_id).in_use() == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert limiter(endpoint_id).in_use() == 1
        with (
            pytest.raises(PolicySlotTimeout, match=f"1/1 held by .* pid {os.getpid()}"),
            limiter(endpoint_id, wait_s=2).slot(),
        ):
            pass
    finally:
        release.set()


def test_holders_and_waiters_can_be_read_and_released_slots_are_gone(endpoint_id):
    release = threading.Event()
    hold_in_thread(limiter(endpoint_id, holder="rollout A"), release)
    second_release = threading.Event()
    waiting = threading.Thread(
        target=lambda: hold_in_thread(limiter(endpoint_id, holder="rollout B"), second_release),
        daemon=True,
    )
    waiting.start()
    time.sleep(1)

    status = slots_status(endpoint_id=endpoint_id, limit=1, redis_url=REDIS_URL)
    assert [h["holder"] for h in status.holders] == ["rollout A"]
    assert [w["holder"] for w in status.waiters] == ["rollout B"]
    assert status.holders[0]["pid"] == os.getpid()
    assert status.describe() == f"1/1 held by {socket.gethostname()} pid {os.getpid()}"
    assert status.waiting("rollout B") and not status.waiting("rollout A")

    release.set()
    waiting.join(10)
    status = slots_status(endpoint_id=endpoint_id, limit=1, redis_url=REDIS_URL)
    second_release.set()
    assert [h["holder"] for h in status.holders] == ["rollout B"] and status.waiters == []


def test_a_wait_for_a_slot_is_reported_to_the_rollout_and_a_free_slot_is_not(endpoint_id):
    class Observer:
        def __init__(self) -> None:
            self.events: list[tuple[str, float]] = []

        def platform_wait_started(self) -> None:
            self.events.append(("started", time.monotonic()))

        def platform_wait_ended(self) -> None:
            self.events.append(("ended", time.monotonic()))

    observer = Observer()
    with platform_waits_observed(observer), limiter(endpoint_id).slot():
        pass
    assert observer.events == []  # a free slot is no wait

    release = threading.Event()
    hold_in_thread(limiter(endpoint_id), release)
    threading.Timer(1.0, release.set).start()
    with platform_waits_observed(observer), limiter(endpoint_id).slot():
        pass
    (started, t0), (ended, t1) = observer.events
    assert (started, ended) == ("started", "ended") and 0.8 < t1 - t0 < 5


def test_without_redis_the_wait_has_a_deadline_too(endpoint_id):
    local = EndpointLimiter(endpoint_id=endpoint_id, limit=1, wait_s=0.5)
    with local.slot(), pytest.raises(PolicySlotTimeout, match="within 0s|within 1s"), local.slot():
        pass

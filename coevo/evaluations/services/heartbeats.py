"""Heartbeats of the rollouts one worker process runs: one thread, one connection and one
UPDATE per COEVO_HEARTBEAT_S for the whole process, whatever its concurrency.

A beat per rollout from a thread of its own (what this replaces) cost a second database
connection per running rollout, opened again for every rollout, and an UPDATE each: at a beat
every few seconds, which the watchdog's short stale bound needs, that is the cost that grows
with concurrency. Batched, a worker of 8 threads makes one UPDATE every COEVO_HEARTBEAT_S.

The beat matches each rollout's attempt as well as its id, so a rollout the watchdog gave to
another worker (or that was cancelled or paused) is not kept alive by this one: its row no
longer matches, and the runner finds out (``cancelled``) at its next step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce
from operator import or_
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import Q
from django.utils import timezone

from coevo.evaluations.models import Rollout, RolloutState

logger = logging.getLogger(__name__)


@dataclass
class _Beating:
    attempt: int
    cancelled: threading.Event = field(default_factory=threading.Event)


class RolloutHeartbeats:
    """The running rollouts of this process, beaten together by one daemon thread.

    The thread starts with the first rollout and ends (closing its connection) once none is
    left, so an idle worker, or a test process, holds no connection for it. With
    ``thread=False`` nothing beats unless ``beat`` is called (tests).
    """

    def __init__(self, *, thread: bool = True) -> None:
        self._threaded = thread
        self._lock = threading.Lock()
        self._beating: dict[Any, _Beating] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def register(self, *, rollout_id: Any, attempt: int) -> threading.Event:
        """Beat this attempt from now on; the event is set once its row stops matching."""
        beating = _Beating(attempt=attempt)
        with self._lock:
            self._beating[rollout_id] = beating
            if self._threaded and self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="rollout-heartbeats"
                )
                self._thread.start()
        return beating.cancelled

    def unregister(self, *, rollout_id: Any) -> None:
        with self._lock:
            self._beating.pop(rollout_id, None)
            if not self._beating:
                self._wake.set()  # the thread ends now rather than after its next wait

    def beat(self) -> int:
        """One UPDATE for every attempt still beating; returns how many rows it moved. Rows that
        no longer match (cancelled, requeued, paused) are told so and not beaten again."""
        with self._lock:
            beating = {
                rollout_id: b for rollout_id, b in self._beating.items() if not b.cancelled.is_set()
            }
        if not beating:
            return 0
        matches = reduce(
            or_, (Q(id=rollout_id, attempts=b.attempt) for rollout_id, b in beating.items())
        )
        rows = Rollout.objects.filter(matches, state=RolloutState.RUNNING)
        moved = rows.update(heartbeat_at=timezone.now())
        if moved < len(beating):
            alive = set(rows.values_list("id", flat=True))
            for rollout_id, b in beating.items():
                if rollout_id not in alive:
                    b.cancelled.set()
        return moved

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(settings.COEVO_HEARTBEAT_S)
                with self._lock:
                    self._wake.clear()
                    if not self._beating:
                        self._thread = None
                        return
                try:
                    # A connection broken by a database restart is replaced, not reused forever.
                    close_old_connections()
                    self.beat()
                except Exception:
                    logger.exception("rollout heartbeats failed (the database is unreachable?)")
                    connection.close()
        finally:
            connection.close()


_heartbeats = RolloutHeartbeats()  # this process's


@contextmanager
def rollout_heartbeat(*, rollout: Rollout) -> Iterator[threading.Event]:
    """Beat ``rollout`` (its current attempt) while the block runs; the event is set when the
    rollout was cancelled, paused or given to another worker under it."""
    cancelled = _heartbeats.register(rollout_id=rollout.id, attempt=rollout.attempts)
    try:
        yield cancelled
    finally:
        _heartbeats.unregister(rollout_id=rollout.id)

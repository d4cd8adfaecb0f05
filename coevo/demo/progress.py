"""The demo's long steps, never silent: a start line, a line with the elapsed time and what the
step waits on whenever that changes and at least every ``HEARTBEAT_S`` seconds, and an end
line with the step's duration.

The polling loops (an evaluation, a campaign, a promotion's held-out games) pass what they see
to ``ProgressStep.update``; a step that blocks in one call (migrations, the policy server's start-up)
has only its label and ``waiting_on``, and the heartbeat thread says it is still waiting. The
thread reads no database: it prints the last status it was given.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# A new user took 6 and 10 minutes without output for a hung demo: 30 s is the longest gap
# the demo may leave. 20, not 30: the heartbeat thread wakes every quarter of it and a loop
# polls once a second, so a line comes at most about 26 s after the one before.
HEARTBEAT_S = 20.0


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def elapsed_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class ProgressStep:
    """One long step's progress lines; ``update`` from its polling loop, if it has one."""

    def __init__(
        self,
        label: str,
        *,
        waiting_on: str = "",
        every_s: float = HEARTBEAT_S,
        out: Callable[[str], None] = _print,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.every_s, self._out, self._clock = label, every_s, out, clock
        self.status = waiting_on or f"waiting on {label}"
        self.started = self._last_line = clock()
        self._printed_status: str | None = None
        self._lock = threading.Lock()  # the heartbeat thread and the polling loop both print

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self.started

    def update(self, status: str) -> None:
        """Print ``status`` with the elapsed time when it changed (or a heartbeat is due)."""
        with self._lock:
            self.status = status
            due = self._clock() - self._last_line >= self.every_s
            if status != self._printed_status or due:
                self._emit()

    def heartbeat(self) -> None:
        """Print the last status again if nothing was printed for ``every_s`` seconds."""
        with self._lock:
            if self._clock() - self._last_line >= self.every_s:
                self._emit()

    def _emit(self) -> None:
        self._out(f"  … {elapsed_text(self.elapsed_s)}: {self.status}")
        self._printed_status, self._last_line = self.status, self._clock()


@contextmanager
def progress_step(
    label: str,
    *,
    waiting_on: str = "",
    every_s: float = HEARTBEAT_S,
    out: Callable[[str], None] = _print,
) -> Iterator[ProgressStep]:
    """Run a long step with a start line, heartbeats from a thread, and an end line saying
    how long it took (or that it stopped, and after how long)."""
    step = ProgressStep(label, waiting_on=waiting_on, every_s=every_s, out=out)
    out(f"coevo: {label} …")
    stop = threading.Event()

    def beat() -> None:
        # Wakes a few times a heartbeat, so a heartbeat is late by a fraction of it at most.
        while not stop.wait(every_s / 4):
            step.heartbeat()

    thread = threading.Thread(target=beat, name=f"heartbeat: {label}", daemon=True)
    thread.start()
    try:
        yield step
    except BaseException as exc:
        stop.set()
        thread.join()
        out(f"coevo: {label}: stopped after {elapsed_text(step.elapsed_s)} ({type(exc).__name__})")
        raise
    stop.set()
    thread.join()
    out(f"coevo: {label}: done in {elapsed_text(step.elapsed_s)}")

"""A worker freezes its start-up objects out of the garbage collector's full collections
(coevo/ops/worker_gc.py); a worker embedded in a thread of another program does not."""

from __future__ import annotations

import os
import subprocess
import sys

# A fresh interpreter: freezing is for the whole process, and this one is pytest's.
PROBE = """
import threading, gc, django
django.setup()
from celery.signals import worker_process_init, worker_ready
import coevo.ops.worker_gc  # noqa: F401 (connected when the ops app loads; imported to be sure)
where = {where!r}
if where == "thread":
    thread = threading.Thread(target=lambda: worker_ready.send(sender=None))
    thread.start(); thread.join()
elif where == "main":
    worker_ready.send(sender=None)
else:
    worker_process_init.send(sender=None)
print(gc.get_freeze_count())
"""


def _frozen_after(where: str) -> int:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "coevo.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(where=where)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().splitlines()[-1])


def test_a_ready_worker_freezes_its_start_up_objects() -> None:
    assert _frozen_after("main") > 10_000  # Django, Celery and coevo's modules at least


def test_a_prefork_child_freezes_what_it_inherited() -> None:
    assert _frozen_after("child") > 10_000


def test_a_worker_in_a_thread_of_another_program_leaves_the_process_alone() -> None:
    assert _frozen_after("thread") == 0

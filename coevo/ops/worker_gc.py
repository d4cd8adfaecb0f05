"""A worker's start-up objects, kept out of the cyclic garbage collector's way.

A worker imports Django, Celery and coevo (about 200,000 objects the collector tracks) and then
allocates briskly for every rollout, so every few hundred rollouts a full collection walked all
of them again: about 160 ms of CPU each on this project's CI machine, for objects that live as
long as the process. ``gc.freeze()`` moves what exists once the worker is ready into a
permanent generation that collections skip (the standard library's advice for long-lived
processes and for forking servers: https://docs.python.org/3/library/gc.html#gc.freeze).
Objects created later are collected as before.

In a prefork pool each child freezes what it inherited, which also keeps the collector from
writing to (and so copying) the pages it shares with its parent. A worker started inside
another program (``celery.contrib.testing``'s, in a thread of a test run) is left alone: the
process and its objects are not the worker's.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

from celery.signals import worker_process_init, worker_ready


@worker_ready.connect
def _freeze_at_ready(**_: Any) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    gc.collect()  # what start-up left as garbage is freed first, not kept forever
    gc.freeze()


@worker_process_init.connect
def _freeze_in_child(**_: Any) -> None:
    gc.freeze()

"""A worker machine's own state for images: build locks (one build of an image at a time on
the machine, whichever of its worker processes asks) and build logs, under COEVO_CONTAINER_DIR.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import docker.errors
from django.conf import settings

from workers.containers.engine import ContainerUnavailable, engine_client, engine_errors

# How long a build waits for another process's build of the same image, past the build's own
# timeout.
LOCK_MARGIN_S = 60


def image_lookup(reference: str) -> str | None:
    """The id of ``reference`` on the engine, or None when it has no such image."""
    with contextlib.suppress(docker.errors.ImageNotFound), engine_errors("looking up an image"):
        return engine_client().api.inspect_image(reference)["Id"]
    return None


def state_dir(name: str) -> Path:
    path = Path(settings.COEVO_CONTAINER_DIR) / name
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_bytes(text.encode())  # bytes: apt's progress lines end in \r
    os.chmod(partial, 0o600)
    partial.replace(path)


@contextlib.contextmanager
def build_lock(key: str, *, timeout_s: float) -> Iterator[None]:
    """One build of ``key`` at a time on this machine (every worker process of it shares
    COEVO_CONTAINER_DIR); a waiter gives up after the holder's longest build and a margin."""
    path = state_dir("locks") / f"{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        give_up = time.monotonic() + timeout_s + LOCK_MARGIN_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > give_up:
                    raise ContainerUnavailable(
                        f"another process has been building the image {key} for longer than "
                        f"its {timeout_s:g} s build time allows (lock {path})"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)

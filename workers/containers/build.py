"""One image build on the engine: the context as a tar made in memory, the build's log kept
(bounded), its time bounded, and a failure that names the step that failed.

The engine's classic builder is used (the API's ``POST /build``, what the Docker SDK speaks):
it reports its progress as a stream of ``Step N/M : INSTRUCTION`` lines, the output of each
step, ``Running in <container>`` when a step starts a container, and a final error or image id.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import tarfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker.errors

from coevo.errors import CoevoError
from workers.containers.engine import engine_client, engine_errors
from workers.environments.workspace_files import spec_bytes

logger = logging.getLogger(__name__)

# Changing how images are made (the CA layer, the context's tar) changes this, and so every
# image hash: images made the old way are not reused.
FORMAT = 1
# What of a build's log is kept: its start (the base, the first steps) and its end (where it
# failed); a build that prints a compiler's every line stays a bounded string.
LOG_HEAD_BYTES = 64 * 1024
LOG_TAIL_BYTES = 448 * 1024
# The part of the log an error message carries.
ERROR_TAIL_CHARS = 3000
# Files in a context get this time (2000-01-01): the stored trees keep no times, and zip
# (Python wheels) refuses the epoch's 1970, which an unset time would give.
CONTEXT_MTIME = 946684800
# How often a timed-out build's running step is killed again (a step that starts after the
# first kill gets killed in turn, so the build ends instead of going on past its time).
KILL_INTERVAL_S = 0.5

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_RUNNING_IN = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})\s*$")
_STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12,64})\s*$")


class ImageBuildFailed(CoevoError):
    """A task image did not build: the Dockerfile or context is unusable, a step failed, or
    the build ran past its time. ``step`` is the instruction that failed (as written, when
    known), ``line`` its line in the Dockerfile, ``log`` the build's (bounded) log."""

    code = "image_build_failed"

    def __init__(
        self,
        message: str,
        *,
        step: str | None = None,
        line: int | None = None,
        log: str = "",
        timed_out: bool = False,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.line = line
        self.log = log
        self.timed_out = timed_out


class BoundedLog:
    """The first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES of what was written."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def write(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        room = LOG_HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > LOG_TAIL_BYTES:
            excess = len(self.tail) - LOG_TAIL_BYTES
            self.dropped += excess
            del self.tail[:excess]

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes of the log left out ...]\n" if self.dropped else ""
        return (bytes(self.head).decode("utf-8", "replace") + middle) + bytes(self.tail).decode(
            "utf-8", "replace"
        )


def context_tar(tree: Mapping[str, Mapping[str, Any]], extra: Mapping[str, bytes]) -> bytes:
    """A build context: the stored tree (already validated by the caller, so bounded) plus
    ``extra`` files coevo adds, as one uncompressed tar in memory."""
    buffer = io.BytesIO()
    files: dict[str, tuple[bytes, bool]] = {
        path: (spec_bytes(spec), bool(spec.get("executable"))) for path, spec in tree.items()
    }
    files.update({path: (data, False) for path, data in extra.items()})
    dirs = sorted({"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)})
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in dirs:
            info = tarfile.TarInfo(path)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, CONTEXT_MTIME
            tar.addfile(info)
        for path in sorted(files):
            data, executable = files[path]
            info = tarfile.TarInfo(path)
            info.size, info.mtime = len(data), CONTEXT_MTIME
            info.mode = 0o755 if executable else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass(frozen=True)
class Built:
    image_id: str
    log: str
    seconds: float


def image_build(
    *,
    context: bytes,
    dockerfile: str,
    tag: str,
    labels: Mapping[str, str],
    timeout_s: float,
    memory_bytes: int,
    origins: list[int | None] | None = None,
) -> Built:
    """Build ``context`` (a tar holding ``dockerfile`` at that path) as ``tag``. ``origins``
    maps each build step to the line of the task's own Dockerfile it comes from. Raises
    ImageBuildFailed (with the log) when a step fails or the build passes ``timeout_s``."""
    client = engine_client()
    log = BoundedLog()
    started = time.monotonic()
    done = threading.Event()
    timed_out = threading.Event()
    state: dict[str, Any] = {"step": None, "container": None, "image": None}

    def watch() -> None:
        # The classic builder has no cancel call; a step's container killed fails the step,
        # and with it the build, which then removes its intermediate containers (forcerm).
        if done.wait(timeout_s):
            return
        timed_out.set()
        while not done.is_set():
            container = state["container"]
            if container:
                with (
                    contextlib.suppress(docker.errors.APIError, CoevoError),
                    engine_errors("stopping a build past its time"),
                ):
                    client.api.kill(container)
            done.wait(KILL_INTERVAL_S)

    watcher = threading.Thread(target=watch, name="coevo-image-build-timeout", daemon=True)
    watcher.start()
    image_id = None
    error: dict[str, Any] | None = None
    try:
        with engine_errors("building an image"):
            stream = client.api.build(
                fileobj=io.BytesIO(context),
                custom_context=True,
                dockerfile=dockerfile,
                tag=tag,
                labels=dict(labels),
                rm=True,
                forcerm=True,
                # The caller made every FROM an image the engine has (mapped, pulled per the
                # operator's pull policy, CA-layered): the build itself never pulls.
                pull=False,
                decode=True,
                container_limits={"memory": memory_bytes, "memswap": memory_bytes},
            )
            for chunk in stream:
                if "stream" in chunk:
                    text = str(chunk["stream"])
                    log.write(text)
                    for line in text.splitlines():
                        if step := _STEP.match(line):
                            state["step"] = (int(step.group(1)), step.group(3))
                            state["container"] = None
                        elif running := _RUNNING_IN.match(line):
                            state["container"] = running.group(1)
                        elif made := _STEP_IMAGE.match(line):
                            state["image"] = made.group(1)
                elif "error" in chunk:
                    error = chunk.get("errorDetail") or {"message": chunk["error"]}
                    log.write(f"\nERROR: {chunk['error']}\n")
                elif "aux" in chunk and isinstance(chunk["aux"], dict):
                    image_id = chunk["aux"].get("ID") or image_id
    except docker.errors.APIError as exc:
        # Refused before any step ran (a malformed Dockerfile, an unknown instruction).
        error = {"message": exc.explanation or str(exc)}
        log.write(f"\nERROR: {error['message']}\n")
    finally:
        done.set()
        watcher.join()
    seconds = time.monotonic() - started
    if timed_out.is_set() or error is not None or not image_id:
        _drop_layers(state["image"])
        raise _failure(state["step"], origins, error, log.text(), timed_out.is_set(), timeout_s)
    logger.info("built image %s (%s) in %.1f s", tag, image_id, seconds)
    return Built(image_id=image_id, log=log.text(), seconds=seconds)


def _drop_layers(image: str | None) -> None:
    """Removes the layers a failed build made (its last step's image and the untagged ones
    below it): the classic builder keeps them, untagged, and failed builds would pile up on the
    engine. A tagged image (the base, the CA layer) or one another build uses stays."""
    if image is None:
        return
    client = engine_client()
    with contextlib.suppress(docker.errors.APIError, CoevoError), engine_errors("cleaning up"):
        if not client.api.inspect_image(image).get("RepoTags"):
            client.api.remove_image(image, noprune=False)


def _failure(
    step: tuple[int, str] | None,
    origins: list[int | None] | None,
    error: Mapping[str, Any] | None,
    log: str,
    timed_out: bool,
    timeout_s: float,
) -> ImageBuildFailed:
    shown = line = None
    if step is not None:
        number, shown = step
        if origins is not None and 0 < number <= len(origins):
            line = origins[number - 1]
    where = f"`{shown}`" if shown else "the build"
    if line is not None:
        where += f" (Dockerfile line {line})"
    if timed_out:
        what = f"{where} was stopped: the build ran past its {max(1, round(timeout_s))} s"
    elif error is not None:
        code = error.get("code")
        detail = str(error.get("message", "")).strip()
        what = f"{where} failed" + (f" with exit code {code}" if code else "") + f": {detail}"
    else:
        what = f"{where} ended without an image"
    tail = log[-ERROR_TAIL_CHARS:]
    return ImageBuildFailed(
        f"the task's image did not build: {what}\n--- the end of the build log ---\n{tail}",
        step=shown,
        line=line,
        log=log,
        timed_out=timed_out,
    )

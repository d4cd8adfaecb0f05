"""Task image builds, recorded where they ran and shown on the suite's page.

A container task's image is built by whichever process first needs it on its machine: a worker
at a rollout's start (workers/environments/workspace.py, ``Workspace.for_task``), or the
importing process checking solutions (coevo/suites/harbor.py). Neither is the web process,
which has no engine: what the suite page shows of a build comes through ``TaskImageBuild``.

- **From a rollout.** The worker's runtime holds no models: its "environment" step carries the
  build (``build``: seconds, content hash, the log's tail) when this rollout's call built the
  image, or ``build_failed`` (the step, its Dockerfile line, the log's tail) when it failed;
  the worker task that stores the rollout's steps hands them to
  ``task_image_builds_record_steps`` (coevo/evaluations/services/rollouts.py).
- **From the import's solution check.** The check builds each task's image before the suite's
  rows exist, so ``task_image_prepare`` builds it first and returns what to record, and
  ``task_image_builds_record`` writes it once the task rows are there.

Only builds that ran are recorded: a cache hit is no build. Held-out tasks' logs are stored
like the others' and never shown (coevo/suites/selectors.py, ``suite_image_rows``).
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from coevo.suites.models import (
    ImageBuildOutcome,
    ImageBuildSource,
    Task,
    TaskImageBuild,
)
from workers.environments.workspace import task_image
from workers.trace import Environment, parse_step

logger = logging.getLogger(__name__)

# What a row keeps of a build's log: its start (the base, the first steps) and its end (where
# it failed), as workers/containers/build.py's BoundedLog keeps a build's whole log.
LOG_HEAD_CHARS = 16 * 1024
LOG_TAIL_CHARS = 48 * 1024
MAX_ERROR_CHARS = 4000
MAX_STEP_CHARS = 2000
# NUL and lone surrogates: PostgreSQL's text refuses both, and a RUN step may print either.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


class StepLike(Protocol):
    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class ImageBuild:
    """One build that ran, from wherever it ran, as a row records it."""

    outcome: ImageBuildOutcome
    content_hash: str = ""
    image: str = ""
    seconds: float | None = None
    failed_step: str = ""
    failed_line: int | None = None
    timed_out: bool = False
    error: str = ""
    log: str = ""


def bounded_log(text: str) -> str:
    """``text`` as a row keeps it: its first LOG_HEAD_CHARS and last LOG_TAIL_CHARS, with a
    line saying how much was left out between them."""
    text = _UNSTORABLE.sub("\ufffd", text)
    if len(text) <= LOG_HEAD_CHARS + LOG_TAIL_CHARS:
        return text
    dropped = len(text) - LOG_HEAD_CHARS - LOG_TAIL_CHARS
    return (
        text[:LOG_HEAD_CHARS]
        + f"\n[... {dropped} characters of the log left out ...]\n"
        + text[-LOG_TAIL_CHARS:]
    )


def _text(value: Any, limit: int) -> str:
    return _UNSTORABLE.sub("\ufffd", value)[:limit] if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))


def image_build_from_step(step: Environment) -> ImageBuild | None:
    """The build an "environment" step records (workers/rollout.py), or None when the step
    records none (the image was cached, or the task runs in bubblewrap). The step comes
    from the worker's trace: each value is checked for its type, not trusted."""
    built = step.build
    if isinstance(built, Mapping):
        return ImageBuild(
            outcome=ImageBuildOutcome.BUILT,
            content_hash=_text(built.get("content_hash"), 64),
            image=_text(step.image, 255),
            seconds=_number(built.get("seconds")),
            log=bounded_log(_text(built.get("log"), 10 * 1024**2)),
        )
    failed = step.build_failed
    if isinstance(failed, Mapping):
        line = failed.get("line")
        return ImageBuild(
            outcome=ImageBuildOutcome.FAILED,
            seconds=_number(failed.get("seconds")),
            failed_step=_text(failed.get("step"), MAX_STEP_CHARS),
            failed_line=line if isinstance(line, int) and not isinstance(line, bool) else None,
            timed_out=failed.get("timed_out") is True,
            error=_text(failed.get("error"), MAX_ERROR_CHARS),
            log=bounded_log(_text(failed.get("log"), 10 * 1024**2)),
        )
    return None


def this_machine() -> str:
    """The machine a build ran on, as the page names it."""
    return socket.gethostname()[:255]


def task_image_builds_record(
    *,
    builds: Iterable[tuple[Task | Any, ImageBuild]],
    source: ImageBuildSource,
    machine: str | None = None,
) -> list[TaskImageBuild]:
    """Writes one row per (task or task id, build). ``machine``: where they ran (this one
    when not given)."""
    where = this_machine() if machine is None else machine[:255]
    rows = [
        TaskImageBuild(
            **({"task": task} if isinstance(task, Task) else {"task_id": task}),
            outcome=build.outcome,
            source=source,
            content_hash=build.content_hash,
            image=build.image,
            seconds=build.seconds,
            failed_step=build.failed_step,
            failed_line=build.failed_line,
            timed_out=build.timed_out,
            error=build.error,
            log=build.log,
            machine=where,
        )
        for task, build in builds
    ]
    return TaskImageBuild.objects.bulk_create(rows)


def task_image_builds_record_steps(
    *, task_id: Any, steps: Iterable[StepLike], machine: str | None = None
) -> list[TaskImageBuild]:
    """The builds a rollout's "environment" steps record, written for its task: what the
    worker task calls with the steps it stored."""
    builds = [
        (task_id, build)
        for step in steps
        if isinstance(environment := parse_step(step.kind, step.payload), Environment)
        and (build := image_build_from_step(environment)) is not None
    ]
    if not builds:
        return []
    rows = task_image_builds_record(builds=builds, source=ImageBuildSource.ROLLOUT, machine=machine)
    for row in rows:
        logger.info("task %s: image %s on %s", task_id, row.outcome, row.machine)
    return rows


def task_image_prepare(*, inputs: Mapping[str, Any]) -> ImageBuild | None:
    """Has the image of a task that needs its container (``inputs["environment"]``) on this
    machine's engine, as ``Workspace.for_task`` would have it, and returns the build that ran
    for it, or None (the image was there, or the task needs none). A failed build raises
    ImageBuildFailed as ``Workspace.for_task`` would."""
    environment = inputs.get("environment")
    if not environment:
        return None
    image = task_image(environment)
    if image.cached:
        return None
    return ImageBuild(
        outcome=ImageBuildOutcome.BUILT,
        content_hash=image.content_hash or "",
        image=image.image,
        seconds=image.seconds,
        log=bounded_log(image.log),
    )

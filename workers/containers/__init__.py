"""The container backend: task images and commands run in containers on a Docker engine, for
tasks defined by their container (Harbor's ``docker_image`` or an ``environment/Dockerfile``
that runs commands).

- ``engine``: the client for COEVO_DOCKER_HOST, ``engine_ping``, the labels every object
  carries, ``engine_reap`` (what dead workers left), ``ContainerUnavailable`` (infra error).
- ``images``: ``image_for_task`` (a task's image: mapped, pulled per policy, built once per
  content, with the operator's CA certificates), ``ImageUnavailable``.
- ``ca``: the operator's extra CA certificates as a first layer of every task image.
- ``build``: one build with its bounded log and time; ``ImageBuildFailed`` names the step.
- ``dockerfile``: a task's Dockerfile read for its build (FROM rewritten, steps to lines).
- ``state``: a worker machine's build locks and build logs (COEVO_CONTAINER_DIR).
- ``run``: ``container_run`` (a command to completion or its timeout, contained and removed),
  ``container_commit`` and ``snapshot_remove``.
- ``session``: a rollout's task container (``TaskContainer``: /app a volume the engine fills
  from the image, the agent phase's commands, its stop and commit; ``image_app_check``).
- ``host_runtime``: the worker's Python and Node.js made to run in any task container, where
  the harness runs; ``process``: the harness's process there, as the channel sees one.

docs/deployment.md ("The container backend") says how a worker gets an engine, and
docs/threat-model.md ("Containers") what a container isolates.
"""

from workers.containers.build import ImageBuildFailed
from workers.containers.engine import (
    ContainerUnavailable,
    EngineInfo,
    Reaped,
    engine_ping,
    engine_reap,
)
from workers.containers.images import ImageUnavailable, TaskImage, image_for_task
from workers.containers.run import (
    CONTAINER_CAPABILITIES,
    ContainerRun,
    container_commit,
    container_run,
    snapshot_remove,
)

__all__ = [
    "CONTAINER_CAPABILITIES",
    "ContainerRun",
    "ContainerUnavailable",
    "EngineInfo",
    "ImageBuildFailed",
    "ImageUnavailable",
    "Reaped",
    "TaskImage",
    "container_commit",
    "container_run",
    "engine_ping",
    "engine_reap",
    "image_for_task",
    "snapshot_remove",
]

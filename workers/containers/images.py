"""Task images: a task's ``docker_image``, or its Dockerfile built with its build context,
each on the engine once per content and reused.

- **Names.** ``COEVO_IMAGE_MAP`` maps image names to others (a local image, a mirror): it
  applies to every ``FROM`` and to a task's ``docker_image``. Names are compared the way the
  engine reads them (``python:3.13`` is ``docker.io/library/python:3.13``; no tag is
  ``:latest``). An image the engine lacks is pulled when ``COEVO_CONTAINER_PULL`` is
  ``if-missing``, never with ``never``; one that is neither present, mapped nor pullable is an
  ``ImageUnavailable`` naming what was tried.
- **CA certificates.** With ``COEVO_CONTAINER_CA_CERTS``, every external base gets a first
  layer with the operator's extra CA certificates (workers/containers/ca.py), so ``RUN pip
  install`` works behind a TLS-inspecting proxy; every FROM of the base is rewritten to it.
- **Caching.** A task image is tagged ``coevo-task:<hash>``, the hash covering the rewritten
  Dockerfile (so the mapping and the CA layer), the base images' ids, the CA certificates and
  the context's files: the same task imported twice builds once. Builds of one hash on one
  machine take a file lock under COEVO_CONTAINER_DIR and look for the image again once they
  hold it, so concurrent workers build it once. The log of each build is kept there too.

The context is taken as given (the importer applies ``.dockerignore`` when it stores it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker.errors
from django.conf import settings

from coevo.errors import CoevoError
from workers.containers.build import (
    FORMAT,
    ImageBuildFailed,
    context_tar,
    image_build,
)
from workers.containers.ca import CaCertificates, ca_base, ca_certificates, ca_tag
from workers.containers.dockerfile import DockerfileInvalid, dockerfile_rewrite
from workers.containers.engine import (
    KIND_TASK_IMAGE,
    LABEL_KIND,
    LABEL_MANAGED,
    engine_client,
    engine_errors,
)
from workers.containers.state import build_lock, image_lookup, state_dir, write_private
from workers.environments.workspace_files import (
    TreeError,
    spec_bytes,
    tree_hash,
    tree_validate,
)

logger = logging.getLogger(__name__)

TASK_REPOSITORY = "coevo-task"
MAX_DOCKERFILE_BYTES = 64 * 1024


class ImageUnavailable(CoevoError):
    """An image a task names cannot be had: not on the engine, not mapped, not pullable."""

    code = "image_unavailable"


@dataclass(frozen=True)
class TaskImage:
    """What to run a task in. ``image`` is a name the engine has (``coevo-task:<hash>``, a CA
    base, or the mapped ``docker_image``); ``cached`` when no build ran for this call; ``log``
    the build's log (the stored one on a cache hit; empty when nothing was ever built)."""

    image: str
    image_id: str
    content_hash: str | None
    cached: bool
    log: str
    seconds: float


# --- names ---------------------------------------------------------------------------------


def reference_key(name: str) -> str:
    """``name`` as the engine reads it: registry, path, and a tag or digest."""
    name = name.strip()
    remote, at, digest = name.partition("@")
    slash = remote.rfind("/")
    colon = remote.rfind(":")
    if colon > slash:
        path, tag = remote[:colon], remote[colon + 1 :]
    else:
        path, tag = remote, ""
    first, _, rest = path.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, rest
    else:
        registry = "docker.io"
    if registry in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        registry = "docker.io"
        if "/" not in path:
            path = f"library/{path}"
    if at:
        return f"{registry}/{path}@{digest}" + (f" {tag}" if tag else "")
    return f"{registry}/{path}:{tag or 'latest'}"


def image_resolve(name: str) -> str:
    """``name`` with COEVO_IMAGE_MAP applied (as written there), or ``name`` itself."""
    key = reference_key(name)
    for source, target in settings.COEVO_IMAGE_MAP.items():
        if reference_key(source) == key:
            return target
    return name


def image_ensure(name: str, *, deadline: float | None = None) -> tuple[str, str]:
    """``(reference, image id)`` of ``name`` once mapped and present on the engine, pulled if
    missing and COEVO_CONTAINER_PULL allows; raises ImageUnavailable otherwise."""
    resolved = image_resolve(name)
    mapped = f" (COEVO_IMAGE_MAP maps {name} to it)" if resolved != name else ""
    client = engine_client()
    with contextlib.suppress(docker.errors.ImageNotFound), engine_errors("looking up an image"):
        return resolved, client.api.inspect_image(resolved)["Id"]
    advice = (
        f"Load or build {resolved} on that engine, or map {name} to an image it has with "
        "COEVO_IMAGE_MAP (e.g. COEVO_IMAGE_MAP=python:3.13-slim-bookworm=local/debian:trixie; "
        "docs/configuration.md)."
    )
    if settings.COEVO_CONTAINER_PULL == "never":
        raise ImageUnavailable(
            f"the image {resolved}{mapped} is not on the Docker engine at "
            f"{settings.COEVO_DOCKER_HOST}, and COEVO_CONTAINER_PULL=never forbids pulling it. "
            + advice
        )
    failure = _pull(client, resolved, deadline=deadline)
    if failure is None:
        with (
            contextlib.suppress(docker.errors.ImageNotFound),
            engine_errors("looking up an image"),
        ):
            return resolved, client.api.inspect_image(resolved)["Id"]
        failure = "the engine reported no error, but has no such image after the pull"
    raise ImageUnavailable(
        f"the image {resolved}{mapped} is not on the Docker engine at "
        f"{settings.COEVO_DOCKER_HOST}, and pulling it failed: {failure}. " + advice
    )


def _pull(client: Any, reference: str, *, deadline: float | None) -> str | None:
    """Pulls ``reference``; the engine's reason when it failed, None when it worked."""
    repository, tag = _split_tag(reference)
    logger.info("pulling %s (COEVO_CONTAINER_PULL=if-missing)", reference)
    try:
        with engine_errors("pulling an image"):
            stream = client.api.pull(repository, tag=tag, stream=True, decode=True)
            try:
                for chunk in stream:
                    if "error" in chunk:
                        return str(chunk["error"])
                    if deadline is not None and time.monotonic() > deadline:
                        return "the pull ran past the build's time"
            finally:
                stream.close()
    except docker.errors.APIError as exc:
        return str(exc.explanation or exc)
    return None


def _split_tag(reference: str) -> tuple[str, str | None]:
    if "@" in reference:
        repository, _, digest = reference.partition("@")
        return repository, digest
    slash, colon = reference.rfind("/"), reference.rfind(":")
    if colon > slash:
        return reference[:colon], reference[colon + 1 :]
    return reference, "latest"


# --- task images ---------------------------------------------------------------------------


def image_for_task(
    *,
    dockerfile: str | None = None,
    context: Mapping[str, Mapping[str, Any]] | None = None,
    docker_image: str | None = None,
    build_timeout_s: float | None = None,
) -> TaskImage:
    """The image a task runs in: its ``docker_image`` (mapped, present or pulled, CA-layered),
    or its ``dockerfile`` built with ``context`` (a stored tree: workers/environments/
    workspace_files.py) within ``build_timeout_s`` (at most COEVO_CONTAINER_BUILD_TIMEOUT_S).

    Raises ImageUnavailable (a name that cannot be had), ImageBuildFailed (the build failed,
    with the step and the log), ContainerUnavailable (no engine)."""
    if (dockerfile is None) == (docker_image is None):
        raise ValueError("give a task's dockerfile or its docker_image, not both or neither")
    cap = settings.COEVO_CONTAINER_BUILD_TIMEOUT_S
    timeout_s = min(build_timeout_s or cap, cap)
    started = time.monotonic()
    deadline = started + timeout_s
    ca = ca_certificates()
    if docker_image is not None:
        reference, image_id = image_ensure(docker_image, deadline=deadline)
        if ca is None:
            return TaskImage(reference, image_id, None, True, "", time.monotonic() - started)
        before = image_lookup(ca_tag(image_id, ca))
        tag, image_id = ca_base(reference, image_id, ca, timeout_s=timeout_s)
        return TaskImage(tag, image_id, None, before is not None, "", time.monotonic() - started)
    return _task_build(str(dockerfile), context or {}, ca=ca, timeout_s=timeout_s, started=started)


def _task_build(
    dockerfile: str,
    context: Mapping[str, Mapping[str, Any]],
    *,
    ca: CaCertificates | None,
    timeout_s: float,
    started: float,
) -> TaskImage:
    deadline = started + timeout_s
    if len(dockerfile.encode()) > MAX_DOCKERFILE_BYTES:
        raise ImageBuildFailed(
            f"the Dockerfile is over the {MAX_DOCKERFILE_BYTES // 1024} KiB limit"
        )
    try:
        tree = tree_validate(dict(context), label="the build context")
    except TreeError as exc:
        raise ImageBuildFailed(f"the task's build context cannot be built: {exc}") from exc
    base_ids: dict[str, str] = {}

    def base(image: str, line: int) -> str:
        try:
            reference, image_id = image_ensure(image, deadline=deadline)
        except ImageUnavailable as exc:
            raise ImageUnavailable(f"Dockerfile line {line} (FROM {image}): {exc}") from exc
        base_ids[image] = image_id
        if ca is None:
            return reference
        remaining = max(1.0, deadline - time.monotonic())
        return ca_base(reference, image_id, ca, timeout_s=remaining)[0]

    try:
        rewritten = dockerfile_rewrite(dockerfile, base=base)
    except DockerfileInvalid as exc:
        raise ImageBuildFailed(f"the task's Dockerfile cannot be built: {exc}") from exc
    content_hash = hashlib.sha256(
        json.dumps(
            {
                "format": FORMAT,
                "dockerfile": rewritten.text,
                "bases": base_ids,
                "ca": ca.digest if ca else None,
                "context": tree_hash(tree),
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    tag = f"{TASK_REPOSITORY}:{content_hash[:32]}"
    log_path = state_dir("logs") / f"{content_hash[:32]}.log"
    with build_lock(content_hash[:32], timeout_s=timeout_s):
        found = image_lookup(tag)
        if found:
            log = log_path.read_bytes().decode(errors="replace") if log_path.is_file() else ""
            return TaskImage(tag, found, content_hash, True, log, time.monotonic() - started)
        # The CLI's way with a Dockerfile kept outside the context: a name of its own, listed
        # in .dockerignore, which the engine then drops from the context (with .dockerignore
        # itself when it lists itself), so `COPY . /app` copies neither.
        name = f".coevo-dockerfile.{secrets.token_hex(8)}"
        ignore = tree.get(".dockerignore")
        ignored = (spec_bytes(ignore) if ignore else b".dockerignore") + f"\n{name}\n".encode()
        files = {name: rewritten.text.encode(), ".dockerignore": ignored}
        data = context_tar({k: v for k, v in tree.items() if k != ".dockerignore"}, files)
        remaining = max(1.0, deadline - time.monotonic())
        try:
            built = image_build(
                context=data,
                dockerfile=name,
                tag=tag,
                labels={LABEL_MANAGED: "1", LABEL_KIND: KIND_TASK_IMAGE},
                timeout_s=remaining,
                memory_bytes=settings.COEVO_CONTAINER_BUILD_MEMORY_BYTES,
                origins=rewritten.origins,
            )
        except ImageBuildFailed as exc:
            write_private(log_path.with_suffix(".failed.log"), exc.log)
            raise
        write_private(log_path, built.log)
        return TaskImage(tag, built.image_id, content_hash, False, built.log, built.seconds)

"""What a Harbor task that needs its container asks of it, read from task.toml and
``environment/`` for the container backend (docs/deployment.md, "The container backend").

coevo/suites/harbor_tasks.py calls this only for a task that needs its container (a
``docker_image``, or a Dockerfile the files-only reading cannot reproduce) when
``COEVO_CONTAINER_BACKEND`` is on. It stores what the worker builds and runs
(workers/containers/images.py, ``image_for_task``):

``inputs["environment"] = {"dockerfile", "context", "docker_image", "build_timeout_s", "cpus",
"memory_bytes", "storage_bytes", "allow_internet"}``, ``verifier["env"]`` and
``verifier["solution_env"]``.

Every value is checked here, at import, so that a task stored is one the worker can take: a
bad value is a ``TaskRefused`` that names the key and what to write instead, never a rollout
that fails later for the same reason on every epoch. Nothing here talks to a Docker engine:
whether an image can be had is the worker's to find out (``ImageUnavailable``), since the web
process that imports has no engine, and a registry reachable from a worker may not be from
here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from coevo.suites.docker_context import DockerfileError, context_tree
from workers.containers.images import image_resolve

# Harbor's default (harbor.models.task.config.EnvironmentConfig): a task that says nothing
# may reach the internet. The worker still applies it only where the operator allows it.
DEFAULT_ALLOW_INTERNET = True
# A reference is at most 255 characters in Docker's own grammar (distribution/reference).
MAX_IMAGE_CHARS = 255
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")
# Environment variables a task's tests or solution get: a few names and short values in
# every real task; bounded so that a task.toml cannot make each container's environment the
# size of the suite.
MAX_ENV_VARS = 64
MAX_ENV_VALUE_BYTES = 4 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Harbor's deprecated ``memory = "4G"`` and ``storage = "10G"`` (still read by Harbor, which
# turns them into memory_mb and storage_mb): the suffixes it accepts.
_SIZE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG])", re.IGNORECASE)
# The task.toml keys this module applies; harbor_tasks.py lists every other key as not applied.
APPLIED_KEYS: dict[str, tuple[str, ...]] = {
    "environment": (
        "docker_image",
        "build_timeout_sec",
        "cpus",
        "memory_mb",
        "memory",
        "storage_mb",
        "storage",
        "allow_internet",
    ),
    "verifier": ("env",),
    "solution": ("env",),
}


class EnvironmentRefused(ValueError):
    """A task.toml value or an ``environment/`` the container backend cannot take; the message
    names it and what to write instead (harbor_tasks.py turns it into TaskRefused)."""


@dataclass
class TaskContainer:
    """What a task's container needs: ``environment`` for ``inputs``, the two env maps for the
    verifier, and one line per value applied (for the import report)."""

    environment: dict[str, Any]
    verifier_env: dict[str, str]
    solution_env: dict[str, str]
    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def task_container(
    *, config: dict[str, Any], environment_dir: Path, dockerfile: str | None
) -> TaskContainer:
    """The container a task asks for. ``dockerfile`` is environment/Dockerfile's text (None
    without one); a ``docker_image`` takes precedence over it, as in Harbor, and then no build
    context is stored. Every value is checked before the build context is read. Raises
    EnvironmentRefused."""
    table = _table(config, "environment")
    image = _image(table.get("docker_image"))
    if image is None and dockerfile is None:
        raise EnvironmentRefused(
            "the task needs its container but has neither [environment] docker_image nor "
            "environment/Dockerfile; add one"
        )
    resources, applied = _resources(table)
    verifier_env, solution_env, env_applied, notes = _env_maps(config)
    if image is not None:
        applied.insert(0, f"environment.docker_image = {image!r}")
        notes = _image_notes(image) + notes
        if dockerfile is not None:
            notes.insert(
                0,
                "environment/Dockerfile is not built: [environment] docker_image takes "
                "precedence, as in Harbor",
            )
    return TaskContainer(
        environment={
            "dockerfile": dockerfile if image is None else None,
            "context": {} if image is not None else _context(environment_dir),
            "docker_image": image,
            **resources,
        },
        verifier_env=verifier_env,
        solution_env=solution_env,
        applied=applied + env_applied,
        notes=notes,
    )


def _resources(table: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``[environment]``'s build timeout, resources and internet rule as stored, and the
    report's line for each (with the operator's bound that caps it on the workers)."""
    build_timeout = _positive(table, "build_timeout_sec", "seconds")
    cpus = _positive(table, "cpus", "CPUs")
    memory = _size(table, "memory")
    storage = _size(table, "storage")
    allow_internet = _allow_internet(table)
    applied: list[str] = []
    if build_timeout is not None:
        applied.append(
            f"environment.build_timeout_sec = {build_timeout:g} (at most "
            "COEVO_CONTAINER_BUILD_TIMEOUT_S on the workers)"
        )
    if cpus is not None:
        applied.append(f"environment.cpus = {cpus:g} (at most COEVO_CONTAINER_MAX_CPUS)")
    if memory is not None:
        applied.append(
            f"environment.{memory[1]} = {memory[2]} ({_mib(memory[0])}, at most "
            "COEVO_CONTAINER_MAX_MEMORY_BYTES)"
        )
    if storage is not None:
        applied.append(
            f"environment.{storage[1]} = {storage[2]} ({_mib(storage[0])}): bounds /app (at "
            "most COEVO_WORKSPACE_MAX_BYTES); the rest of the container's disk is not limited"
        )
    default = "" if "allow_internet" in table else " (Harbor's default)"
    applied.append(
        f"environment.allow_internet = {'true' if allow_internet else 'false'}{default}"
        + (
            ": the container reaches the internet only where COEVO_CONTAINER_ALLOW_INTERNET "
            "is on for the workers"
            if allow_internet
            else ""
        )
    )
    stored = {
        "build_timeout_s": build_timeout,
        "cpus": cpus,
        "memory_bytes": memory[0] if memory else None,
        "storage_bytes": storage[0] if storage else None,
        "allow_internet": allow_internet,
    }
    return stored, applied


def _env_maps(
    config: dict[str, Any],
) -> tuple[dict[str, str], dict[str, str], list[str], list[str]]:
    """(``[verifier] env``, ``[solution] env``, the report's lines, notes)."""
    verifier_env = _env(_table(config, "verifier").get("env"), "verifier")
    solution_env = _env(_table(config, "solution").get("env"), "solution")
    applied: list[str] = []
    notes: list[str] = []
    for section, env in (("verifier", verifier_env), ("solution", solution_env)):
        if env:
            applied.append(f"{section}.env: {', '.join(sorted(env))}")
        if any("${" in value for value in env.values()):
            # Filling a ${NAME} from the host, as Harbor can, would hand the worker's secrets
            # (its settings are in its environment) to the task's code.
            notes.append(
                f"[{section}] env: values are passed as written; a ${{NAME}} in one is not "
                "filled in from the worker's environment"
            )
    return verifier_env, solution_env, applied, notes


def _table(config: dict[str, Any], name: str) -> dict[str, Any]:
    table = config.get(name, {})
    if not isinstance(table, dict):
        raise EnvironmentRefused(f"task.toml: [{name}] must be a table")
    return table


def _image(value: Any) -> str | None:
    """``docker_image`` if it reads as an image reference (``python:3.13-slim``,
    ``ghcr.io/org/name@sha256:…``). Only its form is checked: no engine is asked."""
    if value is None or value == "":  # Harbor reads an empty name as none, too
        return None
    example = "such as python:3.13-slim or ghcr.io/org/name:1.0"
    if not isinstance(value, str) or not value:
        raise EnvironmentRefused(
            f"task.toml: [environment] docker_image must be an image name, {example}"
        )
    shown = value if len(value) <= 80 else value[:77] + "..."
    if len(value) > MAX_IMAGE_CHARS:
        raise EnvironmentRefused(
            f"task.toml: [environment] docker_image is {len(value)} characters, over the "
            f"{MAX_IMAGE_CHARS} an image reference may have"
        )
    if not _IMAGE.fullmatch(value):
        raise EnvironmentRefused(
            f"task.toml: [environment] docker_image = {shown!r} is not an image reference "
            f"(letters, digits and . _ / : @ - only, no spaces), {example}"
        )
    return value


def _image_notes(image: str) -> list[str]:
    """What an operator should know before the first rollout asks the engine for ``image``."""
    if settings.COEVO_CONTAINER_PULL != "never" or image_resolve(image) != image:
        return []
    return [
        f"COEVO_CONTAINER_PULL=never and COEVO_IMAGE_MAP does not map {image}: the workers' "
        "Docker engine must already hold it, or every rollout of this task fails with "
        "image_unavailable"
    ]


def _context(environment_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        return context_tree(environment_dir)
    except DockerfileError as exc:
        raise EnvironmentRefused(str(exc)) from None
    except OSError as exc:
        raise EnvironmentRefused(f"environment/: cannot read it ({exc.strerror})") from None


def _number(value: Any, key: str, unit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EnvironmentRefused(
            f"task.toml: [environment] {key} must be a number of {unit}, got {value!r}"
        )
    if value <= 0:
        raise EnvironmentRefused(
            f"task.toml: [environment] {key} must be above 0, got {value!r}; leave it out "
            "for the operator's default"
        )
    return float(value)


def _positive(table: dict[str, Any], key: str, unit: str) -> float | None:
    value = table.get(key)
    return None if value is None else _number(value, key, unit)


def _size(table: dict[str, Any], name: str) -> tuple[int, str, str] | None:
    """(bytes, the key it came from, its value as written) of ``<name>_mb`` or Harbor's
    deprecated ``<name> = "4G"``, which Harbor lets override ``<name>_mb``."""
    text = table.get(name)
    key = f"{name}_mb"
    if text is not None:
        if not isinstance(text, str) or not (match := _SIZE.fullmatch(text.strip())):
            raise EnvironmentRefused(
                f'task.toml: [environment] {name} must be a size such as "512M" or "4G" '
                f"(K, M or G), got {text!r}; or write {key} = 4096"
            )
        size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])
        key, shown = name, repr(text)
    else:
        value = table.get(key)
        if value is None:
            return None
        size = int(_number(value, key, "MiB") * 1024**2)
        shown = f"{value:g}"
    if size < 1024**2:
        raise EnvironmentRefused(
            f"task.toml: [environment] {key} = {shown} is under 1 MiB; give the container "
            "what it needs, or leave it out for the operator's default"
        )
    return size, key, shown


def _allow_internet(table: dict[str, Any]) -> bool:
    value = table.get("allow_internet", DEFAULT_ALLOW_INTERNET)
    if not isinstance(value, bool):
        raise EnvironmentRefused(
            f"task.toml: [environment] allow_internet must be true or false, got {value!r}"
        )
    return value


def _env(value: Any, section: str) -> dict[str, str]:
    """``[section] env`` as a map of variable names to values, within its bounds."""
    if value is None:
        return {}
    where = f"task.toml: [{section}] env"
    if not isinstance(value, dict):
        raise EnvironmentRefused(f'{where} must be a table of names to strings, e.g. {{ A = "1" }}')
    if len(value) > MAX_ENV_VARS:
        raise EnvironmentRefused(
            f"{where} has {len(value)} variables, over the limit of {MAX_ENV_VARS}"
        )
    for name, item in value.items():
        if not _ENV_NAME.fullmatch(name):
            raise EnvironmentRefused(
                f"{where}: {name[:60]!r} is not a variable name (a letter or _, then letters, "
                "digits or _)"
            )
        if not isinstance(item, str):
            raise EnvironmentRefused(
                f'{where}: {name} must be a string, got {item!r}; quote it ({name} = "...")'
            )
        if "\x00" in item:
            raise EnvironmentRefused(f"{where}: {name} holds a NUL character")
        if len(item.encode()) > MAX_ENV_VALUE_BYTES:
            raise EnvironmentRefused(
                f"{where}: {name} is {len(item.encode())} bytes, over the "
                f"{MAX_ENV_VALUE_BYTES // 1024} KiB limit; put large data in a file of tests/"
            )
    return dict(value)


def _mib(size: int) -> str:
    return f"{size / 1024**2:g} MiB"

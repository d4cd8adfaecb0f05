"""One Harbor task directory read as a workspace task's stored data (coevo/suites/harbor.py
imports them): ``instruction.md``, ``task.toml``, ``tests/``, ``solution/`` and the starting
files that ``environment/`` puts in ``/app`` (coevo/suites/dockerfile.py). Nothing is followed
through a link and every file is bounded before it is read.

A task whose environment needs its container (a ``docker_image``, or a Dockerfile that does
more than copy files) is stored as it is when the container backend is on
(``container_backend``: ``COEVO_CONTAINER_BACKEND``), with what the worker builds and runs
(coevo/suites/harbor_environment.py); otherwise it is refused, or with ``allow_dockerfile``
taken with its copied files only. A Docker Compose task is refused either way: one task, one
container. Files-only tasks are stored as they always were, and run in the bwrap sandbox.
"""

from __future__ import annotations

import datetime
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevo.suites.dockerfile import DockerfileError, DockerfileFiles, dockerfile_files
from coevo.suites.harbor_environment import (
    APPLIED_KEYS,
    EnvironmentRefused,
    TaskContainer,
    task_container,
)
from workers.environments.workspace_files import TreeError, spec_bytes, tree_from_dir

TASK_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
MAX_TASK_TOML_BYTES = 64 * 1024
MAX_INSTRUCTION_BYTES = 256 * 1024
DEFAULT_VERIFIER_TIMEOUT_S = 120.0
# Shown in a warning before "and N more".
MAX_LISTED = 8
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
# task.toml keys that are read; every other key is listed in the report as not applied.
_TASK_KEYS = ("name", "description", "keywords")
_USED: dict[str, tuple[str, ...] | None] = {
    "version": None,
    "schema_version": None,
    "metadata": None,
    "task": _TASK_KEYS,
    "agent": ("timeout_sec",),
    "verifier": ("timeout_sec",),
    # docker_image is read (a task with one needs its container); the rest is not.
    "environment": ("docker_image",),
}
# ... and for a task stored for the container backend, what its container applies besides.
_USED_IN_CONTAINER: dict[str, tuple[str, ...] | None] = {
    **_USED,
    **{
        section: tuple(dict.fromkeys((*(_USED.get(section) or ()), *keys)))
        for section, keys in APPLIED_KEYS.items()
    },
}
CONTAINER_BACKEND_ADVICE = (
    'set COEVO_CONTAINER_BACKEND=1 on the web process and the workers (docs/deployment.md, "The '
    'container backend") to import it as it is'
)


@dataclass(frozen=True)
class HarborTask:
    key: str
    inputs: dict[str, Any]
    verifier: dict[str, Any]
    size: int  # bytes of its instruction and trees, counted against the suite's limit


class TaskRefused(Exception):
    """One task cannot be imported; the message says why and what to change."""


def harbor_task_read(
    *, key: str, directory: Path, allow_dockerfile: bool = False, container_backend: bool = False
) -> tuple[HarborTask, list[str]]:
    """One task directory as stored task data and its warnings; raises TaskRefused.
    ``container_backend`` (COEVO_CONTAINER_BACKEND) stores a task that needs its container
    with what the worker builds and runs; see the module docstring."""
    if not TASK_KEY.match(key):
        raise TaskRefused(
            "the directory name is not a usable task key: use 1 to 100 lowercase letters, "
            "digits, '.', '-' or '_', starting with a letter or digit"
        )
    if stat.S_ISLNK(directory.lstat().st_mode):
        raise TaskRefused("the task directory is a symbolic link; only plain directories are taken")
    warnings: list[str] = []
    config = _task_toml(directory / "task.toml")
    metadata, agent_timeout, verifier_timeout, dropped = _task_config(config)
    instruction = _text_file(directory / "instruction.md", "instruction.md", MAX_INSTRUCTION_BYTES)
    if not instruction.strip():
        raise TaskRefused("instruction.md is empty; write what the task asks for")
    tests = _tree(directory / "tests", "tests", required=True)
    if not _is_regular(directory / "tests" / "test.sh"):
        raise TaskRefused("tests/test.sh is missing: it runs the tests and writes the reward")
    solution = _tree(directory / "solution", "solution", required=False)
    env_warnings: list[str] = []
    files, container = _environment(
        directory / "environment",
        config,
        allow=allow_dockerfile,
        container_backend=container_backend,
        warnings=env_warnings,
    )
    ignored = _not_applied(config, _USED_IN_CONTAINER if container else _USED) + dropped
    if ignored:
        warnings.append(f"task.toml: not applied here: {listed(ignored)}")
    warnings.extend(env_warnings)
    inputs = {
        "instruction": instruction,
        "files": files,
        "metadata": metadata,
        "agent_timeout_s": agent_timeout,
    }
    verifier = {"tests": tests, "solution": solution, "timeout_s": verifier_timeout}
    size = len(instruction.encode()) + sum(_tree_bytes(t) for t in (files, tests, solution))
    if container is not None:
        inputs["environment"] = container.environment
        verifier["env"] = container.verifier_env
        verifier["solution_env"] = container.solution_env
        size += len((container.environment["dockerfile"] or "").encode())
        size += _tree_bytes(container.environment["context"])
    return HarborTask(key=key, inputs=inputs, verifier=verifier, size=size), warnings


def _task_toml(path: Path) -> dict[str, Any]:
    text = _text_file(path, "task.toml", MAX_TASK_TOML_BYTES)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskRefused(f"task.toml is not valid TOML: {exc}") from None


def _task_config(
    config: dict[str, Any],
) -> tuple[dict[str, Any], float | None, float, list[str]]:
    """(metadata, agent timeout, verifier timeout, metadata values dropped) from task.toml."""
    if "steps" in config:
        raise TaskRefused(
            "task.toml declares [[steps]]: multi-step tasks are not supported; import each "
            "step as a task of its own"
        )
    for section, keys in _USED.items():
        if keys is not None and section in config and not isinstance(config[section], dict):
            raise TaskRefused(f"task.toml: [{section}] must be a table")
    metadata_table = config.get("metadata", {})
    if not isinstance(metadata_table, dict):
        raise TaskRefused("task.toml: [metadata] must be a table")
    task_table = config.get("task", {})
    metadata: dict[str, Any] = {k: task_table[k] for k in _TASK_KEYS if k in task_table}
    metadata.update(metadata_table)
    dropped: list[str] = []
    metadata = _jsonable(metadata, "metadata", dropped)
    agent = _timeout(config.get("agent", {}), "agent")
    verifier = _timeout(config.get("verifier", {}), "verifier")
    return (
        metadata,
        agent,
        verifier if verifier is not None else DEFAULT_VERIFIER_TIMEOUT_S,
        dropped,
    )


def _not_applied(config: dict[str, Any], used: dict[str, tuple[str, ...] | None]) -> list[str]:
    """task.toml's keys that ``used`` does not name (a section named None is used whole)."""
    ignored: list[str] = []
    for section, value in config.items():
        keys = used.get(section, ())
        if keys is None:
            continue
        if not isinstance(value, dict):
            ignored.append(section)
            continue
        ignored.extend(f"{section}.{key}" for key in value if key not in keys)
    return ignored


def _timeout(section: dict[str, Any], name: str) -> float | None:
    value = section.get("timeout_sec")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TaskRefused(f"task.toml: [{name}] timeout_sec must be a number of seconds")
    if value <= 0:
        raise TaskRefused(f"task.toml: [{name}] timeout_sec must be above 0, got {value}")
    return float(value)


def _jsonable(value: Any, where: str, dropped: list[str]) -> Any:
    """TOML values as JSON: dates and times become ISO strings; non-finite floats (which JSON
    cannot carry) are dropped and listed."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            converted = _jsonable(item, f"{where}.{key}", dropped)
            if converted is not _DROP:
                out[key] = converted
        return out
    if isinstance(value, list):
        items = [_jsonable(item, f"{where}[{i}]", dropped) for i, item in enumerate(value)]
        return [item for item in items if item is not _DROP]
    if isinstance(value, float) and not math.isfinite(value):
        dropped.append(where)
        return _DROP
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return value


_DROP = object()


def _environment(
    environment: Path,
    config: dict[str, Any],
    *,
    allow: bool,
    container_backend: bool,
    warnings: list[str],
) -> tuple[dict[str, dict[str, Any]], TaskContainer | None]:
    """The starting files of /app from environment/, and the task's container when it needs
    one and the container backend is on (see the module docstring)."""
    exists = _environment_exists(environment)
    files = DockerfileFiles()
    dockerfile = environment / "Dockerfile"
    has_dockerfile = exists and (dockerfile.exists() or dockerfile.is_symlink())
    if has_dockerfile:
        try:
            files = dockerfile_files(context=environment, dockerfile=dockerfile)
        except DockerfileError as exc:
            raise TaskRefused(str(exc)) from None
    compose = [name for name in COMPOSE_FILES if exists and (environment / name).exists()]
    needs = _container_needs(config, compose, files)
    if not needs:
        if not exists:
            warnings.append("no environment/: the task starts from an empty /app")
        elif not has_dockerfile:
            warnings.append("environment/ has no Dockerfile: the task starts from an empty /app")
        _ignored_instructions(files, warnings)
        return files.tree, None
    if compose:
        reason = (
            f"{needs}: multi-container tasks are not supported (the container backend runs "
            "one container a task)"
        )
    elif container_backend:
        return files.tree, _container(environment, config, files, has_dockerfile, warnings)
    else:
        reason = f"{needs}: the task needs its container, which the bwrap sandbox cannot build"
    advice = "" if compose else f"{CONTAINER_BACKEND_ADVICE}, or "
    if not allow:
        raise TaskRefused(
            f"{reason}; {advice}pass --allow-dockerfile (API: allow_dockerfile) to import it "
            "with only its copied files"
        )
    skipped = f" (skipped: {listed(files.unsupported)})" if files.unsupported else ""
    warnings.append(
        f"{reason}; imported with only the files its Dockerfile copies into /app{skipped}: "
        "anything else the image would hold is missing"
        + ("" if compose else f" ({CONTAINER_BACKEND_ADVICE})")
    )
    _ignored_instructions(files, warnings)
    return files.tree, None


def _environment_exists(environment: Path) -> bool:
    try:
        mode = environment.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise TaskRefused("environment is not a directory (a symbolic link or a file)")
    return True


def _container_needs(config: dict[str, Any], compose: list[str], files: DockerfileFiles) -> str:
    """Why the task needs its container ("" when its files are all it needs)."""
    needs: list[str] = []
    image = (config.get("environment") or {}).get("docker_image")
    if image:
        needs.append(f"task.toml sets [environment] docker_image = {str(image)[:80]!r}")
    if compose:
        needs.append(f"environment/{compose[0]} defines the task's containers")
    if files.unsupported:
        first = files.unsupported[0]
        verb = "runs" if first.startswith("RUN ") else "has"
        more = len(files.unsupported) - 1
        needs.append(
            f"environment/Dockerfile {verb} `{first}`"
            + (f" (and {more} more instruction{'s' * (more > 1)} of the kind)" if more else "")
        )
    return "; ".join(needs)


def _container(
    environment: Path,
    config: dict[str, Any],
    files: DockerfileFiles,
    has_dockerfile: bool,
    warnings: list[str],
) -> TaskContainer:
    """The task's container for the container backend, and what it applies in the report."""
    try:
        container = task_container(
            config=config,
            environment_dir=environment,
            dockerfile=files.text if has_dockerfile else None,
        )
    except EnvironmentRefused as exc:
        raise TaskRefused(str(exc)) from None
    image = container.environment["docker_image"]
    runs = "runs in its container (COEVO_CONTAINER_BACKEND): " + (
        f"the image {image}"
        if image is not None
        else f"the image environment/Dockerfile builds, with {listed(files.unsupported)}"
    )
    warnings.append(runs)
    warnings.append(f"task.toml: applied in its container: {'; '.join(container.applied)}")
    warnings.extend(container.notes)
    return container


def _ignored_instructions(files: DockerfileFiles, warnings: list[str]) -> None:
    if files.ignored:
        warnings.append(
            f"environment/Dockerfile: ignored (no effect on /app's files): {listed(files.ignored)}"
        )


def _tree(path: Path, label: str, *, required: bool) -> dict[str, dict[str, Any]]:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        if required:
            raise TaskRefused(
                f"{label}/ is missing: it holds test.sh, which runs the tests and writes the reward"
            ) from None
        return {}
    if not stat.S_ISDIR(mode):
        raise TaskRefused(f"{label} is not a directory (a symbolic link or a file)")
    try:
        return tree_from_dir(path, label=f"{label}/")
    except TreeError as exc:
        raise TaskRefused(str(exc)) from None
    except OSError as exc:
        raise TaskRefused(f"{label}/: cannot read it ({exc.strerror})") from None


def _text_file(path: Path, label: str, limit: int) -> str:
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise TaskRefused(f"{label} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise TaskRefused(f"{label} is not a regular file (a symbolic link or a directory)")
    if st.st_size > limit:
        raise TaskRefused(f"{label} is {st.st_size} bytes, over the {limit // 1024} KiB limit")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    try:
        return data[:limit].decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskRefused(f"{label} is not UTF-8 text (byte {exc.start})") from None


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _tree_bytes(tree: dict[str, dict[str, Any]]) -> int:
    return sum(len(spec_bytes(spec)) for spec in tree.values())


def listed(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    return shown + (f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else "")

"""Harnesses' declared dependencies: one environment per content hash, built with uv (and npm),
cached on the worker and mounted read-only into the sandbox.

A harness declares its dependencies in ``harness.toml`` (``[harness] requirements``): a
requirements file in which every requirement is pinned (``name==version``, optionally with
``--hash``), or a ``pyproject.toml`` with its ``uv.lock``. The environment's key hashes those
files' bytes, the worker's Python and the index configuration, so one key is one set of
installed files on every worker that shares the configuration.

Node dependencies (``[harness] node_lock``) are an npm lock (lockfileVersion 3) with its
package.json, every package a registry tarball pinned by its integrity hash
(workers/harness_requirements.py refuses git, file, link and other URLs before anything runs).
They are installed by ``npm ci`` into the same environment (``site/node_modules``, each
package's command linked into ``site/bin``), keyed also by the Node major version, the platform
and the npm cache or registry. Install scripts do not run (``--ignore-scripts``) unless the
manifest sets ``node_scripts = true``: then the packages' own code runs while the build can
reach the registry, which is the harness author's trust decision, documented as such.

What may run where:
- The build has network (the operator's index, COEVO_HARNESS_INDEX_URL; the npm registry,
  COEVO_HARNESS_NPM_REGISTRY) or none at all (COEVO_HARNESS_FIND_LINKS, a local wheel
  directory: ``--no-index``; COEVO_HARNESS_NPM_CACHE, a prefilled npm cache: ``--offline``).
  It installs wheels only (``--no-build``): installing a wheel unpacks files and runs no
  package code, so nothing the harness controls runs while the build can reach the network
  (nor does npm run install scripts, unless the manifest allows them). uv is given only pins
  that were checked first (workers/harness_requirements.py: no options, URLs, paths or editables
  from the harness's files), the operator's index and no configuration file
  (workers/harness_env_build.py).
- A build never runs inside a rollout's wall time: the worker prepares the environment before
  the harness starts (coevo/evaluations/services/rollouts.py) and in the campaign's import
  stage (coevo/campaigns/import_checks.py). It has a timeout and bounded output; a build that
  fails ends the rollout as a harness_error of kind ``dependencies`` carrying the resolver's
  message (workers/outcomes.py: DependencyBuildFailed).

The cache (COEVO_HARNESS_ENV_DIR):
- ``envs/KEY/site`` is a finished environment (mounted at /opt/harness-env), ``envs/KEY/env.json``
  says what it holds; its mtime is the last use. A build is made in ``builds/`` and renamed into
  ``envs/`` only when complete, so a half-built directory is never used, and a crashed build
  leaves only a directory in ``builds/`` that the next build of its key (or a prune) removes.
- ``locks/KEY.lock`` orders everything about one key across threads and processes (flock):
  building holds it exclusively, so two workers asking for one key end with one build; using an
  environment holds it shared for as long as the sandbox may read it, so eviction, which needs
  it exclusively, never removes an environment in use. Lock files are never deleted (a waiter
  could otherwise lock a deleted file while another locks its replacement).
- Past COEVO_HARNESS_ENV_MAX_BYTES (all environments together) the least recently used ones
  not in use are removed after each build. One environment larger than the whole bound does
  not build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from coevo.errors import InvalidManifest
from workers import sandbox
from workers.harness_env_build import harness_env_build
from workers.harness_requirements import Requirements, harness_env_key, harness_requirements

logger = logging.getLogger(__name__)

# Where the environment appears in the sandbox: on PYTHONPATH, its scripts (bin/) on PATH, its
# Node packages (node_modules/) on NODE_PATH.
ENV_MOUNT = "/opt/harness-env"
# Waiting for another worker's build of the same key: its timeout, and then some.
LOCK_GRACE_S = 60
_POLL_S = 0.05


@dataclass
class HarnessEnv:
    """A built environment held for use (its lock shared until ``close``), or none (``path``
    is None: the harness declares no dependencies)."""

    key: str = ""
    path: Path | None = None
    built: bool = False
    seconds: float = 0.0
    _fd: int | None = field(default=None, repr=False)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> HarnessEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()  # a holder that never closed it (an exception before its with) lets go


# --- the cache -----------------------------------------------------------------------------


def harness_env_prepare(*, harness_dir: Path) -> HarnessEnv:
    """The environment of the harness in ``harness_dir``, built if it is not cached yet, held
    until closed (use it as a context manager around the sandbox that mounts it).

    A harness that declares no dependencies, or whose manifest does not load (the rollout or
    the import check reports that), gets an empty HarnessEnv. Raises DependencyBuildFailed
    when the declared dependencies do not build.
    """
    try:
        requirements = harness_requirements(harness_dir)
    except InvalidManifest:
        return HarnessEnv()
    if requirements is None:
        return HarnessEnv()
    return harness_env_ensure(requirements)


def harness_env_ensure(requirements: Requirements) -> HarnessEnv:
    """The built environment of ``requirements``, held (shared) until closed."""
    started = time.monotonic()
    key = harness_env_key(requirements)
    root = _cache_root()
    env_dir = root / "envs" / key
    wait_s = settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S + LOCK_GRACE_S
    built = False
    for _round in range(3):
        fd = _lock(root / "locks" / f"{key}.lock", fcntl.LOCK_SH, wait_s=wait_s)
        try:
            if not env_dir.is_dir():
                # Exclusive to build, shared again to use: each switch lets go first (two
                # holders of a shared lock could never both upgrade it), so look again once
                # holding the new one: another thread or worker may have built it, or evicted
                # it, in between.
                fcntl.flock(fd, fcntl.LOCK_UN)
                _relock(fd, fcntl.LOCK_EX, wait_s=wait_s)
                if not env_dir.is_dir():
                    harness_env_build(requirements, key=key, root=root)
                    built = True
                fcntl.flock(fd, fcntl.LOCK_UN)
                _relock(fd, fcntl.LOCK_SH, wait_s=wait_s)
            if env_dir.is_dir():
                os.utime(env_dir / "env.json")  # its last use, for least-recently-used eviction
                env = HarnessEnv(key=key, path=env_dir / "site", built=built, _fd=fd)
                fd = None
                break
            # Evicted between the build and the shared lock (a bound smaller than one
            # environment's share): build it again.
        finally:
            if fd is not None:
                os.close(fd)
    else:
        raise TimeoutError(
            f"harness environment {key} was evicted three times as soon as it was built: "
            "COEVO_HARNESS_ENV_MAX_BYTES is too small for the environments in use"
        )
    if built:
        harness_envs_prune(keep=key)
    env.seconds = time.monotonic() - started
    logger.info(
        "harness environment %s (%s): %s in %.2fs",
        key,
        requirements.label,
        "built" if built else "cached",
        env.seconds,
    )
    return env


def harness_envs_prune(*, keep: str = "") -> list[str]:
    """Remove the least recently used environments not in use until all of them fit in
    COEVO_HARNESS_ENV_MAX_BYTES, and leftovers of crashed builds; the keys removed."""
    root = _cache_root()
    for leftover in (root / "trash").iterdir():
        shutil.rmtree(leftover, ignore_errors=True)
    for build in (root / "builds").iterdir():
        _remove_unlocked(root, build.name.split("-")[0], build, what="stale build")
    entries = []
    for env_dir in (root / "envs").iterdir():
        meta = env_dir / "env.json"
        with contextlib.suppress(OSError, ValueError, KeyError):
            entries.append(
                (meta.stat().st_mtime, int(json.loads(meta.read_text())["bytes"]), env_dir)
            )
    total = sum(size for _, size, _ in entries)
    removed: list[str] = []
    for _, size, env_dir in sorted(entries, key=lambda entry: entry[0]):
        if total <= settings.COEVO_HARNESS_ENV_MAX_BYTES:
            break
        if env_dir.name == keep:
            continue
        if _remove_unlocked(root, env_dir.name, env_dir, what="least recently used environment"):
            total -= size
            removed.append(env_dir.name)
    return removed


def _remove_unlocked(root: Path, key: str, directory: Path, *, what: str) -> bool:
    """Remove ``directory`` if no one holds ``key``'s lock (in use, or being built)."""
    try:
        fd = _lock(root / "locks" / f"{key}.lock", fcntl.LOCK_EX, wait_s=0)
    except TimeoutError:
        return False
    try:
        trash = root / "trash" / f"{directory.name}-{secrets.token_hex(4)}"
        try:
            directory.rename(trash)  # gone from envs/ at once; deleted at leisure
        except FileNotFoundError:
            return False
    finally:
        os.close(fd)
    shutil.rmtree(trash, ignore_errors=True)
    logger.info("harness environments: removed %s %s", what, directory.name)
    return True


def _cache_root() -> Path:
    root = Path(settings.COEVO_HARNESS_ENV_DIR)
    for name in ("envs", "locks", "builds", "trash"):
        (root / name).mkdir(parents=True, exist_ok=True)
    return root


def _lock(path: Path, kind: int, *, wait_s: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _relock(fd, kind, wait_s=wait_s)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _relock(fd: int, kind: int, *, wait_s: float) -> None:
    """flock with a deadline (flock itself waits forever or not at all)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"a harness environment's lock stayed taken for {wait_s:g}s"
                ) from None
            time.sleep(_POLL_S)


# --- the sandbox's view --------------------------------------------------------------------


def harness_env_binds(harness_env: Path | None) -> dict[Path, str]:
    """The read-only bind of a built environment into the sandbox (none without one)."""
    return {} if harness_env is None else {Path(harness_env).resolve(): ENV_MOUNT}


def harness_env_vars(harness_env: Path | None, *, pythonpath: str) -> dict[str, str]:
    """PYTHONPATH (and PATH) for the sandbox: ``pythonpath`` (the coevo runtime) first, so
    that no package of the environment can stand in for it, then the environment; the
    environment's scripts first on the sandbox's PATH; its Node packages on NODE_PATH, where
    Node's ``require`` looks after the program's own node_modules directories."""
    if harness_env is None:
        return {"PYTHONPATH": pythonpath}
    env = {
        "PYTHONPATH": f"{pythonpath}:{ENV_MOUNT}",
        "PATH": f"{ENV_MOUNT}/bin:{sandbox.SANDBOX_PATH}",
    }
    if (Path(harness_env) / "node_modules").is_dir():
        env["NODE_PATH"] = f"{ENV_MOUNT}/node_modules"
    return env

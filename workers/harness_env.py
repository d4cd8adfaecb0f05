"""Harnesses' declared dependencies: one environment per content hash, built with uv, cached on
the worker and mounted read-only into the sandbox.

A harness declares its dependencies in ``harness.toml`` (``[harness] requirements``): a
requirements file in which every requirement is pinned (``name==version``, optionally with
``--hash``), or a ``pyproject.toml`` with its ``uv.lock``. The environment's key hashes those
files' bytes, the worker's Python and the index configuration, so one key is one set of
installed files on every worker that shares the configuration.

What may run where:
- The build has network (the operator's index, COEVO_HARNESS_INDEX_URL) or none at all
  (COEVO_HARNESS_FIND_LINKS, a local wheel directory: ``--no-index``). It installs wheels only
  (``--no-build``): installing a wheel unpacks files and runs no package code, so nothing the
  harness controls runs while the build can reach the network. uv is given only pins that
  were checked here (no options, URLs, paths or editables from the harness's files), the
  operator's index and no configuration file.
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
import hashlib
import json
import logging
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from uv import find_uv_bin

from coevo.errors import InvalidManifest
from harness_store.manifest import LOCK_NAME, load_manifest
from workers import sandbox
from workers.outcomes import DependencyBuildFailed

logger = logging.getLogger(__name__)

# Where the environment appears in the sandbox: on PYTHONPATH, its scripts (bin/) on PATH.
ENV_MOUNT = "/opt/harness-env"
# Part of every key: a change to how environments are built or laid out changes this.
LAYOUT = "coevo-harness-env/1"
# A requirements file or lock is text of a few KiB; more is not one.
MAX_REQUIREMENTS_BYTES = 1024 * 1024
MAX_LOCK_BYTES = 16 * 1024 * 1024
# What is kept of uv's output (for the fault's message), and what it may write before it is
# stopped: its output is the resolver's, but it names what the harness declared.
OUTPUT_TAIL_BYTES = 64 * 1024
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
DETAIL_CHARS = 4000
# Waiting for another worker's build of the same key: its timeout, and then some.
LOCK_GRACE_S = 60
_POLL_S = 0.05

# The variables uv may need to reach the operator's index from behind a proxy; nothing else of
# the worker's environment (its database or broker URLs, UV_* overrides) reaches the build.
_PASSED_ENV = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)

# name[extras]==version, an optional environment marker, optional hashes: nothing else.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIN = re.compile(
    rf"^(?P<name>{_NAME})\s*(?P<extras>\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?\s*"
    r"==\s*(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*"
    r"(?:;\s*(?P<marker>[A-Za-z0-9_\s.'\"()<>=!~,*+-]+?))?\s*"
    r"(?P<hashes>(?:--hash[=\s]\s*(?:sha256|sha384|sha512):[0-9a-fA-F]+\s*)*)$"
)
_HASH = re.compile(r"--hash[=\s]\s*((?:sha256|sha384|sha512):[0-9a-fA-F]+)")


@dataclass(frozen=True)
class Requirements:
    """What a harness declares: the manifest's path and the bytes of the files it names."""

    source: str
    files: tuple[tuple[str, bytes], ...]

    @property
    def is_locked_project(self) -> bool:
        return Path(self.source).name == "pyproject.toml"


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    extras: str = ""
    marker: str = ""
    hashes: tuple[str, ...] = ()

    @property
    def normalized_name(self) -> str:
        return normalize_name(self.name)

    def line(self) -> str:
        marker = f" ; {self.marker}" if self.marker else ""
        hashes = "".join(f" --hash={digest}" for digest in self.hashes)
        return f"{self.name}{self.extras}=={self.version}{marker}{hashes}"


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


# --- what the harness declares -------------------------------------------------------------


def normalize_name(name: str) -> str:
    """PEP 503: the name a package index and the installed metadata agree on."""
    return re.sub(r"[-_.]+", "-", name).lower()


def harness_requirements(harness_dir: Path) -> Requirements | None:
    """The declared requirements of the harness in ``harness_dir``, or None when it declares
    none. Raises InvalidManifest for a manifest that does not load."""
    manifest = load_manifest(harness_dir)
    if not manifest.requirements:
        return None
    source = manifest.requirements
    files = [(source, _harness_file(harness_dir, source, MAX_REQUIREMENTS_BYTES))]
    if Path(source).name == "pyproject.toml":
        lock = str(Path(source).with_name(LOCK_NAME))
        files.append((lock, _harness_file(harness_dir, lock, MAX_LOCK_BYTES)))
    return Requirements(source=source, files=tuple(files))


def _harness_file(harness_dir: Path, name: str, limit: int) -> bytes:
    root = Path(harness_dir).resolve()
    path = (root / name).resolve()
    # A link in the candidate could name a file of the worker's, whose text the fault's message
    # would then show the harness's author.
    if not path.is_relative_to(root) or not path.is_file():
        raise DependencyBuildFailed(
            f"declared dependencies: {name} is not a file inside the harness (a symbolic link "
            "out of it is not followed)"
        )
    if path.stat().st_size > limit:
        raise DependencyBuildFailed(
            f"declared dependencies: {name} is larger than {limit // 1024} KiB: it is not a "
            "requirements file"
        )
    return path.read_bytes()


def parse_pins(text: str, *, source: str) -> list[Pin]:
    """Every requirement of a requirements file, each pinned; raises DependencyBuildFailed
    naming the line of anything else (options, ranges, URLs, paths, editables)."""
    pins: list[Pin] = []
    seen: set[str] = set()
    for number, line in _logical_lines(text):
        match = _PIN.fullmatch(line)
        if match is None or "--" in (match["marker"] or ""):
            raise DependencyBuildFailed(
                f"declared dependencies: {source} line {number}: {line[:200]!r} is not a pinned "
                "requirement. Each line is name==version (optionally with extras, a marker and "
                "--hash=sha256:...); the index is the operator's (COEVO_HARNESS_INDEX_URL), so "
                "options, version ranges, URLs, paths and editables are refused. "
                "`uv pip compile` or `uv export` writes such a file."
            )
        pin = Pin(
            name=match["name"],
            version=match["version"],
            extras=re.sub(r"\s+", "", match["extras"] or ""),
            marker=(match["marker"] or "").strip(),
            hashes=tuple(_HASH.findall(match["hashes"] or "")),
        )
        # A marker may pin a package differently per platform; only repeats without one clash.
        if not pin.marker and pin.normalized_name in seen:
            raise DependencyBuildFailed(
                f"declared dependencies: {source} line {number}: {pin.name} is pinned twice"
            )
        if not pin.marker:
            seen.add(pin.normalized_name)
        pins.append(pin)
    if not pins:
        raise DependencyBuildFailed(
            f"declared dependencies: {source} pins no package; remove the requirements key "
            "from harness.toml or pin what the harness imports"
        )
    return pins


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each requirement: continuations joined, comments dropped."""
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        # A comment starts a line or follows whitespace (pip's rule: a '#' in a URL is not one).
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            yield start, line
    if pending.strip():
        yield start, pending.strip()


def harness_env_key(requirements: Requirements) -> str:
    """The environment's content hash: the files' bytes, the Python that runs the harness, the
    index configuration and how environments are built."""
    digest = hashlib.sha256()
    parts = [LAYOUT, _python_identity(), json.dumps(_index_config()), requirements.source]
    for name, data in requirements.files:
        parts += [name, hashlib.sha256(data).hexdigest()]
    for part in parts:
        encoded = part.encode()
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
    return digest.hexdigest()[:32]


def _python_identity() -> str:
    # The interpreter's path too: installed scripts name it on their #! line.
    return " ".join(
        [
            sys.implementation.name,
            platform.python_version(),
            sys.abiflags,
            sysconfig.get_platform(),
            os.path.realpath(sys.executable),
        ]
    )


def _index_config() -> dict[str, str]:
    find_links = str(settings.COEVO_HARNESS_FIND_LINKS or "")
    if find_links:
        return {"find_links": os.path.realpath(find_links)}
    return {"index_url": str(settings.COEVO_HARNESS_INDEX_URL)}


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
                    _build(requirements, key=key, root=root)
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
        requirements.source,
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


# --- the build -----------------------------------------------------------------------------


def _build(requirements: Requirements, *, key: str, root: Path) -> None:
    """Build ``key`` into builds/ and rename it into envs/. The caller holds the key's lock
    exclusively; raises DependencyBuildFailed."""
    for stale in (root / "builds").glob(f"{key}-*"):
        shutil.rmtree(stale, ignore_errors=True)  # a crashed build of this key
    build = root / "builds" / f"{key}-{secrets.token_hex(4)}"
    started = time.monotonic()
    deadline = started + settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S
    try:
        for name in ("env/site", "home", "tmp"):
            (build / name).mkdir(parents=True)
        pins = _pins(requirements, build=build, deadline=deadline)
        (build / "requirements.txt").write_text("".join(pin.line() + "\n" for pin in pins))
        site = build / "env" / "site"
        _uv(
            [
                "pip",
                "install",
                "--target",
                str(site),
                "--python",
                sys.executable,
                # Wheels only: building a source distribution runs its code.
                "--no-build",
                "--link-mode",
                "copy",
                *_index_args(),
                "--requirement",
                str(build / "requirements.txt"),
            ],
            build=build,
            deadline=deadline,
            source=requirements.source,
        )
        (site / ".lock").unlink(missing_ok=True)  # uv's own, for the target directory
        _check_all_pinned(site, pins, source=requirements.source)
        # Bytecode now, with the worker's interpreter isolated from the new files (-I): the
        # sandbox cannot write it, and compiling runs none of the code it compiles.
        _run(
            [sys.executable, "-I", "-m", "compileall", "-qq", str(site)],
            build=build,
            deadline=deadline,
            source=requirements.source,
            check=False,
        )
        _make_readable(site)
        size = _disk_bytes(site)
        limit = settings.COEVO_HARNESS_ENV_MAX_BYTES
        if size > limit:
            raise DependencyBuildFailed(
                f"declared dependencies ({requirements.source}): the environment takes "
                f"{size / 1024**2:.1f} MiB, more than the {limit / 1024**2:.1f} MiB this worker "
                "keeps for all harness environments (COEVO_HARNESS_ENV_MAX_BYTES)"
            )
        meta = {
            "key": key,
            "source": requirements.source,
            "requirements": [pin.line() for pin in pins],
            "python": _python_identity(),
            "index": _redact_config(_index_config()),
            "bytes": size,
            "build_seconds": round(time.monotonic() - started, 3),
            "built_at": time.time(),
        }
        (build / "env" / "env.json").write_text(json.dumps(meta, indent=2) + "\n")
        (build / "env").rename(root / "envs" / key)  # atomic: complete or absent
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _pins(requirements: Requirements, *, build: Path, deadline: float) -> list[Pin]:
    if not requirements.is_locked_project:
        name, data = requirements.files[0]
        return parse_pins(_text(data, name), source=name)
    # uv reads the lock (never resolves: --frozen, --offline) in a directory holding only the
    # two files, outside any workspace they could claim to belong to.
    with tempfile.TemporaryDirectory(prefix="coevo-uv-export-") as project:
        for name, data in requirements.files:
            (Path(project) / Path(name).name).write_bytes(data)
        output = _uv(
            [
                "export",
                "--project",
                project,
                "--frozen",
                "--offline",
                "--format",
                "requirements-txt",
                "--no-default-groups",
                "--no-emit-project",
                "--no-emit-workspace",
                "--no-header",
                "--no-annotate",
            ],
            build=build,
            deadline=deadline,
            source=requirements.source,
        )
    lock = requirements.files[1][0]
    return parse_pins(output, source=f"{lock} (as `uv export` reads it)")


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise DependencyBuildFailed(f"declared dependencies: {name} is not UTF-8 text") from None


def _index_args() -> list[str]:
    config = _index_config()
    if "find_links" in config:
        return ["--no-index", "--find-links", config["find_links"]]
    return ["--default-index", config["index_url"]]


def _check_all_pinned(site: Path, pins: list[Pin], *, source: str) -> None:
    """Every installed distribution is one the file pins: an unpinned dependency of a pin
    would resolve to whatever is newest, so one key could install different code on two
    workers."""
    pinned = {pin.normalized_name for pin in pins}
    unpinned = []
    for info in site.glob("*.dist-info"):
        name, version = _distribution(info)
        if normalize_name(name) not in pinned:
            unpinned.append(f"{name}=={version}")
    if unpinned:
        raise DependencyBuildFailed(
            f"declared dependencies ({source}): {', '.join(sorted(unpinned))} "
            f"{'was' if len(unpinned) == 1 else 'were'} installed as a dependency of the pins "
            "but not pinned; pin every package the environment needs (`uv pip compile` "
            "writes the complete list) so that every worker installs the same versions"
        )


def _distribution(info: Path) -> tuple[str, str]:
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in (info / "METADATA").read_text(errors="replace").splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    fallback = info.name.removesuffix(".dist-info").rpartition("-")
    return fields.get("name") or fallback[0], fields.get("version") or fallback[2]


def _uv(args: list[str], *, build: Path, deadline: float, source: str) -> str:
    argv = [
        find_uv_bin(),
        *args,
        "--no-config",
        "--no-cache",
        "--no-python-downloads",
        "--color",
        "never",
        "--no-progress",
    ]
    return _run(argv, build=build, deadline=deadline, source=source)


def _run(argv: list[str], *, build: Path, deadline: float, source: str, check: bool = True) -> str:
    """Run one build step with the build's deadline and bounded output; its output."""
    env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
    env |= {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(build / "home"),
        "TMPDIR": str(build / "tmp"),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
    }
    timeout_s = deadline - time.monotonic()
    if timeout_s <= 0:
        raise _timed_out(source, "")
    run = run_bounded(argv, env=env, cwd=build, timeout_s=timeout_s)
    if run.flooded:
        raise DependencyBuildFailed(
            f"declared dependencies ({source}) did not build: the build wrote more than "
            f"{MAX_OUTPUT_BYTES // 1024**2} MiB of output and was stopped"
        )
    if run.timed_out:
        raise _timed_out(source, run.output)
    if check and run.returncode != 0:
        raise DependencyBuildFailed(
            f"declared dependencies ({source}) did not build: {_resolver_message(run.output)}"
        )
    return run.output


def _timed_out(source: str, output: str) -> DependencyBuildFailed:
    timeout_s = settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S
    message = f"declared dependencies ({source}) did not build within {timeout_s}s "
    message += "(COEVO_HARNESS_ENV_BUILD_TIMEOUT_S)"
    if output.strip():
        message += f"; the last output: {_redact(output.strip()[-DETAIL_CHARS:])}"
    return DependencyBuildFailed(message)


@dataclass(frozen=True)
class BoundedRun:
    returncode: int | None
    output: str  # the tail (OUTPUT_TAIL_BYTES) of stdout and stderr together
    timed_out: bool = False
    flooded: bool = False  # stopped for writing more than MAX_OUTPUT_BYTES


def run_bounded(
    argv: list[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float
) -> BoundedRun:
    """Run a build step to its end, its timeout or MAX_OUTPUT_BYTES of output."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,  # its own group, so a timeout ends everything it started
    )
    tail = bytearray()
    flooded = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        total = 0
        while chunk := proc.stdout.read1(65536):
            total += len(chunk)
            tail.extend(chunk)
            del tail[:-OUTPUT_TAIL_BYTES]
            if total > MAX_OUTPUT_BYTES and not flooded.is_set():
                flooded.set()
                _kill(proc)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.wait()
    reader.join(timeout=5)
    with contextlib.suppress(OSError):
        proc.stdout.close()  # type: ignore[union-attr]
    return BoundedRun(
        returncode=None if timed_out or flooded.is_set() else proc.returncode,
        output=tail.decode(errors="replace"),
        timed_out=timed_out and not flooded.is_set(),
        flooded=flooded.is_set(),
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _resolver_message(output: str) -> str:
    """uv's own explanation: from its first ``error:`` line (what precedes it is progress)."""
    text = output.strip()
    start = text.find("error:")
    if start > 0:
        text = text[start:]
    if len(text) > DETAIL_CHARS:
        text = text[: DETAIL_CHARS - 20] + " […] " + text[-15:]
    return _redact(text) or "uv failed without a message"


def _redact(text: str) -> str:
    """The index URL's credentials never reach a rollout's detail."""
    parts = urlsplit(str(settings.COEVO_HARNESS_INDEX_URL or ""))
    for secret in (parts.password, parts.username):
        if secret:
            text = text.replace(secret, "***")
    return text


def _redact_config(config: dict[str, str]) -> dict[str, str]:
    return {key: _redact(value) for key, value in config.items()}


def _make_readable(site: Path) -> None:
    """World-readable and read-only: a root worker's sandbox runs as another uid, and the
    environment is shared by every rollout that declares the same files."""
    for directory, _dirs, files in os.walk(site):  # links to directories are not followed
        os.chmod(directory, 0o755)
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            mode = os.stat(path).st_mode
            os.chmod(path, 0o755 if mode & 0o111 else 0o644)


def _disk_bytes(site: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(site):
        total += os.lstat(directory).st_blocks * 512
        for name in files:
            total += os.lstat(os.path.join(directory, name)).st_blocks * 512
    return total


# --- the sandbox's view --------------------------------------------------------------------


def harness_env_binds(harness_env: Path | None) -> dict[Path, str]:
    """The read-only bind of a built environment into the sandbox (none without one)."""
    return {} if harness_env is None else {Path(harness_env).resolve(): ENV_MOUNT}


def harness_env_vars(harness_env: Path | None, *, pythonpath: str) -> dict[str, str]:
    """PYTHONPATH (and PATH) for the sandbox: ``pythonpath`` (the coevo runtime) first, so
    that no package of the environment can stand in for it, then the environment; the
    environment's scripts first on the sandbox's PATH."""
    if harness_env is None:
        return {"PYTHONPATH": pythonpath}
    return {
        "PYTHONPATH": f"{pythonpath}:{ENV_MOUNT}",
        "PATH": f"{ENV_MOUNT}/bin:{sandbox.SANDBOX_PATH}",
    }

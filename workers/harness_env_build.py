"""Building one harness environment with uv and npm (workers/harness_env.py holds the cache and
its locks, and says what may run where): the checked pins, wheels only, the operator's index;
the checked npm lock, no install scripts unless the manifest allows them, the operator's cache
or registry; a deadline and bounded output; the result world-readable, measured and
described."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from uv import find_uv_bin

from workers import sandbox
from workers.harness_requirements import (
    NodePackage,
    Pin,
    Requirements,
    index_config,
    node_identity,
    normalize_name,
    npm_config,
    parse_node_lock,
    parse_pins,
    python_identity,
)
from workers.outcomes import DependencyBuildFailed

# What is kept of uv's output (for the fault's message), and what it may write before it is
# stopped: its output is the resolver's, but it names what the harness declared.
OUTPUT_TAIL_BYTES = 64 * 1024
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
DETAIL_CHARS = 4000

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
    "NODE_EXTRA_CA_CERTS",
)


def harness_env_build(requirements: Requirements, *, key: str, root: Path) -> None:
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
        site = build / "env" / "site"
        # The lock is checked before anything is installed: nothing is fetched for a harness
        # whose Node dependencies are refused.
        node_packages = _node_packages(requirements)
        pins = _python_install(requirements, site=site, build=build, deadline=deadline)
        if node_packages is not None:
            _npm_install(requirements, site=site, build=build, deadline=deadline)
        installed = time.monotonic()
        _make_readable(site)
        size = _disk_bytes(site)
        limit = settings.COEVO_HARNESS_ENV_MAX_BYTES
        if size > limit:
            raise DependencyBuildFailed(
                f"declared dependencies ({requirements.label}): the environment takes "
                f"{size / 1024**2:.1f} MiB, more than the {limit / 1024**2:.1f} MiB this worker "
                "keeps for all harness environments (COEVO_HARNESS_ENV_MAX_BYTES)"
            )
        meta = {
            "key": key,
            "source": requirements.source,
            "requirements": [pin.line() for pin in pins],
            "python": python_identity(),
            "index": _redact_config(index_config()),
            "bytes": size,
            "build_seconds": round(time.monotonic() - started, 3),
            "install_seconds": round(installed - started, 3),
            "built_at": time.time(),
        }
        if node_packages is not None:
            meta["node"] = {
                "lock": requirements.node_lock,
                "node": node_identity(),
                "npm": _redact_config(npm_config()),
                "packages": [package.line() for package in node_packages],
                "scripts": requirements.node_scripts,
                # What a package would have run at install (a native build, a download), had
                # the manifest allowed it: the first place to look when one fails at run time.
                "install_scripts": [p.line() for p in node_packages if p.install_script],
            }
        (build / "env" / "env.json").write_text(json.dumps(meta, indent=2) + "\n")
        (build / "env").rename(root / "envs" / key)  # atomic: complete or absent
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _python_install(
    requirements: Requirements, *, site: Path, build: Path, deadline: float
) -> list[Pin]:
    """The checked pins installed into ``site`` by uv and compiled (none without a Python
    part)."""
    if not requirements.files:
        return []
    pins = _pins(requirements, build=build, deadline=deadline)
    (build / "requirements.txt").write_text("".join(pin.line() + "\n" for pin in pins))
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
    return pins


# --- npm -----------------------------------------------------------------------------------


def _node_packages(requirements: Requirements) -> list[NodePackage] | None:
    if not requirements.node_lock:
        return None
    registry = str(settings.COEVO_HARNESS_NPM_REGISTRY or "")
    return parse_node_lock(requirements, registries=(registry,) if registry else ())


def _npm_install(requirements: Requirements, *, site: Path, build: Path, deadline: float) -> None:
    """``npm ci`` of the checked lock in a directory holding only it and its package.json,
    moved to ``site/node_modules``, its commands linked into ``site/bin``."""
    npm = shutil.which("npm")
    if npm is None:
        raise DependencyBuildFailed(
            f"declared dependencies ({requirements.node_lock}): this worker has no `npm` on "
            "its PATH; install Node.js with npm on the worker"
        )
    project = build / "npm"
    project.mkdir()
    for name, data in requirements.node_files:
        (project / Path(name).name).write_bytes(data)
    # Empty configuration files in place of the worker's (~/.npmrc, the global npmrc): nothing
    # but these arguments decides where packages come from. npm refuses one file for both.
    for name in ("npmrc-user", "npmrc-global"):
        (build / name).write_text("")
    config = npm_config()
    if "cache" in config:
        # The operator's prefilled cache, never the network: npm finds each tarball by the
        # lock's integrity hash, so a tarball the cache lacks fails the build (ENOTCACHED).
        source = ["--offline", "--cache", config["cache"]]
    else:
        source = ["--registry", config["registry"], "--cache", str(build / "npm-cache")]
        # npm trusts Node's own CA list, not the system's: a worker behind a proxy that
        # re-signs TLS names its CA file as it does for uv.
        if os.environ.get("SSL_CERT_FILE"):
            source += ["--cafile", os.environ["SSL_CERT_FILE"]]
    _run(
        [
            npm,
            "ci",
            # Install scripts (preinstall, install, postinstall, node-gyp builds; the project's
            # own too) run code of the packages while the build may reach the network: only
            # when the manifest says node_scripts = true.
            *([] if requirements.node_scripts else ["--ignore-scripts"]),
            "--omit=dev",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--userconfig",
            str(build / "npmrc-user"),
            "--globalconfig",
            str(build / "npmrc-global"),
            "--logs-dir",
            str(build / "tmp" / "npm-logs"),
            "--color=false",
            "--progress=false",
            *source,
        ],
        build=build,
        deadline=deadline,
        source=requirements.node_lock,
        cwd=project,
        explain=_npm_message,
        # npm starts `node` from PATH: the sandbox's first, the one the key names.
        path=f"{sandbox.SANDBOX_PATH}:{os.environ.get('PATH', '')}",
    )
    modules = project / "node_modules"
    modules.mkdir(exist_ok=True)  # a lock without packages installs none
    modules.rename(site / "node_modules")
    _link_node_commands(site, source=requirements.node_lock)


def _link_node_commands(site: Path, *, source: str) -> None:
    """Each top-level package's command (node_modules/.bin) in ``site/bin``, which is on the
    sandbox's PATH for programs and workspace commands alike."""
    commands = site / "node_modules" / ".bin"
    if not commands.is_dir():
        return
    (site / "bin").mkdir(exist_ok=True)
    for command in sorted(commands.iterdir()):
        link = site / "bin" / command.name
        if link.exists() or link.is_symlink():
            raise DependencyBuildFailed(
                f"declared dependencies ({source}): the Node package command {command.name!r} "
                "has the name of a Python package's script; one of them would hide the other"
            )
        link.symlink_to(f"../node_modules/.bin/{command.name}")


def _npm_message(output: str) -> str:
    """npm's own explanation: its ``npm error`` lines, without the pointer to its log."""
    lines = [
        line.removeprefix("npm error").strip()
        for line in output.splitlines()
        if line.startswith("npm error") and "A complete log of this run" not in line
    ]
    text = "\n".join(line for line in lines if line) or output.strip()[-DETAIL_CHARS:]
    if len(text) > DETAIL_CHARS:
        text = text[: DETAIL_CHARS - 20] + " […] " + text[-15:]
    return _redact(text) or "npm failed without a message"


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
    config = index_config()
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


def _run(
    argv: list[str],
    *,
    build: Path,
    deadline: float,
    source: str,
    check: bool = True,
    cwd: Path | None = None,
    explain: Callable[[str], str] | None = None,
    path: str = "",
) -> str:
    """Run one build step with the build's deadline and bounded output; its output."""
    env = {key: os.environ[key] for key in _PASSED_ENV if key in os.environ}
    env |= {
        "PATH": path or os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(build / "home"),
        "TMPDIR": str(build / "tmp"),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
    }
    timeout_s = deadline - time.monotonic()
    if timeout_s <= 0:
        raise _timed_out(source, "")
    run = run_bounded(argv, env=env, cwd=cwd or build, timeout_s=timeout_s)
    if run.flooded:
        raise DependencyBuildFailed(
            f"declared dependencies ({source}) did not build: the build wrote more than "
            f"{MAX_OUTPUT_BYTES // 1024**2} MiB of output and was stopped"
        )
    if run.timed_out:
        raise _timed_out(source, run.output)
    if check and run.returncode != 0:
        raise DependencyBuildFailed(
            f"declared dependencies ({source}) did not build: "
            f"{(explain or _resolver_message)(run.output)}"
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
    """The index's and the registry's credentials never reach a rollout's detail."""
    for url in (settings.COEVO_HARNESS_INDEX_URL, settings.COEVO_HARNESS_NPM_REGISTRY):
        parts = urlsplit(str(url or ""))
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

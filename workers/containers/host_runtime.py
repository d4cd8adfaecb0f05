"""The worker's Python and Node.js, made to run inside any task container: how a harness runs
in its task's container whatever the image holds (no Python, another libc, another version).

A task image is the task's, not the harness's: it may have no Python or Node.js at all, or
versions the harness's built dependencies (workers/harness_env.py) were not built for. So the
harness process runs on the worker's own interpreters, brought in read-only at ``MOUNT``:

- ``bin/``: copies of the worker's ``python3.X`` and ``node`` whose ELF interpreter (the
  dynamic loader) is ``MOUNT/lib/<loader>`` and whose library path (DT_RPATH, which also
  serves the libraries and extension modules they load) is ``MOUNT/lib``, set with patchelf;
- ``lib/``: the loader and every shared library the two and Python's extension modules need
  (ldd's resolution of them on the worker), so nothing of the image's own libc is used;
- ``lib/python3.X``: Python's standard library, the worker's own directory bound there
  (``binds``), found by the interpreter from its own place as on the worker; its extension
  modules (``lib-dynload``) are copies whose library path is the bundle's, bound over the
  worker's.

What the harness starts in turn (a shell, ``pytest``, ``apt-get``) is the image's, with the
image's libraries: the bundle is on no search path but the two binaries' own. A copy of the
binaries is re-executable by path (Node.js's ``process.execPath``, Python's
``sys.executable``), so an agent that starts itself again still runs. The bundle is built once
per worker machine and kept under COEVO_CONTAINER_DIR, keyed by the binaries it came from.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from workers.containers.engine import ContainerUnavailable

MOUNT = "/opt/coevo-host"
# Bumped when the bundle's layout changes: a worker then builds a new one.
LAYOUT = 3
# A library list bigger than this is not what ldd reports for an interpreter.
MAX_LIBRARIES = 400
TOOL_TIMEOUT_S = 60
# ``libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)`` and the loader's own line.
_LDD_LINE = re.compile(r"^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)\s*$")
# Needed by compiled wheels that do not bundle them (C++ and unwinding runtimes).
_ALWAYS = ("libgcc_s.so.1", "libstdc++.so.6")


class HostRuntimeUnavailable(ContainerUnavailable):
    """The bundle cannot be made on this worker (no patchelf, a binary ldd cannot read)."""


@dataclass(frozen=True)
class HostRuntime:
    """A built bundle: ``path`` is bound at ``MOUNT``, ``binds`` beside it (all read-only)."""

    path: Path
    python: str  # the interpreter inside the container
    node: str | None  # None: the worker has no Node.js
    binds: dict[Path, str]


def host_runtime() -> HostRuntime:
    """The bundle of this worker's interpreters, built on first use (under a lock: workers of
    one machine build it once) and kept. Raises HostRuntimeUnavailable."""
    python = Path(_base_python())
    node_found = shutil.which("node")
    node = Path(node_found).resolve() if node_found else None
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["stdlib"]).resolve()
    key = _key(python, node, stdlib)
    root = Path(settings.COEVO_CONTAINER_DIR) / "host-runtime"
    path = root / key
    if not (path / "bundle.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path / "bundle.json").is_file():
                _build(path, python=python, node=node, version=version, stdlib=stdlib)
    return HostRuntime(
        path=path,
        python=f"{MOUNT}/bin/{version}",
        node=f"{MOUNT}/bin/node" if node is not None else None,
        binds={
            path: MOUNT,
            stdlib: f"{MOUNT}/lib/{version}",
            path / "lib-dynload": f"{MOUNT}/lib/{version}/lib-dynload",
        },
    )


def _base_python() -> str:
    """The worker's interpreter itself (a virtual environment's ``python`` is a link to it)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.base_prefix) / "bin" / version, Path(sys.executable)):
        if candidate.exists():
            return str(candidate.resolve())
    raise HostRuntimeUnavailable(f"the worker's interpreter ({version}) cannot be found")


def _key(python: Path, node: Path | None, stdlib: Path) -> str:
    """What the bundle is made of: each binary's path, size and time, the layout's version."""
    digest = hashlib.sha256(f"layout {LAYOUT}\n{stdlib}\n".encode())
    for binary in (python, node):
        if binary is not None:
            stat = binary.stat()
            digest.update(f"{binary} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _build(path: Path, *, python: Path, node: Path | None, version: str, stdlib: Path) -> None:
    """Make the bundle in a directory beside ``path`` and rename it into place."""
    patchelf = shutil.which("patchelf")
    if patchelf is None:
        raise HostRuntimeUnavailable(
            "running a harness in its task's container needs patchelf on the worker (Debian: "
            "apt-get install patchelf; scripts/lib.sh's ensure_docker_engine installs it)"
        )
    work = Path(tempfile.mkdtemp(prefix=".building-", dir=path.parent))
    try:
        (work / "bin").mkdir()
        (work / "lib" / version).mkdir(parents=True)  # the standard library's mount point
        binaries = {version: python, **({"node": node} if node is not None else {})}
        needing = [*binaries.values(), *sorted((stdlib / "lib-dynload").glob("*.so"))]
        libraries: dict[str, Path] = {}
        loader: Path | None = None
        dynamic: set[Path] = set()  # what names a loader (the rest is linked statically)
        for item in needing:
            found, item_loader = _libraries(item)
            libraries.update(found)
            if item_loader is not None:
                dynamic.add(item)
                loader = loader or item_loader
        if loader is None:
            raise HostRuntimeUnavailable(f"ldd names no dynamic loader for {python}")
        for name in _ALWAYS:
            for directory in {p.parent for p in libraries.values()}:
                if name not in libraries and (directory / name).exists():
                    libraries[name] = directory / name
        if len(libraries) > MAX_LIBRARIES:
            raise HostRuntimeUnavailable(f"ldd lists {len(libraries)} libraries: too many")
        for name, source in libraries.items():
            copy = work / "lib" / name
            shutil.copy2(source.resolve(), copy)
            _rpath_to_bundle(patchelf, copy)
        shutil.copy2(loader.resolve(), work / "lib" / loader.name)
        for name, source in binaries.items():
            target = work / "bin" / name
            shutil.copy2(source, target)
            if source in dynamic:
                _tool(patchelf, "--set-interpreter", f"{MOUNT}/lib/{loader.name}", str(target))
                _tool(patchelf, "--force-rpath", "--set-rpath", f"{MOUNT}/lib", str(target))
        # Python's extension modules carry the worker's prefix as their search path: copies of
        # them with the bundle's instead, bound over the standard library's own.
        dynload = work / "lib-dynload"
        dynload.mkdir()
        for module in sorted((stdlib / "lib-dynload").iterdir()):
            if module.is_file():
                shutil.copy2(module, dynload / module.name)
                if module.suffix == ".so":
                    _rpath_to_bundle(patchelf, dynload / module.name)
        for alias in ("python3", "python"):
            (work / "bin" / alias).symlink_to(version)
        (work / "bundle.json").write_text(
            json.dumps(
                {
                    "python": str(python),
                    "node": str(node) if node else None,
                    "stdlib": str(stdlib),
                    "libraries": sorted(libraries),
                    "loader": loader.name,
                },
                indent=1,
            )
        )
        os.chmod(work, 0o755)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
        os.rename(work, path)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _rpath_to_bundle(patchelf: str, library: Path) -> None:
    """A copied library's own search path (libpython's and pyenv's extension modules': the
    worker's prefix) would be searched for what it loads before the binaries': the bundle's
    instead. One without a search path keeps none."""
    if _tool(patchelf, "--print-rpath", str(library)).strip():
        _tool(patchelf, "--force-rpath", "--set-rpath", f"{MOUNT}/lib", str(library))


def _libraries(binary: Path) -> tuple[dict[str, Path], Path | None]:
    """The shared libraries ``binary`` loads (ldd's resolution on this machine) by name, and
    the dynamic loader it names."""
    done = _run("ldd", str(binary))
    out = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        if b"not a dynamic executable" in done.stdout + done.stderr:
            return {}, None  # statically linked: it needs nothing, and keeps its loader
        raise HostRuntimeUnavailable(
            f"ldd failed on {binary}: {done.stderr.decode(errors='replace')[-500:]}"
        )
    found: dict[str, Path] = {}
    loader: Path | None = None
    for line in out.splitlines():
        if "not found" in line:
            raise HostRuntimeUnavailable(f"{binary} needs a library this worker lacks: {line}")
        match = _LDD_LINE.match(line)
        if not match:
            continue  # linux-vdso, statically linked
        library = Path(match.group(1))
        if "=>" not in line:
            loader = library
        elif library.name.startswith("ld-linux"):
            loader = loader or library
        else:
            found[line.split("=>")[0].strip()] = library
    return found, loader


def _run(*argv: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(list(argv), capture_output=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HostRuntimeUnavailable(f"{argv[0]} failed: {exc}") from exc


def _tool(*argv: str) -> str:
    done = _run(*argv)
    if done.returncode != 0:
        raise HostRuntimeUnavailable(
            f"{' '.join(argv[:2])}… failed: {done.stderr.decode(errors='replace')[-500:]}"
        )
    return done.stdout.decode(errors="replace")

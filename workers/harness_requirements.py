"""What a harness declares as its dependencies (``[harness] requirements`` and ``node_lock``):
the files' bytes, the pins they hold (each checked: nothing but ``name==version``, a marker and
hashes; every npm package from the registry with its integrity), and the key of the environment
they make (workers/harness_env.py)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from harness_store.manifest import LOCK_NAME, NODE_PACKAGE_NAME, load_manifest
from workers import sandbox
from workers.outcomes import DependencyBuildFailed

# Part of every key: a change to how environments are built or laid out changes this.
LAYOUT = "coevo-harness-env/1"
# The same for the Node part of an environment (node_modules/ and its bin/ links).
NODE_LAYOUT = "coevo-harness-node/1"
# A requirements file or lock is text of a few KiB; more is not one.
MAX_REQUIREMENTS_BYTES = 1024 * 1024
MAX_LOCK_BYTES = 16 * 1024 * 1024

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
    """What a harness declares: the paths the manifest names and the bytes of the files. The
    Python part (``source``, ``files``) or the Node part (``node_lock``, ``node_files``: the
    package.json, then the lock) may be empty, not both."""

    source: str
    files: tuple[tuple[str, bytes], ...]
    node_lock: str = ""
    node_files: tuple[tuple[str, bytes], ...] = ()
    node_scripts: bool = False

    @property
    def is_locked_project(self) -> bool:
        return Path(self.source).name == "pyproject.toml"

    @property
    def label(self) -> str:
        """The declared files, for messages and logs."""
        return ", ".join(name for name in (self.source, self.node_lock) if name)


@dataclass(frozen=True)
class NodePackage:
    """One package of an npm lock: where it installs, what it is and where it comes from."""

    path: str  # node_modules/a or node_modules/a/node_modules/b
    name: str
    version: str
    resolved: str = ""  # "" for a package bundled in its parent's tarball
    integrity: str = ""
    install_script: bool = False

    def line(self) -> str:
        return f"{self.name}@{self.version}"


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


def normalize_name(name: str) -> str:
    """PEP 503: the name a package index and the installed metadata agree on."""
    return re.sub(r"[-_.]+", "-", name).lower()


def harness_requirements(harness_dir: Path) -> Requirements | None:
    """The declared requirements of the harness in ``harness_dir``, or None when it declares
    none. Raises InvalidManifest for a manifest that does not load."""
    manifest = load_manifest(harness_dir)
    if not manifest.requirements and not manifest.node_lock:
        return None
    source = manifest.requirements
    files = []
    if source:
        files.append((source, _harness_file(harness_dir, source, MAX_REQUIREMENTS_BYTES)))
    if Path(source).name == "pyproject.toml":
        lock = str(Path(source).with_name(LOCK_NAME))
        files.append((lock, _harness_file(harness_dir, lock, MAX_LOCK_BYTES)))
    node_files = []
    if manifest.node_lock:
        package = str(Path(manifest.node_lock).with_name(NODE_PACKAGE_NAME))
        node_files = [
            (package, _harness_file(harness_dir, package, MAX_REQUIREMENTS_BYTES)),
            (manifest.node_lock, _harness_file(harness_dir, manifest.node_lock, MAX_LOCK_BYTES)),
        ]
    return Requirements(
        source=source,
        files=tuple(files),
        node_lock=manifest.node_lock,
        node_files=tuple(node_files),
        node_scripts=manifest.node_scripts,
    )


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
    """The environment's content hash: the files' bytes, the Python (and Node) that runs the
    harness, the index (and npm registry or cache) configuration and how environments are
    built. A harness without Node dependencies keeps the key it had before they existed."""
    digest = hashlib.sha256()
    parts = [LAYOUT, python_identity(), json.dumps(index_config()), requirements.source]
    for name, data in requirements.files:
        parts += [name, hashlib.sha256(data).hexdigest()]
    if requirements.node_lock:
        parts += [NODE_LAYOUT, node_identity(), json.dumps(npm_config()), requirements.node_lock]
        parts.append("scripts" if requirements.node_scripts else "no-scripts")
        for name, data in requirements.node_files:
            parts += [name, hashlib.sha256(data).hexdigest()]
    for part in parts:
        encoded = part.encode()
        digest.update(len(encoded).to_bytes(8, "big") + encoded)
    return digest.hexdigest()[:32]


def python_identity() -> str:
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


def index_config() -> dict[str, str]:
    find_links = str(settings.COEVO_HARNESS_FIND_LINKS or "")
    if find_links:
        return {"find_links": os.path.realpath(find_links)}
    return {"index_url": str(settings.COEVO_HARNESS_INDEX_URL)}


def npm_config() -> dict[str, str]:
    """Where npm takes packages from: the operator's prefilled cache (then it is never online),
    or else the operator's registry."""
    cache = str(settings.COEVO_HARNESS_NPM_CACHE or "")
    if cache:
        return {"cache": os.path.realpath(cache)}
    return {"registry": str(settings.COEVO_HARNESS_NPM_REGISTRY)}


@lru_cache(maxsize=4)
def _node_identity(node: str) -> str:
    try:
        run = subprocess.run(
            [node, "-p", "[process.versions.node, process.platform, process.arch].join(' ')"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DependencyBuildFailed(
            f"declared Node dependencies: {node} does not run: {exc}"
        ) from None
    version, _, machine = run.stdout.strip().partition(" ")
    if run.returncode != 0 or not version:
        raise DependencyBuildFailed(f"declared Node dependencies: {node} does not run")
    # The major version (native addons are built for its ABI), the platform and its C library.
    libc = "-".join(part for part in platform.libc_ver() if part)
    return f"node {version.split('.')[0]} {machine} {libc} {os.path.realpath(node)}"


def node_identity() -> str:
    """The Node that runs the harness: the first on the sandbox's PATH (the npm build runs
    with the same one first, so native code is built for it)."""
    node = shutil.which("node", path=sandbox.SANDBOX_PATH)
    if node is None:
        raise DependencyBuildFailed(
            f"declared Node dependencies: this worker has no `node` in {sandbox.SANDBOX_PATH} "
            "(the sandbox's PATH); install Node.js and npm on the worker"
        )
    return _node_identity(node)


# An npm registry's tarball: https, a path with /-/ and a .tgz at its end.
_TARBALL = re.compile(r"^/(?:[^/?#]+/)*-/[^/?#]+\.tgz$")
_INTEGRITY = re.compile(r"^(?:sha512|sha384|sha256|sha1)-[A-Za-z0-9+/]+={0,2}$")
_NPM_NAME = r"(?:@[a-z0-9~-][a-z0-9._~-]*/)?[a-z0-9~-][a-z0-9._~-]*"
_LOCK_PATH = re.compile(rf"^node_modules/{_NPM_NAME}(?:/node_modules/{_NPM_NAME})*$", re.I)


def parse_node_lock(
    requirements: Requirements, *, registries: tuple[str, ...] = ()
) -> list[NodePackage]:
    """Every package of the lock, each installed from a registry's tarball (its https URL
    under ``registries`` and an integrity hash) or bundled inside one; raises
    DependencyBuildFailed naming the package of anything else (git, a local path, a link, a
    tarball elsewhere, a missing hash)."""
    (package_name, package_data), (lock_name, lock_data) = requirements.node_files
    package = _json(package_data, package_name)
    lock = _json(lock_data, lock_name)
    if not isinstance(package, dict):
        raise DependencyBuildFailed(f"declared dependencies: {package_name} is not an object")
    if not isinstance(lock, dict) or lock.get("lockfileVersion") != 3:
        version = lock.get("lockfileVersion") if isinstance(lock, dict) else None
        raise DependencyBuildFailed(
            f"declared dependencies: {lock_name} has lockfileVersion {version!r}; write it with "
            "npm 9 or later (`npm install --package-lock-only --lockfile-version 3`)"
        )
    entries = lock.get("packages")
    if not isinstance(entries, dict):
        raise DependencyBuildFailed(f"declared dependencies: {lock_name} has no packages")
    hosts = {
        (parts.scheme, parts.netloc)
        for parts in map(urlsplit, ("https://registry.npmjs.org/", *registries))
    }
    packages = []
    for path, entry in entries.items():
        if path == "":
            continue
        where = f"declared dependencies: {lock_name} {path!r}"
        if not isinstance(entry, dict):
            raise DependencyBuildFailed(f"{where} is not an object")
        if entry.get("link") or not _LOCK_PATH.fullmatch(path):
            raise DependencyBuildFailed(
                f"{where} is a link to a directory (a workspace or a file: dependency): only "
                "packages from the registry are installed; publish it, or ship its files in the "
                "harness and load them by path"
            )
        name = entry.get("name") or path.rpartition("node_modules/")[2]
        version = entry.get("version")
        if not isinstance(name, str) or not isinstance(version, str) or not version:
            raise DependencyBuildFailed(f"{where} has no version")
        scripts = entry.get("hasInstallScript") is True
        if entry.get("inBundle") is True:
            # Inside its parent's tarball, which the parent's integrity covers.
            packages.append(NodePackage(path, name, version, install_script=scripts))
            continue
        resolved, integrity = entry.get("resolved"), entry.get("integrity")
        if not isinstance(resolved, str) or not resolved:
            raise DependencyBuildFailed(
                f"{where} ({name}@{version}) has no resolved URL: every package must be pinned "
                "to its registry tarball; write the lock again with `npm install "
                "--package-lock-only --omit-lockfile-registry-resolved=false`"
            )
        parts = urlsplit(resolved)
        if (parts.scheme, parts.netloc) not in hosts or not _TARBALL.fullmatch(parts.path):
            raise DependencyBuildFailed(
                f"{where} ({name}@{version}) comes from {resolved[:200]!r}, not from a "
                "registry's https tarball: git, file, link and other URLs are refused (their "
                "code is not pinned by the registry); depend on a published version"
            )
        if not isinstance(integrity, str) or not _INTEGRITY.fullmatch(integrity.split()[0]):
            raise DependencyBuildFailed(
                f"{where} ({name}@{version}) has no integrity hash: every package must be "
                "pinned by its tarball's hash; write the lock again with `npm install`"
            )
        packages.append(NodePackage(path, name, version, resolved, integrity, scripts))
    return packages


def _json(data: bytes, name: str) -> object:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DependencyBuildFailed(f"declared dependencies: {name} is not JSON: {exc}") from None

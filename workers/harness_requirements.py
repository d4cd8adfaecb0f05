"""What a harness declares as its dependencies (``[harness] requirements``): the files' bytes,
the pins they hold (each checked: nothing but ``name==version``, a marker and hashes), and the
key of the environment they make (workers/harness_env.py)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from harness_store.manifest import LOCK_NAME, load_manifest
from workers.outcomes import DependencyBuildFailed

# Part of every key: a change to how environments are built or laid out changes this.
LAYOUT = "coevo-harness-env/1"
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
    parts = [LAYOUT, python_identity(), json.dumps(index_config()), requirements.source]
    for name, data in requirements.files:
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

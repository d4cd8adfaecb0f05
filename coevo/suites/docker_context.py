"""The build context of a Harbor task's Dockerfile (its environment/ directory), read as
``docker build`` would send it, without following a link: the listing, ``.dockerignore`` and
the glob patterns of COPY sources (Go's ``filepath.Match``, as Docker uses).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from dataclasses import dataclass
from pathlib import Path

MAX_IGNORE_BYTES = 64 * 1024
# Entries of a build context listed before anything is read: room for a context that holds
# far more than the few files it copies, bounded for one that is a whole disk.
MAX_CONTEXT_ENTRIES = 20_000
MAX_IGNORE_PATTERNS = 1000


class DockerfileError(ValueError):
    """A Dockerfile or build context that cannot be read as files, whatever is allowed."""


@dataclass(frozen=True)
class ContextEntry:
    kind: str  # "file", "dir", "symlink" or "special"
    size: int = 0
    executable: bool = False


def context_listing(context: Path) -> dict[str, ContextEntry]:
    """Every entry under ``context`` by its relative path, from lstat (no link is followed)."""
    listing: dict[str, ContextEntry] = {}
    stack = [(context, "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if len(listing) >= MAX_CONTEXT_ENTRIES:
                    raise DockerfileError(
                        f"environment/ holds more than {MAX_CONTEXT_ENTRIES} entries; keep only "
                        "what the Dockerfile copies"
                    )
                relative = f"{prefix}{entry.name}"
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    listing[relative] = ContextEntry("dir")
                    stack.append((Path(entry.path), relative + "/"))
                elif stat.S_ISLNK(st.st_mode):
                    listing[relative] = ContextEntry("symlink")
                elif stat.S_ISREG(st.st_mode):
                    executable = bool(st.st_mode & stat.S_IXUSR)
                    listing[relative] = ContextEntry("file", st.st_size, executable)
                else:
                    listing[relative] = ContextEntry("special")
    return listing


@dataclass(frozen=True)
class IgnoreRules:
    rules: tuple[tuple[re.Pattern[str], bool], ...] = ()  # (pattern, excludes)

    def excludes(self, path: str) -> bool:
        """Whether ``path`` is left out: the last rule matching it or a parent decides."""
        parents = path.split("/")
        candidates = ["/".join(parents[: i + 1]) for i in range(len(parents))]
        excluded = False
        for pattern, excludes in self.rules:
            if any(pattern.fullmatch(candidate) for candidate in candidates):
                excluded = excludes
        return excluded


def dockerignore_rules(context: Path, listing: dict[str, ContextEntry]) -> IgnoreRules:
    """``environment/.dockerignore``'s patterns (none without one), read as Docker reads them:
    cleaned, ``!`` re-includes, ``**`` spans directories, a match on a directory covers what
    is in it."""
    entry = listing.get(".dockerignore")
    if entry is None:
        return IgnoreRules()
    if entry.kind != "file" or entry.size > MAX_IGNORE_BYTES:
        raise DockerfileError(
            f"environment/.dockerignore: must be a regular file of at most "
            f"{MAX_IGNORE_BYTES // 1024} KiB"
        )
    text = read_regular(context / ".dockerignore", entry.size).decode("utf-8", errors="replace")
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        line = line.lstrip("!").strip()
        cleaned = posixpath.normpath(line.lstrip("/")) if line.lstrip("/") else "."
        if cleaned == ".":
            continue
        rules.append((glob_pattern(cleaned, double_star=True), excludes))
        if len(rules) > MAX_IGNORE_PATTERNS:
            raise DockerfileError(
                f"environment/.dockerignore: more than {MAX_IGNORE_PATTERNS} patterns"
            )
    return IgnoreRules(tuple(rules))


def glob_pattern(glob: str, *, double_star: bool) -> re.Pattern[str]:
    """A Go ``filepath.Match`` pattern as a regex (``*`` and ``?`` stay within a path part;
    with ``double_star``, ``**`` spans parts, as .dockerignore reads it)."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            if double_star and glob.startswith("**", i):
                i += 2
                if glob.startswith("/", i):
                    i += 1
                    out.append("(?:.*/)?")
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = glob.find("]", i + 2)
            if end == -1:
                out.append(re.escape(char))
            else:
                body = glob[i + 1 : end]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                out.append(f"[{'^' if negate else ''}{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        elif char == "\\" and i + 1 < len(glob):
            i += 1
            out.append(re.escape(glob[i]))
        else:
            out.append(re.escape(char))
        i += 1
    try:
        return re.compile("".join(out))
    except re.error as exc:
        raise DockerfileError(f"environment/Dockerfile: the pattern {glob!r} is malformed") from exc


def has_glob(path: str) -> bool:
    return any(char in path for char in "*?[")


def read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file, never through a symbolic link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DockerfileError(f"{path.name}: not a regular file")
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1024**2))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)

"""The build context of a Harbor task's Dockerfile (its environment/ directory), read as
``docker build`` would send it, without following a link: the listing, ``.dockerignore``, the
glob patterns of COPY sources (Go's ``filepath.Match``, as Docker uses), and the context itself
as a stored tree for the container backend (``context_tree``).

Globs are matched by RE2, not Python's ``re``: ``**a**a**a…`` became ``.*a.*a.*a…``, which
``re`` backtracks through in time exponential in the stars, holding the interpreter lock, so
one upload with one long file name stalled every thread of the process for minutes. RE2 never
backtracks: its time is linear in the name, times a factor of the pattern that the bounds on a
glob's length and wildcards keep small (``MAX_GLOB_CHARS``, ``MAX_GLOB_WILDCARDS``).
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import re2

from workers.environments.workspace_files import (
    MAX_TREE_BYTES,
    MAX_TREE_FILES,
    TreeError,
    spec_for_bytes,
    tree_validate,
)

MAX_IGNORE_BYTES = 64 * 1024
# Entries of a build context listed before anything is read: room for a context that holds
# far more than the few files it copies, bounded for one that is a whole disk.
MAX_CONTEXT_ENTRIES = 20_000
MAX_IGNORE_PATTERNS = 1000
# A glob with a wildcard (a .dockerignore line, a COPY source; one without is compared as
# text): real ones are a short path with a wildcard or two. RE2 matches with its DFA while the
# states fit its memory budget and falls back to an NFA, still linear but ~30x slower, when
# they do not. Both bounds keep the worst glob on the DFA (measured on a 2-core machine, 512 KiB
# budget, 200-byte names: `*` and 255 letters 2 µs a name; `**a` and seven `?`, whose states
# double with each `?`, 3 µs; with eleven `?` it was 85 µs, with fifteen 120 µs).
MAX_GLOB_CHARS = 256
MAX_GLOB_WILDCARDS = 8
# RE2's memory per compiled glob (program and DFA cache; its default is 8 MiB), which a
# .dockerignore may hold MAX_IGNORE_PATTERNS of: 1000 of the worst globs against 2000 names
# kept the process under 40 MB (measured).
_GLOB_MAX_MEM = 512 * 1024
# Escaped for RE2 outside a character class, and inside one.
_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")
_RE2_CLASS_SPECIAL = frozenset("\\[]^-")


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


def context_tree(context: Path) -> dict[str, dict[str, Any]]:
    """``context`` as ``docker build`` sends it to the engine, ``.dockerignore`` applied, as a
    stored tree (workers/environments/workspace_files.py) within its bounds: what the
    container backend builds a task's image from. Empty directories are not kept (a tree
    holds files). A link or special file that is sent is refused: a stored tree has no place
    for one, and the files-only reading refuses them too."""
    listing = context_listing(context)
    ignore = dockerignore_rules(context, listing)
    tree: dict[str, dict[str, Any]] = {}
    total = 0
    for path, entry in sorted(listing.items()):
        if entry.kind == "dir" or ignore.excludes(path):
            continue
        if entry.kind != "file":
            what = "a symbolic link" if entry.kind == "symlink" else "not a regular file"
            raise DockerfileError(
                f"environment/{path} is {what}; only plain files are taken (list it in "
                "environment/.dockerignore if the image does not need it)"
            )
        total += entry.size
        if total > MAX_TREE_BYTES or len(tree) >= MAX_TREE_FILES:
            raise DockerfileError(
                f"environment/ holds more than {MAX_TREE_FILES} files or "
                f"{MAX_TREE_BYTES // 1024**2} MiB once .dockerignore is applied; list what "
                "the image does not need in environment/.dockerignore"
            )
        data = read_regular(context.joinpath(*path.split("/")), entry.size)
        tree[path] = spec_for_bytes(data, executable=entry.executable)
    try:
        return tree_validate(tree, label="environment/ (the build context)")
    except TreeError as exc:
        raise DockerfileError(str(exc)) from None


@dataclass(frozen=True)
class Glob:
    """A glob pattern: the text it names when it has no wildcard, else an RE2 regexp, whose
    matching takes time linear in the name and never backtracks."""

    literal: str = ""
    regexp: re2._Regexp | None = None

    def matches(self, path: str) -> bool:
        """Whether the whole of ``path`` matches."""
        if self.regexp is None:
            return path == self.literal
        # os.scandir gives a byte that is not UTF-8 as a lone surrogate: "surrogatepass" keeps
        # it one character, as ``?`` and ``*`` counted it under ``re``.
        return self.regexp.fullmatch(path.encode("utf-8", "surrogatepass")) is not None


@dataclass(frozen=True)
class IgnoreRules:
    rules: tuple[tuple[Glob, bool], ...] = ()  # (pattern, excludes)
    # Path -> index of the last rule matching it or a parent (-1: none). A directory's answer
    # is kept for what is in it: each path is matched once per rule, not once per descendant.
    _last: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def excludes(self, path: str) -> bool:
        """Whether ``path`` is left out: the last rule matching it or a parent decides."""
        last, cut = -1, -1
        while cut != len(path):
            cut = path.find("/", cut + 1)
            cut = len(path) if cut == -1 else cut
            last = self._last_rule(path[:cut], last)
        return last >= 0 and self.rules[last][1]

    def _last_rule(self, path: str, parents: int) -> int:
        """The last rule matching ``path`` or a parent; ``parents`` is the last for its
        parents."""
        known = self._last.get(path)
        if known is not None:
            return known
        last = parents
        for index in range(len(self.rules) - 1, parents, -1):  # later rules decide: stop at one
            if self.rules[index][0].matches(path):
                last = index
                break
        self._last[path] = last
        return last


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
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        line = line.lstrip("!").strip()
        cleaned = posixpath.normpath(line.lstrip("/")) if line.lstrip("/") else "."
        if cleaned == ".":
            continue
        where = f"environment/.dockerignore: line {number}"
        rules.append((glob_pattern(cleaned, double_star=True, where=where), excludes))
        if len(rules) > MAX_IGNORE_PATTERNS:
            raise DockerfileError(
                f"environment/.dockerignore: more than {MAX_IGNORE_PATTERNS} patterns"
            )
    return IgnoreRules(tuple(rules))


def glob_pattern(glob: str, *, double_star: bool, where: str) -> Glob:
    """A Go ``filepath.Match`` pattern as a ``Glob`` (``*`` and ``?`` stay within a path part;
    with ``double_star``, ``**`` spans parts, as .dockerignore reads it). ``where`` (the file
    and line) starts the error for a pattern over the bounds or malformed."""
    shown = glob if len(glob) <= 80 else glob[:77] + "..."
    out: list[str] = []
    literal: list[str] = []
    wildcards = 0
    i = 0
    while i < len(glob):
        char = glob[i]
        if char in "*?":
            wildcards += 1  # "**" is one: it is skipped whole below
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
            negate = glob[i + 1 : i + 2] in ("!", "^")
            # As in Go, a "]" first in the class is a member: the class is never empty.
            end = glob.find("]", i + (3 if negate else 2))
            if end == -1:
                out.append(_re2_literal(char))
                literal.append(char)
            else:
                body = glob[i + (2 if negate else 1) : end]
                out.append(f"[{'^' if negate else ''}{_re2_class_body(body)}]")
                wildcards += 1
                i = end
        elif char == "\\" and i + 1 < len(glob):
            i += 1
            out.append(_re2_literal(glob[i]))
            literal.append(glob[i])
        else:
            out.append(_re2_literal(char))
            literal.append(char)
        i += 1
    if not wildcards:
        return Glob(literal="".join(literal))
    if len(glob) > MAX_GLOB_CHARS:
        raise DockerfileError(
            f"{where}: the pattern {shown!r} is {len(glob)} characters, over the limit of "
            f"{MAX_GLOB_CHARS} for a pattern with wildcards; match a shorter path"
        )
    if wildcards > MAX_GLOB_WILDCARDS:
        raise DockerfileError(
            f"{where}: the pattern {shown!r} has {wildcards} wildcards (*, **, ?, [...]), over "
            f"the limit of {MAX_GLOB_WILDCARDS}; split it into simpler patterns"
        )
    options = re2.Options()
    options.log_errors = False  # errors come back as exceptions, not on the process's stderr
    options.never_capture = True
    options.max_mem = _GLOB_MAX_MEM
    try:
        return Glob(regexp=re2.compile("".join(out).encode("utf-8"), options))
    except (re2.error, UnicodeEncodeError):
        raise DockerfileError(f"{where}: the pattern {shown!r} is malformed") from None


def _re2_literal(char: str) -> str:
    return "\\" + char if char in _RE2_SPECIAL else char


def _re2_class_body(body: str) -> str:
    """A class's members as RE2 reads them: a ``-`` between two members is a range, every
    other character is itself (RE2 would read ``[:alpha:]`` as a POSIX class)."""
    return "".join(
        char
        if char == "-" and 0 < index < len(body) - 1
        else ("\\" + char if char in _RE2_CLASS_SPECIAL else char)
        for index, char in enumerate(body)
    )


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

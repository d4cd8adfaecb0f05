"""A Harbor task's ``environment/Dockerfile``, read for the files it puts in ``/app``.

A task with a files-only Dockerfile runs in a bwrap sandbox with the worker's own tools, not
in a container built from the task's image: nothing here builds or runs anything. A
Dockerfile is *files-only* when its only effect that matters to the task is copying files from
its build context into ``/app``: every instruction is FROM (one stage), WORKDIR /app, COPY or
ADD of local files into ``/app``, or an instruction that changes nothing on disk (ENV, ARG,
LABEL, USER, EXPOSE, CMD, ENTRYPOINT and the like, listed as ignored). Those copies are mapped
the way ``docker build`` maps them (a directory source copies its contents; a destination
ending in ``/``, an existing directory or several sources is a directory; ``.dockerignore``
applies; later copies overwrite earlier ones). Everything else (RUN, a second stage,
``COPY --from``, a URL, a destination outside ``/app``, ...) is *unsupported*: the task needs
its container. The caller decides what
that means (coevo/suites/harbor_tasks.py stores it for the container backend when that is on,
with ``DockerfileFiles.text``; otherwise refuses it unless told to take the copied files only).

Refused outright (DockerfileError), whatever the caller allows: a source that is absolute or
climbs out of the build context with ``..``, a destination with ``..``, a source that is a
symbolic link or a special file, a source that matches nothing, a workspace over the
stored-tree bounds (workers/environments/workspace_files.py), and variables that expand past
their bounds (``MAX_EXPANDED_CHARS``, ``MAX_EXPANSION_CHARS``). coevo/suites/docker_context.py
reads the build context.
"""

from __future__ import annotations

import json
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.suites.docker_context import (
    ContextEntry,
    DockerfileError,
    context_listing,
    dockerignore_rules,
    glob_pattern,
    has_glob,
    read_regular,
)
from workers.containers.dockerfile import DockerfileInvalid
from workers.containers.dockerfile import dockerfile_parse as builder_parse
from workers.containers.images import MAX_DOCKERFILE_BYTES
from workers.environments.workspace_files import (
    MAX_TREE_BYTES,
    MAX_TREE_FILES,
    TreeError,
    path_check,
    spec_for_bytes,
    tree_validate,
)

MOUNT = "/app"
# $VAR expansion. Each `ENV Vn=$Vn-1$Vn-1` line doubles a value: a 6 KB Dockerfile took
# 1.17 GB of the importer's memory, a few more lines asked for 100 GB. Lengths are summed
# before a value is built, and refused past these. One value (an ARG or ENV value, a WORKDIR,
# a COPY word) holds at most what the Dockerfile itself may; all of a Dockerfile's expansions
# together, four times that, which bounds the memory its variables hold and the work of every
# line that uses them.
MAX_EXPANDED_CHARS = 64 * 1024
MAX_EXPANSION_CHARS = 256 * 1024
# Shown in the report instead of a whole instruction.
MAX_SHOWN_CHARS = 80

# Instructions that put nothing in the image's files: the workspace is the same without them.
IGNORED = frozenset(
    {
        "ENV",
        "ARG",
        "LABEL",
        "USER",
        "EXPOSE",
        "CMD",
        "ENTRYPOINT",
        "MAINTAINER",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
    }
)
_COPY_FLAGS = {"COPY": {"chown", "chmod", "link"}, "ADD": {"chown", "chmod", "link"}}
_HEREDOC = re.compile(r"<<-?\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\1")
_VARIABLE = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)
# tar and what ADD inflates before untarring: ADD unpacks these, COPY does not.
_ARCHIVE_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str
    heredoc: bool = False

    def shown(self) -> str:
        text = f"{self.keyword} {self.args}".strip()
        text = " ".join(text.split())
        return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


@dataclass
class DockerfileFiles:
    """What a Dockerfile puts in ``/app`` (a stored tree), and what it does besides; ``text``
    is the Dockerfile itself, which the container backend builds when ``unsupported`` is not
    empty (within the builder's bound, ``MAX_DOCKERFILE_BYTES``, checked as it is read)."""

    text: str = ""
    tree: dict[str, dict[str, Any]] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # instructions with no effect on files
    unsupported: list[str] = field(default_factory=list)  # ... that need the container


def dockerfile_parse(text: str) -> list[Instruction]:
    """Instructions with their first line number: comments dropped, continuations joined,
    heredoc bodies kept with the instruction that opens them. The image builder's reading
    (workers/containers/dockerfile.py), so that the importer and the builder see one file."""
    try:
        parsed = builder_parse(text)
    except DockerfileInvalid as exc:
        raise DockerfileError(str(exc)) from None
    return [
        Instruction(
            item.line,
            item.keyword,
            item.args,
            heredoc=item.keyword in ("RUN", "COPY", "ADD") and bool(_HEREDOC.search(item.args)),
        )
        for item in parsed.instructions
    ]


def dockerfile_files(*, context: Path, dockerfile: Path) -> DockerfileFiles:
    """Read ``dockerfile`` (in ``context``, the task's environment/) and map its copies into a
    stored tree of ``/app``; see the module docstring for what counts as files-only."""
    text = _dockerfile_text(dockerfile)
    instructions = dockerfile_parse(text)
    listing = context_listing(context)
    ignore = dockerignore_rules(context, listing)
    visible = {path: entry for path, entry in listing.items() if not ignore.excludes(path)}
    result = DockerfileFiles(text=text)
    plan = _Plan(context=context, listing=visible, result=result)
    for instruction in instructions:
        plan.apply(instruction)
    plan.finish()
    return result


def _dockerfile_text(path: Path) -> str:
    try:
        st = path.lstat()
    except OSError as exc:
        raise DockerfileError(f"environment/Dockerfile: cannot read it ({exc.strerror})") from exc
    if not stat.S_ISREG(st.st_mode):
        raise DockerfileError("environment/Dockerfile: not a regular file")
    if st.st_size > MAX_DOCKERFILE_BYTES:
        raise DockerfileError(
            f"environment/Dockerfile: {st.st_size} bytes, over the "
            f"{MAX_DOCKERFILE_BYTES // 1024} KiB limit"
        )
    try:
        return read_regular(path, st.st_size).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DockerfileError(f"environment/Dockerfile: not UTF-8 text (byte {exc.start})") from exc


class _Plan:
    """The build, instruction by instruction, as far as files in /app go."""

    def __init__(
        self, *, context: Path, listing: dict[str, ContextEntry], result: DockerfileFiles
    ) -> None:
        self.context = context
        self.listing = listing
        self.result = result
        self.stages = 0
        self.workdir: str | None = None  # None: the base image's, which we do not know
        self.global_args: dict[str, str] = {}
        self.variables: dict[str, str] = {}
        self.line = 0  # of the instruction being applied, for errors
        self.expanded = 0  # characters all expansions so far have made
        # Target path in the tree -> (source path in the context, executable)
        self.files: dict[str, tuple[str, bool]] = {}

    def apply(self, instruction: Instruction) -> None:
        keyword = instruction.keyword
        self.line = instruction.line
        if keyword == "FROM":
            self.stages += 1
            if self.stages > 1:
                self._unsupported(instruction)  # multi-stage: files come from other stages
            self.variables = {}
            return
        if keyword == "ARG":
            self._arg(instruction.args)
            self.result.ignored.append(instruction.shown())
            return
        if keyword == "ENV":
            self._env(instruction.args)
            self.result.ignored.append(instruction.shown())
            return
        if keyword in IGNORED:
            self.result.ignored.append(instruction.shown())
            return
        if self.stages == 0:
            raise DockerfileError(
                f"environment/Dockerfile: line {instruction.line}: {keyword} before FROM"
            )
        if keyword == "WORKDIR":
            self._workdir(instruction)
        elif keyword in ("COPY", "ADD"):
            self._copy(instruction)
        else:
            self._unsupported(instruction)

    def finish(self) -> None:
        if self.stages == 0:
            raise DockerfileError("environment/Dockerfile: it has no FROM instruction")
        tree: dict[str, dict[str, Any]] = {}
        total = 0
        for target, (source, executable) in sorted(self.files.items()):
            entry = self.listing[source]
            total += entry.size
            if total > MAX_TREE_BYTES or len(tree) >= MAX_TREE_FILES:
                raise DockerfileError(
                    f"environment/Dockerfile: it copies more than {MAX_TREE_FILES} files or "
                    f"{MAX_TREE_BYTES // 1024**2} MiB into /app"
                )
            data = read_regular(self.context.joinpath(*source.split("/")), entry.size)
            tree[target] = spec_for_bytes(data, executable=executable)
        try:
            self.result.tree = tree_validate(tree, label="environment/Dockerfile's /app")
        except TreeError as exc:
            raise DockerfileError(str(exc)) from None

    # --- instructions -----------------------------------------------------------------------

    def _unsupported(self, instruction: Instruction) -> None:
        self.result.unsupported.append(instruction.shown())

    def _arg(self, args: str) -> None:
        for word in args.split():
            name, has_default, default = word.partition("=")
            value = _unquote(self._expand(default)) if has_default else None
            if self.stages == 0:
                if value is not None:
                    self.global_args[name] = value
            elif value is not None:
                self.variables[name] = value
            elif name in self.global_args:
                self.variables[name] = self.global_args[name]

    def _env(self, args: str) -> None:
        words = args.split(None, 1)
        if words and "=" not in words[0]:
            if len(words) == 2:  # the legacy "ENV NAME value with spaces" form
                self.variables[words[0]] = self._expand(words[1])
            return
        for word in _split_quoted(args):
            name, _, value = word.partition("=")
            if name:
                self.variables[name] = _unquote(self._expand(value))

    def _workdir(self, instruction: Instruction) -> None:
        path = self._expand(instruction.args.strip())
        if path.startswith("/"):
            target = posixpath.normpath(path)
        elif self.workdir is not None:
            target = posixpath.normpath(posixpath.join(self.workdir, path))
        else:
            target = ""  # relative to a directory only the base image knows
        self.workdir = target or None
        if target != MOUNT:
            self._unsupported(instruction)

    def _copy(self, instruction: Instruction) -> None:
        if instruction.heredoc:
            self._unsupported(instruction)  # inline files: shell-expanded by BuildKit
            return
        flags, words = _copy_words(instruction.args)
        if words is None or len(words) < 2:
            raise DockerfileError(
                f"environment/Dockerfile: line {instruction.line}: {instruction.keyword} needs "
                "at least a source and a destination"
            )
        chmod = flags.pop("chmod", None)
        if set(flags) - _COPY_FLAGS[instruction.keyword]:
            self._unsupported(instruction)  # --from, --parents, --exclude, --checksum, ...
            return
        executable: bool | None = None
        if chmod is not None:
            if not re.fullmatch(r"[0-7]{3,4}", chmod):
                self._unsupported(instruction)
                return
            executable = bool(int(chmod, 8) & 0o100)
        words = [self._expand(word) for word in words]
        sources, destination = words[:-1], words[-1]
        line = f"environment/Dockerfile: line {instruction.line}"
        if any("://" in s or s.startswith("git@") for s in sources):
            self._unsupported(instruction)
            return
        if ".." in destination.split("/"):
            raise DockerfileError(
                f"{line}: the destination {destination!r} has a '..' part; write the path "
                "under /app it means"
            )
        target = self._destination(destination)
        if target is None:
            self._unsupported(instruction)
            return
        matched: list[str] = []
        for source in sources:
            matched.extend(self._sources(source, line))
        if instruction.keyword == "ADD" and any(
            s and self.listing[s].kind == "file" and self._is_archive(s) for s in matched
        ):
            self._unsupported(instruction)  # ADD unpacks a local archive
            return
        into_directory = (
            destination.endswith("/")
            or target == ""
            or any(path.startswith(target + "/") for path in self.files)
            or len(matched) > 1
            or any(has_glob(s) for s in sources)
        )
        for source in matched:
            self._copy_one(source, target, into_directory, executable)

    def _destination(self, destination: str) -> str | None:
        """The destination as a path inside /app ("" for /app itself), or None when it is
        outside /app or relative to a working directory other than /app."""
        if destination.startswith("/"):
            absolute = posixpath.normpath(destination)
        elif self.workdir == MOUNT:
            absolute = posixpath.normpath(posixpath.join(MOUNT, destination))
        else:
            return None
        if absolute == MOUNT:
            return ""
        if absolute.startswith(MOUNT + "/"):
            return absolute[len(MOUNT) + 1 :]
        return None

    def _sources(self, source: str, line: str) -> list[str]:
        if source.startswith("/") or ".." in source.split("/"):
            raise DockerfileError(
                f"{line}: the source {source!r} is outside the build context (environment/); "
                "copy files from inside it"
            )
        cleaned = posixpath.normpath(source)
        cleaned = "" if cleaned == "." else cleaned
        if has_glob(cleaned):
            pattern = glob_pattern(cleaned, double_star=False, where=line)
            matched = sorted(path for path in self.listing if pattern.matches(path))
        else:
            matched = [cleaned] if cleaned == "" or cleaned in self.listing else []
        if not matched:
            raise DockerfileError(
                f"{line}: the source {source!r} matches nothing in environment/ "
                "(or only what .dockerignore leaves out)"
            )
        for path in matched:
            kind = "dir" if path == "" else self.listing[path].kind
            if kind == "symlink":
                raise DockerfileError(
                    f"{line}: environment/{path} is a symbolic link; only plain files are taken"
                )
            if kind == "special":
                raise DockerfileError(f"{line}: environment/{path} is not a regular file")
        return matched

    def _copy_one(
        self, source: str, target: str, into_directory: bool, executable: bool | None
    ) -> None:
        kind = "dir" if source == "" else self.listing[source].kind
        if kind == "dir":
            prefix = f"{source}/" if source else ""
            for path, entry in self.listing.items():
                if not path.startswith(prefix):
                    continue
                if entry.kind in ("symlink", "special"):
                    what = "a symbolic link" if entry.kind == "symlink" else "not a regular file"
                    raise DockerfileError(
                        f"environment/{path} is {what}; only plain files are taken"
                    )
                if entry.kind == "file":
                    self._put(_join(target, path[len(prefix) :]), path, executable)
            return
        name = _join(target, posixpath.basename(source)) if into_directory else target
        if not name:
            raise DockerfileError(f"environment/{source}: cannot replace /app with a file")
        self._put(name, source, executable)

    def _put(self, target: str, source: str, executable: bool | None) -> None:
        try:
            path_check(target)
        except TreeError as exc:
            raise DockerfileError(f"environment/Dockerfile: {exc}") from None
        mode = self.listing[source].executable if executable is None else executable
        self.files[target] = (source, mode)

    def _is_archive(self, source: str) -> bool:
        head = read_regular(self.context.joinpath(*source.split("/")), 512)
        is_tar = len(head) >= 262 and head[257:262] == b"ustar"
        return is_tar or head.startswith(_ARCHIVE_MAGIC)

    def _expand(self, text: str) -> str:
        """``$NAME``, ``${NAME}``, ``${NAME:-word}`` and ``${NAME:+word}`` from ARG and ENV, as
        Docker expands them in COPY, ADD and WORKDIR (an unknown name is empty; ``\\$`` is a
        literal dollar). Every expansion of the Dockerfile goes through here, and is refused
        past ``MAX_EXPANDED_CHARS`` alone or ``MAX_EXPANSION_CHARS`` in all."""
        scope = self.variables if self.stages else self.global_args
        # The parts refer to the values; nothing is copied until their lengths pass the bounds.
        parts: list[str] = []
        for index, piece in enumerate(text.split("\\$")):
            if index:
                parts.append("$")
            end = 0
            for match in _VARIABLE.finditer(piece):
                parts.append(piece[end : match.start()])
                parts.append(_substitute(match, scope))
                end = match.end()
            parts.append(piece[end:])
        self._spend(sum(len(part) for part in parts))
        return "".join(parts)

    def _spend(self, size: int) -> None:
        where = f"environment/Dockerfile: line {self.line}"
        if size > MAX_EXPANDED_CHARS:
            raise DockerfileError(
                f"{where}: its variables expand to {size} characters, over the "
                f"{MAX_EXPANDED_CHARS // 1024} KiB limit on one expanded value; a Dockerfile "
                "that copies files needs no such value: shorten the ARG or ENV values it uses"
            )
        self.expanded += size
        if self.expanded > MAX_EXPANSION_CHARS:
            raise DockerfileError(
                f"{where}: the Dockerfile's variables expand to more than "
                f"{MAX_EXPANSION_CHARS // 1024} KiB in all (ARG, ENV, WORKDIR, COPY and ADD "
                "together), over the limit; shorten the ARG or ENV values it uses"
            )


# --- helpers --------------------------------------------------------------------------------


def _substitute(match: re.Match[str], scope: dict[str, str]) -> str:
    value = scope.get(match.group(1) or match.group(4), "")
    if match.group(2) == ":-":
        return value or match.group(3)
    if match.group(2) == ":+":
        return match.group(3) if value else ""
    return value


def _copy_words(args: str) -> tuple[dict[str, str], list[str] | None]:
    flags: dict[str, str] = {}
    rest = args.strip()
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        flags[name.lower()] = value
        rest = rest.strip()
    if rest.startswith("["):
        try:
            words = json.loads(rest)
        except ValueError:
            return flags, None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            return flags, None
        return flags, words
    return flags, rest.split()


def _split_quoted(text: str) -> list[str]:
    """Words split on unquoted whitespace; quotes stay (``_unquote`` takes them off)."""
    words, word, quote, escaped = [], "", "", False
    for char in text:
        if escaped:
            word += char
            escaped = False
        elif char == "\\":
            word += char
            escaped = True
        elif quote:
            word += char
            quote = "" if char == quote else quote
        elif char in "\"'":
            word += char
            quote = char
        elif char.isspace():
            if word:
                words.append(word)
            word = ""
        else:
            word += char
    if word:
        words.append(word)
    return words


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name

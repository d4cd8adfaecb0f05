"""File trees of workspace tasks: stored as JSON, written to disk, read back from what a
harness left, copied for the verifier, and compared.

A tree is ``{relative path: spec}`` where a spec is ``{"text": str}`` (UTF-8 text) or
``{"base64": str}`` (anything else), with ``"executable": true`` for a file whose mode has the
execute bit. Paths use ``/``, are relative, and have no ``.``/``..`` parts. Tasks keep their
starting files and their tests this way in the database (workers share no disk with the web
process); the worker writes them out for each rollout.

What a harness leaves in its workspace is hostile input, read by a worker that may be root.
Every walk here is descriptor-relative: it opens the root once, then each directory with
``openat(parent, name, O_DIRECTORY | O_NOFOLLOW)`` and each file with ``openat(parent, name,
O_NOFOLLOW)``, so no path is ever resolved again and no component of one is ever followed (a
directory swapped for a link to a host directory fails to open instead of being read), and no
path grows past the kernel's PATH_MAX however deep the tree nests (up to ``MAX_TREE_DEPTH``). A
link is recorded as a link, with its target as text; FIFOs, sockets and devices are skipped
instead of opened (a FIFO would block the worker); a file whose identity changed between its
``lstat`` and its ``open`` is refused; every read stops at a bound on files and bytes. And every
sandbox that could write into the tree is dead before it is read back
(``workers/environments/workspace.py``, ``Workspace.seal``), so nothing changes it underneath.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

# A task's stored trees (starting files, tests, solution): a suite holds them in JSON.
MAX_TREE_FILES = 2000
MAX_TREE_BYTES = 16 * 1024**2
MAX_PATH_CHARS = 400
# A file larger than this, or not UTF-8, is shown in a diff as changed, not line by line.
MAX_DIFF_FILE_BYTES = 512 * 1024
# The whole diff kept with a rollout.
MAX_DIFF_CHARS = 256 * 1024


# How deep a tree's directories may nest: past any real project's tree, and a walk holds one
# descriptor per level.
MAX_TREE_DEPTH = 128

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# What a live tree's walk meets when the harness renames or removes an entry it had listed.
_VANISHED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class TreeError(ValueError):
    """A tree is malformed or over its bounds; the message names the path and the rule."""


class WorkspaceRefused(Exception):
    """What a harness left in its workspace cannot be taken (the message says why)."""


class WorkspaceTooLarge(WorkspaceRefused):
    """What a harness left in its workspace is over the limits (files, bytes or depth)."""


class WorkspaceUnreadable(WorkspaceRefused):
    """What a harness left in its workspace cannot be read (a directory it made unreadable,
    a file that changed while it was read)."""


# --- stored trees -------------------------------------------------------------------------


def spec_for_bytes(data: bytes, *, executable: bool = False) -> dict[str, Any]:
    try:
        spec: dict[str, Any] = {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        spec = {"base64": base64.b64encode(data).decode("ascii")}
    if executable:
        spec["executable"] = True
    return spec


def spec_bytes(spec: Mapping[str, Any]) -> bytes:
    if "text" in spec:
        return str(spec["text"]).encode("utf-8")
    return base64.b64decode(spec["base64"])


def path_check(path: str) -> str:
    """``path`` if it is a relative, normalised path inside a tree; raises TreeError."""
    if not isinstance(path, str) or not path:
        raise TreeError(f"{path!r}: a path must be a non-empty string")
    if len(path) > MAX_PATH_CHARS:
        raise TreeError(f"{path[:60]}...: a path is longer than {MAX_PATH_CHARS} characters")
    if "\x00" in path or "\\" in path:
        raise TreeError(f"{path!r}: a path may not hold NUL or a backslash")
    parts = PurePosixPath(path).parts
    if path.startswith("/") or any(part in (".", "..") for part in path.split("/")):
        raise TreeError(f"{path!r}: a path must be relative, with no '.' or '..' part")
    if "/".join(parts) != path:
        raise TreeError(f"{path!r}: a path must be normalised (no '//' or trailing '/')")
    return path


def tree_validate(tree: Any, *, label: str) -> dict[str, dict[str, Any]]:
    """The tree if it is well formed and within the bounds; raises TreeError naming ``label``."""
    if not isinstance(tree, dict):
        raise TreeError(f"{label}: must be an object of path -> file")
    if len(tree) > MAX_TREE_FILES:
        raise TreeError(f"{label}: {len(tree)} files, over the limit of {MAX_TREE_FILES}")
    total = 0
    dirs: set[str] = set()
    for path, spec in tree.items():
        try:
            path_check(path)
        except TreeError as exc:
            raise TreeError(f"{label}: {exc}") from None
        if not isinstance(spec, dict) or len({"text", "base64"} & set(spec)) != 1:
            raise TreeError(f"{label}: {path}: a file is {{'text': ...}} or {{'base64': ...}}")
        unknown = set(spec) - {"text", "base64", "executable"}
        if unknown:
            raise TreeError(f"{label}: {path}: unknown keys {sorted(unknown)}")
        try:
            total += len(spec_bytes(spec))
        except (ValueError, TypeError):
            raise TreeError(f"{label}: {path}: its base64 does not decode") from None
        parents = PurePosixPath(path).parents
        dirs.update(str(p) for p in parents if str(p) != ".")
    clash = dirs & set(tree)
    if clash:
        raise TreeError(f"{label}: {sorted(clash)[0]} is both a file and a directory")
    if total > MAX_TREE_BYTES:
        raise TreeError(
            f"{label}: {total / 1024**2:.1f} MiB, over the limit of {MAX_TREE_BYTES // 1024**2} MiB"
        )
    return tree


def tree_write(tree: Mapping[str, Mapping[str, Any]], root: Path) -> None:
    """Write a stored (validated) tree under ``root``, which exists and is empty. Modes are
    set, not left to the worker's umask: a sandbox's uid reads what is written here."""
    root.chmod(0o755)
    for path, spec in sorted(tree.items()):
        target = root.joinpath(*path_check(path).split("/"))
        for parent in reversed(target.relative_to(root).parents[:-1]):
            directory = root / parent
            if not directory.is_dir():
                directory.mkdir()
                directory.chmod(0o755)
        target.write_bytes(spec_bytes(spec))
        target.chmod(0o755 if spec.get("executable") else 0o644)


def tree_hash(tree: Mapping[str, Mapping[str, Any]]) -> str:
    digest = hashlib.sha256()
    for path in sorted(tree):
        spec = tree[path]
        digest.update(path.encode() + b"\x00")
        digest.update(b"x" if spec.get("executable") else b"-")
        digest.update(hashlib.sha256(spec_bytes(spec)).digest())
    return digest.hexdigest()


def tree_from_dir(root: Path, *, label: str) -> dict[str, dict[str, Any]]:
    """A directory as a stored tree (an import): regular files and directories only."""
    tree: dict[str, dict[str, Any]] = {}
    total = 0
    try:
        for entry in _walk(root):
            mode = entry.st.st_mode
            if stat.S_ISDIR(mode):
                continue
            if stat.S_ISLNK(mode):
                raise TreeError(
                    f"{label}: {entry.relative} is a symbolic link; only plain files are taken"
                )
            if not stat.S_ISREG(mode):
                raise TreeError(f"{label}: {entry.relative} is not a regular file")
            total += entry.st.st_size
            if total > MAX_TREE_BYTES or len(tree) >= MAX_TREE_FILES:
                raise TreeError(
                    f"{label}: over the limit of {MAX_TREE_FILES} files or "
                    f"{MAX_TREE_BYTES // 1024**2} MiB"
                )
            try:
                path_check(entry.relative)
            except TreeError as exc:
                raise TreeError(f"{label}: {exc}") from None
            data = _read_regular(entry, limit=entry.st.st_size)
            tree[entry.relative] = spec_for_bytes(data, executable=bool(mode & stat.S_IXUSR))
    except WorkspaceRefused as exc:
        raise TreeError(f"{label}: {exc}") from None
    return tree


# --- workspaces a harness wrote -------------------------------------------------------------


@dataclass
class Usage:
    files: int = 0
    bytes: int = 0
    # Entries listed but gone (renamed, removed) before they could be measured: the harness
    # changed the tree during the count, so the figures may be short.
    incomplete: bool = False


def tree_usage(root: Path, *, max_files: int) -> Usage:
    """Entries and bytes of a live workspace (lstat only); stops counting past ``max_files``.

    The harness may be changing the tree meanwhile: an entry that vanishes between its listing
    and its measure marks the count ``incomplete``; any other OSError (a directory it made
    unreadable) and a tree deeper than ``MAX_TREE_DEPTH`` (WorkspaceTooLarge) raise."""
    usage = Usage()

    def vanished() -> None:
        usage.incomplete = True

    for entry in _walk(root, vanished=vanished):
        usage.files += 1
        # Blocks, not the apparent size: a sparse file costs what it holds.
        usage.bytes += entry.st.st_blocks * 512
        if usage.files > max_files:
            break
    return usage


@dataclass
class FinalFile:
    kind: str  # "file", "symlink" or "special"
    size: int = 0
    executable: bool = False
    sha256: str = ""
    data: bytes | None = None  # when small enough to diff
    target: str = ""  # a symlink's target


@dataclass
class FinalTree:
    files: dict[str, FinalFile] = field(default_factory=dict)


def tree_read_final(root: Path, *, max_files: int, max_bytes: int) -> FinalTree:
    """What a harness left: every entry by its path, never following a link (see module doc).

    Raises WorkspaceTooLarge past ``max_files`` entries, ``max_bytes`` of regular files or
    ``MAX_TREE_DEPTH`` levels, WorkspaceUnreadable for what cannot be read.
    """
    final = FinalTree()
    total = 0
    with _reading(root):
        for entry in _walk(root):
            if len(final.files) >= max_files:
                raise WorkspaceTooLarge(f"the workspace holds more than {max_files} files")
            mode = entry.st.st_mode
            if stat.S_ISDIR(mode):
                continue
            if stat.S_ISLNK(mode):
                target = os.readlink(entry.name, dir_fd=entry.parent)
                final.files[entry.relative] = FinalFile("symlink", target=target)
                continue
            if not stat.S_ISREG(mode):
                final.files[entry.relative] = FinalFile("special")
                continue
            total += entry.st.st_size
            if total > max_bytes:
                raise WorkspaceTooLarge(
                    f"the workspace holds more than {max_bytes // 1024**2} MiB of files"
                )
            digest, data = _hash_regular(entry, keep=MAX_DIFF_FILE_BYTES)
            final.files[entry.relative] = FinalFile(
                "file",
                size=entry.st.st_size,
                executable=bool(mode & stat.S_IXUSR),
                sha256=digest,
                data=data,
            )
    return final


def tree_copy(src: Path, dst: Path, *, owner: int | None, max_files: int, max_bytes: int) -> None:
    """Copy a workspace a harness left (``dst`` exists, empty): directories, regular files and
    symbolic links as links; FIFOs, sockets and devices are left out. With ``owner`` (a root
    worker), everything copied belongs to that uid and gid, so the sandbox that gets the copy
    may write in it. Both sides are walked by descriptor (see the module doc)."""
    budget = _Budget(max_files=max_files, max_bytes=max_bytes)
    with _reading(src):
        source = os.open(src, _DIR_FLAGS)
        try:
            target = os.open(dst, _DIR_FLAGS)
            try:
                _copy_dir(source, target, "", 1, owner=owner, budget=budget)
                if owner is not None:
                    os.fchown(target, owner, owner)
            finally:
                os.close(target)
        finally:
            os.close(source)


def tree_chown(root: Path, owner: int) -> None:
    """Give a freshly written tree (and its root) to ``owner`` (a root worker's sandbox uid)."""
    os.lchown(root, owner, owner)
    for entry in _walk(root):
        os.chown(entry.name, owner, owner, dir_fd=entry.parent, follow_symlinks=False)


def tree_changes(
    start: Mapping[str, Mapping[str, Any]], root: Path, *, max_files: int, max_bytes: int
) -> dict[str, bytes | None]:
    """What a workspace holds that its starting tree did not: ``{path: new bytes}``, and
    ``{path: None}`` for a file it removed. A link or a special file left there raises
    TreeError (what is proposed is plain files); past the bounds, WorkspaceTooLarge."""
    final: dict[str, bytes] = {}
    total = 0
    with _reading(root):
        for entry in _walk(root):
            mode = entry.st.st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise TreeError(f"{entry.relative} is {kind}; only plain files can be proposed")
            total += entry.st.st_size
            if len(final) >= max_files or total > max_bytes:
                raise WorkspaceTooLarge(
                    f"the workspace holds more than {max_files} files or "
                    f"{max_bytes // 1024**2} MiB of files"
                )
            final[entry.relative] = _read_regular(entry, limit=entry.st.st_size)
    changes: dict[str, bytes | None] = {path: None for path in start if path not in final}
    for path, data in final.items():
        if path not in start or spec_bytes(start[path]) != data:
            changes[path] = data
    return changes


# --- diffs ----------------------------------------------------------------------------------


def tree_diff(
    start: Mapping[str, Mapping[str, Any]] | FinalTree,
    final: FinalTree,
    *,
    max_chars: int = MAX_DIFF_CHARS,
) -> dict[str, Any]:
    """The workspace's final state against its starting files (a stored tree, or a tree read
    from disk: a task image's /app), as the trace keeps it.

    ``{"files": [{"path", "status", "diff"?, "note"?}], "added", "modified", "deleted",
    "truncated"}``: status is ``added``, ``modified`` or ``deleted``; ``diff`` is a unified
    diff of a text file; ``note`` says why there is none (binary, large, a link, a special
    file, the diff's size bound reached). Every changed path is listed, also past the bound.
    """
    rows: list[dict[str, Any]] = []
    used = 0
    truncated = False
    counts = {"added": 0, "modified": 0, "deleted": 0}
    starting = start.files if isinstance(start, FinalTree) else start
    for path in sorted(set(starting) | set(final.files)):
        before = _as_final(starting.get(path))
        after = final.files.get(path)
        if after is None:
            status = "deleted"
        elif before is None:
            status = "added"
        elif _same(before, after):
            continue
        else:
            status = "modified"
        counts[status] += 1
        row: dict[str, Any] = {"path": path, "status": status}
        if before is not None and before.kind == "file" and before.data is None:
            text, note = None, f"{before.size} bytes before, too large to show line by line"
        else:
            old = before.data if before is not None and before.kind == "file" else None
            text, note = _diff_text(path, old, after)
        if text is not None and used + len(text) > max_chars:
            text, note, truncated = None, "the diff is over the size kept with a rollout", True
        if text is not None:
            used += len(text)
            row["diff"] = text
        if note:
            row["note"] = note
        rows.append(row)
    return {"files": rows, **counts, "truncated": truncated}


def _as_final(entry: Mapping[str, Any] | FinalFile | None) -> FinalFile | None:
    """A starting entry (a stored spec, or one read from disk) as a FinalFile."""
    if entry is None or isinstance(entry, FinalFile):
        return entry
    data = spec_bytes(entry)
    return FinalFile(
        "file",
        size=len(data),
        executable=bool(entry.get("executable")),
        sha256=hashlib.sha256(data).hexdigest(),
        data=data,
    )


def _same(before: FinalFile, after: FinalFile) -> bool:
    if before.kind != after.kind:
        return False
    if after.kind == "file":
        return after.sha256 == before.sha256 and after.executable == before.executable
    if after.kind == "symlink":
        return after.target == before.target
    return True  # a special file stays one


def _diff_text(path: str, old: bytes | None, after: FinalFile | None) -> tuple[str | None, str]:
    if after is not None and after.kind == "symlink":
        return None, f"a symbolic link to {after.target[:200]}"
    if after is not None and after.kind == "special":
        return None, "a FIFO, socket or device (left out of the verifier's copy)"
    new = after.data if after is not None else b""
    if after is not None and new is None:
        return None, f"{after.size} bytes, too large to show line by line"
    note = ""
    if after is not None and old is not None and new == old:
        note = "mode changed (executable)" if after.executable else "mode changed"
        return None, note
    try:
        old_lines = (old or b"").decode("utf-8").splitlines(keepends=True)
        new_lines = (new or b"").decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None, "binary"
    if len(old or b"") > MAX_DIFF_FILE_BYTES:
        return None, "too large to show line by line"
    lines = difflib.unified_diff(
        old_lines,
        new_lines,
        fromfile="/dev/null" if old is None else f"a/{path}",
        tofile="/dev/null" if after is None else f"b/{path}",
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines), ""


# --- the walk -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    """One entry of a walk: ``name`` in the directory open as ``parent`` (valid only while the
    walk is at this entry), its path from the root, and its ``lstat``."""

    parent: int
    name: str
    relative: str
    st: os.stat_result


@dataclass
class _Budget:
    max_files: int
    max_bytes: int
    files: int = 0
    bytes: int = 0

    def take(self, st: os.stat_result) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise WorkspaceTooLarge(f"the workspace holds more than {self.max_files} files")
        if stat.S_ISREG(st.st_mode):
            self.bytes += st.st_size
            if self.bytes > self.max_bytes:
                raise WorkspaceTooLarge(
                    f"the workspace holds more than {self.max_bytes // 1024**2} MiB of files"
                )


@contextlib.contextmanager
def _reading(root: Path) -> Iterator[None]:
    """A read-back's OSErrors (a directory the harness left unreadable, an entry that changed
    while read) as WorkspaceUnreadable: the harness's doing, never the worker's failure."""
    try:
        yield
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        reason = exc.strerror or type(exc).__name__
        raise WorkspaceUnreadable(f"the workspace could not be read ({reason}{where})") from None


def _walk(root: Path, *, vanished: Callable[[], None] | None = None) -> Iterator[_Entry]:
    """Every entry under ``root``, depth first, sorted, parents before their entries, by
    descriptor (see the module doc). With ``vanished`` (a live tree), an entry that is gone,
    or is no longer a directory, when it is measured or opened is skipped after calling it;
    without, that raises."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        yield from _walk_dir(fd, "", 1, vanished)
    finally:
        os.close(fd)


def _walk_dir(
    fd: int, prefix: str, depth: int, vanished: Callable[[], None] | None
) -> Iterator[_Entry]:
    for name in _names(fd):
        relative = prefix + name
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            if vanished is None or exc.errno not in _VANISHED:
                raise
            vanished()
            continue
        yield _Entry(fd, name, relative, st)
        if not stat.S_ISDIR(st.st_mode):
            continue
        if depth >= MAX_TREE_DEPTH:
            raise WorkspaceTooLarge(
                f"the workspace nests directories more than {MAX_TREE_DEPTH} levels deep "
                f"({relative[:120]}...)"
            )
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if vanished is None or exc.errno not in _VANISHED:
                raise
            vanished()
            continue
        try:
            yield from _walk_dir(child, relative + "/", depth + 1, vanished)
        finally:
            os.close(child)


def _names(fd: int) -> list[str]:
    # scandir duplicates the descriptor and rewinds it: ``fd`` stays usable for openat.
    with os.scandir(fd) as entries:
        return sorted(entry.name for entry in entries)


def _copy_dir(
    source: int, target: int, prefix: str, depth: int, *, owner: int | None, budget: _Budget
) -> None:
    for name in _names(source):
        st = os.stat(name, dir_fd=source, follow_symlinks=False)
        relative = prefix + name
        if stat.S_ISDIR(st.st_mode):
            budget.take(st)
            if depth >= MAX_TREE_DEPTH:
                raise WorkspaceTooLarge(
                    f"the workspace nests directories more than {MAX_TREE_DEPTH} levels deep "
                    f"({relative[:120]}...)"
                )
            os.mkdir(name, 0o700, dir_fd=target)
            inner_source = os.open(name, _DIR_FLAGS, dir_fd=source)
            try:
                inner_target = os.open(name, _DIR_FLAGS, dir_fd=target)
                try:
                    os.fchmod(inner_target, 0o755)  # whatever the worker's umask
                    if owner is not None:
                        os.fchown(inner_target, owner, owner)
                    _copy_dir(
                        inner_source,
                        inner_target,
                        relative + "/",
                        depth + 1,
                        owner=owner,
                        budget=budget,
                    )
                finally:
                    os.close(inner_target)
            finally:
                os.close(inner_source)
        elif stat.S_ISLNK(st.st_mode):
            budget.take(st)
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
            if owner is not None:
                os.chown(name, owner, owner, dir_fd=target, follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            budget.take(st)
            entry = _Entry(source, name, relative, st)
            _copy_regular(entry, target, owner=owner)


def _open_regular(entry: _Entry) -> int:
    """The entry's file, opened without following a link; it must still be the file the walk
    measured (a harness's sandbox is dead by now: a change means something is wrong)."""
    fd = os.open(entry.name, _FILE_FLAGS, dir_fd=entry.parent)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (entry.st.st_dev, entry.st.st_ino):
        os.close(fd)
        raise WorkspaceUnreadable(f"{entry.relative} changed while the workspace was read")
    return fd


def _read_regular(entry: _Entry, *, limit: int) -> bytes:
    fd = _open_regular(entry)
    try:
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1024**2))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _hash_regular(entry: _Entry, *, keep: int) -> tuple[str, bytes | None]:
    fd = _open_regular(entry)
    digest = hashlib.sha256()
    kept = bytearray()
    size = 0
    try:
        while chunk := os.read(fd, 1024**2):
            digest.update(chunk)
            size += len(chunk)
            if size <= keep:
                kept.extend(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest(), bytes(kept) if size <= keep else None


def _copy_regular(entry: _Entry, target: int, *, owner: int | None) -> None:
    fd = _open_regular(entry)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(entry.name, flags, 0o600, dir_fd=target)
        try:
            while chunk := os.read(fd, 1024**2):
                os.write(out, chunk)
            os.fchmod(out, (entry.st.st_mode & 0o777) | 0o600)
            if owner is not None:
                os.fchown(out, owner, owner)
        finally:
            os.close(out)
    finally:
        os.close(fd)

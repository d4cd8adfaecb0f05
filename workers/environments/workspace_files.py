"""File trees of workspace tasks: stored as JSON, written to disk, read back from what a
harness left, copied for the verifier, and compared.

A tree is ``{relative path: spec}`` where a spec is ``{"text": str}`` (UTF-8 text) or
``{"base64": str}`` (anything else), with ``"executable": true`` for a file whose mode has the
execute bit. Paths use ``/``, are relative, and have no ``.``/``..`` parts. Tasks keep their
starting files and their tests this way in the database (workers share no disk with the web
process); the worker writes them out for each rollout.

What a harness leaves in its workspace is hostile input: everything here that reads a
workspace after a rollout works from ``lstat`` and never follows a symbolic link (a link is
recorded as a link, with its target as text), opens regular files with ``O_NOFOLLOW``, skips
FIFOs, sockets and devices instead of opening them (a FIFO would block the worker), and stops
at a bound on files and bytes. Every sandbox that wrote into the tree is dead before it is read,
so nothing changes it underneath.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
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


class TreeError(ValueError):
    """A tree is malformed or over its bounds; the message names the path and the rule."""


class WorkspaceTooLarge(Exception):
    """What a harness left in its workspace is over the limits (files or bytes)."""


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
    for entry, relative in _walk(root):
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            continue
        if stat.S_ISLNK(mode):
            raise TreeError(f"{label}: {relative} is a symbolic link; only plain files are taken")
        if not stat.S_ISREG(mode):
            raise TreeError(f"{label}: {relative} is not a regular file")
        size = entry.stat(follow_symlinks=False).st_size
        total += size
        if total > MAX_TREE_BYTES or len(tree) >= MAX_TREE_FILES:
            raise TreeError(
                f"{label}: over the limit of {MAX_TREE_FILES} files or "
                f"{MAX_TREE_BYTES // 1024**2} MiB"
            )
        try:
            path_check(relative)
        except TreeError as exc:
            raise TreeError(f"{label}: {exc}") from None
        data = _read_regular(Path(entry.path), limit=size)
        tree[relative] = spec_for_bytes(data, executable=bool(mode & stat.S_IXUSR))
    return tree


# --- workspaces a harness wrote -------------------------------------------------------------


@dataclass
class Usage:
    files: int = 0
    bytes: int = 0


def tree_usage(root: Path, *, max_files: int) -> Usage:
    """Entries and bytes of a live workspace (lstat only); stops counting past ``max_files``."""
    usage = Usage()
    for entry, _relative in _walk(root):
        usage.files += 1
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        # Blocks, not the apparent size: a sparse file costs what it holds.
        usage.bytes += st.st_blocks * 512
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

    Raises WorkspaceTooLarge past ``max_files`` entries or ``max_bytes`` of regular files.
    """
    final = FinalTree()
    total = 0
    for entry, relative in _walk(root):
        if len(final.files) >= max_files:
            raise WorkspaceTooLarge(f"the workspace holds more than {max_files} files")
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            final.files[relative] = FinalFile("symlink", target=os.readlink(entry.path))
            continue
        if not stat.S_ISREG(st.st_mode):
            final.files[relative] = FinalFile("special")
            continue
        total += st.st_size
        if total > max_bytes:
            raise WorkspaceTooLarge(
                f"the workspace holds more than {max_bytes // 1024**2} MiB of files"
            )
        digest, data = _hash_regular(Path(entry.path), keep=MAX_DIFF_FILE_BYTES)
        final.files[relative] = FinalFile(
            "file",
            size=st.st_size,
            executable=bool(st.st_mode & stat.S_IXUSR),
            sha256=digest,
            data=data,
        )
    return final


def tree_copy(src: Path, dst: Path, *, owner: int | None, max_files: int, max_bytes: int) -> None:
    """Copy a workspace a harness left (``dst`` exists, empty): directories, regular files and
    symbolic links as links; FIFOs, sockets and devices are left out. With ``owner`` (a root
    worker), everything copied belongs to that uid and gid, so the sandbox that gets the copy
    may write in it."""
    count = total = 0
    for entry, relative in _walk(src):
        count += 1
        if count > max_files:
            raise WorkspaceTooLarge(f"the workspace holds more than {max_files} files")
        st = entry.stat(follow_symlinks=False)
        target = dst.joinpath(*relative.split("/"))
        if stat.S_ISDIR(st.st_mode):
            target.mkdir()
            target.chmod(0o755)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(entry.path), target)
        elif stat.S_ISREG(st.st_mode):
            total += st.st_size
            if total > max_bytes:
                raise WorkspaceTooLarge(
                    f"the workspace holds more than {max_bytes // 1024**2} MiB of files"
                )
            _copy_regular(Path(entry.path), target, mode=st.st_mode & 0o777)
        else:
            continue
        if owner is not None:
            os.lchown(target, owner, owner)
    if owner is not None:
        os.lchown(dst, owner, owner)


def tree_chown(root: Path, owner: int) -> None:
    """Give a freshly written tree (and its root) to ``owner`` (a root worker's sandbox uid)."""
    os.lchown(root, owner, owner)
    for entry, _relative in _walk(root):
        os.lchown(entry.path, owner, owner)


def tree_changes(
    start: Mapping[str, Mapping[str, Any]], root: Path, *, max_files: int, max_bytes: int
) -> dict[str, bytes | None]:
    """What a workspace holds that its starting tree did not: ``{path: new bytes}``, and
    ``{path: None}`` for a file it removed. A link or a special file left there raises
    TreeError (what is proposed is plain files); past the bounds, WorkspaceTooLarge."""
    final: dict[str, bytes] = {}
    total = 0
    for entry, relative in _walk(root):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            continue
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise TreeError(f"{relative} is {kind}; only plain files can be proposed")
        total += st.st_size
        if len(final) >= max_files or total > max_bytes:
            raise WorkspaceTooLarge(
                f"the workspace holds more than {max_files} files or "
                f"{max_bytes // 1024**2} MiB of files"
            )
        final[relative] = _read_regular(Path(entry.path), limit=st.st_size)
    changes: dict[str, bytes | None] = {path: None for path in start if path not in final}
    for path, data in final.items():
        if path not in start or spec_bytes(start[path]) != data:
            changes[path] = data
    return changes


# --- diffs ----------------------------------------------------------------------------------


def tree_diff(
    start: Mapping[str, Mapping[str, Any]], final: FinalTree, *, max_chars: int = MAX_DIFF_CHARS
) -> dict[str, Any]:
    """The workspace's final state against its starting files, as the trace keeps it.

    ``{"files": [{"path", "status", "diff"?, "note"?}], "added", "modified", "deleted",
    "truncated"}``: status is ``added``, ``modified`` or ``deleted``; ``diff`` is a unified
    diff of a text file; ``note`` says why there is none (binary, large, a link, a special
    file, the diff's size bound reached). Every changed path is listed, also past the bound.
    """
    rows: list[dict[str, Any]] = []
    used = 0
    truncated = False
    counts = {"added": 0, "modified": 0, "deleted": 0}
    for path in sorted(set(start) | set(final.files)):
        before = start.get(path)
        after = final.files.get(path)
        old = spec_bytes(before) if before is not None else None
        if after is None:
            status = "deleted"
        elif before is None:
            status = "added"
        elif (
            after.kind == "file"
            and after.sha256 == hashlib.sha256(old or b"").hexdigest()
            and after.executable == bool(before.get("executable"))
        ):
            continue
        else:
            status = "modified"
        counts[status] += 1
        row: dict[str, Any] = {"path": path, "status": status}
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


def _walk(root: Path) -> Iterator[tuple[os.DirEntry[str], str]]:
    """Every entry under ``root``, depth first, sorted, without following links."""
    stack: list[tuple[str, str]] = [(str(root), "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            relative = f"{prefix}{entry.name}"
            yield entry, relative
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, relative + "/"))


def _open_regular(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)


def _read_regular(path: Path, *, limit: int) -> bytes:
    fd = _open_regular(path)
    try:
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1024**2))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _hash_regular(path: Path, *, keep: int) -> tuple[str, bytes | None]:
    fd = _open_regular(path)
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


def _copy_regular(source: Path, target: Path, *, mode: int) -> None:
    fd = _open_regular(source)
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode | 0o600)
        try:
            while chunk := os.read(fd, 1024**2):
                os.write(out, chunk)
        finally:
            os.close(out)
    finally:
        os.close(fd)

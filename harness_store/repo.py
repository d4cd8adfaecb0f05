"""A project's harness repository: a bare git repository managed with GitPython.

This module is the only place in coevo that touches git. Every candidate is a commit; each
commit coevo creates or imports is kept reachable by a ref under ``refs/coevo/candidates/`` so
that ``git gc`` never drops it and ``git fsck`` reports nothing dangling.

Writers take an exclusive lock per repository (an ``flock`` on a file beside it, so it holds
across threads and processes on the same machine), and each import stages through its own
temporary index file, so two imports at the same time neither corrupt the repository nor lose
a commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import subprocess
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import git

from coevo.errors import HarnessStoreError, InvalidBundle, MissingPrerequisites, NotFound
from harness_store.diffs import NAME_ERRORS, DiffTooLarge, DiffUnreadable, FilePatch, diff_parse

CANDIDATE_REF_PREFIX = "refs/coevo/candidates/"
# Where a bundle's refs land while its commits are checked and indexed; deleted afterwards.
QUARANTINE_REF_PREFIX = "refs/coevo/quarantine/"
# Temporary names for the tips of bundles coevo writes (a bundle records refs, not bare SHAs).
EXPORT_REF_PREFIX = "refs/coevo/export/"
TAG_PREFIX = "refs/tags/"
# Never part of a harness: byte-code and the user's own git metadata.
_IGNORED = "__pycache__/\n*.pyc\n*.pyo\n.git\n.DS_Store\n"
_MAX_FILE_BYTES = 5 * 1024 * 1024
# What a diff may hold by default (the web pages read it whole) and how long git may take
# to write it: a candidate's file can be tens of megabytes, and so can its diff.
DEFAULT_MAX_DIFF_BYTES = 5 * 1024 * 1024
DEFAULT_GIT_TIMEOUT_S = 30.0
# Options every diff is made with, whatever the server's git configuration says: the reader in
# harness_store.diffs expects exactly this format (a/ b/ prefixes, C-quoted names, a space before
# empty context lines, no colour, no drivers that rewrite content, submodules as one line).
_DIFF_CONFIG = ("-c", "core.quotePath=true", "-c", "diff.suppressBlankEmpty=false")
_DIFF_OPTIONS = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--find-renames",
    "--submodule=short",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    tree_sha: str
    parents: tuple[str, ...]
    message: str
    author_name: str
    author_email: str
    authored_at: datetime


@dataclass(frozen=True)
class BundleHeader:
    """What a bundle says about itself: the commits it needs and the refs it carries."""

    prerequisites: tuple[str, ...]
    refs: tuple[tuple[str, str], ...]  # (sha, refname), in the bundle's order
    pack_offset: int  # where the pack data starts, after the header's blank line


@dataclass(frozen=True)
class TreeEntry:
    path: str
    size: int
    mode: int


@dataclass(frozen=True)
class TreeSize:
    """How much a tree unpacks to: its files (blobs and submodule links, folders not counted)
    and their bytes. ``complete`` is False when counting stopped at a limit (then ``files`` or
    ``bytes`` is already above it)."""

    files: int
    bytes: int
    complete: bool


class GitTimedOut(HarnessStoreError):
    """git ran past its time limit and was stopped."""

    code = "harness_store_timeout"


class _Output:
    """git's standard output, remembering whether the reader reached its end."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.at_end = False

    def read1(self, size: int) -> bytes:
        data = self._raw.read1(size)  # type: ignore[attr-defined]
        self.at_end = self.at_end or not data
        return data


class HarnessRepo:
    """One bare repository; create it with :meth:`open_or_init`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._held = threading.local()
        self._local = threading.local()
        git.Repo(self.path)  # fail early on a path that is not a repository

    @property
    def _repo(self) -> git.Repo:
        # One git.Repo per thread: GitPython talks to long-running `git cat-file` helpers
        # without locking, so a Repo shared by threads mixes up their answers.
        repo = getattr(self._local, "repo", None)
        if repo is None:
            repo = self._local.repo = git.Repo(self.path)
        return repo

    @classmethod
    def open_or_init(cls, path: Path) -> HarnessRepo:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _flock(path.with_suffix(".lock")):
            if not (path / "HEAD").exists():
                repo = git.Repo.init(path, bare=True, initial_branch="main")
                with repo.config_writer() as config:
                    config.set_value("core", "logAllRefUpdates", "true")
                (path / "info").mkdir(exist_ok=True)
                (path / "info" / "exclude").write_text(_IGNORED)
        return cls(path)

    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """Exclusive access for writers; re-entrant within one thread."""
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth -= 1
            return
        with _flock(self.path.with_suffix(".lock")):
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0

    # --- writing ---------------------------------------------------------------------------

    def tree_of_directory(self, directory: Path) -> str:
        """Write the directory's content as git objects and return its tree SHA."""
        # Absolute: git resolves --work-tree against its own directory (the bare repository).
        directory = Path(directory).resolve()
        if not directory.is_dir():
            raise HarnessStoreError(f"{directory} is not a directory.")
        with tempfile.TemporaryDirectory(prefix="coevo-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            g = self._repo.git
            try:
                # Honours the directory's own .gitignore files and the repository's
                # info/exclude (byte-code, .git).
                g.execute(["git", f"--work-tree={directory}", "add", "--all", "--", "."], env=env)
            except git.GitCommandError as exc:
                raise HarnessStoreError(
                    f"Could not read {directory}: {exc.stderr.strip()}"
                ) from exc
            tree_sha = g.execute(["git", "write-tree"], env=env).strip()
        if tree_sha == _EMPTY_TREE:
            raise HarnessStoreError(f"{directory} holds no files to import.")
        return tree_sha

    def commit_tree(
        self,
        *,
        tree_sha: str,
        parents: Sequence[str],
        message: str,
        author_name: str,
        author_email: str,
        authored_at: datetime | None = None,
    ) -> str:
        """Create a commit for a tree and keep it reachable; return its SHA."""
        for parent in parents:
            self.commit_info(parent)  # raises NotFound for an unknown parent
        when = f"{int((authored_at or datetime.now(UTC)).timestamp())} +0000"
        env = {
            "GIT_AUTHOR_NAME": author_name,
            "GIT_AUTHOR_EMAIL": author_email,
            "GIT_AUTHOR_DATE": when,
            "GIT_COMMITTER_NAME": "coevo",
            "GIT_COMMITTER_EMAIL": "coevo@localhost",
            "GIT_COMMITTER_DATE": when,
        }
        args = ["git", "commit-tree", tree_sha, "-m", message]
        for parent in parents:
            args += ["-p", parent]
        with self.write_lock():
            sha = self._repo.git.execute(args, env=env).strip()
            self._keep(sha)
        return sha

    def commit_directory(
        self,
        directory: Path,
        *,
        parents: Sequence[str],
        message: str,
        author_name: str,
        author_email: str,
    ) -> str:
        tree_sha = self.tree_of_directory(directory)
        return self.commit_tree(
            tree_sha=tree_sha,
            parents=parents,
            message=message,
            author_name=author_name,
            author_email=author_email,
        )

    def tag(self, name: str, sha: str, *, force: bool = False) -> None:
        self.commit_info(sha)
        with self.write_lock():
            try:
                self._repo.create_tag(name, ref=sha, force=force)
            except git.GitCommandError as exc:
                raise HarnessStoreError(
                    f"Could not tag {sha[:12]} as {name!r}: {exc.stderr.strip()} "
                    "(pass force=True to move an existing tag)."
                ) from exc

    def _keep(self, sha: str) -> None:
        self._repo.git.update_ref(f"{CANDIDATE_REF_PREFIX}{sha}", sha)

    def keep_many(self, shas: Sequence[str]) -> None:
        """Keep these commits reachable, all or none (one ``update-ref`` transaction)."""
        with self.write_lock():
            self._update_refs([f"update {CANDIDATE_REF_PREFIX}{sha} {sha}" for sha in shas])

    def delete_refs(self, refs: Sequence[str]) -> None:
        with self.write_lock():
            self._update_refs([f"delete {ref}" for ref in refs])

    def _update_refs(self, commands: Sequence[str]) -> None:
        lines = "".join(f"{command}\n" for command in commands)
        if not lines:
            return
        with _stdin(lines) as stdin:
            try:
                self._repo.git.execute(["git", "update-ref", "--stdin"], istream=stdin)
            except git.GitCommandError as exc:
                raise HarnessStoreError(f"Could not update refs: {_stderr(exc)}") from exc

    # --- merging ---------------------------------------------------------------------------

    def merge_base(self, ours: str, theirs: str) -> str | None:
        """The best common ancestor of two commits (None: unrelated histories)."""
        a, b = self._commit(ours).hexsha, self._commit(theirs).hexsha
        status, out, _ = self._repo.git.execute(
            ["git", "merge-base", a, b], with_extended_output=True, with_exceptions=False
        )
        if status != 0:
            return None
        return out.strip() or None

    def merge_tree(self, ours: str, theirs: str) -> tuple[str, list[str]]:
        """A three-way merge of two commits against their merge base, with no work tree or
        index (``git merge-tree --write-tree``, git ≥ 2.38): the merged tree's SHA and the
        conflicting paths, sorted (empty when it merged cleanly). The tree's objects are
        written but nothing refers to them until a commit does."""
        a, b = self._commit(ours).hexsha, self._commit(theirs).hexsha
        status, out, err = self._repo.git.execute(
            ["git", "merge-tree", "--write-tree", "--name-only", "--no-messages", a, b],
            with_extended_output=True,
            with_exceptions=False,
        )
        # Exit status 1 is a merge with conflicts (the tree then holds conflict markers);
        # anything else is git failing (unrelated histories, a missing object).
        if status not in (0, 1):
            raise HarnessStoreError(f"Could not merge {a[:12]} and {b[:12]}: {err.strip()}")
        tree_sha, *paths = out.splitlines()
        return tree_sha.strip(), sorted({p for p in paths if p.strip()})

    def diff_to_tree(
        self,
        base_sha: str,
        tree_sha: str,
        *,
        context: int = 3,
        max_bytes: int = DEFAULT_MAX_DIFF_BYTES,
    ) -> str:
        """Unified diff from a commit to a tree (what a merge would change on its first parent);
        DiffTooLarge past ``max_bytes``."""
        base = self._commit(base_sha).hexsha
        return self._diff_text(base, tree_sha, context=context, max_bytes=max_bytes)

    # --- bundles ---------------------------------------------------------------------------

    def bundle_verify(self, path: Path) -> BundleHeader:
        """Check that ``path`` is a complete bundle this repository can apply.

        Raises InvalidBundle for a file that is not a bundle and MissingPrerequisites (with the
        SHAs) for a thin bundle whose prerequisite commits this repository lacks. The pack itself
        is checked when it is fetched (a truncated pack passes ``git bundle verify``).
        """
        header = read_bundle_header(Path(path))
        try:
            self._repo.git.execute(["git", "bundle", "verify", str(path)])
        except git.GitCommandError as exc:
            stderr = _stderr(exc)
            if "lacks these prerequisite commits" in stderr:
                listed = set(_SHA_LINE.findall(stderr))
                missing = [sha for sha in header.prerequisites if sha in listed] or sorted(listed)
                raise MissingPrerequisites(
                    f"The bundle builds on {len(missing)} commit(s) this project does not have "
                    f"({', '.join(sha[:12] for sha in missing)}). Create the bundle again without "
                    "excluding them (ask the server which commits it knows: POST candidates/known/), "
                    "or send a full bundle of the history.",
                    missing=missing,
                ) from exc
            raise InvalidBundle(
                f"The bundle cannot be applied: {stderr or 'git bundle verify failed'}. "
                "Create it again with `git bundle create FILE <ref> --not <known commits>`."
            ) from exc
        return header

    def bundle_fetch(self, path: Path, header: BundleHeader) -> tuple[str, dict[str, str]]:
        """Unpack a verified bundle's objects and point a fresh quarantine namespace at its refs.

        Every object is checked as it is unpacked (``index-pack --strict``: malformed objects
        and links to objects neither in the pack nor in the repository are refused). This is
        what ``git fetch`` from a bundle would do with ``transfer.fsckObjects``, except that git
        before 2.46 does not apply that setting to bundles, so coevo runs the check itself.
        Returns the namespace (drop it with ``delete_refs(refs_under(namespace))``) and
        ``{refname: commit SHA}``. A failure leaves no ref (the objects dangle until gc).
        """
        namespace = f"{QUARANTINE_REF_PREFIX}{uuid.uuid4().hex}/"
        names = list(dict.fromkeys(name for _, name in header.refs))
        targets = dict((name, sha) for sha, name in reversed(header.refs))
        try:
            with open(path, "rb", buffering=0) as pack:
                # The child process reads the descriptor from here on: the pack after the header.
                pack.seek(header.pack_offset)
                self._repo.git.execute(
                    ["git", "index-pack", "--stdin", "--fix-thin", "--strict"], istream=pack
                )
            self._update_refs(
                [f"create {namespace}{i} {targets[name]}" for i, name in enumerate(names)]
            )
            tips = {
                name: self._peel_commit(f"{namespace}{i}", name=name)
                for i, name in enumerate(names)
            }
        except (git.GitCommandError, HarnessStoreError, InvalidBundle) as exc:
            with contextlib.suppress(HarnessStoreError):
                self.delete_refs(self.refs_under(namespace))
            detail = _stderr(exc) if isinstance(exc, git.GitCommandError) else str(exc)
            raise InvalidBundle(
                f"The bundle is corrupt or incomplete ({detail}). Create it again with "
                "`git bundle create FILE <ref> --not <known commits>` and upload the whole file."
            ) from exc
        return namespace, tips

    def bundle_create(self, path: Path, tip_sha: str, *, exclude: Sequence[str] = ()) -> None:
        """Write a bundle of ``tip_sha`` and its ancestry, less what ``exclude`` reaches.

        A bundle records refs, not bare commits, so the tip travels as
        ``refs/coevo/export/<sha>``; import it by SHA.
        """
        sha = self._commit(tip_sha).hexsha
        excluded = [self._commit(other).hexsha for other in exclude]
        ref = f"{EXPORT_REF_PREFIX}{sha}"
        with self.write_lock():
            self._repo.git.update_ref(ref, sha)
            # Revisions on stdin: a thousand `^sha` would make a long command line.
            revisions = "".join(f"{rev}\n" for rev in [ref, *(f"^{o}" for o in excluded)])
            try:
                with _stdin(revisions) as stdin:
                    self._repo.git.execute(
                        [
                            "git",
                            "bundle",
                            "create",
                            "--quiet",
                            str(Path(path).resolve()),
                            "--stdin",
                        ],
                        istream=stdin,
                    )
            except git.GitCommandError as exc:
                raise HarnessStoreError(f"Could not create the bundle: {_stderr(exc)}") from exc
            finally:
                self._repo.git.update_ref("-d", ref)

    def refs_under(self, prefix: str) -> list[str]:
        try:
            out = self._repo.git.execute(["git", "for-each-ref", "--format=%(refname)", prefix])
        except git.GitCommandError as exc:
            raise HarnessStoreError(f"Could not list refs: {_stderr(exc)}") from exc
        return out.split()

    def refs_containing(self, sha: str, prefix: str) -> list[str]:
        """The refs under ``prefix`` from which commit ``sha`` is reachable."""
        try:
            out = self._repo.git.execute(
                ["git", "for-each-ref", "--format=%(refname)", f"--contains={sha}", prefix]
            )
        except git.GitCommandError:
            return []  # not a commit here
        return out.split()

    def rev_list(
        self, sha: str, *, exclude_prefixes: Sequence[str] = ()
    ) -> list[tuple[str, tuple[str, ...]]]:
        """``sha`` and its ancestors, oldest first (parents before children), with parents.

        Ancestors reachable from any ref under ``exclude_prefixes`` are left out.
        """
        args = ["git", "rev-list", "--topo-order", "--reverse", "--parents", sha]
        if exclude_prefixes:
            args += ["--not", *(f"--glob={prefix}*" for prefix in exclude_prefixes)]
        try:
            out = self._repo.git.execute(args)
        except git.GitCommandError as exc:
            raise HarnessStoreError(
                f"Could not walk the history of {sha[:12]}: {_stderr(exc)}"
            ) from exc
        rows = []
        for line in out.splitlines():
            commit, *parents = line.split()
            rows.append((commit, tuple(parents)))
        return rows

    def _peel_commit(self, rev: str, *, name: str) -> str:
        try:
            return self._repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}").strip()
        except git.GitCommandError:
            raise InvalidBundle(f"the bundle's ref {name} does not point to a commit") from None

    # --- reading ---------------------------------------------------------------------------

    def commit_info(self, sha: str) -> CommitInfo:
        commit = self._commit(sha)
        return CommitInfo(
            sha=commit.hexsha,
            tree_sha=commit.tree.hexsha,
            parents=tuple(p.hexsha for p in commit.parents),
            message=commit.message,
            author_name=commit.author.name or "",
            author_email=commit.author.email or "",
            authored_at=commit.authored_datetime,
        )

    def list_tree(self, sha: str) -> list[TreeEntry]:
        tree = self._commit(sha).tree
        entries = [
            TreeEntry(path=blob.path, size=blob.size, mode=blob.mode)
            for blob in tree.traverse()
            if blob.type == "blob"
        ]
        return sorted(entries, key=lambda e: e.path)

    def read_file(self, sha: str, path: str) -> bytes:
        tree = self._commit(sha).tree
        try:
            blob = tree / path
        except KeyError:
            raise NotFound(f"No file {path!r} in candidate {sha[:12]}.") from None
        if blob.type != "blob":
            raise NotFound(f"{path!r} is a folder in candidate {sha[:12]}, not a file.")
        if blob.size > _MAX_FILE_BYTES:
            raise HarnessStoreError(
                f"{path!r} is {blob.size} bytes, above the {_MAX_FILE_BYTES} limit."
            )
        return blob.data_stream.read()

    def diff(
        self,
        base_sha: str | None,
        head_sha: str,
        *,
        context: int = 3,
        max_bytes: int = DEFAULT_MAX_DIFF_BYTES,
    ) -> str:
        """Unified diff from base to head (base None: against the empty tree).

        Raises DiffTooLarge when git's output passes ``max_bytes``: git is stopped there, so a
        diff of a huge file never sits whole in the caller's memory.
        """
        base, head = self._diff_ends(base_sha, head_sha)
        return self._diff_text(base, head, context=context, max_bytes=max_bytes)

    def diff_files(
        self,
        base_sha: str | None,
        head_sha: str,
        *,
        context: int = 3,
        max_bytes: int = DEFAULT_MAX_DIFF_BYTES,
    ) -> list[FilePatch]:
        """The diff from base to head, one part per file, checked against git's own list of
        the changed files: DiffUnreadable when a file git lists is not in the parts (a reader
        must never be shown fewer files than changed), DiffTooLarge as :meth:`diff`."""
        base, head = self._diff_ends(base_sha, head_sha)
        parts = diff_parse(self._diff_output(base, head, context=context, max_bytes=max_bytes))
        listed = set(self._diff_names(base, head))
        shown = {name for part in parts for name in (part.old_path, part.new_path) if name}
        if listed != shown:
            missing = sorted(listed - shown) or sorted(shown - listed)
            raise DiffUnreadable(
                f"The diff does not account for {', '.join(repr(n) for n in missing[:5])}; it is "
                "not shown rather than shown without some of its files."
            )
        return parts

    def diff_names(self, base_sha: str | None, head_sha: str) -> list[str]:
        """Every path the diff from base to head touches (both names of a rename), unquoted.

        Git's NUL-separated list, which holds any name as it is (tabs, newlines, quotes).
        """
        return self._diff_names(*self._diff_ends(base_sha, head_sha))

    def _diff_names(self, base: str, head: str) -> list[str]:
        out, complete = self._git_bounded(
            [*_DIFF_CONFIG, "diff", "--name-status", "-z", *_DIFF_OPTIONS, base, head, "--"],
            max_bytes=DEFAULT_MAX_DIFF_BYTES,
        )
        if not complete:
            raise DiffTooLarge(
                f"The list of changed files is longer than {DEFAULT_MAX_DIFF_BYTES} bytes; "
                "compare candidates that are closer to each other."
            )
        fields = out.split(b"\0")
        if fields and fields[-1] == b"":
            fields.pop()
        names: list[str] = []
        i = 0
        while i < len(fields):
            # "M\0path", or "R086\0old\0new" for a rename or copy.
            status, count = fields[i], 2 if fields[i][:1] in (b"R", b"C") else 1
            if not status or i + count >= len(fields):
                raise DiffUnreadable("git's list of changed files is cut short.")
            names += [name.decode("utf-8", NAME_ERRORS) for name in fields[i + 1 : i + 1 + count]]
            i += 1 + count
        return names

    def _diff_text(self, base: str, head: str, *, context: int, max_bytes: int) -> str:
        # As GitPython returned it before: one trailing newline dropped; bytes that are not UTF-8
        # (a Latin-1 file) shown as U+FFFD rather than failing the page or the JSON encoder.
        output = self._diff_output(base, head, context=context, max_bytes=max_bytes)
        return output.removesuffix(b"\n").decode("utf-8", "replace")

    def _diff_ends(self, base_sha: str | None, head_sha: str) -> tuple[str, str]:
        head = self._commit(head_sha).hexsha
        base = self._commit(base_sha).hexsha if base_sha else _EMPTY_TREE
        return base, head

    def _diff_output(self, base: str, head: str, *, context: int, max_bytes: int) -> bytes:
        args = [*_DIFF_CONFIG, "diff", f"-U{int(context)}", *_DIFF_OPTIONS, base, head, "--"]
        try:
            out, complete = self._git_bounded(args, max_bytes=max_bytes)
        except GitTimedOut:
            raise DiffTooLarge(
                f"git took more than {DEFAULT_GIT_TIMEOUT_S:.0f} s to write this diff: it is too "
                "large to show. Compare candidates that are closer to each other, or read the "
                "changed files one by one."
            ) from None
        if not complete:
            raise DiffTooLarge(
                f"The diff is larger than {max_bytes} bytes: too large to show. Compare "
                "candidates that are closer to each other, or read the changed files one by one."
            )
        return out

    def tree_size(self, tree_sha: str, *, max_files: int, max_bytes: int) -> TreeSize:
        """Count a tree's files and bytes, stopping as soon as either passes its limit (a tree
        of millions of entries is never listed whole)."""
        files = size = 0
        pending = b""
        # "<mode> <type> <sha> <size>\t<path>\0" per file; size is "-" for a submodule link.
        with self._git_stream(["ls-tree", "-r", "-l", "-z", "--full-tree", tree_sha]) as out:
            while chunk := out.read1(_CHUNK):
                pending += chunk
                *records, pending = pending.split(b"\0")
                for record in records:
                    meta = record.split(b"\t", 1)[0].split()
                    files += 1
                    size += int(meta[3]) if len(meta) == 4 and meta[3].isdigit() else 0
                    if files > max_files or size > max_bytes:
                        return TreeSize(files=files, bytes=size, complete=False)
                if len(pending) > _MAX_LISTED_PATH:
                    raise HarnessStoreError(
                        f"Tree {tree_sha[:12]} holds a path longer than {_MAX_LISTED_PATH} bytes."
                    )
        return TreeSize(files=files, bytes=size, complete=True)

    def _git_bounded(self, args: Sequence[str], *, max_bytes: int) -> tuple[bytes, bool]:
        """``(git's output, True)``, or ``(b"", False)`` once it passes ``max_bytes``."""
        chunks: list[bytes] = []
        total = 0
        with self._git_stream(args) as out:
            # In chunks: read(n) on a pipe sets aside n bytes before git has written any.
            while total <= max_bytes and (chunk := out.read1(_CHUNK)):
                chunks.append(chunk)
                total += len(chunk)
        if total > max_bytes:
            return b"", False  # the caller refuses it: no copy of what was read
        return b"".join(chunks), True

    @contextlib.contextmanager
    def _git_stream(
        self, args: Sequence[str], *, timeout_s: float = DEFAULT_GIT_TIMEOUT_S
    ) -> Iterator[_Output]:
        """Run ``git ARGS`` with its output as a stream the caller reads as far as it needs.

        git is stopped when the block ends before its output does, and at ``timeout_s``
        (GitTimedOut). Once read to the end, a failure of git raises HarnessStoreError with
        what it said. (GitPython's execute reads the whole output into memory first.)
        """
        expired = threading.Event()
        with tempfile.TemporaryFile() as stderr:
            process = subprocess.Popen(
                ["git", f"--git-dir={self.path}", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "LC_ALL": "C", "LANGUAGE": "C"},
            )
            assert process.stdout is not None  # noqa: S101 - stdout=PIPE

            def expire() -> None:
                expired.set()
                process.kill()

            timer = threading.Timer(timeout_s, expire)
            timer.daemon = True
            timer.start()
            out = _Output(process.stdout)
            try:
                yield out
            finally:
                if not out.at_end:
                    process.kill()
                process.stdout.close()
                status = process.wait()  # after the end of output, the timer still bounds it
                timer.cancel()
            if expired.is_set():
                raise GitTimedOut(f"git ran for more than {timeout_s:.0f} s and was stopped.")
            if out.at_end and status != 0:
                stderr.seek(0)
                said = " ".join(stderr.read(2000).decode(errors="replace").split())
                raise HarnessStoreError(f"git failed: {said or f'exit status {status}'}")

    def log(self, sha: str, *, max_count: int = 100) -> list[CommitInfo]:
        return [
            self.commit_info(commit.hexsha)
            for commit in self._repo.iter_commits(self._commit(sha).hexsha, max_count=max_count)
        ]

    def archive(self, sha: str) -> bytes:
        """The candidate's files as a gzipped tar (what workers receive)."""
        return self.archive_tree(self._commit(sha).hexsha)

    def archive_tree(self, treeish: str) -> bytes:
        """A tree's files as a gzipped tar: a commit's (:meth:`archive`, which checks the SHA)
        or a bare tree's (a merge result checked before it is committed)."""
        data = io.BytesIO()
        self._repo.archive(data, treeish=treeish, format="tar.gz")
        return data.getvalue()

    def export_tree(self, sha: str, destination: Path) -> None:
        """Write the candidate's files into ``destination`` (which must exist and be empty)."""
        extract_archive(self.archive(sha), destination)

    def fsck(self) -> str:
        return self._repo.git.fsck("--full", "--strict")

    def _commit(self, sha: str | None) -> git.Commit:
        if not sha or not _looks_like_sha(sha):
            raise NotFound(f"{sha!r} is not a commit SHA.")
        try:
            obj = self._repo.commit(sha)
            obj.tree  # noqa: B018 - GitPython makes placeholder commits (e.g. 000…0) lazily
        except (ValueError, git.BadName, git.BadObject):
            raise NotFound(f"No commit {sha} in this harness repository.") from None
        return obj


_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_CHUNK = 64 * 1024
_MAX_LISTED_PATH = 64 * 1024


def extract_archive(data: bytes, destination: Path) -> None:
    """Unpack an :meth:`HarnessRepo.archive` (refusing links and paths out of ``destination``)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        archive.extractall(destination, filter="data")


_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")
_SHA_LINE = re.compile(r"\b([0-9a-f]{40})\b")
_MAX_BUNDLE_HEADER = 1024 * 1024


def read_bundle_header(path: Path) -> BundleHeader:
    """Parse a bundle's text header (format v2 or v3) without touching any repository."""
    not_a_bundle = InvalidBundle(
        "This is not a git bundle. Create one with `git bundle create FILE <ref> --not "
        "<commits the server knows>` and upload that file."
    )
    with open(path, "rb") as handle:
        head = handle.read(_MAX_BUNDLE_HEADER)
    if not head.startswith(_BUNDLE_SIGNATURES):
        raise not_a_bundle
    end = head.find(b"\n\n")
    if end < 0:
        raise not_a_bundle
    try:
        lines = head[: end + 1].decode("ascii").splitlines()[1:]
    except UnicodeDecodeError:
        raise not_a_bundle from None
    prerequisites: list[str] = []
    refs: list[tuple[str, str]] = []
    for line in lines:
        if line.startswith("@"):
            capability = line[1:]
            if capability.startswith("filter="):
                raise InvalidBundle(
                    "This is a partial (filtered) bundle, which lacks file contents. "
                    "Create it without --filter."
                )
            if capability.startswith("object-format=") and capability != "object-format=sha1":
                raise InvalidBundle("Only SHA-1 repositories are supported.")
            continue
        if line.startswith("-"):
            sha = line[1:].split(" ", 1)[0]
            if not _FULL_SHA.fullmatch(sha):
                raise not_a_bundle
            prerequisites.append(sha)
            continue
        sha, _, name = line.partition(" ")
        if not _FULL_SHA.fullmatch(sha) or not _REF_NAME.fullmatch(name):
            raise InvalidBundle(f"The bundle names an unusable ref {name!r}: {not_a_bundle}")
        refs.append((sha, name))
    if not refs:
        raise InvalidBundle("The bundle carries no refs; name a branch or HEAD when creating it.")
    return BundleHeader(prerequisites=tuple(prerequisites), refs=tuple(refs), pack_offset=end + 2)


_FULL_SHA = re.compile(r"[0-9a-f]{40}")
# Ref names come from the upload and reach git's command line and users' screens: only plain
# names, nothing git could read as an option, a refspec or a pattern.
_REF_NAME = re.compile(r"HEAD|refs/[A-Za-z0-9._/+@-]+")


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[IO[bytes]]:
    # GitPython hands istream to Popen as stdin, which needs a real file descriptor.
    with tempfile.TemporaryFile() as handle:
        handle.write(text.encode())
        handle.seek(0)
        yield handle


def _stderr(exc: git.GitCommandError) -> str:
    stderr = exc.stderr
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    text = (stderr or "").strip()
    # GitPython wraps stderr as "\n  stderr: '...'"; keep what git said.
    if text.startswith("stderr:"):
        text = text[len("stderr:") :].strip().strip("'")
    return " ".join(text.split())


def _looks_like_sha(value: str) -> bool:
    return 4 <= len(value) <= 40 and all(c in "0123456789abcdef" for c in value.lower())


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

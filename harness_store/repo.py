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
import tarfile
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import git

from coevo.errors import HarnessStoreError, NotFound

CANDIDATE_REF_PREFIX = "refs/coevo/candidates/"
TAG_PREFIX = "refs/tags/"
# Never part of a harness: byte-code and the user's own git metadata.
_IGNORED = "__pycache__/\n*.pyc\n*.pyo\n.git\n.DS_Store\n"
_MAX_FILE_BYTES = 5 * 1024 * 1024


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
class TreeEntry:
    path: str
    size: int
    mode: int


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

    def diff(self, base_sha: str | None, head_sha: str, *, context: int = 3) -> str:
        """Unified diff from base to head (base None: against the empty tree)."""
        head = self._commit(head_sha).hexsha
        base = self._commit(base_sha).hexsha if base_sha else _EMPTY_TREE
        return self._repo.git.diff(base, head, f"-U{context}", "--no-color", "--no-ext-diff")

    def log(self, sha: str, *, max_count: int = 100) -> list[CommitInfo]:
        return [
            self.commit_info(commit.hexsha)
            for commit in self._repo.iter_commits(self._commit(sha).hexsha, max_count=max_count)
        ]

    def archive(self, sha: str) -> bytes:
        """The candidate's files as a gzipped tar (what workers receive)."""
        data = io.BytesIO()
        self._repo.archive(data, treeish=self._commit(sha).hexsha, format="tar.gz")
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


def extract_archive(data: bytes, destination: Path) -> None:
    """Unpack an :meth:`HarnessRepo.archive` (refusing links and paths out of ``destination``)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        archive.extractall(destination, filter="data")


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

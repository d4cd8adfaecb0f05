"""A project's harness repository: a bare git repository managed with GitPython.

This module and the parts of its class (``repo_base``: the primitives, ``repo_bundles``,
``repo_diffs``) are the only place in coevo that touches git. Every candidate is a commit; each
commit coevo creates or imports is kept reachable by a ref under ``refs/coevo/candidates/`` so
that ``git gc`` never drops it and ``git fsck`` reports nothing dangling.

Writers take an exclusive lock per repository (an ``flock`` on a file beside it, so it holds
across threads and processes on the same machine), and each import stages through its own
temporary index file, so two imports at the same time neither corrupt the repository nor lose
a commit.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import git

from coevo.errors import HarnessStoreError, NotFound
from harness_store.repo_base import CANDIDATE_REF_PREFIX, CHUNK, EMPTY_TREE, flock, git_stderr
from harness_store.repo_bundles import BundleMethods
from harness_store.repo_diffs import DiffMethods
from harness_store.repo_fast_import import FastImportMethods

# Never part of a harness: byte-code and the user's own git metadata.
_IGNORED = "__pycache__/\n*.pyc\n*.pyo\n.git\n.DS_Store\n"
_MAX_FILE_BYTES = 5 * 1024 * 1024
_MAX_LISTED_PATH = 64 * 1024


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


@dataclass(frozen=True)
class TreeSize:
    """How much a tree unpacks to: its files (blobs and submodule links, folders not counted)
    and their bytes. ``complete`` is False when counting stopped at a limit (then ``files`` or
    ``bytes`` is already above it)."""

    files: int
    bytes: int
    complete: bool


class HarnessRepo(BundleMethods, DiffMethods, FastImportMethods):
    """One bare repository; create it with :meth:`open_or_init`. Its bundle, diff and bulk
    import methods live in harness_store.repo_bundles, repo_diffs and repo_fast_import, the
    primitives they share in harness_store.repo_base."""

    @classmethod
    def open_or_init(cls, path: Path) -> HarnessRepo:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with flock(path.with_suffix(".lock")):
            if not (path / "HEAD").exists():
                repo = git.Repo.init(path, bare=True, initial_branch="main")
                with repo.config_writer() as config:
                    config.set_value("core", "logAllRefUpdates", "true")
                (path / "info").mkdir(exist_ok=True)
                (path / "info" / "exclude").write_text(_IGNORED)
        return cls(path)

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
        if tree_sha == EMPTY_TREE:
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

    # --- history ---------------------------------------------------------------------------

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
                f"Could not walk the history of {sha[:12]}: {git_stderr(exc)}"
            ) from exc
        rows = []
        for line in out.splitlines():
            commit, *parents = line.split()
            rows.append((commit, tuple(parents)))
        return rows

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

    def tree_size(self, tree_sha: str, *, max_files: int, max_bytes: int) -> TreeSize:
        """Count a tree's files and bytes, stopping as soon as either passes its limit (a tree
        of millions of entries is never listed whole)."""
        files = size = 0
        pending = b""
        # "<mode> <type> <sha> <size>\t<path>\0" per file; size is "-" for a submodule link.
        with self._git_stream(["ls-tree", "-r", "-l", "-z", "--full-tree", tree_sha]) as out:
            while chunk := out.read1(CHUNK):
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


def extract_archive(data: bytes, destination: Path) -> None:
    """Unpack an :meth:`HarnessRepo.archive` (refusing links and paths out of ``destination``)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        archive.extractall(destination, filter="data")

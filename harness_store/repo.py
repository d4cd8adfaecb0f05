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

CANDIDATE_REF_PREFIX = "refs/coevo/candidates/"
# Where a bundle's refs land while its commits are checked and indexed; deleted afterwards.
QUARANTINE_REF_PREFIX = "refs/coevo/quarantine/"
# Temporary names for the tips of bundles coevo writes (a bundle records refs, not bare SHAs).
EXPORT_REF_PREFIX = "refs/coevo/export/"
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

    def archive_tree(self, tree_sha: str) -> bytes:
        """A tree's files as a gzipped tar (a merge result checked before it is committed)."""
        data = io.BytesIO()
        self._repo.archive(data, treeish=tree_sha, format="tar.gz")
        return data.getvalue()

    def diff_to_tree(self, base_sha: str, tree_sha: str, *, context: int = 3) -> str:
        """Unified diff from a commit to a tree (what a merge would change on its first parent)."""
        base = self._commit(base_sha).hexsha
        return self._repo.git.diff(base, tree_sha, f"-U{context}", "--no-color", "--no-ext-diff")

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

"""What every part of :class:`harness_store.repo.HarnessRepo` builds on: the bare repository
(one GitPython ``Repo`` per thread), the per-repository write lock, ref updates, commit lookup,
and running ``git`` with its output streamed and bounded in size and time."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import git

from coevo.errors import HarnessStoreError, NotFound

# How long git may take to write an answer: a candidate's file can be tens of megabytes, and
# so can its diff.
DEFAULT_GIT_TIMEOUT_S = 30.0
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
# Every commit coevo keeps has a ref here, so that ``git gc`` never drops it.
CANDIDATE_REF_PREFIX = "refs/coevo/candidates/"
CHUNK = 64 * 1024


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


class RepoBase:
    """The primitives of one bare repository; use :class:`harness_store.repo.HarnessRepo`,
    which adds the rest."""

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
        with flock(self.path.with_suffix(".lock")):
            self._held.depth = 1
            try:
                yield
            finally:
                self._held.depth = 0

    def delete_refs(self, refs: Sequence[str]) -> None:
        with self.write_lock():
            self._update_refs([f"delete {ref}" for ref in refs])

    def _update_refs(self, commands: Sequence[str]) -> None:
        lines = "".join(f"{command}\n" for command in commands)
        if not lines:
            return
        with stdin_file(lines) as stdin:
            try:
                self._repo.git.execute(["git", "update-ref", "--stdin"], istream=stdin)
            except git.GitCommandError as exc:
                raise HarnessStoreError(f"Could not update refs: {git_stderr(exc)}") from exc

    def refs_under(self, prefix: str) -> list[str]:
        try:
            out = self._repo.git.execute(["git", "for-each-ref", "--format=%(refname)", prefix])
        except git.GitCommandError as exc:
            raise HarnessStoreError(f"Could not list refs: {git_stderr(exc)}") from exc
        return out.split()

    def _commit(self, sha: str | None) -> git.Commit:
        if not sha or not _looks_like_sha(sha):
            raise NotFound(f"{sha!r} is not a commit SHA.")
        try:
            obj = self._repo.commit(sha)
            obj.tree  # noqa: B018 - GitPython makes placeholder commits (e.g. 000…0) lazily
        except (ValueError, git.BadName, git.BadObject):
            raise NotFound(f"No commit {sha} in this harness repository.") from None
        return obj

    def _git_bounded(self, args: Sequence[str], *, max_bytes: int) -> tuple[bytes, bool]:
        """``(git's output, True)``, or ``(b"", False)`` once it passes ``max_bytes``."""
        chunks: list[bytes] = []
        total = 0
        with self._git_stream(args) as out:
            # In chunks: read(n) on a pipe sets aside n bytes before git has written any.
            while total <= max_bytes and (chunk := out.read1(CHUNK)):
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


@contextlib.contextmanager
def stdin_file(text: str) -> Iterator[IO[bytes]]:
    # GitPython hands istream to Popen as stdin, which needs a real file descriptor.
    with tempfile.TemporaryFile() as handle:
        handle.write(text.encode())
        handle.seek(0)
        yield handle


def git_stderr(exc: git.GitCommandError) -> str:
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
def flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

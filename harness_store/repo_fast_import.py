"""Many commits at once through ``git fast-import``: what lets a scale fill (benchmarks/scale)
write ten thousand real candidate commits in seconds instead of one ``commit-tree`` process
each. The commits are ordinary commits: each is kept under ``refs/coevo/candidates/`` like any
other, so diffs, lineage and ``git fsck`` see nothing special."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from coevo.errors import HarnessStoreError
from harness_store.repo_base import CANDIDATE_REF_PREFIX, RepoBase, stdin_file

# Where fast-import builds its branch while commits stream in; deleted once they are kept.
FAST_IMPORT_REF = "refs/coevo/import/fast"
# A large import (10,000 commits, a few files each) takes seconds; an hour means git is stuck.
FAST_IMPORT_TIMEOUT_S = 3600.0
# Bounds on what one call may write: the scale fill's full plan is well inside them.
FAST_IMPORT_MAX_COMMITS = 200_000
FAST_IMPORT_MAX_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class BulkCommit:
    """One commit of a bulk import. ``parents`` are positions of earlier commits in the same
    import (first parent first); ``files`` are the paths it writes, on top of its first
    parent's tree (a root commit's files are its whole tree)."""

    parents: tuple[int, ...]
    files: Mapping[str, bytes]
    message: str
    author_name: str
    author_email: str
    authored_at: datetime


class FastImportMethods(RepoBase):
    """The bulk-import part of :class:`harness_store.repo.HarnessRepo`."""

    def fast_import(self, commits: Iterable[BulkCommit]) -> list[tuple[str, str]]:
        """Write ``commits`` (streamed, never held whole) and keep each reachable; return
        ``(commit SHA, tree SHA)`` per commit, in order. All or nothing for the refs: a
        failure keeps no commit (its objects dangle until ``git gc``)."""
        with self.write_lock(), tempfile.TemporaryDirectory(prefix="coevo-fast-import-") as tmp:
            marks = Path(tmp) / "marks"
            count = self._fast_import_stream(commits, marks=marks)
            by_mark = {}
            for line in marks.read_text().splitlines():
                mark, sha = line.split()
                by_mark[int(mark[1:])] = sha
            shas = [by_mark[number] for number in range(1, count + 1)]
            trees = self._trees_of(shas)
            self._update_refs(
                [f"update {CANDIDATE_REF_PREFIX}{sha} {sha}" for sha in shas]
                + [f"delete {FAST_IMPORT_REF}"]
            )
        return [(sha, trees[sha]) for sha in shas]

    def _fast_import_stream(self, commits: Iterable[BulkCommit], *, marks: Path) -> int:
        process = subprocess.Popen(
            [
                "git",
                f"--git-dir={self.path}",
                "fast-import",
                "--quiet",
                "--done",
                f"--export-marks={marks}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "LC_ALL": "C", "LANGUAGE": "C"},
        )
        assert process.stdin is not None and process.stderr is not None  # noqa: S101 - PIPE
        timer = threading.Timer(FAST_IMPORT_TIMEOUT_S, process.kill)
        timer.daemon = True
        timer.start()
        count = 0
        try:
            for count, commit in enumerate(commits, start=1):  # noqa: B007 - count returned
                if count > FAST_IMPORT_MAX_COMMITS:
                    raise HarnessStoreError(
                        f"A bulk import takes at most {FAST_IMPORT_MAX_COMMITS} commits; "
                        "split it into several imports."
                    )
                process.stdin.write(_commit_command(count, commit))
            process.stdin.write(b"done\n")
            process.stdin.close()
            said = process.stderr.read(4000).decode(errors="replace")
            status = process.wait()
        except BrokenPipeError:
            status = process.wait()
            said = process.stderr.read(4000).decode(errors="replace")
        finally:
            timer.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
        if status != 0:
            raise HarnessStoreError(
                f"git fast-import failed after {count} commits: {' '.join(said.split())[:1000]}"
            )
        return count

    def _trees_of(self, shas: list[str]) -> dict[str, str]:
        lines = "".join(f"{sha}\n" for sha in shas)
        with stdin_file(lines) as stdin:
            out = self._repo.git.execute(
                ["git", "log", "--no-walk=unsorted", "--stdin", "--format=%H %T"], istream=stdin
            )
        return dict(line.split() for line in out.splitlines())


def _commit_command(mark: int, commit: BulkCommit) -> bytes:
    for parent in commit.parents:
        if not 0 <= parent < mark - 1:
            raise HarnessStoreError(
                f"Commit {mark - 1} of a bulk import names parent {parent}: a parent must come "
                "earlier in the same import."
            )
    when = f"{int(commit.authored_at.timestamp())} +0000"
    message = commit.message.encode()
    out = [
        f"commit {FAST_IMPORT_REF}\nmark :{mark}\n".encode(),
        f"author {_ident(commit.author_name)} <{_ident(commit.author_email)}> {when}\n".encode(),
        f"committer coevo <coevo@localhost> {when}\n".encode(),
        f"data {len(message)}\n".encode(),
        message,
        b"\n",
    ]
    if commit.parents:
        out.append(f"from :{commit.parents[0] + 1}\n".encode())
        out += [f"merge :{parent + 1}\n".encode() for parent in commit.parents[1:]]
    else:
        # A root commit: start from nothing, not from the branch's previous commit.
        out.append(b"deleteall\n")
    for path, data in commit.files.items():
        if len(data) > FAST_IMPORT_MAX_FILE_BYTES or "\n" in path or not path:
            raise HarnessStoreError(
                f"File {path!r} of a bulk commit is empty-named, holds a newline or is over "
                f"{FAST_IMPORT_MAX_FILE_BYTES} bytes."
            )
        out.append(f'M 100644 inline "{_quoted(path)}"\ndata {len(data)}\n'.encode())
        out += [data, b"\n"]
    return b"".join(out)


def _ident(value: str) -> str:
    # fast-import refuses <, > and newlines in a name or email.
    return "".join(c for c in value if c not in "<>\n") or "unknown"


def _quoted(path: str) -> str:
    return path.replace("\\", "\\\\").replace('"', '\\"')

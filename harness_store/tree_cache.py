"""Candidate trees on a worker's disk: exported once per tree, shared by the tree's rollouts.

A rollout runs its candidate's files from a read-only bind into its sandbox. Exporting them
for each rollout cost a database read and an extraction every time, and gave every rollout a
directory of its own, so a warm sandbox (workers/warm.py, one per tree) could never be reused.
Here trees are kept by git tree SHA (content-addressed: the same files whatever the project or
commit) under COEVO_HARNESS_TREE_DIR:

- a tree is extracted into a temporary directory and renamed into place, so a crash or a
  concurrent export never leaves half a tree (the loser of a race removes its copy);
- a rollout holds a shared lock on the tree while it runs (a ``<sha>.lock`` file beside it);
- past COEVO_HARNESS_TREES_MAX trees the least recently used ones that no rollout holds are
  removed (renamed away under an exclusive lock first, so none is seen half removed).

Nothing here is ever written into a tree after it is in place: the sandbox binds it read-only
and the worker only reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from harness_store.selectors import candidate_export

if TYPE_CHECKING:
    from harness_store.models import Candidate

# An export directory this old is a leftover of an interrupted export (an export takes seconds).
STALE_EXPORT_S = 3600

_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


@contextlib.contextmanager
def candidate_tree(*, candidate: Candidate) -> Iterator[Path]:
    """The candidate's files, read-only by convention, for as long as the block runs."""
    sha = candidate.tree_sha
    if not _SHA.match(sha or ""):
        raise ValueError(f"not a tree SHA: {sha!r}")
    root = Path(settings.COEVO_HARNESS_TREE_DIR)
    root.mkdir(parents=True, exist_ok=True)
    entry = root / sha
    created = False
    with open(root / f"{sha}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            if not (entry / "harness").is_dir():
                created = _export(candidate, root=root, entry=entry)
            os.utime(entry)  # recently used: pruned last
            yield entry / "harness"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if created:
        trees_prune(keep=settings.COEVO_HARNESS_TREES_MAX)


def trees_prune(*, keep: int) -> int:
    """Remove the least recently used trees beyond ``keep`` that no rollout holds; how many
    were removed. Leftovers of exports interrupted over an hour ago go too."""
    root = Path(settings.COEVO_HARNESS_TREE_DIR)
    if not root.is_dir():
        return 0
    # An export still being written is another process's (or thread's): only an old one is a
    # leftover of an interrupted export. What a prune moved aside is never in use.
    stale = time.time() - STALE_EXPORT_S
    for leftover in root.glob(".export-*"):
        with contextlib.suppress(OSError):
            if leftover.stat().st_mtime < stale:
                shutil.rmtree(leftover, ignore_errors=True)
    for leftover in root.glob(".trash-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    trees = sorted(
        (path for path in root.iterdir() if path.is_dir() and _SHA.match(path.name)),
        key=lambda path: path.stat().st_mtime,
    )
    removed = 0
    for path in trees[: max(0, len(trees) - keep)]:
        with open(root / f"{path.name}.lock", "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a rollout runs it
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=root))
            path.rename(trash / "tree")
            fcntl.flock(lock, fcntl.LOCK_UN)
        shutil.rmtree(trash, ignore_errors=True)
        removed += 1
    return removed


def _export(candidate: Candidate, *, root: Path, entry: Path) -> bool:
    """Write the tree beside its place, then rename it there; False if another process did."""
    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=root))
    try:
        (staging / "harness").mkdir()
        candidate_export(candidate=candidate, destination=staging / "harness")
        staging.chmod(0o755)
        try:
            staging.rename(entry)
        except OSError:
            return False  # another worker process put it there first
        return True
    finally:
        shutil.rmtree(staging, ignore_errors=True)

"""The user's own ``git``, run as a subprocess, for ``coevo submit``.

This runs on CI runners and laptops, so it needs nothing but the ``git`` executable (no
GitPython, no Django). Every call goes through :func:`git`, which turns a failure into a
:class:`GitError` carrying git's own message.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

# The server's `candidates/known/` takes at most this many SHAs (docs/api.md).
KNOWN_QUERY_LIMIT = 1000

_SHA_RE = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


class GitError(Exception):
    """git failed, or the repository is not in a state we can bundle from."""


def git(repo: Path | str, *args: str, stdin: str | None = None) -> str:
    """Run ``git -C repo ARGS`` and return its stdout (stripped of the final newline)."""
    env = dict(os.environ)
    # Messages are parsed only for display, but keep them in one language and never prompt.
    env.update({"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"})
    try:
        completed = subprocess.run(
            ["git", "-C", str(repo), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed (or not on PATH)") from exc
    if completed.returncode != 0:
        message = completed.stderr.strip() or completed.stdout.strip() or "no output"
        raise GitError(f"git {args[0]} failed: {message}")
    return completed.stdout.rstrip("\n")


def repo_toplevel(*, path: Path | str) -> Path:
    """The work tree root of the repository containing ``path``."""
    if not Path(path).is_dir():
        raise GitError(f"{path} is not a directory")
    try:
        return Path(git(path, "rev-parse", "--show-toplevel"))
    except GitError as exc:
        raise GitError(f"{path} is not inside a git work tree ({exc})") from exc


def commit_resolve(*, repo: Path | str, ref: str) -> str:
    """The full SHA of the commit ``ref`` names (a branch, tag, ``HEAD~2``, a SHA prefix)."""
    if ref.startswith("-"):
        raise GitError(f"{ref!r} is not a revision")
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except GitError as exc:
        raise GitError(f"{ref!r} does not name a commit in {repo}") from exc


def commit_ancestors(*, repo: Path | str, sha: str, limit: int = KNOWN_QUERY_LIMIT) -> list[str]:
    """``sha`` and its ancestors, newest first, at most ``limit`` (what `known/` is asked)."""
    output = git(repo, "rev-list", f"--max-count={limit}", sha)
    return [line for line in output.splitlines() if line]


def worktree_is_dirty(*, repo: Path | str) -> bool:
    """Whether tracked files have uncommitted changes (untracked files are build noise here)."""
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no"))


def repo_is_shallow(*, repo: Path | str) -> bool:
    return git(repo, "rev-parse", "--is-shallow-repository") == "true"


def bundle_create(*, repo: Path | str, sha: str, exclude: list[str], output: Path | str) -> Path:
    """Write a bundle holding ``sha`` and its ancestors, minus ``exclude`` and their ancestors.

    ``git bundle create`` refuses a bare SHA (it bundles refs), so the commit gets a temporary
    ref under ``refs/coevo-submit/`` that is deleted afterwards whatever happens. The ref name
    carries a random part so two submits of one commit from one repository cannot delete each
    other's ref mid-bundle. ``exclude`` must name commits present locally (they come from
    :func:`commit_ancestors`); the resulting "thin" bundle lists them as prerequisites.
    """
    if not _SHA_RE.match(sha):
        raise GitError(f"{sha!r} is not a full commit SHA")
    temporary_ref = f"refs/coevo-submit/{sha}-{uuid.uuid4().hex[:8]}"
    output = Path(output)
    git(repo, "update-ref", temporary_ref, sha)
    try:
        # Revisions on stdin: up to a thousand `^sha` would make a long command line.
        revisions = "\n".join([temporary_ref, *(f"^{known}" for known in exclude)]) + "\n"
        git(repo, "bundle", "create", str(output), "--stdin", stdin=revisions)
    finally:
        git(repo, "update-ref", "-d", temporary_ref)
    return output

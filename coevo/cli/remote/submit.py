"""``coevo submit``: bundle a commit of a local repository (only the commits the server lacks)
and import it as a candidate, keeping its SHA."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from coevo.cli import gitlocal
from coevo.cli.client import ApiError, Client, add_connection_arguments
from coevo.cli.remote.common import (
    EXIT_FAIL,
    EXIT_OK,
    human_size,
    note,
    print_error,
    print_json,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "submit",
        help="import a commit of a local harness repository as a candidate",
        description=(
            "Bundle a commit of the git repository at PATH (only the commits the server lacks)"
            " and import it as a candidate. Prints the SHA and the candidate's dashboard URL."
        ),
    )
    parser.add_argument("path", nargs="?", default=".", help="repository (default: .)")
    parser.add_argument("--ref", default="HEAD", help="the commit to submit (default: HEAD)")
    parser.add_argument("--json", action="store_true", help="print the candidate as JSON")
    add_connection_arguments(parser)
    parser.set_defaults(handler=submit)


def submit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        with Client.from_args(args) as client:
            candidate = candidate_submit(client=client, path=Path(args.path), ref=args.ref)
    except (ApiError, gitlocal.GitError) as exc:
        print_error(exc)
        return EXIT_FAIL
    if args.json:
        print_json(candidate)
    else:
        print(candidate["sha"])
        if candidate.get("dashboard_url"):
            print(candidate["dashboard_url"])
    return EXIT_OK


def candidate_submit(*, client: Client, path: Path, ref: str) -> dict[str, Any]:
    """Import ``ref`` of the repository at ``path``; return the API's candidate object."""
    repo = gitlocal.repo_toplevel(path=path)
    sha = gitlocal.commit_resolve(repo=repo, ref=ref)
    if gitlocal.worktree_is_dirty(repo=repo):
        note(
            "warning: the work tree has uncommitted changes; they are not submitted"
            f" (the bundle holds commit {sha[:12]}, not the work tree)"
        )
    ancestors = gitlocal.commit_ancestors(repo=repo, sha=sha)
    known_reply = client.post(client.project_url("candidates/known/"), json={"shas": ancestors})
    # Only what we asked about: anything else could not be excluded from a bundle anyway.
    asked = set(ancestors)
    known = [s for s in known_reply.get("known") or [] if s in asked]
    if sha in known:
        note(f"{sha[:12]} is already a candidate; nothing to upload")
        return client.get(client.project_url(f"candidates/{sha}/"))
    if gitlocal.repo_is_shallow(repo=repo):
        # A shallow clone's bundle would name parents it does not contain.
        raise gitlocal.GitError(
            f"{repo} is a shallow clone, so its commits' history cannot be bundled; fetch it"
            " first (`git fetch --unshallow`, or `fetch-depth: 0` in actions/checkout)"
        )
    try:
        return _upload(client=client, repo=repo, sha=sha, exclude=known)
    except ApiError as exc:
        if exc.code != "missing_prerequisites" or not known:
            raise
        # The server forgot (or never had) a commit it reported known: send everything once.
        note("the server lacks commits it reported known; retrying with the full history")
        return _upload(client=client, repo=repo, sha=sha, exclude=[])


def _upload(*, client: Client, repo: Path, sha: str, exclude: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="coevo-submit-") as tmp:
        bundle = gitlocal.bundle_create(
            repo=repo, sha=sha, exclude=exclude, output=Path(tmp) / f"{sha}.bundle"
        )
        size = bundle.stat().st_size
        note(
            f"uploading {sha[:12]} ({human_size(size)}"
            + (f", excluding {len(exclude)} commits the server has)" if exclude else ")")
        )

        def files() -> dict[str, Any]:
            return {"bundle": (bundle.name, bundle.open("rb"), "application/octet-stream")}

        return client.post(
            client.project_url("candidates/import-bundle/"), data={"ref": sha}, files=files
        )

"""Deriving a candidate from others: their tree plus file changes, or a merge of two, as a
new commit.

Proposers describe a change as ``{path: new bytes | None (delete)}``, or name two parents to
merge; this module is the only place that turns it into a commit, so proposers never touch git.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.contrib.auth.models import AbstractBaseUser

from coevo.errors import InvalidInput
from coevo.projects.models import Project
from harness_store.diffs import DiffTooLarge
from harness_store.manifest import manifest_from_archive
from harness_store.models import Candidate, CandidateOrigin
from harness_store.repo import HarnessRepo
from harness_store.services import (
    candidate_import_directory,
    candidate_index_commit,
    project_repo,
)


def candidate_derive(
    *,
    project: Project,
    parents: list[Candidate],
    changes: dict[str, bytes | None],
    message: str,
    author_name: str,
    author_email: str = "",
    origin: CandidateOrigin = CandidateOrigin.PROPOSER,
) -> tuple[Candidate, bool]:
    """The first parent's tree with ``changes`` applied, committed with ``parents``; with two
    parents and no changes, their merge (``candidate_merge``).

    Returns ``(candidate, created)``: a tree equal to an existing candidate's returns that
    candidate and False (the caller rejects the proposal as a duplicate). Raises InvalidInput
    for a path outside the tree and InvalidManifest when the result is no valid harness.
    """
    if not parents:
        raise InvalidInput("A derived candidate needs at least one parent.")
    if len(parents) == 2:
        if changes:
            raise InvalidInput(
                "A merge takes no further changes: merge first, then derive from the merge."
            )
        return candidate_merge(
            project=project,
            ours=parents[0],
            theirs=parents[1],
            message=message,
            author_name=author_name,
            author_email=author_email,
            origin=origin,
        )
    if len(parents) > 2:
        raise InvalidInput("A merge combines exactly two candidates.")
    parent = parents[0]
    if parent.project_id != project.id:
        raise InvalidInput("The parent candidate belongs to another project.")
    with tempfile.TemporaryDirectory(prefix="coevo-derive-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        project_repo(project=project).export_tree(parent.sha, root)
        for path, content in changes.items():
            target = root / _safe_relative(path)
            if content is None:
                if not target.is_file():
                    raise InvalidInput(f"Cannot delete {path!r}: the parent has no such file.")
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
        return candidate_import_directory(
            project=project,
            directory=root,
            message=message,
            author_name=author_name,
            author_email=author_email,
            parent=parent,
            origin=origin,
        )


@dataclass(frozen=True)
class MergePreview:
    """What merging ``theirs`` into ``ours`` would give, before anything is committed."""

    tree_sha: str
    conflicts: list[str]  # paths both sides changed differently; empty when clean
    patch: str  # unified diff from ours to the merged tree ("" when it conflicts or is too large)
    patch_too_large: bool = False  # the diff passed DEFAULT_MAX_DIFF_BYTES: not kept

    @property
    def clean(self) -> bool:
        return not self.conflicts


def candidate_merge_preview(
    *, project: Project, ours: Candidate, theirs: Candidate
) -> MergePreview:
    """The three-way merge of two candidates against their merge base, not committed.

    Raises InvalidInput for candidates of another project or without a common ancestor."""
    repo = project_repo(project=project)
    _check_mergeable(repo=repo, project=project, ours=ours, theirs=theirs)
    tree_sha, conflicts = repo.merge_tree(ours.sha, theirs.sha)
    if conflicts:
        return MergePreview(tree_sha=tree_sha, conflicts=conflicts, patch="")
    try:
        patch = repo.diff_to_tree(ours.sha, tree_sha)
    except DiffTooLarge:
        # The merge itself is fine; only its description is too long to keep or show.
        return MergePreview(tree_sha=tree_sha, conflicts=[], patch="", patch_too_large=True)
    return MergePreview(tree_sha=tree_sha, conflicts=conflicts, patch=patch)


def candidate_merge(
    *,
    project: Project,
    ours: Candidate,
    theirs: Candidate,
    message: str,
    author_name: str,
    author_email: str = "",
    origin: CandidateOrigin = CandidateOrigin.PROPOSER,
    created_by: AbstractBaseUser | None = None,
) -> tuple[Candidate, bool]:
    """Merge ``theirs`` into ``ours`` as a commit with two parents (ours first).

    A real three-way merge against the merge base: each side's changes to different files,
    or to different hunks of one file, are both kept. Conflicting edits raise InvalidInput
    listing the paths (nothing is committed). A merged tree equal to an existing candidate's
    (say, theirs is an ancestor of ours) returns that candidate and False. A merge whose
    harness.toml no longer validates raises InvalidManifest.
    """
    if not message.strip():
        raise InvalidInput("A candidate needs a commit message.")
    preview = candidate_merge_preview(project=project, ours=ours, theirs=theirs)
    if preview.conflicts:
        raise InvalidInput(
            f"Merging {theirs.short_sha} into {ours.short_sha} conflicts in "
            f"{', '.join(preview.conflicts)}: both changed the same lines. Merge candidates "
            "that changed different components, or resolve the conflict in a new commit."
        )
    existing = _candidate_with_tree(project=project, tree_sha=preview.tree_sha)
    if existing is not None:
        return existing, False
    repo = project_repo(project=project)
    # Each side's manifest validated, but a clean textual merge of two manifests need not.
    manifest_from_archive(repo.archive_tree(preview.tree_sha))
    # Check-then-commit under the repository lock, as candidate_import_directory does: two
    # merges of the same pair at once end with one candidate.
    with repo.write_lock():
        existing = _candidate_with_tree(project=project, tree_sha=preview.tree_sha)
        if existing is not None:
            return existing, False
        sha = repo.commit_tree(
            tree_sha=preview.tree_sha,
            parents=[ours.sha, theirs.sha],
            message=message,
            author_name=author_name,
            author_email=author_email,
        )
        return candidate_index_commit(
            project=project, sha=sha, origin=origin, created_by=created_by, repo=repo
        )


def _check_mergeable(
    *, repo: HarnessRepo, project: Project, ours: Candidate, theirs: Candidate
) -> None:
    if ours.project_id != project.id or theirs.project_id != project.id:
        raise InvalidInput("Both candidates of a merge must belong to the project.")
    if ours.sha == theirs.sha:
        raise InvalidInput(f"Cannot merge candidate {ours.short_sha} with itself.")
    if repo.merge_base(ours.sha, theirs.sha) is None:
        raise InvalidInput(
            f"Candidates {ours.short_sha} and {theirs.short_sha} share no history: there is "
            "no common ancestor to merge against."
        )


def _candidate_with_tree(*, project: Project, tree_sha: str) -> Candidate | None:
    return (
        Candidate.objects.filter(project=project, tree_sha=tree_sha).order_by("created_at").first()
    )


def _safe_relative(path: str) -> PurePosixPath:
    relative = PurePosixPath(path.replace("\\", "/"))
    if (
        not path.strip()
        or relative.is_absolute()
        or ".." in relative.parts
        or relative.parts[:1] == (".git",)
    ):
        raise InvalidInput(f"{path!r} is not a path inside the harness.")
    return relative

"""Writes to the harness store: every candidate goes through here."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from coevo.errors import InvalidInput
from coevo.projects.models import Project
from harness_store.models import Candidate, CandidateOrigin, TreeSnapshot
from harness_store.repo import HarnessRepo


def project_repo(*, project: Project) -> HarnessRepo:
    """The project's bare repository, created on first use."""
    root = Path(settings.COEVO_HARNESS_STORE_DIR)
    return HarnessRepo.open_or_init(root / f"{project.id}.git")


def candidate_import_directory(
    *,
    project: Project,
    directory: Path,
    message: str,
    author_name: str,
    author_email: str = "",
    parent: Candidate | None = None,
    origin: CandidateOrigin = CandidateOrigin.IMPORT,
    created_by: AbstractBaseUser | None = None,
) -> tuple[Candidate, bool]:
    """Import a directory as a new candidate (a commit whose parent is ``parent``).

    Returns ``(candidate, created)``. A directory whose content equals an existing candidate's
    returns that candidate (``created`` False) instead of making a second commit of the same tree.
    """
    if not message.strip():
        raise InvalidInput("A candidate needs a commit message.")
    if parent is not None and parent.project_id != project.id:
        raise InvalidInput("The parent candidate belongs to another project.")
    repo = project_repo(project=project)
    tree_sha = repo.tree_of_directory(Path(directory))
    # A directory handed to coevo must be a harness that can run (a commit imported with its
    # history may not be: it keeps its SHA and fails at run time with the manifest's error).
    from workers.manifest import load_manifest

    load_manifest(Path(directory))
    # Check-then-commit under the repository lock, so two imports of the same content at the
    # same time end with one candidate, not two commits of one tree.
    with repo.write_lock():
        existing = Candidate.objects.filter(project=project, tree_sha=tree_sha).order_by(
            "created_at"
        )
        if existing.exists():
            return existing.first(), False
        sha = repo.commit_tree(
            tree_sha=tree_sha,
            parents=[parent.sha] if parent else [],
            message=message,
            author_name=author_name,
            author_email=author_email,
        )
        return _candidate_index(
            project=project, repo=repo, sha=sha, origin=origin, created_by=created_by
        )


def _candidate_index(
    *,
    project: Project,
    repo: HarnessRepo,
    sha: str,
    origin: CandidateOrigin,
    created_by: AbstractBaseUser | None,
) -> tuple[Candidate, bool]:
    info = repo.commit_info(sha)
    tree_snapshot_ensure(project=project, repo=repo, sha=sha, tree_sha=info.tree_sha)
    try:
        with transaction.atomic():
            candidate = Candidate.objects.create(
                project=project,
                sha=info.sha,
                tree_sha=info.tree_sha,
                parent_shas=list(info.parents),
                message=info.message,
                author_name=info.author_name,
                author_email=info.author_email,
                authored_at=info.authored_at,
                origin=origin,
                created_by=created_by,
            )
    except IntegrityError:
        # Two imports of the same content raced; the other one indexed it first.
        return Candidate.objects.get(project=project, sha=info.sha), False
    return candidate, True


def tree_snapshot_ensure(
    *, project: Project, repo: HarnessRepo, sha: str, tree_sha: str
) -> TreeSnapshot:
    """Store the tree of ``sha`` for workers, once per distinct tree."""
    existing = TreeSnapshot.objects.filter(project=project, tree_sha=tree_sha).first()
    if existing:
        return existing
    archive = repo.archive(sha)
    try:
        with transaction.atomic():
            return TreeSnapshot.objects.create(
                project=project, tree_sha=tree_sha, archive=archive, size_bytes=len(archive)
            )
    except IntegrityError:
        return TreeSnapshot.objects.get(project=project, tree_sha=tree_sha)

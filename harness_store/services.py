"""Writes to the harness store: every candidate goes through here."""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction

from coevo.errors import CoevoError, InvalidBundle, InvalidInput, PayloadTooLarge
from coevo.projects.models import Project
from harness_store.archives import archive_extract, archive_limits
from harness_store.manifest import load_manifest
from harness_store.models import Candidate, CandidateOrigin, TreeSnapshot
from harness_store.repo import CANDIDATE_REF_PREFIX, CommitInfo, HarnessRepo

logger = logging.getLogger(__name__)

DEFAULT_MAX_BUNDLE_BYTES = 200 * 1024 * 1024
_FULL_SHA = re.compile(r"[0-9a-f]{40}")


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


def candidate_import_tarball(
    *,
    project: Project,
    archive: bytes,
    message: str,
    author_name: str,
    author_email: str = "",
    parent: Candidate | None = None,
    created_by: AbstractBaseUser | None = None,
    origin: CandidateOrigin = CandidateOrigin.IMPORT,
) -> tuple[Candidate, bool]:
    """Import an uploaded tar or tar.gz of a harness directory as a new candidate.

    The archive is checked whole before anything is unpacked (see ``harness_store.archives``:
    unsafe entries raise UnsafeArchive, oversized ones PayloadTooLarge) and must hold a valid
    ``harness.toml`` (InvalidManifest). Same tree as an existing candidate: ``(it, False)``.
    """
    with tempfile.TemporaryDirectory(prefix="coevo-tarball-") as tmp:
        root = archive_extract(data=archive, destination=Path(tmp))
        return candidate_import_directory(
            project=project,
            directory=root,
            message=message,
            author_name=author_name,
            author_email=author_email,
            parent=parent,
            origin=origin,
            created_by=created_by,
        )


def candidate_import_bundle(
    *,
    project: Project,
    bundle: bytes,
    ref: str,
    created_by: AbstractBaseUser | None = None,
    origin: CandidateOrigin = CandidateOrigin.CI,
) -> tuple[Candidate, bool]:
    """Import commit ``ref`` of a git bundle, and every ancestor not yet a candidate, as is.

    The SHAs do not change (the bundle carries the commits themselves), so a CI job can refer
    to a candidate by the SHA it has in its own repository. ``ref`` is a ref name the bundle
    carries (``HEAD``, ``main``, ``refs/heads/main``) or a full commit SHA reachable from its
    refs. Returns ``(candidate, created)``; created is False when the commit already was one.

    All or nothing: the bundle's refs land in a quarantine namespace, the commits are indexed
    in one transaction, and only then are they kept under ``refs/coevo/candidates/``; on any
    failure no row and no ref remain (fetched objects dangle until ``git gc`` prunes them).
    A commit without a valid harness.toml is imported all the same: it keeps its SHA and fails
    at run time with the manifest's error. A commit whose files pass the archive limits
    (``COEVO_MAX_ARCHIVE_FILES``/``BYTES``, as for a tarball) is not: PayloadTooLarge.
    """
    ref = ref.strip()
    if not ref:
        raise InvalidBundle("Name the commit to import: a ref in the bundle (e.g. HEAD) or a SHA.")
    max_bytes = int(getattr(settings, "COEVO_MAX_BUNDLE_BYTES", DEFAULT_MAX_BUNDLE_BYTES))
    if len(bundle) > max_bytes:
        raise PayloadTooLarge(
            f"The bundle is {len(bundle)} bytes, above the {max_bytes} limit. Exclude the commits "
            "the server already has (POST candidates/known/, then `git bundle create FILE <ref> "
            "--not <known>`)."
        )
    as_sha = ref.lower() if _FULL_SHA.fullmatch(ref.lower()) else None
    if as_sha:
        # Idempotent without reading the upload: a retried CI job gets its candidate back.
        existing = Candidate.objects.filter(project=project, sha=as_sha).first()
        if existing:
            return existing, False
    repo = project_repo(project=project)
    with tempfile.TemporaryDirectory(prefix="coevo-bundle-") as tmp:
        path = Path(tmp) / "upload.bundle"
        path.write_bytes(bundle)
        # One import at a time per repository: a second, overlapping bundle then finds the
        # first one's commits indexed and adds only its own.
        with repo.write_lock():
            header = repo.bundle_verify(path)
            namespace, tips = repo.bundle_fetch(path, header)
            try:
                sha = _bundle_resolve(
                    repo=repo, ref=ref, as_sha=as_sha, tips=tips, namespace=namespace
                )
                return _candidate_index_history(
                    project=project, repo=repo, sha=sha, origin=origin, created_by=created_by
                )
            finally:
                _quarantine_drop(repo=repo, namespace=namespace)


def _quarantine_drop(*, repo: HarnessRepo, namespace: str) -> None:
    # A leftover quarantine ref only keeps objects from gc; it must not turn a finished
    # import (or its real error) into a different failure.
    try:
        repo.delete_refs(repo.refs_under(namespace))
    except CoevoError:
        logger.warning("Could not delete the quarantine refs %s", namespace, exc_info=True)


def _bundle_resolve(
    *, repo: HarnessRepo, ref: str, as_sha: str | None, tips: dict[str, str], namespace: str
) -> str:
    if as_sha:
        if not repo.refs_containing(as_sha, namespace):
            raise InvalidBundle(
                f"Commit {as_sha[:12]} is not in the bundle (its refs: {', '.join(tips)}). "
                "Create the bundle from a ref that contains it."
            )
        return as_sha
    # git's own order for a short name: exact, refs/<name>, tags, then branches.
    for name in (ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}"):
        if name in tips:
            return tips[name]
    raise InvalidBundle(
        f"The bundle has no ref {ref!r} (it has: {', '.join(tips)}). Pass one of those, or the "
        "full SHA of a commit they contain."
    )


def _candidate_index_history(
    *,
    project: Project,
    repo: HarnessRepo,
    sha: str,
    origin: CandidateOrigin,
    created_by: AbstractBaseUser | None,
) -> tuple[Candidate, bool]:
    """Index ``sha`` and its ancestors that are not candidates yet, oldest first, all or none."""
    existing = Candidate.objects.filter(project=project, sha=sha).first()
    if existing:
        return existing, False
    history = repo.rev_list(sha, exclude_prefixes=[CANDIDATE_REF_PREFIX])
    listed = {commit for commit, _ in history}
    boundary = {parent for _, parents in history for parent in parents if parent not in listed}
    if sha not in listed or len(_candidate_shas(project=project, shas=boundary)) != len(boundary):
        # A kept ref without its row (an import whose transaction was rolled back by its
        # caller): the refs no longer prove the ancestry is indexed, so walk all of it.
        history = repo.rev_list(sha)
    known = _candidate_shas(project=project, shas=[commit for commit, _ in history])
    new = [commit for commit, _ in history if commit not in known]
    infos = {commit: repo.commit_info(commit) for commit in new}
    _bundle_check_sizes(project=project, repo=repo, infos=list(infos.values()))
    created_tip = False
    kept = False
    try:
        with transaction.atomic():
            for commit in new:
                _, created = _candidate_create(
                    project=project,
                    repo=repo,
                    info=infos[commit],
                    origin=origin,
                    created_by=created_by,
                )
                created_tip = created if commit == sha else created_tip
            # Refs last and in one update-ref transaction: if they fail, the rows roll back.
            repo.keep_many(new)
            kept = True
    except BaseException:
        if kept:
            # The commit of the rows failed after the refs were written: drop the refs that
            # no row backs (a racing writer may have indexed some of these commits; they stay).
            orphaned = set(new) - _candidate_shas(project=project, shas=new)
            with contextlib.suppress(CoevoError):
                repo.delete_refs([f"{CANDIDATE_REF_PREFIX}{c}" for c in sorted(orphaned)])
        raise
    logger.info(
        "Imported %s from a bundle: %d new candidate(s)",
        sha,
        len(new),
        extra={"project": project.slug, "candidate_sha": sha},
    )
    return Candidate.objects.get(project=project, sha=sha), created_tip


def _bundle_check_sizes(*, project: Project, repo: HarnessRepo, infos: list[CommitInfo]) -> None:
    """Refuse the bundle if a commit it brings unpacks to more than an uploaded tarball may.

    A bundle is compressed and delta-encoded: a 150 KiB one can carry a 150 MiB file, which
    every later step would unpack (the tree snapshot for workers, their export, the diff page).
    Checked before any row or kept ref exists; trees already snapshotted passed before.
    """
    max_files, max_bytes = archive_limits()
    trees = list(dict.fromkeys(info.tree_sha for info in infos))
    accepted = set(
        TreeSnapshot.objects.filter(project=project, tree_sha__in=trees).values_list(
            "tree_sha", flat=True
        )
    )
    for info in infos:
        if info.tree_sha in accepted:
            continue
        size = repo.tree_size(info.tree_sha, max_files=max_files, max_bytes=max_bytes)
        if size.files > max_files:
            raise PayloadTooLarge(
                f"Commit {info.sha[:12]} in the bundle has more than {max_files} files; a "
                "harness should be far smaller (leave out data sets, virtual environments and "
                "caches, and rewrite the commits that added them)."
            )
        if size.bytes > max_bytes:
            raise PayloadTooLarge(
                f"Commit {info.sha[:12]} in the bundle unpacks to more than {max_bytes} bytes; "
                "leave out large data files (a harness is code and prompts) and rewrite the "
                "commits that added them."
            )
        accepted.add(info.tree_sha)


def _candidate_shas(*, project: Project, shas: Iterable[str]) -> set[str]:
    shas = list(shas)
    found: set[str] = set()
    for start in range(0, len(shas), 1000):
        found.update(
            Candidate.objects.filter(
                project=project, sha__in=shas[start : start + 1000]
            ).values_list("sha", flat=True)
        )
    return found


def _candidate_create(
    *,
    project: Project,
    repo: HarnessRepo,
    info: CommitInfo,
    origin: CandidateOrigin,
    created_by: AbstractBaseUser | None,
) -> tuple[Candidate, bool]:
    """One row (with its tree snapshot) inside the caller's transaction; a race is not an error."""
    tree_snapshot_ensure(project=project, repo=repo, sha=info.sha, tree_sha=info.tree_sha)
    try:
        with transaction.atomic():
            return Candidate.objects.create(
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
            ), True
    except IntegrityError:
        # Another writer indexed this commit first (two imports of the same content, or a
        # caller whose outer transaction had not committed when it released the lock).
        return Candidate.objects.get(project=project, sha=info.sha), False


def _candidate_index(
    *,
    project: Project,
    repo: HarnessRepo,
    sha: str,
    origin: CandidateOrigin,
    created_by: AbstractBaseUser | None,
) -> tuple[Candidate, bool]:
    # A race with another import of the same commit is not an error: it returns that row.
    return _candidate_create(
        project=project,
        repo=repo,
        info=repo.commit_info(sha),
        origin=origin,
        created_by=created_by,
    )


def candidate_index_commit(
    *,
    project: Project,
    sha: str,
    origin: CandidateOrigin = CandidateOrigin.PROPOSER,
    created_by: AbstractBaseUser | None = None,
    repo: HarnessRepo | None = None,
) -> tuple[Candidate, bool]:
    """Index a commit the store itself wrote into the project's repository (a merge commit of
    ``harness_store.derive.candidate_merge``); ``(its row, created)``. A caller holding the
    repository's write lock passes its ``repo``: opening the repository again takes the lock
    file anew, which would wait for itself."""
    repo = repo or project_repo(project=project)
    return _candidate_index(
        project=project, repo=repo, sha=sha, origin=origin, created_by=created_by
    )


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

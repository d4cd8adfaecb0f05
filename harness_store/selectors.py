"""Reads from the harness store: candidate rows plus their content from git."""

from __future__ import annotations

import datetime
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import Q, QuerySet

from coevo.db import keyset_slice
from coevo.errors import InvalidInput, NotFound
from coevo.projects.models import Project
from harness_store.diffs import FilePatch
from harness_store.manifest import Manifest, manifest_from_archive
from harness_store.models import Candidate, TreeSnapshot
from harness_store.repo import CommitInfo, TreeEntry, extract_archive
from harness_store.repo_diffs import DEFAULT_MAX_DIFF_BYTES
from harness_store.services import project_repo, tree_snapshot_ensure

_FULL_SHA = re.compile(r"[0-9a-f]{40}")


def candidate_list(*, project: Project) -> QuerySet[Candidate]:
    return Candidate.objects.filter(project=project)


@dataclass(frozen=True)
class CandidatePage:
    candidates: list[Candidate]
    # Pass as ``cursor`` for the next (older) page; None on the last page.
    next_cursor: str | None


def candidate_page(
    *, project: Project, cursor: str | None = None, limit: int = 50
) -> CandidatePage:
    """One page of the project's candidates, newest authored first, after ``cursor``: keyset
    pagination (served by candidate_recent_idx), so page 200 of a 10,000-commit project costs
    what page 1 does, and commits imported meanwhile never shift or repeat rows."""
    limit = max(1, min(limit, 500))
    rows = candidate_list(project=project).order_by("-authored_at", "-id")
    if cursor:
        stamp, pk = _candidate_cursor_decode(cursor)
        rows = rows.filter(Q(authored_at__lt=stamp) | Q(authored_at=stamp, id__lt=pk))
    page, more = keyset_slice(rows, limit)
    last = page[-1] if page else None
    return CandidatePage(
        candidates=page,
        next_cursor=f"{last.authored_at.isoformat()}|{last.id}" if more and last else None,
    )


def _candidate_cursor_decode(cursor: str) -> tuple[datetime.datetime, uuid.UUID]:
    try:
        stamp, pk = cursor.split("|", 1)
        return datetime.datetime.fromisoformat(stamp), uuid.UUID(pk)
    except ValueError:
        raise InvalidInput("That page link is broken: start again from the first page.") from None


def candidate_get(*, project: Project, sha: str) -> Candidate:
    """A candidate by full SHA or an unambiguous prefix (at least 4 characters)."""
    sha = sha.lower()
    if len(sha) < 4:
        raise NotFound("Give at least 4 characters of the SHA.")
    matches = list(Candidate.objects.filter(project=project, sha__startswith=sha)[:2])
    if not matches:
        raise NotFound(f"No candidate {sha} in project {project.slug}.")
    if len(matches) > 1:
        raise NotFound(f"{sha} is ambiguous in project {project.slug}: give more of the SHA.")
    return matches[0]


def candidate_shas_known(*, project: Project, shas: list[str]) -> list[str]:
    """Which of these full commit SHAs are candidates of the project, in the order given.

    The CLI asks this before making a bundle, to leave out the commits the server has.
    Malformed entries (not 40 hex digits) are ignored, not an error: they are simply unknown.
    """
    wanted = list(dict.fromkeys(sha.lower() for sha in shas if isinstance(sha, str)))
    wanted = [sha for sha in wanted if _FULL_SHA.fullmatch(sha)]
    if not wanted:
        return []
    known = set(
        Candidate.objects.filter(project=project, sha__in=wanted).values_list("sha", flat=True)
    )
    return [sha for sha in wanted if sha in known]


def candidate_files(*, candidate: Candidate) -> list[TreeEntry]:
    return project_repo(project=candidate.project).list_tree(candidate.sha)


def candidate_read_file(*, candidate: Candidate, path: str) -> bytes:
    return project_repo(project=candidate.project).read_file(candidate.sha, path)


def candidate_diff(*, candidate: Candidate, base: Candidate | None) -> str:
    """Unified diff from ``base`` (None: the empty tree) to ``candidate``; DiffTooLarge above
    ``COEVO_MAX_DIFF_BYTES`` (git is stopped there, the rest is never read)."""
    return project_repo(project=candidate.project).diff(
        base.sha if base else None, candidate.sha, max_bytes=_max_diff_bytes()
    )


def candidate_diff_files(*, candidate: Candidate, base: Candidate | None) -> list[FilePatch]:
    """The same diff split by file, every file git lists accounted for (DiffUnreadable if not);
    DiffTooLarge as :func:`candidate_diff`."""
    return project_repo(project=candidate.project).diff_files(
        base.sha if base else None, candidate.sha, max_bytes=_max_diff_bytes()
    )


def candidate_diff_names(*, candidate: Candidate, base: Candidate | None) -> list[str]:
    """Every path the diff touches, for when the diff itself is too large to show."""
    return project_repo(project=candidate.project).diff_names(
        base.sha if base else None, candidate.sha
    )


def _max_diff_bytes() -> int:
    return int(getattr(settings, "COEVO_MAX_DIFF_BYTES", DEFAULT_MAX_DIFF_BYTES))


def candidate_parent(*, candidate: Candidate) -> Candidate | None:
    if not candidate.parent_sha:
        return None
    return Candidate.objects.filter(project=candidate.project_id, sha=candidate.parent_sha).first()


def candidate_lineage(*, candidate: Candidate, max_count: int = 50) -> list[CommitInfo]:
    return project_repo(project=candidate.project).log(candidate.sha, max_count=max_count)


def candidate_export(*, candidate: Candidate, destination: Path) -> None:
    """Write the candidate's files into ``destination``, from its snapshot in the database.

    This is how workers get candidate content: by SHA, with no access to the harness store's
    disk. (A candidate indexed before snapshots existed gets one from git, where git is here.)
    """
    extract_archive(_snapshot_archive(candidate), destination)


def candidate_manifest(*, candidate: Candidate) -> Manifest:
    """The candidate's validated manifest, read from its snapshot as workers read candidates
    (so it works where the store's disk is not), without writing its files anywhere.
    InvalidManifest when it does not validate."""
    return manifest_from_archive(_snapshot_archive(candidate))


def _snapshot_archive(candidate: Candidate) -> bytes:
    snapshot = (
        TreeSnapshot.objects.filter(project_id=candidate.project_id, tree_sha=candidate.tree_sha)
        .only("archive")
        .first()
    )
    if snapshot is None:
        snapshot = tree_snapshot_ensure(
            project=candidate.project,
            repo=project_repo(project=candidate.project),
            sha=candidate.sha,
            tree_sha=candidate.tree_sha,
        )
    return bytes(snapshot.archive)

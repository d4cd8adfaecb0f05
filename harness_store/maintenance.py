"""Keeping the harness store safe: backups as git bundles, restore, and integrity checks.

A backup is a directory with one ``<project-slug>-<project-id>.bundle`` per project
(``git bundle create --all``: every ref, so the candidates' ``refs/coevo/candidates/*``, tags and
any branch) and a ``manifest.json`` naming each bundle with its SHA-256 and ref count. A
restore fetches every ref of each bundle into a fresh bare repository and swaps it into the
store. The integrity check runs ``git fsck`` and also asks git for every commit the database
indexes as a candidate, since a repository can be internally consistent and still have lost
commits (a restore from an old backup): both must hold for a check to pass.

The database is backed up separately (``pg_dump``); repositories are named by project id, so a
restored database and a restored store fit together. docs/operations.md is the runbook.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from coevo.errors import HarnessStoreError
from coevo.projects.models import Project
from harness_store.models import Candidate, StoreCheck
from harness_store.repo import HarnessRepo
from harness_store.repo_base import flock
from harness_store.services import project_repo

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# Checks kept per project; older rows are deleted by each new check.
STORE_CHECKS_KEPT = 30
_GIT_TIMEOUT_S = 3600


@dataclass(frozen=True)
class BundleEntry:
    project_id: str
    project_slug: str
    bundle: str  # file name inside the backup directory ("" for a repository with no refs)
    sha256: str
    refs: int
    size_bytes: int


@dataclass(frozen=True)
class BackupManifest:
    created_at: str
    directory: Path
    projects: list[BundleEntry]


@dataclass(frozen=True)
class RestoreResult:
    project_id: str
    project_slug: str
    path: Path
    refs: int
    replaced: bool


@dataclass(frozen=True)
class FsckResult:
    ok: bool
    output: str
    duration_ms: int


# --- git ---------------------------------------------------------------------------------


def _git(args: Sequence[str], *, cwd: Path | None = None, stdin: str | None = None) -> str:
    """Run git; a failure raises HarnessStoreError carrying git's own message."""
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HarnessStoreError(f"git {args[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        raise HarnessStoreError(
            f"git {' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()}"
        )
    return done.stdout


def repository_path(*, project: Project) -> Path:
    """Where the project's repository lives, without creating it (project_repo would)."""
    # Mirrors harness_store.services.project_repo; tests/harness_store/test_maintenance.py
    # holds the two together.
    return Path(settings.COEVO_HARNESS_STORE_DIR) / f"{project.id}.git"


def _has_repository(path: Path) -> bool:
    return (path / "HEAD").exists()


def _ref_lines(repo: Path) -> list[str]:
    out = _git(["for-each-ref", "--format=%(objectname) %(refname)"], cwd=repo)
    return [line for line in out.splitlines() if line.strip()]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- backup ------------------------------------------------------------------------------


def store_backup(*, destination: Path, projects: Iterable[Project] | None = None) -> BackupManifest:
    """Write a bundle of every project's repository (and a manifest) into ``destination``.

    Each bundle is written under the repository's write lock (imports wait a moment; readers
    do not), to a temporary name, verified with ``git bundle verify`` and only then renamed, so
    a backup directory never holds a half-written bundle under its real name.
    """
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    if (destination / MANIFEST_NAME).exists():
        raise HarnessStoreError(
            f"{destination} already holds a backup ({MANIFEST_NAME}): give an empty directory."
        )
    entries = []
    for project in projects if projects is not None else Project.objects.order_by("slug"):
        entries.append(_backup_one(project=project, destination=destination))
    manifest = BackupManifest(
        created_at=datetime.now(UTC).isoformat(), directory=destination, projects=entries
    )
    body = {
        "format": MANIFEST_FORMAT,
        "created_at": manifest.created_at,
        "projects": [asdict(entry) for entry in entries],
    }
    tmp = destination / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.rename(destination / MANIFEST_NAME)
    logger.info("harness store backup: %d projects into %s", len(entries), destination)
    return manifest


def _backup_one(*, project: Project, destination: Path) -> BundleEntry:
    path = repository_path(project=project)
    empty = BundleEntry(str(project.id), project.slug, "", "", 0, 0)
    if not _has_repository(path):
        if Candidate.objects.filter(project=project).exists():
            raise HarnessStoreError(
                f"Project {project.slug} has candidates but no repository at {path}: "
                "restore it from an earlier backup before taking a new one."
            )
        return empty
    repo = project_repo(project=project)
    name = f"{project.slug}-{project.id}.bundle"
    target = destination / name
    tmp = destination / f".{name}.tmp"
    with repo.write_lock():
        refs = _ref_lines(repo.path)
        if not refs:
            # git refuses to write a bundle with no refs; nothing to keep anyway.
            return empty
        _git(["bundle", "create", str(tmp), "--all"], cwd=repo.path)
    _git(["bundle", "verify", "--quiet", str(tmp)], cwd=repo.path)
    tmp.rename(target)
    return BundleEntry(
        project_id=str(project.id),
        project_slug=project.slug,
        bundle=name,
        sha256=_sha256(target),
        refs=len(refs),
        size_bytes=target.stat().st_size,
    )


# --- restore -----------------------------------------------------------------------------


def backup_read_manifest(*, source: Path) -> list[BundleEntry]:
    path = Path(source) / MANIFEST_NAME
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        raise HarnessStoreError(f"{path} does not exist: is {source} a coevo backup?") from None
    except json.JSONDecodeError as exc:
        raise HarnessStoreError(f"{path} is not valid JSON: {exc}") from None
    if body.get("format") != MANIFEST_FORMAT:
        raise HarnessStoreError(
            f"{path} has format {body.get('format')!r}; this coevo reads format {MANIFEST_FORMAT}."
        )
    return [BundleEntry(**entry) for entry in body["projects"]]


def store_restore(
    *, source: Path, force: bool = False, project_ids: Iterable[str] | None = None
) -> list[RestoreResult]:
    """Recreate each repository of the backup in ``source`` inside the harness store.

    Every bundle is checked against the manifest's SHA-256 before anything is written. A
    repository that exists with refs is left alone (HarnessStoreError) unless ``force``; with
    ``force`` it is replaced, and the old one is deleted only once the new one is in place.
    """
    source = Path(source)
    entries = backup_read_manifest(source=source)
    wanted = {str(pid) for pid in project_ids} if project_ids is not None else None
    entries = [e for e in entries if e.bundle and (wanted is None or e.project_id in wanted)]
    for entry in entries:
        bundle = source / entry.bundle
        if not bundle.is_file():
            raise HarnessStoreError(f"{bundle} is missing from the backup.")
        if _sha256(bundle) != entry.sha256:
            raise HarnessStoreError(
                f"{bundle} does not match the SHA-256 in {MANIFEST_NAME}: it is damaged."
            )
    store = Path(settings.COEVO_HARNESS_STORE_DIR)
    store.mkdir(parents=True, exist_ok=True)
    if not force:
        occupied = [
            e
            for e in entries
            if _has_repository(target := store / f"{e.project_id}.git") and _ref_lines(target)
        ]
        if occupied:
            names = ", ".join(e.project_slug for e in occupied)
            raise HarnessStoreError(
                f"The harness store already has repositories with commits for: {names}. "
                "Restore into an empty store, or pass --force to replace them."
            )
    return [_restore_one(entry=e, bundle=source / e.bundle, store=store) for e in entries]


def _restore_one(*, entry: BundleEntry, bundle: Path, store: Path) -> RestoreResult:
    target = store / f"{entry.project_id}.git"
    staging = store / f".restore-{entry.project_id}.git"
    if staging.exists():
        shutil.rmtree(staging)  # left by an interrupted restore
    # open_or_init gives the staging repository the store's own setup (bare, reflogs on,
    # info/exclude), so a restored repository is indistinguishable from a created one.
    HarnessRepo.open_or_init(staging)
    _git(
        ["fetch", "--quiet", "--no-write-fetch-head", str(bundle.resolve()), "+refs/*:refs/*"],
        cwd=staging,
    )
    refs = len(_ref_lines(staging))
    if refs != entry.refs:
        shutil.rmtree(staging)
        raise HarnessStoreError(
            f"{bundle.name} gave {refs} refs, the manifest says {entry.refs}: not restored."
        )
    _git(["fsck", "--full", "--strict", "--no-dangling"], cwd=staging)
    replaced = False
    # The repository's own lock: no import writes into it while it is swapped.
    with flock(target.with_suffix(".lock")):
        old = None
        if target.exists():
            old = store / f".replaced-{entry.project_id}-{int(time.time())}.git"
            target.rename(old)
            replaced = True
        staging.rename(target)
        if old is not None:
            shutil.rmtree(old)
    staging.with_suffix(".lock").unlink(missing_ok=True)
    logger.info("restored %s (%d refs) into %s", entry.project_slug, refs, target)
    return RestoreResult(entry.project_id, entry.project_slug, target, refs, replaced)


# --- integrity ---------------------------------------------------------------------------


def repository_fsck(*, project: Project) -> FsckResult:
    """``git fsck`` of the project's repository, and every indexed candidate present in it.

    Reads only: nothing is recorded (``store_fsck`` records), and a missing repository is not
    created.
    """
    started = time.monotonic()
    path = repository_path(project=project)
    shas = list(Candidate.objects.filter(project=project).values_list("sha", flat=True))

    def result(ok: bool, output: str) -> FsckResult:
        return FsckResult(ok, output.strip(), int((time.monotonic() - started) * 1000))

    if not _has_repository(path):
        if shas:
            return result(
                False,
                f"No repository at {path}, but {len(shas)} candidates in the "
                "database: restore the harness store from a backup.",
            )
        return result(True, "No repository yet (the project has no candidates).")
    try:
        output = _git(["fsck", "--full", "--strict", "--no-dangling", "--no-progress"], cwd=path)
    except HarnessStoreError as exc:
        return result(False, str(exc))
    missing = _missing_objects(path, shas)
    if missing:
        listed = "\n".join(missing[:50])
        return result(
            False,
            f"{len(missing)} candidates indexed in the database are missing "
            f"from the repository:\n{listed}\n{output}",
        )
    return result(True, output or f"ok: {len(shas)} candidates present")


def _missing_objects(path: Path, shas: list[str]) -> list[str]:
    if not shas:
        return []
    out = _git(
        ["cat-file", "--batch-check=%(objectname) %(objecttype)"],
        cwd=path,
        stdin="\n".join(shas) + "\n",
    )
    return [line.split()[0] for line in out.splitlines() if line.endswith(" missing")]


def store_fsck(*, project: Project) -> StoreCheck:
    """Check one project's repository and record the result (keeping the last few)."""
    checked = repository_fsck(project=project)
    check = StoreCheck.objects.create(
        project=project,
        ok=checked.ok,
        output=checked.output[: StoreCheck.OUTPUT_MAX_CHARS],
        duration_ms=checked.duration_ms,
        checked_at=timezone.now(),
    )
    if not check.ok:
        logger.error("harness store fsck failed for %s: %s", project.slug, checked.output[:2000])
    keep = StoreCheck.objects.filter(project=project).order_by("-checked_at")
    stale = keep.values_list("id", flat=True)[STORE_CHECKS_KEPT:]
    StoreCheck.objects.filter(id__in=list(stale)).delete()
    return check


def store_fsck_all() -> list[StoreCheck]:
    return [store_fsck(project=project) for project in Project.objects.order_by("slug")]


def store_check_latest() -> list[StoreCheck]:
    """The newest check of each project (what the system page shows), by project slug."""
    newest = StoreCheck.objects.filter(project=OuterRef("project")).order_by("-checked_at")
    return list(
        StoreCheck.objects.filter(id=Subquery(newest.values("id")[:1]))
        .select_related("project")
        .order_by("project__slug")
    )

"""Harness store backup, restore and integrity checks (harness_store.maintenance and the
harness_backup / harness_restore / harness_fsck commands), on real repositories."""

from __future__ import annotations

import json
import shutil
import subprocess
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from coevo.errors import HarnessStoreError
from coevo.projects.services import project_get_or_create
from harness_store.maintenance import (
    repository_fsck,
    repository_path,
    store_backup,
    store_check_latest,
    store_fsck,
    store_restore,
)
from harness_store.models import Candidate, StoreCheck
from harness_store.selectors import candidate_lineage, candidate_read_file
from harness_store.services import candidate_import_bundle, project_repo
from tests.conftest import SEED_HARNESS

pytestmark = pytest.mark.django_db

_IDENTITY = ["-c", "user.name=Dev", "-c", "user.email=dev@example.com"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def commit(work: Path, message: str, files: dict[str, str]) -> str:
    for name, content in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(content)
    git(work, "add", "--all")
    git(work, "commit", "--quiet", "-m", message)
    return git(work, "rev-parse", "HEAD").strip()


@pytest.fixture
def populated(project, tmp_path):
    """A project whose repository has five candidates (one a merge), a lightweight and an
    annotated tag."""
    work = tmp_path / "user"
    shutil.copytree(SEED_HARNESS, work)
    git(work, "init", "--quiet", "--initial-branch=main")
    commit(work, "Seed", {})
    commit(work, "Tune", {"prompts/system.txt": "Be brief.\n"})
    git(work, "checkout", "--quiet", "-b", "feature")
    commit(work, "Helper", {"tools/helper.py": "def helper():\n    return 1\n"})
    git(work, "checkout", "--quiet", "main")
    commit(work, "Longer", {"prompts/system.txt": "Be brief and exact.\n"})
    git(work, "merge", "--quiet", "--no-ff", "-m", "Merge feature", "feature")
    bundle = tmp_path / "user.bundle"
    git(work, "bundle", "create", "--quiet", str(bundle), "main")
    merge, _ = candidate_import_bundle(project=project, bundle=bundle.read_bytes(), ref="main")
    repo = project_repo(project=project)
    repo.tag("v1", merge.sha)
    git(repo.path, "tag", "-a", "reviewed", "-m", "Reviewed by a human", merge.parent_shas[0])
    return merge


def refs_of(path: Path) -> list[str]:
    return git(path, "for-each-ref", "--format=%(objectname) %(objecttype) %(refname)").split("\n")


def test_backup_and_restore_round_trip_a_repository_with_history_and_tags(
    populated, project, tmp_path, settings
):
    store = Path(settings.COEVO_HARNESS_STORE_DIR)
    path = repository_path(project=project)
    before = refs_of(path)
    assert len(Candidate.objects.filter(project=project)) == 5
    assert any("refs/tags/reviewed" in line and " tag " in line for line in before)

    manifest = store_backup(destination=tmp_path / "backup")
    (entry,) = manifest.projects
    assert entry.bundle == f"demo-{project.id}.bundle" and entry.refs == 7
    written = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert written["projects"][0]["sha256"] == entry.sha256

    shutil.rmtree(store)
    (result,) = store_restore(source=tmp_path / "backup")

    assert result.path == path and result.refs == 7 and not result.replaced
    assert refs_of(path) == before
    assert repository_fsck(project=project).ok
    assert git(path, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    for candidate in Candidate.objects.filter(project=project):
        assert b"def run" in candidate_read_file(candidate=candidate, path="agent.py")
    lineage = candidate_lineage(candidate=populated)
    assert len(lineage) == 5 and len(lineage[0].parents) == 2


def test_restore_refuses_to_overwrite_a_repository_with_commits_unless_forced(
    populated, project, tmp_path
):
    store_backup(destination=tmp_path / "backup")
    with pytest.raises(HarnessStoreError, match="--force"):
        store_restore(source=tmp_path / "backup")
    (result,) = store_restore(source=tmp_path / "backup", force=True)
    assert result.replaced and repository_fsck(project=project).ok
    leftovers = [p.name for p in result.path.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_restore_refuses_a_damaged_bundle(populated, project, tmp_path, settings):
    manifest = store_backup(destination=tmp_path / "backup")
    bundle = tmp_path / "backup" / manifest.projects[0].bundle
    data = bytearray(bundle.read_bytes())
    data[-30] ^= 0xFF
    bundle.write_bytes(bytes(data))
    shutil.rmtree(settings.COEVO_HARNESS_STORE_DIR)
    with pytest.raises(HarnessStoreError, match="SHA-256"):
        store_restore(source=tmp_path / "backup")
    assert not repository_path(project=project).exists()


def test_backup_refuses_a_directory_that_holds_a_backup(populated, tmp_path):
    store_backup(destination=tmp_path / "backup")
    with pytest.raises(HarnessStoreError, match="already holds a backup"):
        store_backup(destination=tmp_path / "backup")


def test_a_project_without_commits_backs_up_as_empty(project, tmp_path):
    (entry,) = store_backup(destination=tmp_path / "backup").projects
    assert entry.bundle == "" and entry.refs == 0
    assert store_restore(source=tmp_path / "backup") == []


def test_repository_path_is_where_project_repo_keeps_it(project):
    assert repository_path(project=project) == project_repo(project=project).path


def test_fsck_passes_a_healthy_repository_and_records_it(populated, project):
    check = store_fsck(project=project)
    assert check.ok and "5 candidates present" in check.output
    assert store_check_latest() == [check]


def test_fsck_fails_a_repository_with_a_corrupt_object(seed_candidate, project):
    path = repository_path(project=project)
    loose = next(p for p in (path / "objects").glob("??/*"))
    loose.chmod(0o644)
    loose.write_bytes(b"not a git object")

    check = store_fsck(project=project)
    assert not check.ok and check.output
    assert StoreCheck.objects.get(project=project).ok is False


def test_fsck_fails_a_missing_repository_whose_candidates_are_in_the_database(
    seed_candidate, project
):
    shutil.rmtree(repository_path(project=project))
    result = repository_fsck(project=project)
    assert not result.ok and "restore" in result.output
    # Checking must not create an empty repository in its place.
    assert not repository_path(project=project).exists()


def test_fsck_fails_when_a_candidate_commit_is_missing_from_git(populated, project, tmp_path):
    other = project_get_or_create(slug="other", name="Other")
    # A repository restored from an older backup: valid, but without the newest commits.
    repo = project_repo(project=other)
    Candidate.objects.create(
        project=other,
        sha="0" * 39 + "1",
        tree_sha="0" * 40,
        message="gone",
        author_name="x",
        authored_at=populated.authored_at,
    )
    assert repo.path.exists()
    result = repository_fsck(project=other)
    assert not result.ok and "missing from the repository" in result.output


def test_fsck_keeps_the_last_checks_of_each_project(project, seed_candidate, monkeypatch):
    from harness_store import maintenance

    monkeypatch.setattr(maintenance, "STORE_CHECKS_KEPT", 3)
    for _ in range(5):
        store_fsck(project=project)
    assert StoreCheck.objects.filter(project=project).count() == 3


def test_the_commands_back_up_restore_and_check(populated, project, tmp_path, settings):
    out = StringIO()
    call_command("harness_backup", "--to", str(tmp_path / "b"), stdout=out)
    assert "demo: 7 refs" in out.getvalue()
    shutil.rmtree(settings.COEVO_HARNESS_STORE_DIR)

    out = StringIO()
    call_command("harness_restore", "--from", str(tmp_path / "b"), stdout=out)
    assert "demo: restored, 7 refs" in out.getvalue()
    with pytest.raises(CommandError, match="--force"):
        call_command("harness_restore", "--from", str(tmp_path / "b"), stdout=StringIO())

    out = StringIO()
    call_command("harness_fsck", stdout=out)
    assert "demo: ok" in out.getvalue()
    shutil.rmtree(repository_path(project=project))
    with pytest.raises(CommandError, match="1 of 1 repositories failed"):
        call_command("harness_fsck", stdout=StringIO())


def test_backup_defaults_to_a_timestamped_folder_in_the_backup_dir(populated, tmp_path, settings):
    settings.COEVO_BACKUP_DIR = tmp_path / "backups"
    call_command("harness_backup", stdout=StringIO())
    (folder,) = (tmp_path / "backups").iterdir()
    assert folder.name.startswith("harness-store-") and (folder / "manifest.json").exists()


def test_the_beat_job_records_a_check_per_project(populated, project, settings):
    from coevo.ops.tasks import harness_store_fsck

    harness_store_fsck.apply().get()
    assert [c.project for c in store_check_latest()] == [project]
    assert settings.CELERY_BEAT_SCHEDULE["harness-store-fsck"]["task"] == harness_store_fsck.name

"""Candidates: importing directories as commits, and reading them back by SHA."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from django.db import connection

from coevo.errors import HarnessStoreError, InvalidInput, NotFound
from coevo.projects.services import project_get_or_create
from harness_store.models import Candidate, CandidateOrigin
from harness_store.repo import CANDIDATE_REF_PREFIX
from harness_store.selectors import (
    candidate_diff,
    candidate_files,
    candidate_get,
    candidate_lineage,
    candidate_list,
    candidate_parent,
    candidate_read_file,
)
from harness_store.services import candidate_import_directory, project_repo
from tests.conftest import SEED_HARNESS


def _git(project, *args: str) -> str:
    git_dir = project_repo(project=project).path
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, check=True
    ).stdout


def _assert_fsck_clean(project) -> None:
    git_dir = project_repo(project=project).path
    result = subprocess.run(
        ["git", f"--git-dir={git_dir}", "fsck", "--full", "--strict"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", result.stdout
    assert "error" not in result.stderr.lower(), result.stderr


def _candidate_ref_shas(project) -> set[str]:
    out = _git(project, "for-each-ref", "--format=%(objectname)", CANDIDATE_REF_PREFIX)
    return set(out.split())


def _commit_count(project) -> int:
    return int(_git(project, "rev-list", "--all", "--count").strip())


def _copy_seed(tmp_path: Path, name: str = "harness") -> Path:
    return Path(shutil.copytree(SEED_HARNESS, tmp_path / name))


def _import(project, directory: Path, *, message: str = "An import", **kwargs):
    return candidate_import_directory(
        project=project,
        directory=directory,
        message=message,
        author_name=kwargs.pop("author_name", "Owner"),
        author_email=kwargs.pop("author_email", "owner@example.com"),
        **kwargs,
    )


def _edited_child(project, parent, tmp_path: Path, *, message: str = "Raise max_tokens"):
    directory = _copy_seed(tmp_path, "child")
    agent = directory / "agent.py"
    agent.write_text(agent.read_text() + "\n# tuned by the proposer\n")
    return _import(
        project, directory, message=message, parent=parent, origin=CandidateOrigin.PROPOSER
    )


# --- candidate_import_directory -----------------------------------------------------------


def test_it_imports_a_directory_as_a_commit_the_git_cli_reads(seed_candidate, project, owner):
    log = _git(
        project,
        "log",
        "--format=%H%x09%P%x09%an%x09%ae%x09%s",
        f"{CANDIDATE_REF_PREFIX}{seed_candidate.sha}",
    )

    assert log.splitlines() == [
        f"{seed_candidate.sha}\t\tOwner\towner@example.com\tSeed harness: plain completion"
    ]
    assert _candidate_ref_shas(project) == {seed_candidate.sha}
    _assert_fsck_clean(project)


def test_it_indexes_the_commit_in_the_database(seed_candidate, project, owner):
    candidate = Candidate.objects.get(project=project)

    assert candidate == seed_candidate
    assert candidate.sha == _git(project, "rev-parse", seed_candidate.sha).strip()
    assert candidate.tree_sha == _git(project, "rev-parse", f"{candidate.sha}^{{tree}}").strip()
    assert candidate.parent_shas == []
    assert candidate.parent_sha is None
    assert candidate.subject == "Seed harness: plain completion"
    assert (candidate.author_name, candidate.author_email) == ("Owner", "owner@example.com")
    assert candidate.origin == CandidateOrigin.IMPORT
    assert candidate.created_by == owner
    assert candidate.authored_at is not None


def test_it_imports_every_file_of_the_directory(seed_candidate):
    expected = sorted(
        p.relative_to(SEED_HARNESS).as_posix()
        for p in SEED_HARNESS.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )

    assert [entry.path for entry in candidate_files(candidate=seed_candidate)] == expected
    for path in expected:
        assert (
            candidate_read_file(candidate=seed_candidate, path=path)
            == (SEED_HARNESS / path).read_bytes()
        )


def test_it_gives_a_child_its_parent(seed_candidate, project, tmp_path):
    child, created = _edited_child(project, seed_candidate, tmp_path)

    assert created is True
    assert child.parent_shas == [seed_candidate.sha]
    assert child.origin == CandidateOrigin.PROPOSER
    log = _git(
        project, "log", "--format=%H%x09%P%x09%an%x09%s", f"{CANDIDATE_REF_PREFIX}{child.sha}"
    )
    assert log.splitlines() == [
        f"{child.sha}\t{seed_candidate.sha}\tOwner\tRaise max_tokens",
        f"{seed_candidate.sha}\t\tOwner\tSeed harness: plain completion",
    ]
    assert _candidate_ref_shas(project) == {seed_candidate.sha, child.sha}
    _assert_fsck_clean(project)


def test_it_returns_the_existing_candidate_for_identical_content(seed_candidate, project, tmp_path):
    commits_before = _commit_count(project)

    again, created = _import(project, _copy_seed(tmp_path), message="The same files again")

    assert created is False
    assert again.sha == seed_candidate.sha
    assert again.pk == seed_candidate.pk
    assert Candidate.objects.filter(project=project).count() == 1
    assert _commit_count(project) == commits_before
    assert _candidate_ref_shas(project) == {seed_candidate.sha}


def test_it_returns_the_existing_candidate_when_only_bytecode_differs(
    seed_candidate, project, tmp_path
):
    directory = _copy_seed(tmp_path)
    (directory / "__pycache__").mkdir()
    (directory / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\x00compiled")
    (directory / "agent.pyc").write_bytes(b"\x00compiled")

    again, created = _import(project, directory)

    assert (created, again.sha) == (False, seed_candidate.sha)


def test_it_leaves_bytecode_out_of_an_import(project, tmp_path):
    directory = _copy_seed(tmp_path)
    (directory / "__pycache__").mkdir()
    (directory / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\x00compiled")
    (directory / "stale.pyc").write_bytes(b"\x00compiled")

    candidate, _ = _import(project, directory)

    paths = [entry.path for entry in candidate_files(candidate=candidate)]
    assert paths == ["agent.py", "harness.toml"]
    assert _git(project, "ls-tree", "-r", "--name-only", candidate.sha).split() == paths


def test_it_keeps_the_same_content_apart_in_two_projects(seed_candidate, project, tmp_path):
    other = project_get_or_create(slug="other", name="Other agent")

    theirs, created = _import(other, _copy_seed(tmp_path))

    assert created is True
    assert theirs.project == other
    assert theirs.pk != seed_candidate.pk
    assert project_repo(project=other).path != project_repo(project=project).path


def test_it_refuses_an_empty_directory(project, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()

    with pytest.raises(HarnessStoreError):
        _import(project, empty)

    assert not Candidate.objects.filter(project=project).exists()


def test_it_refuses_a_directory_whose_manifest_is_invalid(project, tmp_path):
    from coevo.errors import InvalidManifest

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "agent.py").write_text("def run(task, ctx):\n    return ''\n")
    (broken / "harness.toml").write_text('[harness]\nname = "broken"\n')

    with pytest.raises(InvalidManifest, match="entrypoint"):
        _import(project, broken)

    assert not Candidate.objects.filter(project=project).exists()


def test_it_refuses_a_directory_that_does_not_exist(project, tmp_path):
    with pytest.raises(HarnessStoreError):
        _import(project, tmp_path / "missing")


@pytest.mark.parametrize("message", ["", "   \n\t"])
def test_it_refuses_an_import_without_a_message(project, tmp_path, message):
    with pytest.raises(InvalidInput, match="message"):
        _import(project, _copy_seed(tmp_path), message=message)

    assert not Candidate.objects.filter(project=project).exists()


def test_it_refuses_a_parent_from_another_project(seed_candidate, tmp_path):
    other = project_get_or_create(slug="other", name="Other agent")

    with pytest.raises(InvalidInput, match="another project"):
        _edited_child(other, seed_candidate, tmp_path)

    assert not Candidate.objects.filter(project=other).exists()


# --- selectors ----------------------------------------------------------------------------


def test_it_gets_a_candidate_by_full_sha(seed_candidate, project):
    assert candidate_get(project=project, sha=seed_candidate.sha) == seed_candidate


@pytest.mark.parametrize("length", [4, 7, 12, 39])
def test_it_gets_a_candidate_by_a_sha_prefix(seed_candidate, project, length):
    assert candidate_get(project=project, sha=seed_candidate.sha[:length]) == seed_candidate


def test_it_gets_a_candidate_by_an_upper_case_prefix(seed_candidate, project):
    assert candidate_get(project=project, sha=seed_candidate.sha[:10].upper()) == seed_candidate


def test_it_refuses_a_prefix_shorter_than_four_characters(seed_candidate, project):
    with pytest.raises(NotFound, match="at least 4"):
        candidate_get(project=project, sha=seed_candidate.sha[:3])


def test_it_raises_not_found_for_an_unknown_sha(seed_candidate, project):
    unknown = "0" * 40 if not seed_candidate.sha.startswith("0") else "f" * 40

    with pytest.raises(NotFound):
        candidate_get(project=project, sha=unknown)


def test_it_raises_not_found_for_another_projects_candidate(seed_candidate):
    other = project_get_or_create(slug="other", name="Other agent")

    with pytest.raises(NotFound):
        candidate_get(project=other, sha=seed_candidate.sha)


def test_it_refuses_an_ambiguous_prefix(project, seed_candidate):
    for suffix in ("1", "2"):
        Candidate.objects.create(
            project=project,
            sha="abcd" + suffix * 36,
            tree_sha=seed_candidate.tree_sha,
            message="fake",
            author_name="Owner",
            authored_at=seed_candidate.authored_at,
        )

    with pytest.raises(NotFound, match="ambiguous"):
        candidate_get(project=project, sha="abcd")
    assert candidate_get(project=project, sha="abcd1").sha == "abcd" + "1" * 36


def test_it_lists_only_the_projects_candidates(seed_candidate, project, tmp_path):
    other = project_get_or_create(slug="other", name="Other agent")
    _import(other, _copy_seed(tmp_path))

    assert list(candidate_list(project=project)) == [seed_candidate]


def test_it_raises_not_found_for_an_unknown_file(seed_candidate):
    with pytest.raises(NotFound):
        candidate_read_file(candidate=seed_candidate, path="missing.py")


def test_it_diffs_a_child_against_its_parent(seed_candidate, project, tmp_path):
    directory = _copy_seed(tmp_path, "child")
    toml = directory / "harness.toml"
    toml.write_text(toml.read_text().replace("default = 192", "default = 384"))
    child, _ = _import(project, directory, parent=seed_candidate)

    diff = candidate_diff(candidate=child, base=seed_candidate)

    assert "--- a/harness.toml\n+++ b/harness.toml" in diff
    assert "\n-default = 192\n+default = 384" in diff
    assert "agent.py" not in diff


def test_it_diffs_against_the_empty_tree_without_a_base(seed_candidate):
    diff = candidate_diff(candidate=seed_candidate, base=None)

    assert "--- /dev/null\n+++ b/agent.py" in diff
    assert "--- /dev/null\n+++ b/harness.toml" in diff
    assert '\n+entrypoint = "agent:run"' in diff
    removed = [
        line for line in diff.splitlines() if line.startswith("-") and line != "--- /dev/null"
    ]
    assert removed == []


def test_it_finds_a_candidates_parent(seed_candidate, project, tmp_path):
    child, _ = _edited_child(project, seed_candidate, tmp_path)

    assert candidate_parent(candidate=child) == seed_candidate
    assert candidate_parent(candidate=seed_candidate) is None


def test_it_lists_the_lineage_from_newest_to_the_seed(seed_candidate, project, tmp_path):
    child, _ = _edited_child(project, seed_candidate, tmp_path)
    directory = _copy_seed(tmp_path, "grandchild")
    (directory / "notes.md").write_text("third generation\n")
    grandchild, _ = _import(project, directory, parent=child, message="Add notes")

    lineage = candidate_lineage(candidate=grandchild)

    assert [info.sha for info in lineage] == [grandchild.sha, child.sha, seed_candidate.sha]
    assert [info.message.strip() for info in lineage] == [
        "Add notes",
        "Raise max_tokens",
        "Seed harness: plain completion",
    ]
    assert [info.sha for info in candidate_lineage(candidate=grandchild, max_count=1)] == [
        grandchild.sha
    ]


# --- concurrency --------------------------------------------------------------------------


def _threads(count: int, target) -> tuple[dict[int, tuple[Candidate, bool]], list[Exception]]:
    barrier = threading.Barrier(count)
    results: dict[int, tuple[Candidate, bool]] = {}
    errors: list[Exception] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = target(i)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not [t for t in threads if t.is_alive()], "an import never finished"
    return results, errors


def test_it_keeps_every_import_when_threads_import_at_once(transactional_db, project, tmp_path):
    dirs = []
    for i in range(8):
        directory = _copy_seed(tmp_path, f"harness-{i}")
        (directory / f"variant_{i}.py").write_text(f"VARIANT = {i}\n")
        dirs.append(directory)

    results, errors = _threads(8, lambda i: _import(project, dirs[i], message=f"Variant {i}"))

    assert errors == []
    assert all(created for _, created in results.values())
    shas = {candidate.sha for candidate, _ in results.values()}
    assert len(shas) == 8
    assert set(Candidate.objects.filter(project=project).values_list("sha", flat=True)) == shas
    assert _candidate_ref_shas(project) == shas
    for i, (candidate, _) in results.items():
        assert candidate_read_file(candidate=candidate, path=f"variant_{i}.py") == (
            f"VARIANT = {i}\n".encode()
        )
    _assert_fsck_clean(project)


def test_it_makes_one_candidate_when_threads_import_the_same_content(
    transactional_db, project, tmp_path
):
    dirs = [_copy_seed(tmp_path, f"copy-{i}") for i in range(8)]

    results, errors = _threads(8, lambda i: _import(project, dirs[i], message=f"Copy {i}"))

    assert errors == []
    assert sorted(created for _, created in results.values()) == [False] * 7 + [True]
    assert len({candidate.sha for candidate, _ in results.values()}) == 1
    assert Candidate.objects.filter(project=project).count() == 1
    assert _commit_count(project) == 1
    _assert_fsck_clean(project)


def test_it_exports_a_candidate_from_its_database_snapshot_alone(
    project, seed_candidate, settings, tmp_path
):
    import shutil

    from harness_store.models import TreeSnapshot
    from harness_store.selectors import candidate_export

    assert TreeSnapshot.objects.filter(project=project, tree_sha=seed_candidate.tree_sha).exists()
    shutil.rmtree(settings.COEVO_HARNESS_STORE_DIR)
    destination = tmp_path / "out"
    destination.mkdir()

    candidate_export(candidate=seed_candidate, destination=destination)

    assert sorted(p.name for p in destination.iterdir()) == ["agent.py", "harness.toml"]
    assert (destination / "agent.py").read_text() == (SEED_HARNESS / "agent.py").read_text()

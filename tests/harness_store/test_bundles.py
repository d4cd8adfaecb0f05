"""Importing candidates from git bundles: the SHAs in coevo are the SHAs in the user's repository.

Every test builds a real user repository with the ``git`` CLI and imports real bundles of it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from django.db import connection

from coevo.errors import InvalidBundle, MissingPrerequisites, PayloadTooLarge
from coevo.projects.services import project_get_or_create
from harness_store.models import Candidate, CandidateOrigin, TreeSnapshot
from harness_store.repo import CANDIDATE_REF_PREFIX, HarnessRepo
from harness_store.repo_bundles import read_bundle_header
from harness_store.selectors import candidate_read_file, candidate_shas_known
from harness_store.services import candidate_import_bundle, project_repo
from tests.conftest import SEED_HARNESS

_IDENTITY = ["-c", "user.name=Dev", "-c", "user.email=dev@example.com"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def _commit(work: Path, message: str, files: dict[str, str]) -> str:
    for name, content in files.items():
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    _git(work, "add", "--all")
    _git(work, "commit", "--quiet", "-m", message)
    return _git(work, "rev-parse", "HEAD").strip()


@pytest.fixture
def user_repo(tmp_path) -> dict[str, str | Path]:
    """A user's harness repository: main with a feature branch merged back (--no-ff).

    c1 -- c2 -- c4 -- merge
            \\          /
             c3 ------
    """
    work = tmp_path / "user"
    shutil.copytree(SEED_HARNESS, work)
    _git(work, "init", "--quiet", "--initial-branch=main")
    c1 = _commit(work, "Seed", {})
    c2 = _commit(work, "Tune the prompt", {"prompts/system.txt": "Be brief.\n"})
    _git(work, "checkout", "--quiet", "-b", "feature")
    c3 = _commit(work, "Add a helper", {"tools/helper.py": "def helper():\n    return 1\n"})
    _git(work, "checkout", "--quiet", "main")
    c4 = _commit(work, "Longer prompt", {"prompts/system.txt": "Be brief and exact.\n"})
    _git(work, "merge", "--quiet", "--no-ff", "-m", "Merge feature", "feature")
    merge = _git(work, "rev-parse", "HEAD").strip()
    _git(work, "branch", "before-merge", c4)
    return {"work": work, "c1": c1, "c2": c2, "c3": c3, "c4": c4, "merge": merge}


def _bundle(work: Path, tmp_path: Path, *revs: str) -> bytes:
    path = tmp_path / f"b{len(list(tmp_path.glob('*.bundle')))}.bundle"
    _git(work, "bundle", "create", "--quiet", str(path), *revs)
    return path.read_bytes()


def _store_git(project, *args: str) -> str:
    git_dir = project_repo(project=project).path
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, check=True
    ).stdout


def _refs(project) -> list[str]:
    return _store_git(project, "for-each-ref", "--format=%(refname)").split()


def _candidate_shas(project) -> set[str]:
    return set(Candidate.objects.filter(project=project).values_list("sha", flat=True))


def _assert_nothing_imported(project) -> None:
    assert Candidate.objects.filter(project=project).count() == 0
    assert TreeSnapshot.objects.filter(project=project).count() == 0
    assert _refs(project) == []


def _assert_fsck_clean(project) -> None:
    git_dir = project_repo(project=project).path
    result = subprocess.run(
        ["git", f"--git-dir={git_dir}", "fsck", "--full", "--strict", "--no-dangling"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


# --- the SHA-preserving import ------------------------------------------------------------


def test_it_imports_a_history_with_a_merge_keeping_every_sha(project, owner, user_repo, tmp_path):
    work = user_repo["work"]
    bundle = _bundle(work, tmp_path, "main")

    candidate, created = candidate_import_bundle(
        project=project, bundle=bundle, ref="main", created_by=owner
    )

    assert created is True
    assert candidate.sha == user_repo["merge"]
    user_shas = set(_git(work, "rev-list", "main").split())
    assert len(user_shas) == 5
    assert _candidate_shas(project) == user_shas
    for sha in user_shas:
        row = Candidate.objects.get(project=project, sha=sha)
        assert row.parent_shas == _git(work, "rev-list", "--parents", "-n1", sha).split()[1:]
        assert row.tree_sha == _git(work, "rev-parse", f"{sha}^{{tree}}").strip()
        assert row.message.strip() == _git(work, "log", "-1", "--format=%B", sha).strip()
        assert (row.author_name, row.author_email) == ("Dev", "dev@example.com")
        assert row.origin == CandidateOrigin.CI
        assert row.created_by == owner
    merge = Candidate.objects.get(project=project, sha=user_repo["merge"])
    assert merge.parent_shas == [user_repo["c4"], user_repo["c3"]]
    assert candidate_read_file(candidate=merge, path="tools/helper.py") == (
        (work / "tools/helper.py").read_bytes()
    )
    assert candidate_read_file(candidate=merge, path="prompts/system.txt") == (
        b"Be brief and exact.\n"
    )
    # Every commit is kept reachable under its own ref; the quarantine refs are gone.
    assert sorted(_refs(project)) == sorted(f"{CANDIDATE_REF_PREFIX}{sha}" for sha in user_shas)
    assert TreeSnapshot.objects.filter(project=project).count() == 5
    _assert_fsck_clean(project)


def test_it_imports_only_the_new_commits_of_a_thin_bundle(project, user_repo, tmp_path):
    work = user_repo["work"]
    candidate_import_bundle(project=project, bundle=_bundle(work, tmp_path, "main"), ref="main")
    c5 = _commit(work, "Five", {"agent.py": "# five\n"})
    c6 = _commit(work, "Six", {"agent.py": "# six\n"})
    # What the CLI does: ask which commits the server knows, bundle only the rest.
    known = candidate_shas_known(project=project, shas=_git(work, "rev-list", "HEAD").split())
    assert known == [user_repo[k] for k in ("merge", "c4", "c3", "c2", "c1")]
    thin = _bundle(work, tmp_path, "HEAD", "--not", *known)

    candidate, created = candidate_import_bundle(project=project, bundle=thin, ref="HEAD")

    assert (candidate.sha, created) == (c6, True)
    assert Candidate.objects.filter(project=project).count() == 7
    assert Candidate.objects.get(project=project, sha=c5).parent_shas == [user_repo["merge"]]
    assert Candidate.objects.get(project=project, sha=c6).parent_shas == [c5]
    assert candidate_read_file(candidate=candidate, path="agent.py") == b"# six\n"
    _assert_fsck_clean(project)


def test_it_imports_a_commit_named_by_sha_inside_the_bundle(project, user_repo, tmp_path):
    bundle = _bundle(user_repo["work"], tmp_path, "main")

    candidate, created = candidate_import_bundle(
        project=project, bundle=bundle, ref=user_repo["c3"]
    )

    assert (candidate.sha, created) == (user_repo["c3"], True)
    # Only c3 and its ancestry: the rest of the bundle is not a candidate.
    assert _candidate_shas(project) == {user_repo["c1"], user_repo["c2"], user_repo["c3"]}
    assert not [ref for ref in _refs(project) if "quarantine" in ref]


def test_it_returns_the_existing_candidate_for_a_sha_it_has(project, user_repo, tmp_path):
    bundle = _bundle(user_repo["work"], tmp_path, "main")
    first, _ = candidate_import_bundle(project=project, bundle=bundle, ref="main")
    refs = _refs(project)

    by_sha = candidate_import_bundle(project=project, bundle=bundle, ref=user_repo["merge"])
    by_name = candidate_import_bundle(project=project, bundle=bundle, ref="refs/heads/main")

    assert by_sha == (first, False)
    assert by_name == (first, False)
    assert Candidate.objects.filter(project=project).count() == 5
    assert _refs(project) == refs


def test_it_imports_a_commit_without_a_valid_manifest_as_is(project, tmp_path):
    work = tmp_path / "broken"
    work.mkdir()
    _git(work, "init", "--quiet", "--initial-branch=main")
    sha = _commit(work, "Not a harness yet", {"README.md": "todo\n"})

    candidate, created = candidate_import_bundle(
        project=project, bundle=_bundle(work, tmp_path, "main"), ref="main"
    )

    assert (candidate.sha, created) == (sha, True)


def test_it_round_trips_a_bundle_the_store_creates(project, user_repo, tmp_path):
    candidate_import_bundle(
        project=project, bundle=_bundle(user_repo["work"], tmp_path, "main"), ref="main"
    )
    other = project_get_or_create(slug="backup", name="Backup")
    path = tmp_path / "export.bundle"
    project_repo(project=project).bundle_create(path, user_repo["merge"], exclude=[])

    candidate, created = candidate_import_bundle(
        project=other, bundle=path.read_bytes(), ref=user_repo["merge"]
    )

    assert (candidate.sha, created) == (user_repo["merge"], True)
    assert _candidate_shas(other) == _candidate_shas(project)
    # The temporary export ref does not outlive the export.
    assert not [ref for ref in _refs(project) if "export" in ref]
    # A thin export carries only what the excluded commits do not reach.
    thin = tmp_path / "thin.bundle"
    project_repo(project=project).bundle_create(thin, user_repo["merge"], exclude=[user_repo["c4"]])
    header = read_bundle_header(thin)
    assert set(header.prerequisites) == {user_repo["c4"], user_repo["c2"]}
    assert header.refs == ((user_repo["merge"], f"refs/coevo/export/{user_repo['merge']}"),)


# --- bad input: a clear error and nothing imported ----------------------------------------


def test_it_refuses_garbage_that_is_not_a_bundle(project):
    with pytest.raises(InvalidBundle, match="not a git bundle"):
        candidate_import_bundle(project=project, bundle=b"PK\x03\x04 not a bundle", ref="HEAD")
    _assert_nothing_imported(project)


def test_it_refuses_a_truncated_bundle(project, user_repo, tmp_path):
    bundle = _bundle(user_repo["work"], tmp_path, "main")

    with pytest.raises(InvalidBundle, match="corrupt or incomplete"):
        candidate_import_bundle(project=project, bundle=bundle[: len(bundle) // 2], ref="main")
    _assert_nothing_imported(project)


def test_it_refuses_a_bundle_whose_pack_is_garbled(project, user_repo, tmp_path):
    bundle = bytearray(_bundle(user_repo["work"], tmp_path, "main"))
    pack = bundle.index(b"PACK")
    bundle[pack + 40 : pack + 80] = b"\xff" * 40

    with pytest.raises(InvalidBundle):
        candidate_import_bundle(project=project, bundle=bytes(bundle), ref="main")
    _assert_nothing_imported(project)


def test_it_refuses_a_bundle_with_a_malformed_commit_object(project, tmp_path):
    # git itself accepts this commit (hash-object --literally); transfer.fsckObjects would not.
    work = tmp_path / "bad"
    work.mkdir()
    _git(work, "init", "--quiet", "--initial-branch=main")
    tree = _git(work, "write-tree").strip()
    raw = f"tree {tree}\nauthor Dev <dev@example.com> not-a-date\n"
    raw += "committer Dev <dev@example.com> 1700000000 +0000\n\nBad date\n"
    sha = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--literally", "--stdin"],
        cwd=work,
        input=raw,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    _git(work, "update-ref", "refs/heads/main", sha)

    with pytest.raises(InvalidBundle, match="badDate"):
        candidate_import_bundle(project=project, bundle=_bundle(work, tmp_path, "main"), ref="main")
    _assert_nothing_imported(project)


def test_it_refuses_a_thin_bundle_that_hides_its_prerequisites(project, user_repo, tmp_path):
    thin = _bundle(user_repo["work"], tmp_path, "main", "--not", user_repo["c4"])
    header_end = thin.index(b"\n\n")
    lines = thin[:header_end].split(b"\n")
    forged = b"\n".join(line for line in lines if not line.startswith(b"-"))
    forged += thin[header_end:]

    with pytest.raises(InvalidBundle, match="corrupt or incomplete"):
        candidate_import_bundle(project=project, bundle=forged, ref="main")
    _assert_nothing_imported(project)


def test_it_names_the_prerequisites_the_server_lacks(project, user_repo, tmp_path):
    work = user_repo["work"]
    thin = _bundle(work, tmp_path, "main", "--not", user_repo["c4"], user_repo["c3"])

    with pytest.raises(MissingPrerequisites) as raised:
        candidate_import_bundle(project=project, bundle=thin, ref="main")

    assert sorted(raised.value.missing) == sorted([user_repo["c4"], user_repo["c3"]])
    assert "without excluding them" in str(raised.value)
    _assert_nothing_imported(project)


@pytest.mark.parametrize("ref", ["release", "refs/heads/feature", "c3-sha", "unknown-sha"])
def test_it_refuses_a_ref_the_bundle_does_not_carry(project, user_repo, tmp_path, ref):
    work = user_repo["work"]
    # The bundle holds c1, c2, c4 only: neither c3 (feature) nor a made-up commit.
    bundle = _bundle(work, tmp_path, "before-merge")
    ref = {"c3-sha": user_repo["c3"], "unknown-sha": "ab" * 20}.get(ref, ref)

    with pytest.raises(InvalidBundle):
        candidate_import_bundle(project=project, bundle=bundle, ref=ref)
    _assert_nothing_imported(project)


def test_it_refuses_a_bundle_above_the_size_limit(project, user_repo, tmp_path, settings):
    bundle = _bundle(user_repo["work"], tmp_path, "main")
    settings.COEVO_MAX_BUNDLE_BYTES = len(bundle) - 1

    with pytest.raises(PayloadTooLarge):
        candidate_import_bundle(project=project, bundle=bundle, ref="main")
    _assert_nothing_imported(project)


def test_it_refuses_a_bundle_whose_commit_unpacks_past_the_byte_limit(
    project, user_repo, tmp_path, settings
):
    # A few KiB of bundle carry megabytes of file (git compresses it); the commit after
    # deletes the file again, but the one that added it would still become a candidate.
    settings.COEVO_MAX_ARCHIVE_BYTES = 1024 * 1024
    work = user_repo["work"]
    big = _commit(work, "Add weights", {"weights.txt": "0" * (3 * 1024 * 1024)})
    (work / "weights.txt").unlink()
    _commit(work, "Drop weights", {})
    bundle = _bundle(work, tmp_path, "main")
    assert len(bundle) < 64 * 1024

    with pytest.raises(PayloadTooLarge, match=f"Commit {big[:12]} .* more than 1048576 bytes"):
        candidate_import_bundle(project=project, bundle=bundle, ref="main")

    _assert_nothing_imported(project)


def test_it_refuses_a_bundle_whose_commit_has_more_files_than_the_limit(
    project, user_repo, tmp_path, settings
):
    settings.COEVO_MAX_ARCHIVE_FILES = 8
    work = user_repo["work"]
    many = _commit(work, "Add data", {f"data/{i}.txt": f"{i}\n" for i in range(8)})
    bundle = _bundle(work, tmp_path, "main")

    with pytest.raises(PayloadTooLarge, match=f"Commit {many[:12]} .* more than 8 files"):
        candidate_import_bundle(project=project, bundle=bundle, ref="main")

    _assert_nothing_imported(project)
    # Its ancestors alone are within the limits and import (the refused objects dangle).
    candidate, created = candidate_import_bundle(
        project=project, bundle=bundle, ref=user_repo["c4"]
    )
    assert (candidate.sha, created) == (user_repo["c4"], True)


def test_it_accepts_a_bundle_at_exactly_the_limits(project, user_repo, tmp_path, settings):
    work = user_repo["work"]
    files = _git(work, "ls-tree", "-r", "-l", "main").splitlines()
    settings.COEVO_MAX_ARCHIVE_FILES = len(files)
    settings.COEVO_MAX_ARCHIVE_BYTES = sum(int(line.split()[3]) for line in files)

    candidate, created = candidate_import_bundle(
        project=project, bundle=_bundle(work, tmp_path, "main"), ref="main"
    )

    assert (candidate.sha, created) == (user_repo["merge"], True)


def test_it_leaves_no_row_and_no_ref_when_indexing_fails_halfway(
    project, user_repo, tmp_path, monkeypatch
):
    bundle = _bundle(user_repo["work"], tmp_path, "main")

    def fail(self, shas):
        raise RuntimeError("disk full")

    monkeypatch.setattr(HarnessRepo, "keep_many", fail)
    with pytest.raises(RuntimeError):
        candidate_import_bundle(project=project, bundle=bundle, ref="main")

    _assert_nothing_imported(project)
    monkeypatch.undo()
    # The same bundle imports cleanly afterwards (its objects are already there).
    candidate, created = candidate_import_bundle(project=project, bundle=bundle, ref="main")
    assert (candidate.sha, created) == (user_repo["merge"], True)
    assert Candidate.objects.filter(project=project).count() == 5


def test_it_reindexes_ancestors_whose_refs_outlived_their_rows(project, user_repo, tmp_path):
    work = user_repo["work"]
    candidate_import_bundle(
        project=project, bundle=_bundle(work, tmp_path, "before-merge"), ref="before-merge"
    )
    # As if an outer transaction rolled back after the refs were kept.
    Candidate.objects.filter(project=project).delete()
    assert len(_refs(project)) == 3

    candidate_import_bundle(project=project, bundle=_bundle(work, tmp_path, "main"), ref="main")

    assert _candidate_shas(project) == set(_git(work, "rev-list", "main").split())


# --- known SHAs -----------------------------------------------------------------------------


def test_it_lists_known_shas_in_the_order_asked_ignoring_malformed_ones(
    project, user_repo, tmp_path
):
    work = user_repo["work"]
    candidate_import_bundle(
        project=project, bundle=_bundle(work, tmp_path, "before-merge"), ref="before-merge"
    )
    other = project_get_or_create(slug="other", name="Other")

    asked = [
        user_repo["merge"],
        user_repo["c1"],
        "not-a-sha",
        user_repo["c4"][:12],
        user_repo["c4"].upper(),
        user_repo["c2"],
        user_repo["c1"],
    ]

    assert candidate_shas_known(project=project, shas=asked) == [
        user_repo["c1"],
        user_repo["c4"],
        user_repo["c2"],
    ]
    assert candidate_shas_known(project=other, shas=asked) == []


# --- concurrency ----------------------------------------------------------------------------


def test_it_imports_overlapping_bundles_at_once_without_duplicates(
    transactional_db, project, user_repo, tmp_path
):
    work = user_repo["work"]
    bundles = [
        (_bundle(work, tmp_path, "main"), "main"),
        (_bundle(work, tmp_path, "feature"), "feature"),
        (_bundle(work, tmp_path, "before-merge"), "before-merge"),
        (_bundle(work, tmp_path, "main"), user_repo["merge"]),
    ]
    barrier = threading.Barrier(len(bundles))
    results: dict[int, tuple[Candidate, bool]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            bundle, ref = bundles[i]
            results[i] = candidate_import_bundle(project=project, bundle=bundle, ref=ref)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bundles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert [results[i][0].sha for i in range(4)] == [
        user_repo["merge"],
        user_repo["c3"],
        user_repo["c4"],
        user_repo["merge"],
    ]
    # The two imports of the merge: exactly one created it.
    assert sorted([results[0][1], results[3][1]]) == [False, True]
    shas = list(Candidate.objects.filter(project=project).values_list("sha", flat=True))
    assert sorted(shas) == sorted(set(_git(work, "rev-list", "main").split()))
    assert len([r for r in _refs(project) if r.startswith(CANDIDATE_REF_PREFIX)]) == 5
    assert not [ref for ref in _refs(project) if "quarantine" in ref]
    _assert_fsck_clean(project)

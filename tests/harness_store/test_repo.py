"""HarnessRepo: a bare git repository that the ``git`` CLI must be able to read at all times."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from coevo.errors import CoevoError, HarnessStoreError, NotFound
from harness_store.repo import CANDIDATE_REF_PREFIX, HarnessRepo

REPO_ROOT = Path(__file__).resolve().parents[2]
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _write(directory: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return directory


def _git(repo: HarnessRepo | Path, *args: str) -> str:
    git_dir = repo.path if isinstance(repo, HarnessRepo) else repo
    completed = subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, check=True
    )
    return completed.stdout


def _fsck(repo: HarnessRepo | Path) -> subprocess.CompletedProcess[str]:
    git_dir = repo.path if isinstance(repo, HarnessRepo) else repo
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "fsck", "--full", "--strict"],
        capture_output=True,
        text=True,
    )


def _assert_fsck_clean(repo: HarnessRepo | Path) -> None:
    result = _fsck(repo)
    assert result.returncode == 0, result.stderr
    # Nothing dangling or broken: every object coevo wrote is reachable from a ref.
    assert result.stdout.strip() == "", result.stdout
    assert "error" not in result.stderr.lower(), result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr


def _candidate_refs(repo: HarnessRepo | Path) -> dict[str, str]:
    out = _git(repo, "for-each-ref", "--format=%(refname)%09%(objectname)", CANDIDATE_REF_PREFIX)
    return dict(line.split("\t") for line in out.splitlines())


@pytest.fixture
def repo(tmp_path) -> HarnessRepo:
    return HarnessRepo.open_or_init(tmp_path / "store" / "project.git")


@pytest.fixture
def harness_dir(tmp_path) -> Path:
    return _write(
        tmp_path / "harness",
        {
            "agent.py": "def run(task):\n    return 'v1'\n",
            "harness.toml": '[harness]\nname = "h"\nentrypoint = "agent:run"\n',
            "lib/util.py": "HELPER = 1\n",
        },
    )


def _commit(repo: HarnessRepo, directory: Path, *, parents=(), message="Import") -> str:
    return repo.commit_directory(
        directory,
        parents=list(parents),
        message=message,
        author_name="Ada Lovelace",
        author_email="ada@example.com",
    )


# --- open_or_init -------------------------------------------------------------------------


def test_it_creates_a_bare_repository_that_git_recognises(tmp_path):
    path = tmp_path / "nested" / "dirs" / "p.git"

    HarnessRepo.open_or_init(path)

    assert _git(path, "rev-parse", "--is-bare-repository").strip() == "true"
    assert (path / "info" / "exclude").read_text().count("__pycache__/") == 1
    _assert_fsck_clean(path)


def test_it_reopens_an_existing_repository_without_losing_commits(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    reopened = HarnessRepo.open_or_init(repo.path)

    assert reopened.commit_info(sha).sha == sha
    assert _candidate_refs(reopened) == {f"{CANDIDATE_REF_PREFIX}{sha}": sha}


# --- writing ------------------------------------------------------------------------------


def test_it_writes_a_directory_as_a_tree_equal_to_gits_own(repo, harness_dir, tmp_path):
    tree_sha = repo.tree_of_directory(harness_dir)

    # The same content committed with plain git in a fresh repository has the same tree id.
    scratch = tmp_path / "scratch"
    subprocess.run(["git", "init", "-q", str(scratch)], check=True)
    _write(
        scratch,
        {p.relative_to(harness_dir).as_posix(): p.read_bytes() for p in _files(harness_dir)},
    )
    subprocess.run(["git", "-C", str(scratch), "add", "--all"], check=True)
    expected = subprocess.run(
        ["git", "-C", str(scratch), "write-tree"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert tree_sha == expected


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def test_it_leaves_bytecode_out_of_the_tree(repo, harness_dir):
    _write(
        harness_dir,
        {
            "__pycache__/agent.cpython-311.pyc": b"\x00junk",
            "lib/__pycache__/util.cpython-311.pyc": b"\x00junk",
            "lib/stale.pyc": b"\x00junk",
            "lib/stale.pyo": b"\x00junk",
            ".DS_Store": b"\x00junk",
        },
    )

    sha = _commit(repo, harness_dir)

    paths = [entry.path for entry in repo.list_tree(sha)]
    assert paths == ["agent.py", "harness.toml", "lib/util.py"]
    assert _git(repo, "ls-tree", "-r", "--name-only", sha).split() == paths


def test_it_gives_the_same_tree_with_or_without_bytecode(repo, harness_dir):
    before = repo.tree_of_directory(harness_dir)
    _write(harness_dir, {"__pycache__/agent.cpython-311.pyc": b"\x00junk"})

    assert repo.tree_of_directory(harness_dir) == before


def test_it_honours_the_directorys_own_gitignore(repo, harness_dir):
    _write(harness_dir, {".gitignore": "secrets.env\n", "secrets.env": "TOKEN=1\n"})

    paths = [entry.path for entry in repo.list_tree(_commit(repo, harness_dir))]

    assert "secrets.env" not in paths
    assert ".gitignore" in paths


def test_it_imports_a_directory_that_is_itself_a_git_checkout(repo, harness_dir):
    subprocess.run(["git", "init", "-q", str(harness_dir)], check=True)

    paths = [entry.path for entry in repo.list_tree(_commit(repo, harness_dir))]

    assert paths == ["agent.py", "harness.toml", "lib/util.py"]


def test_it_keeps_the_executable_bit(repo, harness_dir):
    script = _write(harness_dir, {"run.sh": "#!/bin/sh\necho hi\n"}) / "run.sh"
    script.chmod(0o755)

    entries = {entry.path: entry for entry in repo.list_tree(_commit(repo, harness_dir))}

    assert entries["run.sh"].mode == 0o100755
    assert entries["agent.py"].mode == 0o100644


def test_it_reads_a_directory_given_by_a_relative_path(repo, harness_dir, monkeypatch):
    monkeypatch.chdir(harness_dir.parent)

    assert repo.tree_of_directory(Path(harness_dir.name)) == repo.tree_of_directory(harness_dir)


def test_it_refuses_an_empty_directory(repo, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()

    with pytest.raises(HarnessStoreError, match="no files"):
        repo.tree_of_directory(empty)


def test_it_refuses_a_directory_holding_only_bytecode(repo, tmp_path):
    only_cache = _write(tmp_path / "cache", {"__pycache__/a.cpython-311.pyc": b"\x00"})

    with pytest.raises(HarnessStoreError, match="no files"):
        repo.tree_of_directory(only_cache)


def test_it_refuses_a_path_that_is_not_a_directory(repo, harness_dir, tmp_path):
    with pytest.raises(HarnessStoreError, match="not a directory"):
        repo.tree_of_directory(tmp_path / "missing")
    with pytest.raises(HarnessStoreError, match="not a directory"):
        repo.tree_of_directory(harness_dir / "agent.py")


def test_it_commits_a_tree_that_git_reads_back_with_author_and_message(repo, harness_dir):
    tree_sha = repo.tree_of_directory(harness_dir)

    sha = repo.commit_tree(
        tree_sha=tree_sha,
        parents=[],
        message="First harness\n\nWith a body.",
        author_name="Ada Lovelace",
        author_email="ada@example.com",
    )

    fields = _git(repo, "log", "-1", "--format=%H%x09%T%x09%P%x09%an%x09%ae%x09%cn%x09%s", sha)
    assert fields.rstrip("\n").split("\t") == [
        sha,
        tree_sha,
        "",
        "Ada Lovelace",
        "ada@example.com",
        "coevo",
        "First harness",
    ]
    assert _git(repo, "log", "-1", "--format=%b", sha).strip() == "With a body."
    assert _candidate_refs(repo) == {f"{CANDIDATE_REF_PREFIX}{sha}": sha}
    _assert_fsck_clean(repo)


def test_it_records_the_given_author_date(repo, harness_dir):
    when = datetime(2024, 3, 1, 12, 30, tzinfo=UTC)

    sha = repo.commit_tree(
        tree_sha=repo.tree_of_directory(harness_dir),
        parents=[],
        message="Dated",
        author_name="Ada",
        author_email="ada@example.com",
        authored_at=when,
    )

    assert repo.commit_info(sha).authored_at == when
    assert (
        _git(repo, "log", "-1", "--format=%at %ct", sha).split() == [str(int(when.timestamp()))] * 2
    )


def test_it_gives_the_same_sha_for_the_same_tree_parents_message_author_and_date(repo, harness_dir):
    when = datetime(2024, 3, 1, tzinfo=UTC)
    kwargs = dict(
        tree_sha=repo.tree_of_directory(harness_dir),
        parents=[],
        message="Same",
        author_name="Ada",
        author_email="ada@example.com",
        authored_at=when,
    )

    first = repo.commit_tree(**kwargs)
    second = repo.commit_tree(**kwargs)

    assert first == second
    assert len(_candidate_refs(repo)) == 1
    _assert_fsck_clean(repo)


def test_it_commits_a_child_whose_parent_git_reports(repo, harness_dir):
    parent = _commit(repo, harness_dir, message="Parent")
    _write(harness_dir, {"agent.py": "def run(task):\n    return 'v2'\n"})

    child = _commit(repo, harness_dir, parents=[parent], message="Child")

    log = _git(repo, "log", "--format=%H%x09%P%x09%s", child).splitlines()
    assert log == [f"{child}\t{parent}\tChild", f"{parent}\t\tParent"]
    assert repo.commit_info(child).parents == (parent,)
    assert set(_candidate_refs(repo).values()) == {parent, child}
    _assert_fsck_clean(repo)


def test_it_commits_a_merge_with_both_parents_in_order(repo, harness_dir, tmp_path):
    left = _commit(repo, harness_dir, message="Left")
    right = _commit(repo, _write(tmp_path / "right", {"agent.py": "x = 2\n"}), message="Right")

    merge = _commit(repo, harness_dir, parents=[left, right], message="Merge")

    assert repo.commit_info(merge).parents == (left, right)
    assert _git(repo, "log", "-1", "--format=%P", merge).split() == [left, right]


def test_it_refuses_an_unknown_parent_without_writing_a_commit(repo, harness_dir):
    with pytest.raises(NotFound):
        _commit(repo, harness_dir, parents=["deadbeef" * 5])

    assert _candidate_refs(repo) == {}


def test_it_refuses_the_all_zero_sha_as_a_parent_with_not_found(repo, harness_dir):
    with pytest.raises(NotFound):
        _commit(repo, harness_dir, parents=["0" * 40])


def test_it_tags_a_commit(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    repo.tag("baseline", sha)

    assert _git(repo, "rev-parse", "refs/tags/baseline").strip() == sha


def test_it_moves_a_tag_only_when_forced(repo, harness_dir):
    first = _commit(repo, harness_dir, message="First")
    _write(harness_dir, {"agent.py": "changed = True\n"})
    second = _commit(repo, harness_dir, message="Second")
    repo.tag("best", first)

    repo.tag("best", second, force=True)

    assert _git(repo, "rev-parse", "refs/tags/best").strip() == second


def test_it_refuses_to_move_an_existing_tag_with_a_domain_error(repo, harness_dir):
    sha = _commit(repo, harness_dir)
    repo.tag("best", sha)

    # A coevo error (translated to a message in one place), not GitPython's exception.
    with pytest.raises(CoevoError):
        repo.tag("best", sha)


def test_it_refuses_to_tag_an_unknown_commit(repo):
    with pytest.raises(NotFound):
        repo.tag("nowhere", "deadbeef" * 5)

    assert _git(repo, "tag", "--list").strip() == ""


# --- reading ------------------------------------------------------------------------------


def test_it_describes_a_commit(repo, harness_dir):
    sha = _commit(repo, harness_dir, message="Describe me")

    info = repo.commit_info(sha)

    assert info.sha == sha
    assert info.tree_sha == _git(repo, "rev-parse", f"{sha}^{{tree}}").strip()
    assert info.parents == ()
    assert info.message.strip() == "Describe me"
    assert (info.author_name, info.author_email) == ("Ada Lovelace", "ada@example.com")
    assert info.authored_at.tzinfo is not None


def test_it_finds_a_commit_by_an_unambiguous_prefix_in_any_case(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    assert repo.commit_info(sha[:8]).sha == sha
    assert repo.commit_info(sha[:8].upper()).sha == sha


@pytest.mark.parametrize(
    "bad_sha",
    ["deadbeef" * 5, "0" * 40, "1234", "not-a-sha", "abc", "g" * 40, "a" * 41],
)
def test_it_raises_not_found_for_an_unknown_or_malformed_sha(repo, harness_dir, bad_sha):
    sha = _commit(repo, harness_dir)

    for read in (
        lambda: repo.commit_info(bad_sha),
        lambda: repo.list_tree(bad_sha),
        lambda: repo.read_file(bad_sha, "agent.py"),
        lambda: repo.diff(bad_sha, sha),
        lambda: repo.diff(sha, bad_sha),
        lambda: repo.log(bad_sha),
    ):
        with pytest.raises(NotFound):
            read()


def test_it_raises_not_found_for_a_tree_sha(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    with pytest.raises(NotFound):
        repo.commit_info(repo.commit_info(sha).tree_sha)


def test_it_lists_every_file_with_its_size_sorted_by_path(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    entries = repo.list_tree(sha)

    assert [(e.path, e.size) for e in entries] == [
        ("agent.py", len((harness_dir / "agent.py").read_bytes())),
        ("harness.toml", len((harness_dir / "harness.toml").read_bytes())),
        ("lib/util.py", len(b"HELPER = 1\n")),
    ]


def test_it_reads_a_file_byte_for_byte(repo, harness_dir):
    _write(harness_dir, {"data/blob.bin": bytes(range(256))})
    sha = _commit(repo, harness_dir)

    assert repo.read_file(sha, "agent.py") == (harness_dir / "agent.py").read_bytes()
    assert repo.read_file(sha, "lib/util.py") == b"HELPER = 1\n"
    assert repo.read_file(sha, "data/blob.bin") == bytes(range(256))


def test_it_raises_not_found_for_an_unknown_file(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    with pytest.raises(NotFound, match="nope.py"):
        repo.read_file(sha, "nope.py")
    with pytest.raises(NotFound):
        repo.read_file(sha, "lib/nope.py")


def test_it_raises_not_found_when_asked_to_read_a_folder(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    with pytest.raises(NotFound, match="folder"):
        repo.read_file(sha, "lib")


def test_it_diffs_two_commits_showing_the_changed_lines(repo, harness_dir):
    base = _commit(repo, harness_dir, message="Base")
    _write(harness_dir, {"agent.py": "def run(task):\n    return 'v2'\n", "new.py": "NEW = 1\n"})
    (harness_dir / "lib" / "util.py").unlink()
    head = _commit(repo, harness_dir, parents=[base], message="Head")

    diff = repo.diff(base, head)

    assert "diff --git a/agent.py b/agent.py" in diff
    assert "--- a/agent.py\n+++ b/agent.py\n" in diff
    assert "\n-    return 'v1'\n" in diff
    assert "\n+    return 'v2'" in diff
    assert "\n+NEW = 1" in diff
    assert "--- a/lib/util.py\n+++ /dev/null" in diff
    assert "harness.toml" not in diff
    assert diff == _git(repo, "diff", base, head).rstrip("\n")


def test_it_diffs_against_the_empty_tree_when_there_is_no_base(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    diff = repo.diff(None, sha)

    for path in ("agent.py", "harness.toml", "lib/util.py"):
        assert f"--- /dev/null\n+++ b/{path}" in diff
    assert "\n+def run(task):\n+    return 'v1'" in diff
    assert diff == _git(repo, "diff", EMPTY_TREE, sha).rstrip("\n")


def test_it_gives_an_empty_diff_between_a_commit_and_itself(repo, harness_dir):
    sha = _commit(repo, harness_dir)

    assert repo.diff(sha, sha) == ""


def test_it_honours_the_diff_context_size(repo, harness_dir):
    lines = [f"line{i}\n" for i in range(20)]
    _write(harness_dir, {"long.txt": "".join(lines)})
    base = _commit(repo, harness_dir)
    lines[10] = "changed\n"
    _write(harness_dir, {"long.txt": "".join(lines)})
    head = _commit(repo, harness_dir, parents=[base])

    narrow = repo.diff(base, head, context=0)
    wide = repo.diff(base, head, context=5)

    assert "\n-line10\n+changed" in narrow
    assert "\n line9\n" not in narrow and "\n line11" not in narrow
    assert "\n line5\n" in wide and "\n line15" in wide
    assert "\n line4\n" not in wide and "\n line16" not in wide


def test_it_lists_the_lineage_newest_first(repo, harness_dir):
    shas = []
    for version in range(3):
        _write(harness_dir, {"agent.py": f"VERSION = {version}\n"})
        shas.append(_commit(repo, harness_dir, parents=shas[-1:], message=f"v{version}"))

    lineage = repo.log(shas[-1])

    assert [info.sha for info in lineage] == shas[::-1]
    assert [info.message.strip() for info in lineage] == ["v2", "v1", "v0"]
    assert [info.sha for info in repo.log(shas[-1], max_count=2)] == shas[:0:-1]
    assert [info.sha for info in repo.log(shas[0])] == [shas[0]]


def test_it_exports_the_same_files_it_imported(repo, harness_dir, tmp_path):
    _write(harness_dir, {"data/blob.bin": bytes(range(256))})
    (harness_dir / "agent.py").chmod(0o755)
    sha = _commit(repo, harness_dir)
    destination = tmp_path / "export"
    destination.mkdir()

    repo.export_tree(sha, destination)

    exported = {p.relative_to(destination): p.read_bytes() for p in _files(destination)}
    original = {p.relative_to(harness_dir): p.read_bytes() for p in _files(harness_dir)}
    assert exported == original
    assert os.access(destination / "agent.py", os.X_OK)


def test_it_exports_a_commit_without_its_bytecode(repo, harness_dir, tmp_path):
    _write(harness_dir, {"__pycache__/agent.cpython-311.pyc": b"\x00"})
    sha = _commit(repo, harness_dir)
    destination = tmp_path / "export"
    destination.mkdir()

    repo.export_tree(sha, destination)

    assert not (destination / "__pycache__").exists()


def test_it_refuses_to_export_an_unknown_commit(repo, tmp_path):
    with pytest.raises(NotFound):
        repo.export_tree("deadbeef" * 5, tmp_path)


def test_it_reports_a_clean_fsck(repo, harness_dir):
    _commit(repo, harness_dir)

    assert repo.fsck() == ""


# --- concurrency --------------------------------------------------------------------------


def _distinct_dirs(root: Path, count: int) -> list[Path]:
    return [
        _write(
            root / f"harness-{i}",
            {
                "agent.py": f"def run(task):\n    return {i}\n",
                f"lib/only_in_{i}.py": f"N = {i}\n",
                "shared.txt": "the same in every harness\n",
            },
        )
        for i in range(count)
    ]


def _run_threads(target, count: int, *, timeout_s: float = 60) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, f"{len(stuck)} of {count} threads did not finish in {timeout_s}s"


def test_it_keeps_every_commit_when_threads_import_at_once(tmp_path):
    path = tmp_path / "store" / "shared.git"
    dirs = _distinct_dirs(tmp_path, 8)
    barrier = threading.Barrier(len(dirs))
    results: dict[int, str] = {}
    errors: list[Exception] = []

    def work(i: int) -> None:
        try:
            # Each thread opens the (not yet existing) repository itself, as services do.
            repo = HarnessRepo.open_or_init(path)
            barrier.wait()
            results[i] = _commit(repo, dirs[i], message=f"Harness {i}")
        except Exception as exc:
            errors.append(exc)

    _run_threads(work, len(dirs))

    assert errors == []
    assert len(set(results.values())) == len(dirs)
    assert set(_candidate_refs(path).values()) == set(results.values())
    repo = HarnessRepo.open_or_init(path)
    for i, sha in results.items():
        assert repo.read_file(sha, f"lib/only_in_{i}.py") == f"N = {i}\n".encode()
    _assert_fsck_clean(path)


def test_it_keeps_every_commit_when_threads_share_one_repository_object(tmp_path):
    # write_lock() is re-entrant per thread, so one HarnessRepo is meant to be shared by
    # threads; committing children of one parent checks that parent from every thread.
    repo = HarnessRepo.open_or_init(tmp_path / "store" / "shared.git")
    base = _commit(repo, _write(tmp_path / "base", {"agent.py": "BASE = 1\n"}), message="Base")
    dirs = _distinct_dirs(tmp_path, 8)
    barrier = threading.Barrier(len(dirs))
    results: dict[tuple[int, int], str] = {}
    errors: list[Exception] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            for round_ in range(4):
                sha = _commit(repo, dirs[i], parents=[base], message=f"Child {i}.{round_}")
                assert repo.read_file(sha, f"lib/only_in_{i}.py") == f"N = {i}\n".encode()
                results[(i, round_)] = sha
        except Exception as exc:
            errors.append(exc)

    _run_threads(work, len(dirs), timeout_s=20)

    assert errors == []
    assert len(set(results.values())) == len(dirs) * 4
    assert set(_candidate_refs(repo).values()) == {base, *results.values()}
    _assert_fsck_clean(repo)


_IMPORT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from harness_store.repo import HarnessRepo

    repo_path, go_file, *directories = sys.argv[1:]
    repo = HarnessRepo.open_or_init(Path(repo_path))
    deadline = time.monotonic() + 60
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            sys.exit("never told to start")
        time.sleep(0.005)
    for directory in directories:
        sha = repo.commit_directory(
            Path(directory),
            parents=[],
            message=f"Import {Path(directory).name}",
            author_name="Worker",
            author_email="worker@example.com",
        )
        print(sha, flush=True)
    """
)


def test_it_keeps_every_commit_when_processes_import_at_once(tmp_path):
    path = tmp_path / "store" / "shared.git"
    dirs = _distinct_dirs(tmp_path, 8)
    go_file = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    # Four processes, two directories each; all start writing when ``go`` appears.
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _IMPORT_SCRIPT, str(path), str(go_file)]
            + [str(d) for d in dirs[i : i + 2]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for i in range(0, len(dirs), 2)
    ]
    go_file.touch()
    outputs = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        outputs.extend(stdout.split())

    assert len(outputs) == len(dirs)
    assert len(set(outputs)) == len(dirs)
    assert set(_candidate_refs(path).values()) == set(outputs)
    subjects = _git(path, "log", "--format=%s", "--all").split("\n")
    assert sorted(s for s in subjects if s) == sorted(f"Import {d.name}" for d in dirs)
    _assert_fsck_clean(path)

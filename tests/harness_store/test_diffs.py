"""Diffs read file by file: every changed file accounted for, whatever its name; bounded in size."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from harness_store.diffs import DiffTooLarge, DiffUnreadable, diff_parse
from harness_store.repo import HarnessRepo
from tests.harness_store.test_repo import _git, _write

BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\xff"


@pytest.fixture
def repo(tmp_path) -> HarnessRepo:
    return HarnessRepo.open_or_init(tmp_path / "store" / "project.git")


def _commit(repo: HarnessRepo, directory: Path, *, parents=()) -> str:
    return repo.commit_directory(
        directory, parents=list(parents), message="Import", author_name="A", author_email="a@b"
    )


@pytest.fixture
def odd_names(repo, tmp_path) -> tuple[str, str]:
    """Two commits whose diff has every kind of name and change git writes differently."""
    work = tmp_path / "work"
    _write(
        work,
        {
            "agent.py": "def run(task, ctx):\n    return 1\n",
            "my file.py": "x = 1\n",
            "plain.txt": "the same content, renamed to a quoted name\n",
            "old name b/x.txt": "the same content, renamed between two unquoted names\n",
            "tc": "a file, then a link\n",
            "logo.png": BINARY,
            "run.sh": "echo hi\n",
            "gone.txt": "deleted\n",
            "tricky.txt": "-- a/x\n",
            "crlf.txt": "one\r\ntwo\u2028three\x0cfour\n",
        },
    )
    base = _commit(repo, work)
    (work / "plain.txt").rename(work / "plain é.txt")
    (work / "old name b").rename(work / "new b")
    (work / "tc").unlink()
    (work / "tc").symlink_to("agent.py")
    (work / "run.sh").chmod(0o755)
    (work / "gone.txt").unlink()
    _write(
        work,
        {
            "agent.py": "import Aé\n\ndef run(task, ctx):\n    return Aé.ANSWER\n",
            "Aé.py": "ANSWER = 2\n",
            "my file.py": "x = 2\n",
            "new\nline.py": "N = 1\n",
            'quo"te\\.py': "Q = 1\n",
            "tab\there.py": "T = 1\n",
            "x b/y b/z.py": "Z = 1\n",
            "empty.txt": "",
            "logo.png": BINARY + b"\x01",
            "tricky.txt": "++ b/x\n",
            "crlf.txt": "one\r\ntwo\u2028three\x0cfive\n",
        },
    )
    return base, _commit(repo, work, parents=[base])


def test_it_reads_every_file_of_a_diff_whatever_git_quotes(repo, odd_names):
    base, head = odd_names

    parts = repo.diff_files(base, head)

    assert sorted((p.old_path or "", p.new_path or "") for p in parts) == sorted(
        [
            ("", "Aé.py"),
            ("agent.py", "agent.py"),
            ("crlf.txt", "crlf.txt"),
            ("", "empty.txt"),
            ("gone.txt", ""),
            ("logo.png", "logo.png"),
            ("my file.py", "my file.py"),
            ("", "new\nline.py"),
            ("old name b/x.txt", "new b/x.txt"),
            ("plain.txt", "plain é.txt"),
            ("", 'quo"te\\.py'),
            ("run.sh", "run.sh"),
            ("", "tab\there.py"),
            # A file that became a link: git writes a deletion and an addition.
            ("tc", ""),
            ("", "tc"),
            ("tricky.txt", "tricky.txt"),
            ("", "x b/y b/z.py"),
        ]
    )
    by_path = {p.path: p for p in parts}
    assert (by_path["agent.py"].added, by_path["agent.py"].removed) == (3, 1)
    assert by_path["logo.png"].binary
    assert by_path["plain é.txt"].renamed_from == "plain.txt"
    # Changed lines that look like ---/+++ lines are read as changed lines, by the hunk's counts.
    assert (by_path["tricky.txt"].added, by_path["tricky.txt"].removed) == (1, 1)
    assert by_path["tricky.txt"].text.endswith("\n@@ -1 +1 @@\n--- a/x\n+++ b/x")
    # Only \n ends a line: \r, U+2028 and form feeds are content.
    assert (by_path["crlf.txt"].added, by_path["crlf.txt"].removed) == (1, 1)
    names = {name for p in parts for name in (p.old_path, p.new_path) if name}
    assert set(repo.diff_names(base, head)) == names


def test_it_reads_the_diff_the_same_whatever_the_server_git_config_says(
    repo, odd_names, tmp_path, monkeypatch
):
    base, head = odd_names
    expected = repo.diff_files(base, head)
    config = tmp_path / "gitconfig"
    config.write_text(
        "[core]\n\tquotePath = false\n"
        "[diff]\n\tnoprefix = true\n\tsuppressBlankEmpty = true\n\trenames = false\n"
        "\tsubmodule = log\n\texternal = false\n"
        "[color]\n\tdiff = always\n\tui = always\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))

    assert repo.diff_files(base, head) == expected


@pytest.mark.parametrize(
    ("diff", "message"),
    [
        (b"stray text before any file\n", "Line 1 of the diff could not be read"),
        (
            b"diff --git a/x b/x\nindex 1111111..2222222 100644\n--- a/x\n+++ b/x\n"
            b"@@ -1 +1 @@\n-a\n+b\nstray\n",
            "Line 8 of the diff could not be read",
        ),
        (
            b"diff --git a/x b/x\nsomething git never writes\n",
            "Line 2 of the diff could not be read",
        ),
        (
            b"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n",
            "ends inside a hunk",
        ),
        (b"diff --git a/x b/x\nnew file mode 100644\n--- /dev/null", "middle of a line"),
        (
            b'diff --git "a/A\\303\\251.py" "b/A\\303\\251.py"\nnew file mode 100644\n'
            b"--- /dev/null\n+++ b/other.py\n@@ -0,0 +1 @@\n+x\n",
            "names files that its other lines do not",
        ),
        (b'diff --git "a/unterminated b/x\n', "Line 1 of the diff could not be read"),
    ],
)
def test_it_refuses_a_diff_with_a_part_it_cannot_read(diff, message):
    with pytest.raises(DiffUnreadable, match=message):
        diff_parse(diff)


def test_it_reads_an_empty_diff_as_no_files():
    assert diff_parse(b"") == []


def test_it_stops_reading_a_diff_past_its_bound(repo, tmp_path):
    work = _write(tmp_path / "big", {"agent.py": "x = 1\n", "data.txt": "0123456789\n" * 300_000})
    sha = _commit(repo, work)  # a diff of 3.3 MB against the empty tree

    tracemalloc.start()
    try:
        with pytest.raises(DiffTooLarge, match="larger than 1048576 bytes: too large to show"):
            repo.diff(None, sha, max_bytes=1024 * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < 3 * 1024 * 1024, peak
    with pytest.raises(DiffTooLarge):
        repo.diff_files(None, sha, max_bytes=1024 * 1024)
    assert sorted(repo.diff_names(None, sha)) == ["agent.py", "data.txt"]
    assert len(repo.diff(None, sha, max_bytes=4 * 1024 * 1024)) > 3_000_000
    # git diff was stopped, not left writing into a pipe nobody reads.
    assert [p for p in Path("/proc").glob("[0-9]*") if _is_git_diff_child(p)] == []


def _is_git_diff_child(proc: Path) -> bool:
    try:
        stat = (proc / "stat").read_text()
        command = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    parent = int(stat[stat.rindex(")") + 2 :].split()[1])
    return parent == os.getpid() and command[0] == b"git" and b"diff" in command


def test_it_counts_a_tree_and_stops_at_the_first_limit_passed(repo, tmp_path):
    work = _write(tmp_path / "t", {f"f{i}.txt": "x" * 100 for i in range(10)})
    tree = _git(repo, "rev-parse", f"{_commit(repo, work)}^{{tree}}").strip()

    whole = repo.tree_size(tree, max_files=10, max_bytes=1000)
    by_files = repo.tree_size(tree, max_files=3, max_bytes=10_000)
    by_bytes = repo.tree_size(tree, max_files=100, max_bytes=250)

    assert (whole.files, whole.bytes, whole.complete) == (10, 1000, True)
    assert (by_files.files, by_files.complete) == (4, False)
    assert (by_bytes.bytes, by_bytes.complete) == (300, False)

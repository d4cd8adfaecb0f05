"""HarnessRepo.fast_import: many real commits through one git fast-import, each kept."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from coevo.errors import HarnessStoreError
from harness_store.repo import CANDIDATE_REF_PREFIX, HarnessRepo
from harness_store.repo_fast_import import FAST_IMPORT_REF, BulkCommit

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def commit(parents=(), files=None, message="m") -> BulkCommit:
    return BulkCommit(
        parents=tuple(parents),
        files=files or {"a.txt": b"a\n"},
        message=message,
        author_name="Ada <x>",
        author_email="ada@example.com",
        authored_at=WHEN,
    )


def test_it_writes_commits_with_lineage_and_keeps_them(tmp_path):
    repo = HarnessRepo.open_or_init(tmp_path / "r.git")
    written = repo.fast_import(
        [
            commit(files={"a.txt": b"a\n", "dir/b.txt": b"b\n"}, message="root"),
            commit([0], {"a.txt": b"a2\n"}, "left"),
            commit([0], {"c.txt": b"c\n"}, "right"),
            commit([1, 2], {"c.txt": b"c\n"}, "merge"),
        ]
    )
    (root, _), (left, _), (right, _), (merge, merge_tree) = written
    info = repo.commit_info(merge)
    assert info.parents == (left, right)
    assert info.tree_sha == merge_tree
    assert info.author_name == "Ada x" and info.authored_at == WHEN
    assert repo.read_file(merge, "a.txt") == b"a2\n"
    assert repo.read_file(merge, "dir/b.txt") == b"b\n"
    assert repo.commit_info(left).parents == (root,)
    refs = repo.refs_under(CANDIDATE_REF_PREFIX)
    assert sorted(refs) == sorted(f"{CANDIDATE_REF_PREFIX}{sha}" for sha, _ in written)
    assert repo.refs_under(FAST_IMPORT_REF) == []
    assert "dangling" not in repo.fsck()


def test_the_same_commits_get_the_same_shas(tmp_path):
    one = HarnessRepo.open_or_init(tmp_path / "one.git").fast_import([commit(), commit([0])])
    two = HarnessRepo.open_or_init(tmp_path / "two.git").fast_import([commit(), commit([0])])
    assert one == two


def test_it_refuses_a_parent_that_comes_later_and_keeps_nothing(tmp_path):
    repo = HarnessRepo.open_or_init(tmp_path / "r.git")
    with pytest.raises(HarnessStoreError, match="must come earlier"):
        repo.fast_import([commit(), commit([1])])
    assert repo.refs_under(CANDIDATE_REF_PREFIX) == []

"""Candidate trees on a worker's disk (harness_store/tree_cache.py): exported once per tree,
shared by its rollouts, never seen half written, pruned least recently used first and never
while a rollout holds them."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness_store import tree_cache
from harness_store.tree_cache import candidate_tree, trees_prune


@pytest.fixture(autouse=True)
def tree_dir(settings, tmp_path):
    settings.COEVO_HARNESS_TREE_DIR = tmp_path / "trees"
    return settings.COEVO_HARNESS_TREE_DIR


def test_a_tree_is_exported_once_and_shared(seed_candidate, child_candidate, monkeypatch):
    exports = []
    real = tree_cache.candidate_export

    def counting(**kwargs):
        exports.append(kwargs["candidate"].sha)
        return real(**kwargs)

    monkeypatch.setattr(tree_cache, "candidate_export", counting)

    with candidate_tree(candidate=seed_candidate) as first:
        with candidate_tree(candidate=seed_candidate) as again:
            assert again == first
        assert (first / "harness.toml").is_file()
    with candidate_tree(candidate=child_candidate) as child:
        assert child != first

    assert exports == [seed_candidate.sha, child_candidate.sha]
    assert first.name == "harness" and first.parent.name == seed_candidate.tree_sha
    # Readable by a sandbox's uid: nothing in the way above the bound directory matters,
    # the tree itself must be.
    assert oct(first.parent.stat().st_mode & 0o777) == "0o755"


def test_concurrent_first_uses_leave_one_whole_tree(seed_candidate, tree_dir, monkeypatch):
    # The export is faked (threads would not see the test's uncommitted snapshot): slow, so
    # that all four race to put their copy in place.
    def slow_export(*, candidate, destination):
        for name in ("harness.toml", "agent.py"):
            time.sleep(0.05)
            (destination / name).write_text(candidate.sha)

    monkeypatch.setattr(tree_cache, "candidate_export", slow_export)
    barrier = threading.Barrier(4)

    def use() -> list[str]:
        barrier.wait()
        with candidate_tree(candidate=seed_candidate) as tree:
            return sorted(p.name for p in tree.iterdir())

    with ThreadPoolExecutor(4) as pool:
        listings = list(pool.map(lambda _: use(), range(4)))

    assert listings == [["agent.py", "harness.toml"]] * 4
    assert sorted(p.name for p in tree_dir.iterdir() if not p.name.endswith(".lock")) == [
        seed_candidate.tree_sha
    ]


def test_pruning_removes_the_least_recently_used_and_skips_trees_in_use(
    seed_candidate, child_candidate, tree_dir
):
    with candidate_tree(candidate=seed_candidate):
        pass
    with candidate_tree(candidate=child_candidate):
        pass
    old = time.time() - 3600
    os.utime(tree_dir / seed_candidate.tree_sha, (old, old))

    with candidate_tree(candidate=seed_candidate):
        # In use (and now the most recent): the other goes first, and this one never.
        assert trees_prune(keep=1) == 1
        assert trees_prune(keep=0) == 0
        assert (tree_dir / seed_candidate.tree_sha / "harness" / "harness.toml").is_file()
    assert not (tree_dir / child_candidate.tree_sha).exists()
    assert trees_prune(keep=0) == 1
    assert [p for p in tree_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_a_new_tree_past_the_maximum_prunes(seed_candidate, child_candidate, settings, tree_dir):
    settings.COEVO_HARNESS_TREES_MAX = 1
    with candidate_tree(candidate=seed_candidate):
        pass
    with candidate_tree(candidate=child_candidate):
        pass
    assert [p.name for p in tree_dir.iterdir() if not p.name.endswith(".lock")] == [
        child_candidate.tree_sha
    ]


def test_an_interrupted_export_leaves_nothing_behind(seed_candidate, tree_dir, monkeypatch):
    def broken(**kwargs):
        (kwargs["destination"] / "half").write_text("x")
        raise OSError("disk full")

    monkeypatch.setattr(tree_cache, "candidate_export", broken)
    with pytest.raises(OSError), candidate_tree(candidate=seed_candidate):
        pass
    assert [p for p in tree_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_pruning_leaves_exports_in_progress_and_removes_old_leftovers(tree_dir, seed_candidate):
    with candidate_tree(candidate=seed_candidate):
        pass
    in_progress = tree_dir / ".export-now"
    (in_progress / "harness").mkdir(parents=True)
    leftover = tree_dir / ".export-old"
    leftover.mkdir()
    old = time.time() - 2 * tree_cache.STALE_EXPORT_S
    os.utime(leftover, (old, old))

    trees_prune(keep=10)

    assert in_progress.is_dir()
    assert not leftover.exists()


def test_a_malformed_tree_sha_is_refused(seed_candidate):
    seed_candidate.tree_sha = "../../etc"
    with pytest.raises(ValueError), candidate_tree(candidate=seed_candidate):
        pass

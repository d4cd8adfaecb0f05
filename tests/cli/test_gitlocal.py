"""Bundles made from real repositories (created with the git CLI), as `coevo submit` makes them."""

from __future__ import annotations

import subprocess

import pytest

from coevo.cli import gitlocal
from tests.cli.conftest import commit_file, run_git


def bundle_heads_and_prerequisites(bundle) -> tuple[list[str], list[str]]:
    text = bundle.read_bytes().split(b"\n\n", 1)[0].decode()
    lines = text.splitlines()[1:]
    prerequisites = [line[1:].split()[0] for line in lines if line.startswith("-")]
    heads = [line.split()[0] for line in lines if not line.startswith("-")]
    return heads, prerequisites


def test_it_resolves_revisions_to_full_shas(history):
    assert gitlocal.commit_resolve(repo=history.repo, ref="HEAD") == history.merge
    assert gitlocal.commit_resolve(repo=history.repo, ref="side") == history.b1
    assert gitlocal.commit_resolve(repo=history.repo, ref="HEAD^1~1") == history.a1
    assert gitlocal.commit_resolve(repo=history.repo, ref=history.a2[:10]) == history.a2


@pytest.mark.parametrize("ref", ["no-such-branch", "HEAD:agent.py", "--all"])
def test_it_refuses_revisions_that_are_not_commits(history, ref):
    with pytest.raises(gitlocal.GitError, match="does not name a commit|is not a revision"):
        gitlocal.commit_resolve(repo=history.repo, ref=ref)


def test_it_refuses_a_directory_outside_any_repository(tmp_path):
    with pytest.raises(gitlocal.GitError, match="not inside a git work tree"):
        gitlocal.repo_toplevel(path=tmp_path)


def test_it_lists_both_sides_of_a_merge_newest_first(history):
    ancestors = gitlocal.commit_ancestors(repo=history.repo, sha=history.merge)
    assert ancestors[0] == history.merge
    assert ancestors[-1] == history.root
    assert set(ancestors) == {history.root, history.a1, history.a2, history.b1, history.merge}
    assert gitlocal.commit_ancestors(repo=history.repo, sha=history.merge, limit=2)[0] == (
        history.merge
    )
    assert len(gitlocal.commit_ancestors(repo=history.repo, sha=history.merge, limit=2)) == 2


def test_a_full_bundle_holds_the_whole_history(history, tmp_path):
    bundle = gitlocal.bundle_create(
        repo=history.repo, sha=history.merge, exclude=[], output=tmp_path / "full.bundle"
    )
    heads, prerequisites = bundle_heads_and_prerequisites(bundle)
    assert heads == [history.merge]
    assert prerequisites == []
    empty = tmp_path / "empty"
    run_git(tmp_path, "init", "-q", str(empty))
    run_git(empty, "bundle", "verify", str(bundle))
    run_git(empty, "fetch", "-q", str(bundle), f"{history.merge}:refs/heads/imported")
    assert run_git(empty, "rev-list", "--count", "imported") == "5"


def test_a_thin_bundle_excludes_the_known_commits(history, tmp_path):
    full = gitlocal.bundle_create(
        repo=history.repo, sha=history.merge, exclude=[], output=tmp_path / "full.bundle"
    )
    # The server knows main up to a2 (so root and a1 too), not the side branch.
    thin = gitlocal.bundle_create(
        repo=history.repo,
        sha=history.merge,
        exclude=[history.a2, history.a1, history.root],
        output=tmp_path / "thin.bundle",
    )
    heads, prerequisites = bundle_heads_and_prerequisites(thin)
    assert heads == [history.merge]
    assert set(prerequisites) <= {history.a2, history.a1, history.root}
    assert history.a2 in prerequisites
    assert thin.stat().st_size < full.stat().st_size

    # A repository without the known commits cannot use it ...
    empty = tmp_path / "empty"
    run_git(tmp_path, "init", "-q", str(empty))
    with pytest.raises(subprocess.CalledProcessError):
        run_git(empty, "bundle", "verify", str(thin))
    # ... one holding them gets exactly the missing commits (b1 and the merge).
    server = tmp_path / "server"
    run_git(tmp_path, "clone", "-q", "--bare", "--no-local", str(history.repo), str(server))
    run_git(server, "update-ref", "-d", "refs/heads/side")
    run_git(server, "update-ref", "refs/heads/main", history.a2)
    run_git(server, "gc", "-q", "--prune=now")
    assert run_git(server, "cat-file", "-t", history.a2) == "commit"
    with pytest.raises(subprocess.CalledProcessError):
        run_git(server, "cat-file", "-e", history.b1)
    run_git(server, "fetch", "-q", str(thin), f"{history.merge}:refs/heads/imported")
    assert run_git(server, "rev-list", "imported", f"^{history.a2}").split() == [
        history.merge,
        history.b1,
    ]


def test_it_deletes_its_temporary_ref_even_when_bundling_fails(history, tmp_path):
    gitlocal.bundle_create(
        repo=history.repo, sha=history.a1, exclude=[], output=tmp_path / "ok.bundle"
    )
    with pytest.raises(gitlocal.GitError, match="bundle"):
        # Excluding the commit itself leaves nothing to bundle.
        gitlocal.bundle_create(
            repo=history.repo, sha=history.a1, exclude=[history.a1], output=tmp_path / "x.bundle"
        )
    assert run_git(history.repo, "for-each-ref", "refs/coevo-submit/") == ""


def test_it_tells_a_dirty_work_tree_and_ignores_untracked_files(history):
    assert not gitlocal.worktree_is_dirty(repo=history.repo)
    (history.repo / "untracked.txt").write_text("build output\n")
    assert not gitlocal.worktree_is_dirty(repo=history.repo)
    (history.repo / "agent.py").write_text("def run(task, ctx):\n    return 'edited'\n")
    assert gitlocal.worktree_is_dirty(repo=history.repo)


def test_it_tells_a_shallow_clone(history, tmp_path):
    assert not gitlocal.repo_is_shallow(repo=history.repo)
    shallow = tmp_path / "shallow"
    run_git(tmp_path, "clone", "-q", "--depth", "1", f"file://{history.repo}", str(shallow))
    assert gitlocal.repo_is_shallow(repo=shallow)
    commit_file(shallow, "c.txt", "c\n", "on top of a shallow clone")
    assert len(gitlocal.commit_ancestors(repo=shallow, sha="HEAD")) == 2

"""Two-parent candidates: a real three-way merge in the project's git repository."""

from __future__ import annotations

import subprocess

import pytest

from coevo.errors import InvalidInput, InvalidManifest
from harness_store.derive import candidate_derive, candidate_merge, candidate_merge_preview
from harness_store.models import Candidate, CandidateOrigin
from harness_store.services import project_repo

pytestmark = pytest.mark.django_db

PROMPT = "line one\nline two\nline three\nline four\nline five\n"


@pytest.fixture
def base(project, seed_candidate):
    candidate, _ = candidate_derive(
        project=project,
        parents=[seed_candidate],
        changes={"prompts/p.txt": PROMPT.encode(), "notes.txt": b"notes\n"},
        message="base with a prompt",
        author_name="t",
    )
    return candidate


def derive(project, parent, changes, message):
    candidate, created = candidate_derive(
        project=project, parents=[parent], changes=changes, message=message, author_name="t"
    )
    assert created
    return candidate


def read(project, sha, path):
    return project_repo(project=project).read_file(sha, path).decode()


def test_it_merges_two_candidates_with_both_parents_and_both_changes(project, base):
    ours = derive(project, base, {"prompts/p.txt": PROMPT.replace("one", "ONE").encode()}, "ours")
    theirs = derive(
        project,
        base,
        {"prompts/p.txt": PROMPT.replace("five", "FIVE").encode(), "tools/t.py": b"X = 1\n"},
        "theirs",
    )

    merged, created = candidate_merge(
        project=project, ours=ours, theirs=theirs, message="merge", author_name="merger"
    )

    assert created
    assert merged.parent_shas == [ours.sha, theirs.sha]
    assert merged.origin == CandidateOrigin.PROPOSER
    # Both edits of the one file survive (a three-way merge, not "take one side").
    text = read(project, merged.sha, "prompts/p.txt")
    assert "line ONE" in text and "line FIVE" in text
    assert read(project, merged.sha, "tools/t.py") == "X = 1\n"
    git_dir = project_repo(project=project).path
    parents = subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-list", "--parents", "-n1", merged.sha],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert parents == [merged.sha, ours.sha, theirs.sha]
    # Kept reachable, like every candidate.
    fsck = subprocess.run(
        ["git", f"--git-dir={git_dir}", "fsck", "--full", "--strict"],
        capture_output=True,
        text=True,
    )
    assert fsck.returncode == 0 and not fsck.stdout.strip()


def test_it_merges_through_candidate_derive_with_two_parents(project, base):
    ours = derive(project, base, {"a.txt": b"a\n"}, "ours")
    theirs = derive(project, base, {"b.txt": b"b\n"}, "theirs")

    merged, created = candidate_derive(
        project=project, parents=[ours, theirs], changes={}, message="m", author_name="t"
    )

    assert created and merged.parent_shas == [ours.sha, theirs.sha]
    with pytest.raises(InvalidInput, match="takes no further changes"):
        candidate_derive(
            project=project,
            parents=[ours, theirs],
            changes={"c.txt": b"c"},
            message="m",
            author_name="t",
        )


def test_it_refuses_conflicting_edits_and_lists_the_paths(project, base):
    ours = derive(
        project,
        base,
        {"prompts/p.txt": PROMPT.replace("three", "3").encode(), "notes.txt": b"ours\n"},
        "ours",
    )
    theirs = derive(
        project,
        base,
        {"prompts/p.txt": PROMPT.replace("three", "III").encode(), "notes.txt": b"theirs\n"},
        "theirs",
    )
    before = Candidate.objects.count()

    preview = candidate_merge_preview(project=project, ours=ours, theirs=theirs)
    assert preview.conflicts == ["notes.txt", "prompts/p.txt"] and not preview.clean
    with pytest.raises(InvalidInput, match=r"conflicts in notes\.txt, prompts/p\.txt"):
        candidate_merge(project=project, ours=ours, theirs=theirs, message="m", author_name="t")
    assert Candidate.objects.count() == before


def test_it_returns_the_existing_candidate_when_the_merged_tree_exists(project, base):
    child = derive(project, base, {"a.txt": b"a\n"}, "child")

    # base is an ancestor of child: the merge is child's own tree.
    same, created = candidate_merge(
        project=project, ours=child, theirs=base, message="m", author_name="t"
    )
    assert (same, created) == (child, False)

    # Two commits that made the same change: their merge is either one's tree.
    twin_a = derive(project, base, {"twin.txt": b"t\n"}, "twin a")
    twin_b_commit = project_repo(project=project).commit_tree(
        tree_sha=twin_a.tree_sha,
        parents=[base.sha],
        message="twin b",
        author_name="t",
        author_email="",
    )
    from harness_store.services import candidate_index_commit

    twin_b, _ = candidate_index_commit(project=project, sha=twin_b_commit)
    merged, created = candidate_merge(
        project=project, ours=twin_a, theirs=twin_b, message="m", author_name="t"
    )
    assert not created and merged == twin_a


def test_it_refuses_a_merge_whose_manifest_no_longer_validates(project, base):
    manifest = read(project, base.sha, "harness.toml")
    knob = '[knobs.temperature]\ntype = "float"\ndefault = 0.0\nmin = 0.0\nmax = 1.0\n'
    assert knob in manifest
    # Each side is valid alone; together the default lies above the maximum.
    ours = derive(
        project,
        base,
        {
            "harness.toml": manifest.replace(
                knob, knob.replace("default = 0.0", "default = 0.9")
            ).encode()
        },
        "ours",
    )
    theirs = derive(
        project,
        base,
        {"harness.toml": manifest.replace(knob, knob.replace("max = 1.0", "max = 0.5")).encode()},
        "theirs",
    )
    before = Candidate.objects.count()

    with pytest.raises(InvalidManifest):
        candidate_merge(project=project, ours=ours, theirs=theirs, message="m", author_name="t")
    assert Candidate.objects.count() == before


def test_it_refuses_merging_a_candidate_with_itself_or_another_project(project, base):
    with pytest.raises(InvalidInput, match="with itself"):
        candidate_merge(project=project, ours=base, theirs=base, message="m", author_name="t")


def test_it_merges_candidates_whose_merge_diff_is_too_large_to_keep(project, base):
    # Diffs are read with a bound now (issue 15, item 3): a merge whose description would pass
    # it is still a merge, only without the patch text.
    ours = derive(project, base, {"prompts/p.txt": PROMPT.replace("one", "ONE").encode()}, "ours")
    theirs = derive(project, base, {"data.txt": b"0123456789\n" * 600_000}, "theirs: 6.6 MB")

    preview = candidate_merge_preview(project=project, ours=ours, theirs=theirs)
    merged, created = candidate_merge(
        project=project, ours=ours, theirs=theirs, message="merge", author_name="merger"
    )

    assert (preview.clean, preview.patch, preview.patch_too_large) == (True, "", True)
    assert created and merged.parent_shas == [ours.sha, theirs.sha]

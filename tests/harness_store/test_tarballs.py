"""Importing candidates from uploaded tarballs: checked whole, refused whole, never half-imported."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from coevo.errors import InvalidInput, InvalidManifest, PayloadTooLarge, UnsafeArchive
from harness_store.models import Candidate
from harness_store.selectors import candidate_files, candidate_read_file
from harness_store.services import candidate_import_tarball, project_repo
from tests.conftest import SEED_HARNESS

MANIFEST = (SEED_HARNESS / "harness.toml").read_bytes()
AGENT = (SEED_HARNESS / "agent.py").read_bytes()


def _tar(entries: list[tarfile.TarInfo | tuple[str, bytes]], *, mode: str = "w:gz") -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode=mode) as archive:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                archive.addfile(entry)
            else:
                name, content = entry
                info = tarfile.TarInfo(name)
                info.size = len(content)
                archive.addfile(info, io.BytesIO(content))
    return data.getvalue()


def _link(name: str, target: str, *, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _harness(prefix: str = "") -> list[tuple[str, bytes]]:
    return [(f"{prefix}harness.toml", MANIFEST), (f"{prefix}agent.py", AGENT)]


def _import(project, archive: bytes, **kwargs):
    return candidate_import_tarball(
        project=project,
        archive=archive,
        message=kwargs.pop("message", "From a tarball"),
        author_name="CI",
        author_email="ci@example.com",
        **kwargs,
    )


def _store_git(project, *args: str) -> str:
    git_dir = project_repo(project=project).path
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True, check=True
    ).stdout


def _assert_nothing_imported(project) -> None:
    assert Candidate.objects.filter(project=project).count() == 0
    assert _store_git(project, "for-each-ref").strip() == ""
    assert _store_git(project, "rev-list", "--all", "--count").strip() == "0"


def test_it_imports_a_tar_gz_made_by_the_tar_cli(project, owner, tmp_path):
    archive = tmp_path / "h.tar.gz"
    subprocess.run(["tar", "czf", archive, "-C", SEED_HARNESS, "."], check=True)

    candidate, created = _import(project, archive.read_bytes(), created_by=owner)

    assert created is True
    assert [entry.path for entry in candidate_files(candidate=candidate)] == [
        "agent.py",
        "harness.toml",
    ]
    assert candidate_read_file(candidate=candidate, path="agent.py") == AGENT
    assert candidate.created_by == owner
    # The same content again is the same candidate, whatever the message.
    again, created_again = _import(project, archive.read_bytes(), message="Again")
    assert (again, created_again) == (candidate, False)
    assert Candidate.objects.filter(project=project).count() == 1


def test_it_imports_a_plain_tar_and_sets_the_parent(project, seed_candidate):
    archive = _tar([*_harness(), ("prompts/extra.txt", b"Think step by step.\n")], mode="w")

    candidate, created = _import(project, archive, parent=seed_candidate)

    assert created is True
    assert candidate.parent_shas == [seed_candidate.sha]
    assert candidate_read_file(candidate=candidate, path="prompts/extra.txt") == (
        b"Think step by step.\n"
    )


def test_it_uses_the_single_top_level_folder_as_the_root(project):
    archive = _tar([*_harness("my-harness/"), ("my-harness/lib/util.py", b"X = 1\n")])

    candidate, _ = _import(project, archive)

    assert sorted(entry.path for entry in candidate_files(candidate=candidate)) == [
        "agent.py",
        "harness.toml",
        "lib/util.py",
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (("../evil.py", b"x"), "climbs out"),
        (("sub/../../evil.py", b"x"), "climbs out"),
        (("/abs/evil.py", b"x"), "absolute path"),
        (_link("passwd", "/etc/passwd"), "symbolic link"),
        (_link("a", "../../x"), "symbolic link"),
        (_link("inside", "agent.py"), "symbolic link"),
        (_link("hard", "agent.py", kind=tarfile.LNKTYPE), "hard link"),
        (_link("hard-out", "/etc/passwd", kind=tarfile.LNKTYPE), "hard link"),
        (_link("fifo", "", kind=tarfile.FIFOTYPE), "special file"),
        (_link("null", "", kind=tarfile.CHRTYPE), "special file"),
    ],
)
def test_it_refuses_an_unsafe_entry_and_imports_nothing(project, tmp_path, entry, message):
    archive = _tar([*_harness(), entry])

    with pytest.raises(UnsafeArchive, match=message):
        _import(project, archive)

    _assert_nothing_imported(project)
    assert not (tmp_path.parent / "evil.py").exists()


def test_it_refuses_more_entries_than_the_limit(project, settings):
    settings.COEVO_MAX_ARCHIVE_FILES = 5
    archive = _tar([*_harness(), *[(f"data/{i}.txt", b"x") for i in range(4)]])

    with pytest.raises(PayloadTooLarge, match="more than 5 entries"):
        _import(project, archive)
    _assert_nothing_imported(project)


def test_it_accepts_exactly_the_entry_limit(project, settings):
    settings.COEVO_MAX_ARCHIVE_FILES = 5
    archive = _tar([*_harness(), *[(f"data/{i}.txt", b"x") for i in range(3)]])

    _, created = _import(project, archive)

    assert created is True


def test_it_refuses_more_bytes_than_the_limit_before_inflating_them(project, settings):
    settings.COEVO_MAX_ARCHIVE_BYTES = 10_000
    # 5 MB of zeros compress to a few KB: the limit applies to what it unpacks to.
    archive = _tar([*_harness(), ("weights.bin", b"\0" * 5_000_000)])
    assert len(archive) < 10_000

    with pytest.raises(PayloadTooLarge, match="more than 10000 bytes"):
        _import(project, archive)
    _assert_nothing_imported(project)


def test_it_refuses_an_archive_without_a_valid_manifest(project):
    archive = _tar([("harness.toml", b"[harness]\nname = 1\n"), ("agent.py", AGENT)])

    with pytest.raises(InvalidManifest):
        _import(project, archive)
    _assert_nothing_imported(project)


@pytest.mark.parametrize("data", [b"", b"not a tarball at all", b"\x1f\x8b\x08\x00garbage"])
def test_it_refuses_an_upload_that_is_not_a_tarball(project, data):
    with pytest.raises(InvalidInput, match="not a readable tar"):
        _import(project, data)
    _assert_nothing_imported(project)


def test_it_refuses_a_truncated_tar_gz(project):
    archive = _tar([*_harness(), ("big.txt", bytes(range(256)) * 400)])

    with pytest.raises(InvalidInput, match="not a readable tar"):
        _import(project, archive[: len(archive) // 2])
    _assert_nothing_imported(project)


def test_it_leaves_no_temporary_files_behind(project, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    _import(project, _tar(_harness()))
    with pytest.raises(UnsafeArchive):
        _import(project, _tar([*_harness(), ("../evil.py", b"x")]))

    assert [p.name for p in Path(tmp_path).iterdir() if p.name.startswith("coevo-tarball")] == []

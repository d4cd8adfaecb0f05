"""Importing candidates from uploaded tarballs: checked whole, refused whole, never half-imported."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tracemalloc
import zlib
from pathlib import Path

import pytest

from coevo.errors import InvalidInput, InvalidManifest, PayloadTooLarge, UnsafeArchive
from harness_store.archives import archive_extract
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


# --- what tarfile reads before any member is checked (issue 15, item 2) ----------------------


def _header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _gzip_stream(parts: list[bytes | int]) -> bytes:
    """A tar.gz of raw parts: bytes as they are, an int as that many zero bytes, streamed
    through the compressor so the test never holds them inflated."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    out: list[bytes] = []
    block = b"\0" * (1024 * 1024)
    for part in parts:
        if isinstance(part, bytes):
            out.append(compressor.compress(part))
            continue
        for start in range(0, part, len(block)):
            out.append(compressor.compress(block[: min(len(block), part - start)]))
    out.append(compressor.flush())
    return b"".join(out)


def _member(name: str, content: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    return info.tobuf(format=tarfile.GNU_FORMAT) + content + b"\0" * (-len(content) % 512)


def _peak_bytes(action) -> tuple[int, BaseException | None]:
    """Peak Python memory allocated while ``action`` runs, and what it raised."""
    tracemalloc.start()
    raised = None
    try:
        action()
    except BaseException as exc:  # noqa: BLE001 - the test asserts on it
        raised = exc
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, raised


@pytest.mark.parametrize(
    ("kind", "what"),
    [(tarfile.GNUTYPE_LONGNAME, "GNU long-name"), (tarfile.XHDTYPE, "pax")],
)
def test_it_refuses_a_long_extended_header_before_reading_its_body(tmp_path, kind, what):
    claimed = 8 * 1024 * 1024
    archive = _gzip_stream(
        [_header("././@LongLink", kind, claimed), claimed, *_harness_members(), b"\0" * 1024]
    )
    assert len(archive) < 64 * 1024

    peak, raised = _peak_bytes(lambda: archive_extract(data=archive, destination=tmp_path))

    assert isinstance(raised, PayloadTooLarge), raised
    assert f"{what} header of {claimed} bytes" in str(raised)
    # tarfile used to read the claimed 8 MiB whole (fileobj.read(size)) before any check.
    assert peak < 4 * 1024 * 1024, peak
    assert list(tmp_path.iterdir()) == []


def test_it_stops_inflating_past_what_the_limits_allow(project, tmp_path):
    # The bomb, smaller: a long-name header claiming 200 MiB of zeros, a few hundred
    # KiB compressed; the limits (50 MiB, 2000 files) allow about 63 MiB of tar stream.
    claimed = 200 * 1024 * 1024
    archive = _gzip_stream(
        [_header("././@LongLink", tarfile.GNUTYPE_LONGNAME, claimed), claimed, b"\0" * 1024]
    )
    assert len(archive) < 1024 * 1024

    peak, raised = _peak_bytes(lambda: _import(project, archive))

    assert isinstance(raised, PayloadTooLarge), raised
    assert "unpacks to more than" in str(raised)
    assert peak < 8 * 1024 * 1024, peak
    _assert_nothing_imported(project)


def test_it_refuses_a_chain_of_extended_headers_without_recursing_through_it(project):
    # tarfile follows each GNU long-name header to the next header by recursion: a few
    # thousand in a row used to end in a RecursionError (a server error) instead of a refusal.
    link = _header("././@LongLink", tarfile.GNUTYPE_LONGNAME, 512) + b"x" * 511 + b"\0"
    archive = _gzip_stream([link * 5000, *_harness_members(), b"\0" * 1024])

    with pytest.raises(UnsafeArchive, match="extended headers in a row"):
        _import(project, archive)
    _assert_nothing_imported(project)


def test_it_refuses_a_sparse_member(project):
    sparse = _header("data.bin", tarfile.GNUTYPE_SPARSE, 0)
    archive = _gzip_stream([*_harness_members(), sparse, b"\0" * 1024])

    with pytest.raises(UnsafeArchive, match="sparse file"):
        _import(project, archive)
    _assert_nothing_imported(project)


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_it_still_imports_long_names_and_pax_headers_archivers_write(project, compression):
    # Python's pax writer (like GNU tar --format=pax) puts a long path in a pax header;
    # `git archive` writes a global pax header with the commit.
    long_path = "prompts/" + "very-long-folder-name/" * 12 + "system.txt"
    data = io.BytesIO()
    with tarfile.open(
        fileobj=data,
        mode=f"w:{compression}",
        format=tarfile.PAX_FORMAT,
        pax_headers={"comment": "0" * 40},
    ) as archive:
        for name, content in [*_harness(), (long_path, b"Be brief.\n")]:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))

    candidate, created = _import(project, data.getvalue())

    assert created is True
    assert candidate_read_file(candidate=candidate, path=long_path) == b"Be brief.\n"


def test_it_imports_a_git_archive(project, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(["cp", "-r", f"{SEED_HARNESS}/.", str(work)], check=True)
    git = ["git", "-c", "user.name=Dev", "-c", "user.email=dev@example.com"]
    subprocess.run([*git, "init", "--quiet"], cwd=work, check=True)
    subprocess.run([*git, "add", "--all"], cwd=work, check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "Seed"], cwd=work, check=True)
    archive = subprocess.run(
        [*git, "archive", "--format=tar.gz", "HEAD"], cwd=work, capture_output=True, check=True
    ).stdout

    _, created = _import(project, archive)

    assert created is True


def _harness_members() -> list[bytes]:
    return [_member(name, content) for name, content in _harness()]

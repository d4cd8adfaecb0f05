"""Safe extraction of uploaded tarballs (tar, tar.gz, …) before they become candidates.

Every member is checked before anything is written: an archive is refused as a whole, never
extracted in part. Refused (UnsafeArchive): absolute paths, ``..`` components, hard links,
devices, fifos and **every symbolic link**. Links are refused even when they point inside the
archive because whether a link stays inside depends on the other links it passes through
(``s -> .`` then ``t -> s/..`` escapes although each looks harmless), and the server reads files
of the extracted tree (``harness.toml``) before git stores it. A harness that needs a linked file
can ship a copy (``tar --dereference``), or travel as a git bundle, which keeps links as git does.
Refused (PayloadTooLarge): more entries than ``COEVO_MAX_ARCHIVE_FILES`` or more uncompressed
bytes than ``COEVO_MAX_ARCHIVE_BYTES``; both are counted while reading headers, so a member's
content is never inflated before its size is checked.

What tarfile reads before any of those checks is bounded too. A compressed upload is inflated
first, in chunks, into a temporary file that stops past what the limits allow (content, plus a
header and padding per entry): a 400 KiB tar.gz cannot make 400 MiB, in memory or on disk. And
tarfile reads the body of a GNU long-name or pax extended header whole, at the size the header
claims, before the member it describes exists (``_proc_gnulong``, ``_proc_pax``:
``fileobj.read(size)``), and follows a chain of them by recursion: such headers above
``_MAX_EXTENDED_HEADER`` bytes, above ``_MAX_EXTENDED_TOTAL`` in all, deeper than
``_MAX_EXTENDED_CHAIN`` in a row, and global pax headers above ``_MAX_GLOBAL_TOTAL`` (copied into
every later member) are refused before tarfile reads them. Sparse members, whose maps tarfile
also reads ahead of any check, are refused (a harness has no sparse files).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import posixpath
import re
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from django.conf import settings

from coevo.errors import InvalidInput, PayloadTooLarge, UnsafeArchive

DEFAULT_MAX_FILES = 2000
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
# Top-level clutter some archivers add (macOS: .DS_Store and ._* AppleDouble files) that should
# not stop a single top-level folder from being taken as the harness root.
_CLUTTER = (".DS_Store",)
# Extended headers: a long name is at most a few KiB (PATH_MAX is 4096), and pax records a
# path, a link target, times and a few attributes. Far above what archivers write, far below
# what would strain a web process.
_MAX_EXTENDED_HEADER = 64 * 1024
_MAX_EXTENDED_TOTAL = 4 * 1024 * 1024
_MAX_EXTENDED_CHAIN = 8  # GNU long name + long link + pax + global: 4 in a row at most
_MAX_GLOBAL_TOTAL = 4 * 1024  # `git archive` writes one of 52 bytes
# What tarfile's "r:*" reads, told apart by magic numbers (bzip2's with its block or
# end-of-stream magic, so a plain tar whose first file is named "BZh…" stays a plain tar).
_COMPRESSED = (
    (re.compile(rb"\x1f\x8b"), lambda raw: gzip.GzipFile(fileobj=raw)),
    (re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"), bz2.BZ2File),
    (re.compile(rb"\xfd7zXZ\x00"), lzma.LZMAFile),
)
_CHUNK = 64 * 1024
_NOT_READABLE = (
    "The upload is not a readable tar or tar.gz archive ({}). "
    "Create one with `tar czf harness.tar.gz -C DIR .`."
)


def archive_limits() -> tuple[int, int]:
    """(max entries, max uncompressed bytes), from settings."""
    return (
        int(getattr(settings, "COEVO_MAX_ARCHIVE_FILES", DEFAULT_MAX_FILES)),
        int(getattr(settings, "COEVO_MAX_ARCHIVE_BYTES", DEFAULT_MAX_BYTES)),
    )


def archive_extract(*, data: bytes, destination: Path) -> Path:
    """Check and unpack ``data`` into ``destination`` (an empty directory); return the root.

    The root is ``destination`` itself, or its only top-level folder when the archive wraps the
    harness in one (``tar czf h.tgz my-harness/``) and has no ``harness.toml`` at the top.
    """
    max_files, max_bytes = archive_limits()
    with _inflated(data, max_files=max_files, max_bytes=max_bytes) as tar:
        try:
            # "r:" and never "r:*": the content is inflated already, and a second layer of
            # compression would be inflated again without a bound.
            with _BoundedTarFile.open(fileobj=tar, mode="r:") as archive:
                members = _checked_members(archive, max_files=max_files, max_bytes=max_bytes)
                # filter="data" repeats the path checks (defence in depth) and drops ownership,
                # setuid bits and group/other write permissions.
                archive.extractall(destination, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise UnsafeArchive(f"The archive was refused: {exc}.") from None
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise InvalidInput(_NOT_READABLE.format(exc)) from None
        except OSError as exc:
            # E.g. a file and a folder of the same name: the archive cannot be a directory tree.
            raise InvalidInput(
                f"The archive could not be unpacked: {exc.strerror or exc}."
            ) from None
    return _harness_root(Path(destination))


@contextlib.contextmanager
def _inflated(data: bytes, *, max_files: int, max_bytes: int) -> Iterator[IO[bytes]]:
    """The upload as an uncompressed tar: itself, or inflated into a temporary file that stops
    past what an archive within the limits can unpack to."""
    opener = next((o for magic, o in _COMPRESSED if magic.match(data)), None)
    if opener is None:
        yield io.BytesIO(data)  # a plain tar is no bigger than the upload itself
        return
    # Content, plus per entry a header and padding for it and for up to three extended headers
    # (4 KiB in all), plus the extended headers' bodies and end-of-archive padding (tar writes
    # records of 10 KiB; some archivers more).
    limit = max_bytes + (max_files + 1) * 4 * 1024 + _MAX_EXTENDED_TOTAL + 1024 * 1024
    with tempfile.TemporaryFile(prefix="coevo-tar-") as inflated:
        total = 0
        try:
            with opener(io.BytesIO(data)) as stream:
                while chunk := stream.read(_CHUNK):  # inflates at most _CHUNK at a time
                    total += len(chunk)
                    if total > limit:
                        raise PayloadTooLarge(
                            f"The archive unpacks to more than {limit} bytes, beyond what "
                            f"{max_bytes} bytes of files and their tar headers could take; "
                            "leave out large data files (a harness is code and prompts)."
                        )
                    inflated.write(chunk)
        except (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
            raise InvalidInput(_NOT_READABLE.format(exc)) from None
        except OSError as exc:  # bz2 says "Invalid data stream" with a bare OSError
            raise InvalidInput(_NOT_READABLE.format(exc.strerror or exc)) from None
        inflated.seek(0)
        yield inflated


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo that checks an extended header's claimed size before tarfile reads its body."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        if self.size < 0:  # base-256 sizes can be negative; tarfile would read (or seek) back
            raise UnsafeArchive(f"{self.name!r} has a negative size; the archive is damaged.")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise UnsafeArchive(
                f"{self.name!r} is a sparse file; archive plain files only (tar without --sparse)."
            )
        if self.type not in _EXTENDED_TYPES:
            return super()._proc_member(tarfile_)
        budget: _ExtendedBudget = tarfile_.extended_budget  # type: ignore[attr-defined]
        budget.take(self, tarfile_)
        try:
            return super()._proc_member(tarfile_)
        finally:
            budget.depth -= 1


_EXTENDED_TYPES = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class _ExtendedBudget:
    def __init__(self) -> None:
        self.depth = 0
        self.total = 0
        self.global_total = 0

    def take(self, header: tarfile.TarInfo, archive: tarfile.TarFile) -> None:
        """Count ``header`` against the limits, or refuse it, before its body is read."""
        long_name = header.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
        kind = "GNU long-name" if long_name else "pax"
        size = header.size
        self.total += size
        if header.type == tarfile.XGLTYPE:
            self.global_total += size
        if size > _MAX_EXTENDED_HEADER or self.total > _MAX_EXTENDED_TOTAL:
            raise PayloadTooLarge(
                f"The archive has a {kind} header of {size} bytes; names and attributes that "
                f"long are not accepted (at most {_MAX_EXTENDED_HEADER} bytes each, "
                f"{_MAX_EXTENDED_TOTAL} in all). Create the archive again with `tar czf`."
            )
        if self.global_total > _MAX_GLOBAL_TOTAL:
            raise PayloadTooLarge(
                f"The archive's global pax headers hold more than {_MAX_GLOBAL_TOTAL} bytes; "
                "create the archive again with `tar czf`."
            )
        if self.depth >= _MAX_EXTENDED_CHAIN:
            raise UnsafeArchive(
                f"The archive has more than {_MAX_EXTENDED_CHAIN} extended headers in a row; "
                "create it again with `tar czf`."
            )
        if header.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            # GNU sparse 1.0 keeps its map in the member's data, which tarfile reads ahead of
            # any check: look for it in the (now bounded) pax records first.
            where = archive.fileobj.tell()
            records = archive.fileobj.read(size)
            archive.fileobj.seek(where)
            if b"GNU.sparse." in records:
                raise UnsafeArchive(
                    "The archive holds a sparse file; archive plain files only "
                    "(tar without --sparse)."
                )
        self.depth += 1


class _BoundedTarFile(tarfile.TarFile):
    tarinfo = _BoundedTarInfo

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before super().__init__: in read mode it reads the first member at once.
        self.extended_budget = _ExtendedBudget()
        super().__init__(*args, **kwargs)


def _checked_members(
    archive: tarfile.TarFile, *, max_files: int, max_bytes: int
) -> list[tarfile.TarInfo]:
    members: list[tarfile.TarInfo] = []
    total = 0
    for member in archive:  # reads headers one by one: limits apply before the next is read
        if len(members) >= max_files:
            raise PayloadTooLarge(
                f"The archive has more than {max_files} entries; a harness should be far "
                "smaller (leave out data sets, virtual environments and caches)."
            )
        name = _checked_name(member.name)
        if member.issym():
            raise UnsafeArchive(
                f"{name!r} is a symbolic link (to {member.linkname!r}); links are not accepted in "
                "archives. Archive the file it points to instead (tar --dereference)."
            )
        if member.islnk():
            raise UnsafeArchive(
                f"{name!r} is a hard link; archive plain files only (tar --hard-dereference)."
            )
        if not (member.isreg() or member.isdir()):
            raise UnsafeArchive(
                f"{name!r} is a device, fifo or other special file; archive plain files only."
            )
        total += member.size if member.isreg() else 0
        if total > max_bytes:
            raise PayloadTooLarge(
                f"The archive unpacks to more than {max_bytes} bytes; leave out large data "
                "files (a harness is code and prompts)."
            )
        members.append(member)
    return members


def _checked_name(name: str) -> str:
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"{name!r} is an absolute path; archive paths must be relative.")
    if "\x00" in name or "\\" in name:
        raise UnsafeArchive(f"{name!r} is not a usable file name.")
    if ".." in name.split("/"):
        raise UnsafeArchive(f"{name!r} climbs out of the archive with '..'.")
    return posixpath.normpath(name)


def _harness_root(destination: Path) -> Path:
    if (destination / "harness.toml").exists():
        return destination
    entries = [
        entry
        for entry in destination.iterdir()
        if entry.name not in _CLUTTER and not entry.name.startswith("._")
    ]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return destination

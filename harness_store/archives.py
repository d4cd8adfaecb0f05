"""Safe extraction of uploaded tarballs (tar, tar.gz, …) before they become candidates.

Every member is checked before anything is written: an archive is refused as a whole, never
extracted in part. Refused (UnsafeArchive): absolute paths, ``..`` components, hard links,
devices, fifos and **every symbolic link**. Links are refused even when they point inside the
archive because whether a link stays inside depends on the other links it passes through
(``s -> .`` then ``t -> s/..`` escapes although each looks harmless), and the server reads files
of the extracted tree (``harness.toml``) before git stores it. A harness that needs a linked file
can ship a copy (``tar --dereference``), or travel as a git bundle, which keeps links as git does.
Refused (PayloadTooLarge): more entries than ``COEVO_MAX_ARCHIVE_FILES`` or more uncompressed
bytes than ``COEVO_MAX_ARCHIVE_BYTES``; both are counted while reading headers, so a
decompression bomb is stopped before it is inflated.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib
from pathlib import Path

from django.conf import settings

from coevo.errors import InvalidInput, PayloadTooLarge, UnsafeArchive

DEFAULT_MAX_FILES = 2000
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
# Top-level clutter some archivers add (macOS: .DS_Store and ._* AppleDouble files) that should
# not stop a single top-level folder from being taken as the harness root.
_CLUTTER = (".DS_Store",)


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
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            members = _checked_members(archive, max_files=max_files, max_bytes=max_bytes)
            # filter="data" repeats the path checks (defence in depth) and drops ownership,
            # setuid bits and group/other write permissions.
            archive.extractall(destination, members=members, filter="data")
    except tarfile.FilterError as exc:
        raise UnsafeArchive(f"The archive was refused: {exc}.") from None
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise InvalidInput(
            f"The upload is not a readable tar or tar.gz archive ({exc}). "
            "Create one with `tar czf harness.tar.gz -C DIR .`."
        ) from None
    except OSError as exc:
        # E.g. a file and a folder of the same name: the archive cannot be a directory tree.
        raise InvalidInput(f"The archive could not be unpacked: {exc.strerror or exc}.") from None
    return _harness_root(Path(destination))


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

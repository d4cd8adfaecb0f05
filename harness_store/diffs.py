"""Reading ``git diff`` output: one part per changed file, every line accounted for.

The diff page and the promotion evidence show a reviewer what a candidate changes, so a file
the reader cannot place is an error (DiffUnreadable), never silently left out. The reader
expects the output of :meth:`harness_store.repo.HarnessRepo.diff` (harness_store.repo_diffs),
whose options it relies on: ``a/`` and ``b/`` prefixes, no colour, no external or textconv
drivers, and C-quoted names (``core.quotePath=true``), so a header line is ASCII and a name with
a tab, a newline, a quote or a non-ASCII character is written ``"a/tab\\there"``. Hunk bodies
are read by their line counts, so a changed line that looks like a header (``diff --git …`` in a
file) stays a changed line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from coevo.errors import HarnessStoreError

# Names are decoded as UTF-8 for display; a byte that is not UTF-8 shows as U+FFFD, the same
# way in the patch and in ``git diff --name-status -z``, so the two still compare equal.
NAME_ERRORS = "replace"


class DiffTooLarge(HarnessStoreError):
    """A diff longer than the caller's bound, or one git takes too long to write."""

    code = "diff_too_large"


class DiffUnreadable(HarnessStoreError):
    """git wrote a diff this reader cannot account for line by line."""

    code = "diff_unreadable"


@dataclass(frozen=True)
class FilePatch:
    """One file's part of a diff. ``old_path`` is None for an added file, ``new_path`` for a
    deleted one; a rename has both, different."""

    old_path: str | None
    new_path: str | None
    added: int
    removed: int
    binary: bool
    text: str  # the part as git wrote it, header included

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path or ""

    @property
    def deleted(self) -> bool:
        return self.new_path is None

    @property
    def created(self) -> bool:
        return self.old_path is None

    @property
    def renamed_from(self) -> str | None:
        renamed = self.old_path is not None and self.new_path is not None
        return self.old_path if renamed and self.old_path != self.new_path else None


_HUNK = re.compile(rb"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# Extended header lines git writes between ``diff --git`` and the patch (git-diff(1),
# "Generating patch text with -p"). The name-carrying ones are read separately below.
_EXTENDED = re.compile(
    rb"(old mode|new mode|deleted file mode|new file mode) [0-7]{6}"
    rb"|(similarity|dissimilarity) index \d{1,3}%"
    rb"|index [0-9a-f]+\.\.[0-9a-f]+( [0-7]{6})?"
)
_NAMED = (b"rename from ", b"rename to ", b"copy from ", b"copy to ")
_BINARY = re.compile(rb"Binary files .+ and .+ differ")
_ESCAPES = {
    ord("a"): 7,
    ord("b"): 8,
    ord("t"): 9,
    ord("n"): 10,
    ord("v"): 11,
    ord("f"): 12,
    ord("r"): 13,
    ord('"'): ord('"'),
    ord("\\"): ord("\\"),
}


@dataclass
class _Part:
    number: int  # line number of its header, for errors
    header: tuple[str | None, str | None] | None  # None: an unquoted rename, read elsewhere
    header_text: bytes
    lines: list[bytes] = field(default_factory=list)
    created: bool = False
    deleted: bool = False
    renamed: dict[bytes, str] = field(default_factory=dict)
    minus: str | None = None  # names from the ---/+++ lines (None: /dev/null)
    plus: str | None = None
    has_names: bool = False
    added: int = 0
    removed: int = 0
    binary: bool = False


def diff_parse(diff: bytes) -> list[FilePatch]:
    """Split ``git diff`` output into files; DiffUnreadable names the first line that does not
    fit git's format (the whole diff is refused, not shown in part)."""
    lines = diff.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        raise DiffUnreadable("The diff ends in the middle of a line; it may have been cut off.")
    parts: list[_Part] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"diff --git "):
            raise _unreadable(i, line)
        part = _Part(number=i + 1, header=_header_names(i, line), header_text=line)
        part.lines.append(line)
        i = _read_part(lines, i + 1, part)
        parts.append(part)
    return [_finish(part) for part in parts]


def _read_part(lines: list[bytes], i: int, part: _Part) -> int:
    """Read the part's extended header and patch from line ``i``; return the next part's line."""
    while i < len(lines) and not lines[i].startswith((b"diff --git ", b"--- ")):
        line = lines[i]
        if _EXTENDED.fullmatch(line):
            part.created |= line.startswith(b"new file mode")
            part.deleted |= line.startswith(b"deleted file mode")
        elif line.startswith(_NAMED):
            kind = next(prefix for prefix in _NAMED if line.startswith(prefix))
            part.renamed[kind] = _decode(_name(i, line[len(kind) :]))
        elif _BINARY.fullmatch(line):
            part.binary = True
        else:
            raise _unreadable(i, line)
        part.lines.append(line)
        i += 1
    if i >= len(lines) or lines[i].startswith(b"diff --git "):
        return i
    # "--- a/NAME" then "+++ b/NAME" (or /dev/null), then at least one hunk.
    if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
        raise _unreadable(i, lines[i])
    part.minus = _side(i, lines[i][4:], b"a/")
    part.plus = _side(i + 1, lines[i + 1][4:], b"b/")
    part.has_names = True
    part.lines += lines[i : i + 2]
    i += 2
    hunks = 0
    while i < len(lines) and not lines[i].startswith(b"diff --git "):
        match = _HUNK.match(lines[i])
        if not match:
            raise _unreadable(i, lines[i])
        hunks += 1
        old_left = int(match[1]) if match[1] is not None else 1
        new_left = int(match[2]) if match[2] is not None else 1
        part.lines.append(lines[i])
        i += 1
        while i < len(lines) and (old_left or new_left or lines[i].startswith(b"\\")):
            line = lines[i]
            kind = line[:1]
            if kind == b" " and old_left and new_left:
                old_left, new_left = old_left - 1, new_left - 1
            elif kind == b"-" and old_left:
                old_left -= 1
                part.removed += 1
            elif kind == b"+" and new_left:
                new_left -= 1
                part.added += 1
            elif kind != b"\\":  # "\ No newline at end of file"
                raise _unreadable(i, line)
            part.lines.append(line)
            i += 1
        if old_left or new_left:
            raise DiffUnreadable(
                f"The diff of {part.header_text[11:80].decode('ascii', 'replace')} ends inside "
                "a hunk; it may have been cut off."
            )
    if not hunks:
        raise _unreadable(i - 1, lines[i - 1])
    return i


def _finish(part: _Part) -> FilePatch:
    """Settle the part's names from what git wrote, checking that all its lines agree."""
    old = part.renamed.get(b"rename from ", part.renamed.get(b"copy from "))
    new = part.renamed.get(b"rename to ", part.renamed.get(b"copy to "))
    disagree = DiffUnreadable(
        f"Line {part.number} of the diff names files that its other lines do not "
        f"({part.header_text[:200].decode('ascii', 'replace')!r}); the diff is not shown rather "
        "than shown with a file misnamed."
    )
    if (old is None) != (new is None) or (part.created and part.deleted):
        raise disagree
    if old is None or new is None:
        if part.header is None:
            raise disagree
        old, new = part.header
    elif part.header is None:
        # Both header names unquoted (so printable ASCII) and different: only a rename does
        # that, and its lines name both sides.
        if part.header_text != f"diff --git a/{old} b/{new}".encode("ascii", "replace"):
            raise disagree
    elif part.header != (old, new):
        raise disagree
    if part.has_names:
        sides = (None if part.created else old, None if part.deleted else new)
        if (part.minus, part.plus) != sides:
            raise disagree
    return FilePatch(
        old_path=None if part.created else old,
        new_path=None if part.deleted else new,
        added=part.added,
        removed=part.removed,
        binary=part.binary,
        text=b"\n".join(part.lines).decode("utf-8", "replace"),
    )


def _header_names(i: int, line: bytes) -> tuple[str, str] | None:
    """The two names of ``diff --git a/OLD b/NEW``; None when both are unquoted and differ
    (ambiguous: a name may hold " b/"), left to the rename lines."""
    rest = line[len(b"diff --git ") :]
    if rest.startswith(b'"'):
        old, end = _quoted(i, rest)
        if rest[end : end + 1] != b" ":
            raise _unreadable(i, line)
        new = _side(i, rest[end + 1 :], b"b/")
    else:
        cut = rest.find(b' "')
        if cut >= 0:  # an unquoted name holds no '"': the quoted new name starts here
            old = _side(i, rest[:cut], b"a/")
            new = _side(i, rest[cut + 1 :], b"b/")
        else:
            # "a/" + N + " b/" + N: the same unquoted name twice, unless a rename.
            half = (len(rest) - 1) // 2
            left, right = rest[:half], rest[half + 1 :]
            if len(rest) % 2 == 0 or rest[half : half + 1] != b" ":
                return None
            if not (left.startswith(b"a/") and right.startswith(b"b/")) or left[2:] != right[2:]:
                return None
            old = new = _decode(left[2:])
    if old is None or new is None:
        raise _unreadable(i, line)
    return old, new


def _side(i: int, text: bytes, prefix: bytes) -> str | None:
    """A name on a ---/+++ line or in a header: quoted or not, with its a/ or b/ prefix, or
    /dev/null (None). git ends the ---/+++ name with a tab when it holds a space."""
    if text.endswith(b"\t"):
        text = text[:-1]
    if text == b"/dev/null":
        return None
    raw = _name(i, text)
    if not raw.startswith(prefix):
        raise _unreadable(i, text)
    return _decode(raw[len(prefix) :])


def _name(i: int, text: bytes) -> bytes:
    if text.startswith(b'"'):
        raw, end = _quoted(i, text)
        if end != len(text):
            raise _unreadable(i, text)
        return raw
    if not text or b"\t" in text:
        raise _unreadable(i, text)
    return text


def _quoted(i: int, text: bytes) -> tuple[bytes, int]:
    """Unquote git's C-style quoting (quote_c_style): returns the bytes and the index after
    the closing quote."""
    out = bytearray()
    j = 1
    while j < len(text):
        c = text[j]
        if c == ord('"'):
            return bytes(out), j + 1
        if c != ord("\\"):
            out.append(c)
            j += 1
            continue
        escape = text[j + 1 : j + 2]
        if escape and escape[0] in _ESCAPES:
            out.append(_ESCAPES[escape[0]])
            j += 2
        elif re.fullmatch(rb"[0-3][0-7]{2}", text[j + 1 : j + 4]):
            out.append(int(text[j + 1 : j + 4], 8))
            j += 4
        else:
            raise _unreadable(i, text)
    raise _unreadable(i, text)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", NAME_ERRORS)


def _unreadable(i: int, line: bytes) -> DiffUnreadable:
    shown = line[:120].decode("utf-8", "replace")
    return DiffUnreadable(
        f"Line {i + 1} of the diff could not be read ({shown!r}); the diff is not shown rather "
        "than shown without some of its files. Download the candidate's files to compare them."
    )

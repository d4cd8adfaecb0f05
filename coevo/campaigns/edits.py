"""The llm-patch proposer's answer: a strict format, parsed and applied by pure functions.

An answer is a ``HYPOTHESIS:`` line followed by edits in ONE of two formats.

Search/replace blocks (each SEARCH text must occur exactly once in the file; an empty SEARCH
creates a file that does not exist yet)::

    HYPOTHESIS: numbered choices make the model pick admissible commands
    <<<<<<< SEARCH agent.py
    prompt = "> "
    =======
    prompt = "Choose a number: "
    >>>>>>> REPLACE

A unified diff (``--- a/PATH`` / ``+++ b/PATH`` headers, ``@@ -l,c +l,c @@`` hunks whose
context and removed lines must match the file; ``/dev/null`` creates or deletes a file)::

    HYPOTHESIS: ...
    --- a/agent.py
    +++ b/agent.py
    @@ -1,2 +1,2 @@
     def run(task, ctx):
    -    return "x"
    +    return "y"

Markdown code fences around the edits are ignored; prose outside them is not an edit and is
ignored too (it stays in the recorded response). Everything else is refused with a precise
reason (the ``applies`` validation stage): a missing hypothesis, an unterminated block, both
formats at once, paths that are absolute or contain ``..``, files outside the manifest's
declared ``components``, edits that do not apply, an edit of ``harness.toml`` when it is not
itself a component, and any edit that changes the manifest's ``components``, ``entrypoint`` or
``command`` (a proposer must not widen what it may edit, or move where the harness starts).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from harness_store.manifest import MANIFEST_NAME

MAX_HYPOTHESIS_CHARS = 500

_HYPOTHESIS = re.compile(r"^\s*\**HYPOTHESIS\**\s*:\s*(?P<text>.*)$", re.IGNORECASE)
_SEARCH = re.compile(r"^<{7} SEARCH\s+(?P<path>\S.*?)\s*$")
_DIVIDER = "======="
_REPLACE = re.compile(r"^>{7} REPLACE\s*$")
_FENCE = re.compile(r"^\s*```[\w+-]*\s*$")
_HUNK = re.compile(r"^@@ -(?P<old>\d+)(?:,(?P<old_n>\d+))? \+(?P<new>\d+)(?:,(?P<new_n>\d+))? @@")


class EditRejected(Exception):
    """The answer cannot become a candidate; ``str(exc)`` is the applies stage's reason."""


@dataclass(frozen=True)
class SearchReplace:
    path: str
    search: str
    replace: str


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_lines: list[str]  # context and removed lines, without their prefix
    new_lines: list[str]  # context and added lines


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None: /dev/null (a new file)
    new_path: str | None  # None: /dev/null (the file is deleted)
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


@dataclass(frozen=True)
class ParsedAnswer:
    hypothesis: str
    format: str  # "search-replace" | "unified-diff" | "json" (coevo.campaigns.answers)
    blocks: list[SearchReplace] = field(default_factory=list)
    diffs: list[FileDiff] = field(default_factory=list)

    @property
    def paths(self) -> list[str]:
        found = [b.path for b in self.blocks] + [d.path for d in self.diffs]
        return list(dict.fromkeys(found))


# --- parsing -------------------------------------------------------------------------------


def answer_parse(text: str) -> ParsedAnswer:
    """The hypothesis and the edits of a proposer's answer; raises EditRejected."""
    lines = [line.rstrip("\r") for line in text.replace("\r\n", "\n").split("\n")]
    hypothesis = ""
    for line in lines:
        match = _HYPOTHESIS.match(line)
        if match:
            hypothesis = match["text"].strip()
            break
    if not hypothesis:
        raise EditRejected(
            "malformed answer: no 'HYPOTHESIS: ...' line (one line saying what the edit should "
            "improve and why)."
        )
    hypothesis = hypothesis[:MAX_HYPOTHESIS_CHARS]
    lines = [line for line in lines if not _FENCE.match(line)]
    has_blocks = any(_SEARCH.match(line) for line in lines)
    has_diff = any(line.startswith("--- ") for line in lines) and any(
        line.startswith("+++ ") for line in lines
    )
    if has_blocks and has_diff:
        raise EditRejected(
            "malformed answer: it mixes search/replace blocks and a unified diff; use one format."
        )
    if has_blocks:
        return ParsedAnswer(hypothesis, "search-replace", blocks=_parse_blocks(lines))
    if has_diff:
        return ParsedAnswer(hypothesis, "unified-diff", diffs=_parse_diff(lines))
    if any(line.startswith(("<<<<<<<", "=======", ">>>>>>>")) for line in lines):
        raise EditRejected(
            "malformed answer: a search/replace marker without its '<<<<<<< SEARCH path' line."
        )
    raise EditRejected(
        "malformed answer: no edit found (expected '<<<<<<< SEARCH path' ... '=======' ... "
        "'>>>>>>> REPLACE' blocks or a unified diff with '--- a/path' / '+++ b/path' headers)."
    )


def _parse_blocks(lines: list[str]) -> list[SearchReplace]:
    blocks: list[SearchReplace] = []
    i = 0
    while i < len(lines):
        match = _SEARCH.match(lines[i])
        if not match:
            if lines[i].startswith(("=======", ">>>>>>>")):
                raise EditRejected(
                    f"malformed answer: line {i + 1} ({lines[i][:40]!r}) is outside a "
                    "search/replace block."
                )
            i += 1
            continue
        path, start = match["path"], i + 1
        try:
            divider = lines.index(_DIVIDER, start)
        except ValueError:
            raise EditRejected(
                f"malformed answer: the SEARCH block for {path!r} (line {i + 1}) has no "
                f"'{_DIVIDER}' line."
            ) from None
        end = next((j for j in range(divider + 1, len(lines)) if _REPLACE.match(lines[j])), None)
        if end is None:
            raise EditRejected(
                f"malformed answer: the block for {path!r} (line {i + 1}) has no "
                "'>>>>>>> REPLACE' line."
            )
        inner = lines[start:divider] + lines[divider + 1 : end]
        if any(_SEARCH.match(line) for line in inner):
            raise EditRejected(
                f"malformed answer: the block for {path!r} (line {i + 1}) is not closed before "
                "the next '<<<<<<< SEARCH'."
            )
        search, replace = lines[start:divider], lines[divider + 1 : end]
        blocks.append(
            SearchReplace(
                path=path,
                search="\n".join(search) + "\n" if search else "",
                replace="\n".join(replace) + "\n" if replace else "",
            )
        )
        i = end + 1
    return blocks


def _diff_path(header: str, prefix: str) -> str | None:
    raw = header[len(prefix) :].split("\t")[0].strip()
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    if not raw:
        raise EditRejected(f"malformed diff: the header {header!r} names no file.")
    return raw


def _parse_diff(lines: list[str]) -> list[FileDiff]:
    diffs: list[FileDiff] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise EditRejected(
                f"malformed diff: line {i + 1} ({lines[i][:60]!r}) is not followed by a '+++ ' line."
            )
        old_path, new_path = _diff_path(lines[i], "--- "), _diff_path(lines[i + 1], "+++ ")
        if old_path is None and new_path is None:
            raise EditRejected("malformed diff: both sides of a file header are /dev/null.")
        if old_path and new_path and old_path != new_path:
            raise EditRejected(
                f"malformed diff: renames are not supported ({old_path!r} → {new_path!r})."
            )
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            match = _HUNK.match(lines[i])
            if not match:
                raise EditRejected(f"malformed diff: bad hunk header {lines[i][:80]!r}.")
            old_n = int(match["old_n"]) if match["old_n"] is not None else 1
            new_n = int(match["new_n"]) if match["new_n"] is not None else 1
            i += 1
            old: list[str] = []
            new: list[str] = []
            while len(old) < old_n or len(new) < new_n:
                if i >= len(lines):
                    raise EditRejected(
                        f"malformed diff: a hunk of {new_path or old_path!r} ends early (it "
                        f"announces -{old_n} +{new_n} lines)."
                    )
                line = lines[i]
                if line.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                tag, body = (line[:1], line[1:]) if line else (" ", "")
                if tag == " ":
                    old.append(body)
                    new.append(body)
                elif tag == "-":
                    old.append(body)
                elif tag == "+":
                    new.append(body)
                else:
                    raise EditRejected(
                        f"malformed diff: line {i + 1} ({line[:60]!r}) in a hunk of "
                        f"{new_path or old_path!r} starts with neither ' ', '-' nor '+' (or the "
                        "hunk's line counts are wrong)."
                    )
                i += 1
            if len(old) != old_n or len(new) != new_n:
                raise EditRejected(
                    f"malformed diff: a hunk of {new_path or old_path!r} does not match its "
                    f"header's line counts (-{old_n} +{new_n})."
                )
            hunks.append(Hunk(int(match["old"]), old, new))
        if not hunks:
            raise EditRejected(f"malformed diff: no hunk for {new_path or old_path!r}.")
        diffs.append(FileDiff(old_path, new_path, hunks))
    return diffs


# --- applying ------------------------------------------------------------------------------


def path_check(path: str, components: tuple[str, ...] | list[str]) -> str:
    """``path`` normalized when it is a relative path inside a declared component."""
    if "\\" in path or "\x00" in path:
        raise EditRejected(f"{path!r} is not a valid harness path.")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == ".git":
        raise EditRejected(
            f"{path!r} is not a path inside the harness (absolute paths, '..' and .git are refused)."
        )
    normalized = str(pure)
    if normalized == MANIFEST_NAME and MANIFEST_NAME not in components:
        raise EditRejected(
            f"{MANIFEST_NAME} is not a declared component: only the files the manifest lists "
            f"in [harness] components may be edited ({', '.join(components) or 'none'})."
        )
    for component in components:
        component = component.replace("\\", "/")
        if component.endswith("/"):
            if normalized.startswith(component):
                return normalized
        elif normalized == str(PurePosixPath(component)):
            return normalized
    raise EditRejected(
        f"{normalized!r} is outside the declared components "
        f"({', '.join(components) or 'none'}): edits there are refused."
    )


def edits_apply(
    *, answer: ParsedAnswer, files: dict[str, str], components: tuple[str, ...] | list[str]
) -> dict[str, bytes | None]:
    """``{path: new bytes | None (deleted)}`` for the changed files; raises EditRejected.

    ``files`` holds the parent's text files (at least those the answer names).
    """
    current: dict[str, str | None] = {}

    def text_of(path: str) -> str | None:
        return current[path] if path in current else files.get(path)

    for block in answer.blocks:
        path = path_check(block.path, components)
        text = text_of(path)
        if block.search == "":
            if text is not None:
                raise EditRejected(
                    f"{path}: an empty SEARCH creates a file, but {path} exists; quote the lines "
                    "to replace."
                )
            current[path] = block.replace
            continue
        if text is None:
            raise EditRejected(f"{path}: no such file in the parent candidate.")
        count = text.count(block.search)
        if count != 1:
            first = block.search.strip().splitlines()[0][:80] if block.search.strip() else ""
            raise EditRejected(
                f"{path}: the SEARCH text (starting {first!r}) occurs {count} times; it must "
                "match exactly once, whitespace included."
            )
        current[path] = text.replace(block.search, block.replace, 1)
    for diff in answer.diffs:
        path = path_check(diff.path, components)
        text = text_of(path)
        if diff.old_path is None:
            if text is not None:
                raise EditRejected(f"{path}: the diff creates it from /dev/null, but it exists.")
            text = ""
        elif text is None:
            raise EditRejected(f"{path}: no such file in the parent candidate.")
        result = _apply_hunks(path, text, diff.hunks)
        if diff.new_path is None:
            if result.strip():
                raise EditRejected(f"{path}: the diff deletes the file but leaves lines in it.")
            current[path] = None
        else:
            current[path] = result
    if MANIFEST_NAME in current:
        _check_manifest_edit(files.get(MANIFEST_NAME, ""), current[MANIFEST_NAME])
    changes = {
        path: (None if text is None else text.encode())
        for path, text in current.items()
        if text != files.get(path)
    }
    return changes


def _apply_hunks(path: str, text: str, hunks: list[Hunk]) -> str:
    lines = text.split("\n") if text else []
    trailing_newline = text.endswith("\n")
    if trailing_newline:
        lines = lines[:-1]
    offset = 0  # how far earlier hunks moved the lines after them
    searched_from = 0
    for number, hunk in enumerate(hunks, start=1):
        if not hunk.old_lines:
            # Pure insertion: after line old_start (0 = at the top).
            at = hunk.old_start + offset
            if not 0 <= at <= len(lines):
                raise EditRejected(
                    f"{path}: hunk {number} inserts after line {hunk.old_start}, past the end."
                )
        else:
            at = _locate(lines, hunk.old_lines, hunk.old_start - 1 + offset, searched_from)
            if at is None:
                first = next((line for line in hunk.old_lines if line.strip()), "")
                raise EditRejected(
                    f"{path}: hunk {number} does not apply: its context/removed lines (from "
                    f"{first.strip()[:80]!r}) are not in the file at line {hunk.old_start} or "
                    "exactly once elsewhere."
                )
        lines[at : at + len(hunk.old_lines)] = hunk.new_lines
        offset += len(hunk.new_lines) - len(hunk.old_lines)
        searched_from = at + len(hunk.new_lines)
    result = "\n".join(lines)
    return result + "\n" if (trailing_newline or not text) and lines else result


def _locate(lines: list[str], needle: list[str], hint: int, start: int) -> int | None:
    """Where ``needle`` is: at the stated line, else its one occurrence after ``start``
    (proposer models often get line numbers wrong, never the content)."""
    n = len(needle)
    if hint >= 0 and lines[hint : hint + n] == needle:
        return hint
    found = [i for i in range(start, len(lines) - n + 1) if lines[i : i + n] == needle]
    return found[0] if len(found) == 1 else None


def changes_check(
    *, changes: dict[str, bytes | None], manifest_text: str, components: tuple[str, ...] | list[str]
) -> None:
    """Files a proposer changed by other means than an answer (the agentic proposer's edited
    working copy) pass the same rules as edits: inside the declared components, and a
    manifest that keeps its components, entrypoint and command. Raises EditRejected."""
    for path in sorted(changes):
        path_check(path, components)
    if MANIFEST_NAME in changes:
        after = changes[MANIFEST_NAME]
        try:
            text = None if after is None else after.decode()
        except UnicodeDecodeError:
            raise EditRejected(f"{MANIFEST_NAME} is not UTF-8 text.") from None
        _check_manifest_edit(manifest_text, text)


def _check_manifest_edit(before: str, after: str | None) -> None:
    if after is None:
        raise EditRejected(f"{MANIFEST_NAME} cannot be deleted.")
    try:
        old, new = tomllib.loads(before), tomllib.loads(after)
    except tomllib.TOMLDecodeError:
        return  # invalid TOML is the manifest stage's to report, with the parser's message
    old_harness, new_harness = old.get("harness") or {}, new.get("harness") or {}
    if not isinstance(new_harness, dict):
        return
    for key in ("components", "entrypoint", "command"):
        if old_harness.get(key) != new_harness.get(key):
            raise EditRejected(
                f"{MANIFEST_NAME}: the edit changes [harness] {key}; a proposer may not change "
                "what it may edit or where the harness starts."
            )

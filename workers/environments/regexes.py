"""The regex scorer's engine: RE2 (the ``google-re2`` package), for patterns and answers that
both come from outside.

Python's ``re`` backtracks: ``(\\d+\\s?)+`` against 26 digits and an ``x`` took 3.4 s, doubling
with each extra digit, and held the interpreter lock the whole time, so a harness (through its
answer) and a suite author (through the pattern) could freeze every thread of a worker: its
heartbeat, its timers, the other rollouts. RE2 never backtracks: its time is linear in the
answer's length times the pattern's compiled size, and the binding releases the interpreter
lock while it matches. Both factors are bounded here, so one match is bounded too (at most
``MAX_REGEX_WORK`` steps: about a second measured, worst case, on a 2-core CI machine; real
patterns take microseconds) and no other thread waits for it.

The price is RE2's syntax: no lookaround, backreferences, possessive quantifiers or atomic
groups; ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII (``\\p{L}``, ``\\p{Nd}`` are the Unicode
classes); ``\\z`` rather than ``\\Z``. The suite import checks every pattern with this same
engine, so a pattern either works on the worker or is refused with the line that has it.
"""

from __future__ import annotations

import re2

# A pattern compiled to more RE2 instructions than this is refused: \p{L} alone is ~1,200
# (so \p{L}{40} fits), typical answer patterns are under 100.
MAX_REGEX_PROGRAM_SIZE = 50_000
# Answers longer than this are refused before any matching (as before RE2).
MAX_REGEX_ANSWER_CHARS = 100_000
# Compiled size × answer bytes. RE2's worst case is 6 ns per unit with a 1,000-instruction
# program and 10 ns with a 48,000-instruction one (measured on a 2-core CI machine with
# `(?:[ab]*a[ab]{999}|…)`, which keeps every instruction alive at every byte), so this bounds
# one match to about a second whatever the pattern and the answer: a pattern under 1,000
# instructions may take the full 100,000 characters, the largest about 2,000 bytes.
MAX_REGEX_WORK = 100_000_000

_SYNTAX = (
    "Scoring regexes use RE2 syntax (linear time): no lookahead/lookbehind, backreferences, "
    "possessive quantifiers or atomic groups; \\d \\w \\s \\b are ASCII (use \\p{L}, \\p{Nd} "
    "for Unicode); write \\z for the end of the text."
)


class RegexRefused(ValueError):
    """A pattern RE2 cannot or will not run; the message says why and what to write instead."""


class RegexAnswerTooLong(ValueError):
    """An answer too long to match against this pattern within the work bound."""


def _options() -> re2.Options:
    options = re2.Options()
    # Errors come back as exceptions; RE2's own log would write them to the worker's stderr.
    options.log_errors = False
    # Scoring needs a yes or no, never the groups: without captures RE2 uses its fastest
    # engines and a smaller program.
    options.never_capture = True
    # RE2's memory budget per compiled pattern (program and DFA cache; the default is 8 MiB).
    # The binding keeps its last 128 compiled patterns, so a suite of many hostile patterns
    # could otherwise hold ~350 MiB (measured) of DFA caches in a worker; past the budget RE2
    # falls back to its NFA, still linear and within MAX_REGEX_WORK.
    options.max_mem = 2 * 1024**2
    return options


def regex_compile(pattern: str) -> re2._Regexp:
    """The pattern compiled by RE2, or ``RegexRefused`` with what to change."""
    try:
        encoded = pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise RegexRefused(
            "contains a lone surrogate (\\ud800-\\udfff): not valid Unicode"
        ) from None
    empty_min = _empty_minimum_repeat(pattern)
    if empty_min is not None:
        # Python reads "{,3}" as "{0,3}"; RE2 reads it as the literal text "{,3}". Refusing it
        # keeps the pattern meaning what its author meant.
        raise RegexRefused(
            f"uses {empty_min}, which RE2 reads as literal text: write {{0,{empty_min[2:-1]}}}"
        )
    try:
        compiled = re2.compile(encoded, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "unknown error"
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise RegexRefused(f"is not a pattern RE2 accepts ({reason}). {_SYNTAX}") from None
    size = compiled.programsize
    if size > MAX_REGEX_PROGRAM_SIZE:
        raise RegexRefused(
            f"compiles to {size} RE2 instructions, over the limit of {MAX_REGEX_PROGRAM_SIZE}: "
            "simplify it (fewer or smaller repetition counts and Unicode classes)"
        )
    return compiled


def regex_answer_bytes(compiled: re2._Regexp, text: str) -> bytes:
    """The answer as the UTF-8 bytes RE2 matches, or ``RegexAnswerTooLong``."""
    if len(text) > MAX_REGEX_ANSWER_CHARS:
        raise RegexAnswerTooLong(f"the answer is over {MAX_REGEX_ANSWER_CHARS} characters")
    # A lone surrogate (JSON allows "\ud800") cannot be UTF-8: it becomes "?" and fails to
    # match, rather than crashing the scorer.
    data = text.encode("utf-8", errors="replace")
    allowed = MAX_REGEX_WORK // compiled.programsize
    if len(data) > allowed:
        raise RegexAnswerTooLong(
            f"the answer is {len(data)} bytes; this pattern can be matched against at most "
            f"{allowed} (a larger pattern leaves room for a shorter answer)"
        )
    return data


def regex_fullmatch(pattern: str, text: str) -> bool:
    """Whether the whole ``text`` matches ``pattern``; ``RegexRefused`` or
    ``RegexAnswerTooLong`` when either is beyond the bounds."""
    compiled = regex_compile(pattern)
    return compiled.fullmatch(regex_answer_bytes(compiled, text)) is not None


def regex_problem(pattern: str) -> str | None:
    """Why the suite import refuses this pattern (to follow "field 'expected' "), or None."""
    try:
        regex_compile(pattern)
    except RegexRefused as exc:
        return str(exc)
    return None


def _empty_minimum_repeat(pattern: str) -> str | None:
    """The first ``{,n}`` outside a character class and not escaped, or None."""
    i, in_class, n = 0, False, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            # A "]" right after "[" or "[^" is a literal member, not the end of the class.
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            continue
        elif ch == "{" and pattern.startswith("{,", i):
            j = i + 2
            while j < n and pattern[j].isdigit():
                j += 1
            if j > i + 2 and j < n and pattern[j] == "}":
                return pattern[i : j + 1]
        i += 1
    return None

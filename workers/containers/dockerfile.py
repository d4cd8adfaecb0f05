"""A task's Dockerfile, as the image builder needs it: its instructions with their lines, and
its ``FROM`` references rewritten to the images this engine has.

The one reading of a Dockerfile's lines in coevo (coevo/suites/dockerfile.py, which reads
Dockerfiles at import for the files they copy, uses it too): logical lines (continuations,
comments, parser directives, heredoc bodies) with the physical line each starts on, since the
engine's build log counts steps (instructions) and an error must name the line of the
Dockerfile the task's author wrote.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.*?)\s*$")
_HEREDOC = re.compile(r"<<-?\s*([\"']?)([A-Za-z_][A-Za-z0-9_]*)\1")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
MAX_SHOWN_CHARS = 120


class DockerfileInvalid(ValueError):
    """The Dockerfile cannot be built as written (the message names the line)."""


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based, where it starts
    keyword: str  # upper case
    args: str  # continuations joined
    text: str  # the physical lines, as written

    def shown(self) -> str:
        text = " ".join(f"{self.keyword} {self.args}".split())
        return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class Parsed:
    directives: list[str]  # the parser directive lines, kept first
    instructions: list[Instruction]


def dockerfile_parse(text: str) -> Parsed:
    lines = text.splitlines()
    escape = "\\"
    start = 0
    for index, line in enumerate(lines):
        match = _DIRECTIVE.match(line)
        if not match:
            break
        if match.group(1).lower() == "escape" and match.group(2) in ("\\", "`"):
            escape = match.group(2)
        start = index + 1
    instructions: list[Instruction] = []
    parts: list[str] = []
    physical: list[str] = []
    first = 0
    index = start
    while index < len(lines):
        line = lines[index]
        index += 1
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            if parts:
                physical.append(line)  # a comment inside a continuation is dropped by docker
            continue
        if not parts:
            first = index
        physical.append(line)
        if line.rstrip().endswith(escape):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        logical = " ".join(part.strip() for part in parts)
        keyword, *rest = logical.split(None, 1)
        args = rest[0].strip() if rest else ""
        if keyword.upper() in ("RUN", "COPY", "ADD"):
            for match in _HEREDOC.finditer(args):
                while index < len(lines):
                    physical.append(lines[index])
                    index += 1
                    if lines[index - 1].strip() == match.group(2):
                        break
        instructions.append(Instruction(first, keyword.upper(), args, "\n".join(physical)))
        parts, physical = [], []
    if parts:
        raise DockerfileInvalid(
            f"line {first}: the last instruction ends with a line continuation ({escape})"
        )
    return Parsed(lines[:start], instructions)


@dataclass(frozen=True)
class FromLine:
    flags: list[str]  # --platform=...
    image: str  # as written
    stage: str | None  # AS name


def from_parse(instruction: Instruction) -> FromLine:
    words = instruction.args.split()
    flags = [word for word in words if word.startswith("--")]
    rest = [word for word in words if not word.startswith("--")]
    if len(rest) == 1:
        return FromLine(flags, rest[0], None)
    if len(rest) == 3 and rest[1].lower() == "as":
        return FromLine(flags, rest[0], rest[2])
    raise DockerfileInvalid(f"line {instruction.line}: `{instruction.shown()}` is not a FROM")


def expand(value: str, scope: dict[str, str], *, line: int) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` from the ARGs declared before the first
    FROM (the only variables a FROM sees); a name with no value is an error, not an empty
    string, since ``FROM `` with a hole in it names some other image."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if scope.get(name):
            return scope[name]
        if match.group(2) is not None:
            return match.group(2)
        raise DockerfileInvalid(
            f"line {line}: FROM uses ${name}, which has no value (give its ARG a default "
            "before the first FROM)"
        )

    return _VARIABLE.sub(substitute, value)


@dataclass(frozen=True)
class Rewritten:
    text: str
    # For each instruction of ``text``, in order (the engine's build steps): the line of the
    # original Dockerfile it comes from.
    origins: list[int | None]
    # External images the FROMs name, as written (after ARG expansion) -> what they became.
    bases: dict[str, str]


def dockerfile_rewrite(text: str, *, base: Callable[[str, int], str]) -> Rewritten:
    """The Dockerfile with each FROM of an external image replaced by ``base(image, line)``
    (the mapped, present, CA-layered image); a FROM of an earlier stage, or of ``scratch``, is
    kept. Every other instruction is kept as written, so the engine's layer cache is shared
    with any build of the same steps."""
    parsed = dockerfile_parse(text)
    out: list[str] = list(parsed.directives)
    origins: list[int | None] = []
    bases: dict[str, str] = {}
    scope: dict[str, str] = {}
    stages: set[str] = set()
    seen_from = False
    for instruction in parsed.instructions:
        if instruction.keyword == "ARG" and not seen_from:
            for word in instruction.args.split():
                name, _, default = word.partition("=")
                scope[name] = default.strip("\"'")
        if instruction.keyword != "FROM":
            out.append(instruction.text)
            origins.append(instruction.line)
            continue
        seen_from = True
        line = from_parse(instruction)
        image = expand(line.image, scope, line=instruction.line)
        if image.lower() != "scratch" and image.lower() not in stages:
            if image not in bases:
                bases[image] = base(image, instruction.line)
            image = bases[image]
        words = ["FROM", *line.flags, image] + (["AS", line.stage] if line.stage else [])
        out.append(" ".join(words))
        origins.append(instruction.line)
        if line.stage:
            stages.add(line.stage.lower())
    if not seen_from:
        raise DockerfileInvalid("the Dockerfile has no FROM")
    return Rewritten("\n".join(out) + "\n", origins, bases)

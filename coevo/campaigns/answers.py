"""The llm-patch proposer's structured answer: one JSON object the server can enforce.

A small model asked for the free-text format (coevo.campaigns.edits) often leaves out the
``HYPOTHESIS:`` line or a block marker; asked for JSON under a grammar or schema the server
enforces while decoding, every answer it finishes is the object below, so what remains to judge
is whether its edits apply::

    {"hypothesis": "numbered choices make the model pick admissible commands",
     "edits": [{"path": "agent.py", "search": "prompt = \\"> \\"\\n",
                "replace": "prompt = \\"Choose a number: \\"\\n"}]}

Each edit is a search/replace block of coevo.campaigns.edits (an empty ``search`` creates a
file), so the same rules apply them. Servers enforce it differently: llama.cpp's server and
llama-cpp-python take a GBNF ``grammar`` on both completions and chat; vLLM (and OpenAI's API,
on chat) take ``response_format`` with a JSON schema. ``answer_request_fields`` gives the one
each takes. The path is one of the parent's editable files (a small model cannot misspell it)
or, for a new file, a path under a component directory.
"""

from __future__ import annotations

import json
import re
from typing import Any

from coevo.campaigns.edits import MAX_HYPOTHESIS_CHARS, EditRejected, ParsedAnswer, SearchReplace
from coevo.policies.client import ServerFlavor

# json-lines: JSON whose every search is one whole line the file has exactly once, chosen from
# the file's own lines by the grammar or schema, so every finished answer applies.
ANSWER_FORMATS = ("auto", "json", "json-lines", "text")
JSON_FORMATS = ("json", "json-lines")
MAX_LINE_CHOICES = 400  # lines offered per file
MAX_LINE_CHARS = 300
MAX_EDITS = 8
# A JSON answer longer than this is refused unread (max_tokens bounds it already: 32768 tokens
# are at most ~130,000 characters of code).
MAX_ANSWER_CHARS = 400_000
GRAMMAR_SERVERS = (ServerFlavor.LLAMA_CPP, ServerFlavor.LLAMA_CPP_PYTHON)


def answer_schema(*, paths: list[str], directories: list[str]) -> dict[str, Any]:
    """The JSON schema of an answer whose edits name one of ``paths`` or a new file under one
    of ``directories`` (component directories, ending in /)."""
    choices: list[dict[str, Any]] = [{"enum": paths}] if paths else []
    if directories:
        prefixes = "|".join(re.escape(d) for d in directories)
        choices.append({"type": "string", "pattern": f'^({prefixes})[^"\\\\]+$'})
    path: dict[str, Any] = (
        choices[0] if len(choices) == 1 else {"anyOf": choices} if choices else {"type": "string"}
    )
    return {
        "type": "object",
        "properties": {
            "hypothesis": {"type": "string", "minLength": 1},
            "edits": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_EDITS,
                "items": {
                    "type": "object",
                    "properties": {
                        "path": path,
                        "search": {"type": "string"},
                        "replace": {"type": "string"},
                    },
                    "required": ["path", "search", "replace"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["hypothesis", "edits"],
        "additionalProperties": False,
    }


def unique_lines(text: str) -> list[str]:
    """The lines of ``text`` (each with its line break) that a search may quote: not blank,
    and occurring exactly once in the file as a substring."""
    found = []
    for line in text.split("\n")[:-1]:  # the last piece has no line break
        quoted = line + "\n"
        if line.strip() and len(line) <= MAX_LINE_CHARS and text.count(quoted) == 1:
            found.append(quoted)
        if len(found) >= MAX_LINE_CHOICES:
            break
    return found


def answer_lines_schema(*, lines: dict[str, list[str]]) -> dict[str, Any]:
    """The json-lines schema: each edit names a file and one of its ``lines``."""
    schema = answer_schema(paths=sorted(lines), directories=[])
    schema["properties"]["edits"]["items"] = {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "path": {"const": path},
                    "search": {"enum": choices},
                    "replace": {"type": "string"},
                },
                "required": ["path", "search", "replace"],
                "additionalProperties": False,
            }
            for path, choices in sorted(lines.items())
        ]
    }
    return schema


def answer_lines_grammar(*, lines: dict[str, list[str]]) -> str:
    """The json-lines grammar: an edit of each file, its search one of that file's lines."""
    base = answer_grammar(paths=sorted(lines), directories=[]).splitlines()
    rules = [rule for rule in base if not rule.startswith(("edit ::=", "path ::="))]
    files = sorted(lines)
    rules.append("edit ::= " + " | ".join(f"edit{i}" for i in range(len(files))))
    for i, path in enumerate(files):
        rules.append(
            f'edit{i} ::= "{{" ws "\\"path\\":" ws {_gbnf_literal(json.dumps(path))} "," ws '
            f'"\\"search\\":" ws line{i} "," ws "\\"replace\\":" ws text ws "}}"'
        )
        rules.append(
            f"line{i} ::= " + " | ".join(_gbnf_literal(json.dumps(line)) for line in lines[path])
        )
    return "\n".join(rules)


def answer_grammar(*, paths: list[str], directories: list[str]) -> str:
    """The same object as GBNF (llama.cpp's grammar format), keys in a fixed order.

    Whitespace between tokens is bounded: an unbounded ``ws`` lets a small model emit
    newlines until max_tokens, a known failure of JSON grammars."""
    choices = [_gbnf_literal(json.dumps(p)) for p in paths]
    if directories:
        prefixes = " | ".join(_gbnf_literal(d) for d in directories)
        choices.append(f'"\\"" ({prefixes}) char+ "\\""')
    path_rule = " | ".join(choices) or "text1"
    return "\n".join(
        [
            'root ::= "{" ws "\\"hypothesis\\":" ws text1 "," ws "\\"edits\\":" ws "[" ws edit '
            f'("," ws edit){{0,{MAX_EDITS - 1}}} ws "]" ws "}}"',
            'edit ::= "{" ws "\\"path\\":" ws path "," ws "\\"search\\":" ws text "," ws '
            '"\\"replace\\":" ws text ws "}"',
            f"path ::= {path_rule}",
            'text ::= "\\"" char* "\\""',
            'text1 ::= "\\"" char+ "\\""',
            'char ::= [^"\\\\\\x00-\\x1f] | "\\\\" (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
            "ws ::= [ \\n]{0,4}",
        ]
    )


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def answer_request_fields(
    *,
    flavor: str | None,
    paths: list[str],
    directories: list[str],
    lines: dict[str, list[str]] | None = None,
) -> tuple[dict[str, Any], str]:
    """The request fields that make the server of ``flavor`` enforce the JSON answer (with
    ``lines``: the json-lines answer), and what enforces it (``grammar`` or
    ``response_format``)."""
    if flavor in GRAMMAR_SERVERS:
        if lines is not None:
            return {"grammar": answer_lines_grammar(lines=lines)}, "grammar"
        return {"grammar": answer_grammar(paths=paths, directories=directories)}, "grammar"
    if lines is not None:
        schema = answer_lines_schema(lines=lines)
    else:
        schema = answer_schema(paths=paths, directories=directories)
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "harness_patch", "schema": schema, "strict": True},
        }
    }, "response_format"


def answer_format_choose(
    *, wanted: str, flavor: str | None, texts: dict[str, str], components: list[str]
) -> tuple[str, dict[str, Any], str | None]:
    """The answer format (json|json-lines|text) for ``wanted`` (an ANSWER_FORMATS value) on a
    server of ``flavor`` (None: unknown), the request fields that enforce a JSON answer, and
    what enforces them. ``texts``: the parent's editable text files. auto: json-lines on
    llama.cpp (the CPU servers small models run on: every finished answer applies), json on
    vLLM, text where the server is unknown."""
    if wanted == "text" or (wanted == "auto" and flavor is None):
        return "text", {}, None
    if wanted == "auto":
        wanted = "json-lines" if flavor in GRAMMAR_SERVERS else "json"
    lines = None
    if wanted == "json-lines":
        lines = {path: found for path, text in texts.items() if (found := unique_lines(text))}
        if not lines:
            wanted, lines = "json", None  # no line is unique anywhere: quote freely
    directories = [c for c in components if c.endswith("/")]
    fields, enforced_by = answer_request_fields(
        flavor=flavor, paths=sorted(texts), directories=directories, lines=lines
    )
    return wanted, fields, enforced_by


def answer_parse_json(text: str) -> ParsedAnswer:
    """The hypothesis and edits of a JSON answer; raises EditRejected saying what is wrong.

    Lenient where a server did not enforce the format: a Markdown fence or prose around the
    object is skipped (the first ``{`` starts it, whatever follows it is ignored)."""
    if len(text) > MAX_ANSWER_CHARS:
        raise EditRejected(
            f"malformed answer: {len(text):,} characters, more than the {MAX_ANSWER_CHARS:,} a "
            "JSON answer may have."
        )
    start = text.find("{")
    if start < 0:
        raise EditRejected(
            'malformed answer: no JSON object (expected {"hypothesis": ..., "edits": [...]}).'
        )
    try:
        value, _ = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise EditRejected(
            f"malformed answer: not valid JSON ({exc.msg} at line {exc.lineno} column "
            f'{exc.colno}); expected {{"hypothesis": ..., "edits": [...]}}.'
        ) from None
    if not isinstance(value, dict):
        raise EditRejected("malformed answer: the JSON answer is not an object.")
    hypothesis = value.get("hypothesis")
    if not isinstance(hypothesis, str) or not hypothesis.strip():
        raise EditRejected(
            'malformed answer: no "hypothesis" (one line saying what the edit should improve '
            "and why)."
        )
    edits = value.get("edits")
    if not isinstance(edits, list) or not edits:
        raise EditRejected('malformed answer: no "edits" (a list of {path, search, replace}).')
    if len(edits) > MAX_EDITS:
        raise EditRejected(f"malformed answer: {len(edits)} edits, more than {MAX_EDITS}.")
    blocks = []
    for i, edit in enumerate(edits):
        if not isinstance(edit, dict) or not all(
            isinstance(edit.get(key), str) for key in ("path", "search", "replace")
        ):
            raise EditRejected(
                f"malformed answer: edits[{i}] is not an object with string path, search and "
                "replace."
            )
        search, replace = edit["search"], edit["replace"]
        if search.endswith("\n") and replace and not replace.endswith("\n"):
            # Whole lines replaced by lines: a model that drops the last line break would
            # otherwise join the replacement to the next line of the file.
            replace += "\n"
        blocks.append(SearchReplace(path=edit["path"].strip(), search=search, replace=replace))
    return ParsedAnswer(" ".join(hypothesis.split())[:MAX_HYPOTHESIS_CHARS], "json", blocks=blocks)

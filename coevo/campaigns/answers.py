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
each takes. The path is an enum of the parent's editable files where every component is a file
(a small model cannot misspell it), free text where a component is a directory (new files).
"""

from __future__ import annotations

import json
from typing import Any

from coevo.campaigns.edits import MAX_HYPOTHESIS_CHARS, EditRejected, ParsedAnswer, SearchReplace
from coevo.policies.client import ServerFlavor

ANSWER_FORMATS = ("auto", "json", "text")
MAX_EDITS = 8
# A JSON answer longer than this is refused unread (max_tokens bounds it already: 32768 tokens
# are at most ~130,000 characters of code).
MAX_ANSWER_CHARS = 400_000
GRAMMAR_SERVERS = (ServerFlavor.LLAMA_CPP, ServerFlavor.LLAMA_CPP_PYTHON)


def answer_schema(*, paths: list[str], free_paths: bool) -> dict[str, Any]:
    """The JSON schema of an answer whose edits name ``paths`` (or, ``free_paths``, any)."""
    path: dict[str, Any] = {"type": "string"} if free_paths or not paths else {"enum": paths}
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


def answer_grammar(*, paths: list[str], free_paths: bool) -> str:
    """The same object as GBNF (llama.cpp's grammar format), keys in a fixed order.

    Whitespace between tokens is bounded: an unbounded ``ws`` lets a small model emit
    newlines until max_tokens, a known failure of JSON grammars."""
    if free_paths or not paths:
        path_rule = "text1"
    else:
        path_rule = " | ".join(_gbnf_literal(json.dumps(p)) for p in paths)
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
    *, flavor: str | None, paths: list[str], free_paths: bool
) -> tuple[dict[str, Any], str]:
    """The request fields that make the server of ``flavor`` enforce the JSON answer, and
    what enforces it (``grammar`` or ``response_format``)."""
    if flavor in GRAMMAR_SERVERS:
        return {"grammar": answer_grammar(paths=paths, free_paths=free_paths)}, "grammar"
    schema = answer_schema(paths=paths, free_paths=free_paths)
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "harness_patch", "schema": schema, "strict": True},
        }
    }, "response_format"


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

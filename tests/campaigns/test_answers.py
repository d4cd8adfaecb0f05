"""The JSON answer format: its schema and grammar, and the parser's bounds and leniency."""

from __future__ import annotations

import json

import pytest

from coevo.campaigns.answers import (
    MAX_ANSWER_CHARS,
    MAX_EDITS,
    answer_format_choose,
    answer_grammar,
    answer_lines_grammar,
    answer_lines_schema,
    answer_parse_json,
    answer_request_fields,
    answer_schema,
    unique_lines,
)
from coevo.campaigns.edits import EditRejected

EDIT = {"path": "agent.py", "search": "a = 1\n", "replace": "a = 2"}


def test_it_parses_an_answer_inside_a_fence_and_keeps_whole_lines():
    text = "Here it is:\n```json\n" + json.dumps({"hypothesis": " two\nlines ", "edits": [EDIT]})
    answer = answer_parse_json(text + "\n```\nThanks.")
    assert answer.format == "json" and answer.hypothesis == "two lines"
    [block] = answer.blocks
    # A replacement of whole lines keeps its line break even when the model dropped it.
    assert (block.path, block.search, block.replace) == ("agent.py", "a = 1\n", "a = 2\n")
    assert answer.paths == ["agent.py"]


def test_it_bounds_what_it_reads():
    with pytest.raises(EditRejected, match="more than the 400,000"):
        answer_parse_json("{" + " " * MAX_ANSWER_CHARS)
    many = {"hypothesis": "h", "edits": [EDIT] * (MAX_EDITS + 1)}
    with pytest.raises(EditRejected, match=f"{MAX_EDITS + 1} edits, more than {MAX_EDITS}"):
        answer_parse_json(json.dumps(many))
    with pytest.raises(EditRejected, match='no "hypothesis"'):
        answer_parse_json('{"edits": []}')


def test_paths_are_the_editable_files_or_new_files_under_a_component_directory():
    schema = answer_schema(paths=["agent.py"], directories=["prompts/"])
    path = schema["properties"]["edits"]["items"]["properties"]["path"]
    assert path["anyOf"][0] == {"enum": ["agent.py"]}
    assert path["anyOf"][1]["pattern"].startswith("^(prompts/)")
    grammar = answer_grammar(paths=["agent.py"], directories=["prompts/"])
    assert 'path ::= "\\"agent.py\\"" | "\\"" ("prompts/") char+ "\\""' in grammar
    assert f'("," ws edit){{0,{MAX_EDITS - 1}}}' in grammar


def test_each_server_gets_the_field_it_enforces():
    fields, by = answer_request_fields(flavor="llama-cpp-python", paths=["a.py"], directories=[])
    assert by == "grammar" and set(fields) == {"grammar"}
    fields, by = answer_request_fields(flavor="vllm", paths=["a.py"], directories=[])
    assert by == "response_format" and fields["response_format"]["type"] == "json_schema"
    assert fields["response_format"]["json_schema"]["strict"] is True


def test_json_lines_offers_only_lines_a_search_can_quote_exactly_once():
    text = 'def run(task, ctx):\n    x = 1\n    x = 1\n\n    return "a\\b"\nno break'
    assert unique_lines(text) == ["def run(task, ctx):\n", '    return "a\\b"\n']
    grammar = answer_lines_grammar(lines={"agent.py": unique_lines(text), "b.py": ["y\n"]})
    assert "edit ::= edit0 | edit1" in grammar
    assert 'line0 ::= "\\"def run(task, ctx):\\\\n\\"" | "\\"    return \\\\\\"a' in grammar
    assert 'line1 ::= "\\"y\\\\n\\""' in grammar
    schema = answer_lines_schema(lines={"b.py": ["y\n"]})
    [choice] = schema["properties"]["edits"]["items"]["anyOf"]
    assert choice["properties"]["path"] == {"const": "b.py"}
    assert choice["properties"]["search"] == {"enum": ["y\n"]}


def test_auto_picks_by_server_and_json_lines_falls_back_when_no_line_is_unique():
    texts = {"agent.py": "a\nb\n"}
    assert answer_format_choose(wanted="auto", flavor=None, texts={}, components=[])[0] == "text"
    chosen, fields, by = answer_format_choose(
        wanted="auto", flavor="llama-cpp-python", texts=texts, components=["agent.py"]
    )
    assert (chosen, by) == ("json-lines", "grammar") and "line0 ::=" in fields["grammar"]
    assert answer_format_choose(wanted="auto", flavor="vllm", texts=texts, components=[])[0] == (
        "json"
    )
    repeated = {"agent.py": "x\nx\n"}
    chosen, fields, _ = answer_format_choose(
        wanted="json-lines", flavor="llama.cpp", texts=repeated, components=[]
    )
    assert chosen == "json" and "line0" not in fields["grammar"]

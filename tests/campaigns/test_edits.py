"""The llm-patch answer format: parsing and applying edits (pure functions, no database)."""

from __future__ import annotations

import pytest

from coevo.campaigns.edits import EditRejected, answer_parse, edits_apply, path_check

COMPONENTS = ("agent.py", "prompts/", "harness.toml")
MANIFEST = """[harness]
name = "x"
entrypoint = "agent:run"
components = ["agent.py", "prompts/", "harness.toml"]

[knobs.temperature]
type = "float"
default = 0.0
"""
AGENT = 'def run(task, ctx):\n    prompt = "Q: " + task["input"]\n    return ctx.llm.complete(prompt).text\n'
FILES = {"agent.py": AGENT, "harness.toml": MANIFEST, "prompts/system.txt": "Be brief.\n"}


def apply(text: str, files=FILES, components=COMPONENTS):
    return edits_apply(answer=answer_parse(text), files=dict(files), components=components)


def block(path: str, search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH {path}\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def test_it_applies_a_search_replace_block_and_keeps_the_hypothesis():
    text = "HYPOTHESIS: an answer prefix helps\n" + block(
        "agent.py", '    prompt = "Q: " + task["input"]\n', '    prompt = "A: " + task["input"]\n'
    )
    answer = answer_parse(text)
    assert answer.hypothesis == "an answer prefix helps"
    assert answer.format == "search-replace"
    changes = apply(text)
    assert changes == {"agent.py": AGENT.replace('"Q: "', '"A: "').encode()}


def test_it_ignores_code_fences_and_prose_around_blocks():
    text = (
        "Sure! Here is my change.\nHYPOTHESIS: shorter\n```python\n"
        + block("prompts/system.txt", "Be brief.\n", "Be very brief.\n")
        + "```\nThat is all."
    )
    assert apply(text) == {"prompts/system.txt": b"Be very brief.\n"}


def test_it_creates_a_new_file_inside_a_component_directory_with_an_empty_search():
    text = "HYPOTHESIS: few-shot file\n" + block("prompts/shots.txt", "", "Q: 1\nA: 2\n")
    assert apply(text) == {"prompts/shots.txt": b"Q: 1\nA: 2\n"}


def test_it_applies_a_unified_diff_even_with_wrong_line_numbers():
    diff = (
        "HYPOTHESIS: use the answer prefix\n"
        "--- a/agent.py\n+++ b/agent.py\n"
        "@@ -7,3 +7,3 @@\n"
        " def run(task, ctx):\n"
        '-    prompt = "Q: " + task["input"]\n'
        '+    prompt = "A: " + task["input"]\n'
        "     return ctx.llm.complete(prompt).text\n"
    )
    assert answer_parse(diff).format == "unified-diff"
    assert apply(diff) == {"agent.py": AGENT.replace('"Q: "', '"A: "').encode()}


def test_it_creates_and_deletes_files_with_dev_null_diffs():
    diff = (
        "HYPOTHESIS: move the prompt\n"
        "--- /dev/null\n+++ b/prompts/new.txt\n@@ -0,0 +1,1 @@\n+hello\n"
        "--- a/prompts/system.txt\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-Be brief.\n"
    )
    assert apply(diff) == {"prompts/new.txt": b"hello\n", "prompts/system.txt": None}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (block("agent.py", "x\n", "y\n"), "no 'HYPOTHESIS: ...' line"),
        ("HYPOTHESIS: nothing\nI would change the prompt.", "no edit found"),
        (
            "HYPOTHESIS: h\n<<<<<<< SEARCH agent.py\nx\n=======\ny\n",
            "has no '>>>>>>> REPLACE' line",
        ),
        ("HYPOTHESIS: h\n<<<<<<< SEARCH agent.py\nx\n", "has no '=======' line"),
        ("HYPOTHESIS: h\n=======\n>>>>>>> REPLACE\n", "without its '<<<<<<< SEARCH path' line"),
        (
            "HYPOTHESIS: h\n"
            + block("agent.py", "x\n", "y\n")
            + "--- a/agent.py\n+++ b/agent.py\n@@ -1 +1 @@\n-a\n+b\n",
            "mixes search/replace blocks and a unified diff",
        ),
        ("HYPOTHESIS: h\n--- a/agent.py\n+++ b/agent.py\n@@ nonsense\n", "bad hunk header"),
        (
            "HYPOTHESIS: h\n--- a/agent.py\n+++ b/agent.py\n@@ -1,3 +1,3 @@\n def run(task, ctx):\n",
            "ends early",
        ),
        ("HYPOTHESIS: h\n--- a/agent.py\n+++ b/other.py\n@@ -1 +1 @@\n-a\n+b\n", "renames"),
    ],
)
def test_it_refuses_malformed_answers_with_a_precise_reason(text, reason):
    with pytest.raises(EditRejected, match="malformed") as exc:
        answer_parse(text)
    assert reason in str(exc.value)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("notes.txt", "outside the declared components"),
        ("prompts", "outside the declared components"),
        ("../agent.py", "not a path inside the harness"),
        ("/etc/passwd", "not a path inside the harness"),
        (".git/config", "not a path inside the harness"),
        ("prompts/../../x", "not a path inside the harness"),
    ],
)
def test_it_refuses_paths_outside_the_components(path, reason):
    with pytest.raises(EditRejected, match=reason):
        path_check(path, COMPONENTS)
    with pytest.raises(EditRejected, match=reason):
        apply("HYPOTHESIS: h\n" + block(path, "", "x\n"))


def test_it_refuses_manifest_edits_unless_the_manifest_is_a_component():
    text = "HYPOTHESIS: h\n" + block("harness.toml", "default = 0.0\n", "default = 0.5\n")
    assert apply(text) == {"harness.toml": MANIFEST.replace("0.0", "0.5").encode()}
    with pytest.raises(EditRejected, match="harness.toml is not a declared component"):
        apply(text, components=("agent.py",))


def test_it_refuses_a_manifest_edit_that_widens_the_components_or_moves_the_entrypoint():
    widen = block("harness.toml", '"harness.toml"]\n', '"harness.toml", "tools/"]\n')
    with pytest.raises(EditRejected, match="changes \\[harness\\] components"):
        apply("HYPOTHESIS: h\n" + widen)
    move = block("harness.toml", 'entrypoint = "agent:run"\n', 'entrypoint = "other:run"\n')
    with pytest.raises(EditRejected, match="changes \\[harness\\] entrypoint"):
        apply("HYPOTHESIS: h\n" + move)


def test_it_lets_invalid_toml_through_for_the_manifest_stage_to_report():
    text = "HYPOTHESIS: h\n" + block("harness.toml", "default = 0.0\n", "default = = 0.5\n")
    assert b"default = = 0.5" in apply(text)["harness.toml"]


def test_it_refuses_edits_that_do_not_apply():
    with pytest.raises(EditRejected, match="occurs 0 times"):
        apply("HYPOTHESIS: h\n" + block("agent.py", "not in the file\n", "x\n"))
    twice = {**FILES, "agent.py": "a = 1\na = 1\n"}
    with pytest.raises(EditRejected, match="occurs 2 times"):
        apply("HYPOTHESIS: h\n" + block("agent.py", "a = 1\n", "a = 2\n"), files=twice)
    with pytest.raises(EditRejected, match="no such file"):
        apply("HYPOTHESIS: h\n" + block("prompts/missing.txt", "x\n", "y\n"))
    with pytest.raises(EditRejected, match="exists"):
        apply("HYPOTHESIS: h\n" + block("agent.py", "", "x\n"))
    diff = "HYPOTHESIS: h\n--- a/agent.py\n+++ b/agent.py\n@@ -1,1 +1,1 @@\n-nope\n+yes\n"
    with pytest.raises(EditRejected, match="hunk 1 does not apply"):
        apply(diff)


def test_it_reports_a_no_op_edit_as_no_change():
    text = "HYPOTHESIS: h\n" + block("prompts/system.txt", "Be brief.\n", "Be brief.\n")
    assert apply(text) == {}

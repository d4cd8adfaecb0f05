"""The imports stage of a program harness, in the real sandbox: its command's program is there
(shipped and executable, or on the PATH the program gets) and its script parses."""

from __future__ import annotations

import shutil

import pytest

from workers.import_check import import_check


def program(tmp_path, command: str, files: dict[str, str], *, mode: int = 0o644):
    directory = tmp_path / "harness"
    directory.mkdir()
    (directory / "harness.toml").write_text(
        f'[harness]\nname = "p"\ncommand = {command}\ncomponents = ["agent.py", "prompts/"]\n'
    )
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    return directory


@pytest.mark.parametrize(
    ("command", "files", "ok", "reason"),
    [
        ('["python3", "agent.py"]', {"agent.py": "print(1)\n"}, True, "agent.py parses"),
        ('["python", "-u", "agent.py"]', {"agent.py": "x = 1\n"}, True, "agent.py parses"),
        (
            '["python3", "agent.py"]',
            {"agent.py": "def run(:\n"},
            False,
            "agent.py does not parse: SyntaxError",
        ),
        # The check never runs the program: this one would exit 3 at once.
        ('["python3", "agent.py"]', {"agent.py": "raise SystemExit(3)\n"}, True, "parses"),
        ('["bash", "run.sh"]', {"run.sh": "echo '\"x\"' > $COEVO_ANSWER_FILE\n"}, True, "parses"),
        ('["bash", "run.sh"]', {"run.sh": "if then fi {\n"}, False, "run.sh does not parse"),
        (
            '["no-such-agent-cli", "--task"]',
            {},
            False,
            "'no-such-agent-cli' is not on the sandbox's PATH",
        ),
        # A module to run, not a script: the interpreter is there, nothing more to check.
        ('["python3", "-m", "agent"]', {"agent.py": "def run(:\n"}, True, "is there"),
    ],
)
def test_it_checks_the_program_and_its_script_in_the_sandbox(tmp_path, command, files, ok, reason):
    result = import_check(harness_dir=program(tmp_path, command, files))
    assert (result.ok, reason in result.reason) == (ok, True), result


def test_a_shipped_program_must_be_executable(tmp_path):
    script = '#!/bin/sh\necho 1 > "$COEVO_ANSWER_FILE"\n'
    result = import_check(harness_dir=program(tmp_path, '["./run.sh"]', {"run.sh": script}))
    assert not result.ok and "./run.sh is not executable" in result.reason, result
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    result = import_check(
        harness_dir=program(shipped, '["./run.sh"]', {"run.sh": script}, mode=0o755)
    )
    assert result.ok and "./run.sh is there" in result.reason, result


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_a_node_script_is_parsed_by_node(tmp_path):
    good = import_check(
        harness_dir=program(tmp_path, '["node", "agent.js"]', {"agent.js": "console.log(1);\n"})
    )
    assert good.ok and "agent.js parses" in good.reason, good
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = import_check(
        harness_dir=program(bad_dir, '["node", "agent.js"]', {"agent.js": "function (\n"})
    )
    assert not bad.ok and "agent.js does not parse: SyntaxError" in bad.reason, bad

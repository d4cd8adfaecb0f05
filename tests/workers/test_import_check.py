"""The imports validation stage: the entrypoint imported in the real sandbox."""

from __future__ import annotations

import pytest

from workers.import_check import import_check


def harness(tmp_path, agent: str):
    # A 0755 directory, as the worker exports one (pytest's tmp_path is 0700: the sandbox's
    # unprivileged uid could not read it).
    directory = tmp_path / "harness"
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST)
    (directory / "agent.py").write_text(agent)
    return directory


MANIFEST = '[harness]\nname = "x"\nentrypoint = "agent:run"\ncomponents = ["agent.py"]\n'


@pytest.mark.parametrize(
    ("agent", "ok", "reason"),
    [
        ("def run(task, ctx):\n    return 1\n", True, "agent:run imports"),
        ("def run(task, ctx):\n    return (\n", False, "SyntaxError: '(' was never closed"),
        ("import no_such_module_xyz\n", False, "ModuleNotFoundError"),
        ("def walk(task, ctx):\n    pass\n", False, "agent has no function 'run'"),
        ("run = 3\n", False, "agent:run is not callable"),
        ("raise SystemExit(3)\n", False, "SystemExit: 3"),
        ("import os\nos._exit(0)\n", False, "exited with code 0 before finishing"),
        (
            "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n",
            False,
            "OSError",
        ),
    ],
)
def test_it_imports_the_entrypoint_in_the_sandbox(tmp_path, agent, ok, reason):
    result = import_check(harness_dir=harness(tmp_path, agent))
    assert (result.ok, reason in result.reason) == (ok, True), result


def test_it_fails_an_import_that_hangs_at_the_timeout(tmp_path):
    result = import_check(harness_dir=harness(tmp_path, "while True:\n    pass\n"), timeout_s=1)
    assert not result.ok and "did not finish within 1s" in result.reason

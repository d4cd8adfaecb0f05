"""Harbor-format task directories for tests: tiny bash tasks whose tests read /app/answer.txt."""

from __future__ import annotations

from pathlib import Path

FILES_ONLY = """\
FROM python:3.12-slim
WORKDIR /app
COPY answer.txt /app/
"""
TASK_TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"
tags = ["bash"]

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 60.0
"""
# Reward 1 when /app/answer.txt says 42.
TEST_SH = """\
#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "answer.txt says $(cat /app/answer.txt 2>/dev/null)"
  echo 0 > /logs/verifier/reward.txt
fi
"""
SOLVE_42 = "#!/bin/bash\necho 42 > /app/answer.txt\n"
SOLVE_41 = "#!/bin/bash\necho 41 > /app/answer.txt\necho 'solved, surely'\n"
_DEFAULT = object()


def write_harbor_task(
    parent: Path,
    key: str,
    *,
    dockerfile: str | None = FILES_ONLY,
    environment: dict[str, str] | None = None,
    task_toml: str = TASK_TOML,
    instruction: str = "Write the answer to /app/answer.txt.\n",
    tests: dict[str, str] | None | object = _DEFAULT,
    solve_sh: str | None = None,
) -> Path:
    """A task directory ``parent/key``; ``environment`` holds environment/'s files besides the
    Dockerfile (default: answer.txt saying 0), ``tests`` tests/'s files (default test.sh)."""
    root = parent / key
    root.mkdir(parents=True)
    (root / "task.toml").write_text(task_toml)
    (root / "instruction.md").write_text(instruction)
    files = {"answer.txt": "0\n"} if environment is None else environment
    if dockerfile is not None or files:
        (root / "environment").mkdir()
    if dockerfile is not None:
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    for path, text in files.items():
        target = root / "environment" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    test_files = {"test.sh": TEST_SH} if tests is _DEFAULT else tests
    if test_files is not None:
        (root / "tests").mkdir()
        for path, text in test_files.items():
            (root / "tests" / path).write_text(text)
    if solve_sh is not None:
        (root / "solution").mkdir()
        (root / "solution" / "solve.sh").write_text(solve_sh)
    return root

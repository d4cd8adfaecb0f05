"""HumanEval: the harness returns a completion of the prompt; the hidden tests decide.

The tests run on the worker side in a sandboxed process of their own, with a timeout; the
harness never sees them (only ``prompt`` and ``entry_point`` are in its view of the task).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from workers import sandbox
from workers.environments.base import Verdict


def harness_view(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": inputs["prompt"], "entry_point": inputs["entry_point"]}


def program_for(*, prompt: str, completion: str, test: str, entry_point: str) -> str:
    return f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"


def verify(*, inputs: dict[str, Any], verifier: dict[str, Any], answer: Any) -> Verdict:
    if not isinstance(answer, str):
        return Verdict(
            False, 0.0, f"the answer must be a string completion, got {type(answer).__name__}"
        )
    program = program_for(
        prompt=inputs["prompt"],
        completion=answer,
        test=verifier["test"],
        entry_point=verifier["entry_point"],
    )
    timeout_s = settings.COEVO_VERIFIER_TIMEOUT_S
    result = sandbox.run(
        [sandbox.python_executable(), "-s", "-"],
        stdin=program.encode(),
        timeout_s=timeout_s,
        limits=sandbox.SandboxLimits(cpu_s=timeout_s, memory_bytes=2 * 1024**3),
        max_output_bytes=8 * 1024,
    )
    output = (result.stdout + result.stderr).decode(errors="replace")
    if result.timed_out:
        return Verdict(False, 0.0, f"the hidden tests timed out after {timeout_s}s", output)
    if result.returncode == 0:
        return Verdict(True, 1.0, "all hidden tests passed", output)
    last_line = (
        output.strip().splitlines()[-1] if output.strip() else f"exit code {result.returncode}"
    )
    return Verdict(False, 0.0, f"hidden tests failed: {last_line[:300]}", output)

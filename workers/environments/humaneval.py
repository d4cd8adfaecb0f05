"""HumanEval: the harness returns a completion of the prompt; the hidden tests decide.

The tests run on the worker side in a sandboxed process of their own, with a timeout; the
harness never sees them (only ``prompt`` and ``entry_point`` are in its view of the task).

Helper ``check`` (``ctx.check(completion)``): runs the prompt plus a completion against the
``>>>`` examples in the prompt's own docstring — which the harness can already read — in a
sandbox of its own. It is built from the task's inputs only, never from the hidden tests.
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

from django.conf import settings

from workers import sandbox
from workers.environments.base import (
    Environment,
    InvalidHelperCall,
    Verdict,
    register_environment,
)

CHECK_MARKER = "__coevo_check__ "
MAX_CHECK_CODE = 64 * 1024
MAX_CHECK_OUTPUT = 4000

# Runs after the prompt and the completion, in the same module; the examples come from the
# prompt's docstring, parsed by doctest as `python -m doctest` would.
_CHECK_RUNNER = """

def __coevo_check(prompt):
    import ast, doctest, json, sys
    # The examples of each docstring, as `python -m doctest` reads them (the closing quotes
    # are not part of an example's expected output).
    try:
        tree = ast.parse(prompt)
        docs = [ast.get_docstring(node) or "" for node in ast.walk(tree)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    except SyntaxError:
        docs = [prompt]
    examples = [e for doc in docs for e in doctest.DocTestParser().get_examples(doc)]
    test = doctest.DocTest(examples, globals(), "visible examples", None, 0, None)

    class Checker(doctest.OutputChecker):
        # HumanEval's docstrings are looser than doctest: "21" for '21', and bare
        # `f(x) == y` lines with no output shown. Accept equal literals and a True there.
        def check_output(self, want, got, optionflags):
            if super().check_output(want, got, optionflags):
                return True
            if not want.strip():
                return got.strip() == "True"
            try:
                return ast.literal_eval(want.strip()) == ast.literal_eval(got.strip())
            except Exception:
                return False

    runner = doctest.DocTestRunner(checker=Checker(), optionflags=doctest.NORMALIZE_WHITESPACE)
    report = []
    failed, attempted = runner.run(test, out=report.append)
    sys.stdout.flush()
    print("\\n" + {marker!r} + json.dumps(
        {{"examples": attempted, "failed": failed, "report": "".join(report)}}
    ))


__coevo_check({prompt!r})
"""


def harness_view(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": inputs["prompt"], "entry_point": inputs["entry_point"]}


# The hidden tests compare what the function returns with plain values (``assert f(x) == y``).
# A function that returns an object of its own making can answer every comparison with True
# (an ``__eq__`` that always holds, an ``int`` subclass that equals anything): a reward hack,
# not a solution. So the tests call the function through this guard, defined after the answer
# and the tests (their module-level code cannot replace it) and built from literals only, with
# no global name it could look up (a rebound ``type``, ``isinstance``, ``set`` or ``id`` does not
# fool it): every value the function returns must be made of plain built-in types, containers
# included. Code aimed at the process itself (tracing hooks) remains out of reach of any check
# inside it (docs/threat-model.md).
_PLAIN_GUARD = """
def __coevo_plain(function):
    real_type = ().__class__.__class__
    plain = (
        (0).__class__, (0.0).__class__, (0j).__class__, True.__class__, None.__class__,
        "".__class__, b"".__class__, [].__class__, ().__class__, {}.__class__, {0}.__class__,
    )
    containers = ([].__class__, ().__class__, {0}.__class__)
    mapping = {}.__class__

    def check_plain(value, depth):
        kind = real_type(value)
        if kind not in plain:
            raise AssertionError(
                "the function returned a " + kind.__name__ + " object where the tests "
                "expect plain values (int, float, str, list, dict, ...)"
            )
        if depth > 50:
            raise AssertionError("the function returned a value nested over 50 levels deep")
        if kind is mapping:
            for pair in value.items():
                check_plain(pair, depth + 1)
        elif kind in containers:
            for item in value:
                check_plain(item, depth + 1)

    def guarded(*args, **kwargs):
        value = function(*args, **kwargs)
        check_plain(value, 0)
        return value

    return guarded
"""


# Replaces the end marker in a passing rollout's verifier output.
PASSED_LINE = "[coevo] check() returned: every hidden test ran and passed"


def program_for(*, prompt: str, completion: str, test: str, entry_point: str) -> str:
    return f"{prompt}{completion}\n\n{test}\n{_PLAIN_GUARD}\ncheck(__coevo_plain({entry_point}))\n"


def verify(*, inputs: dict[str, Any], verifier: dict[str, Any], answer: Any) -> Verdict:
    if not isinstance(answer, str):
        return Verdict(
            False, 0.0, f"the answer must be a string completion, got {type(answer).__name__}"
        )
    # The answer's code runs in the same process as the tests, so an exit status of 0 proves
    # nothing (the answer can exit early): only a fresh token printed after check() returned
    # does.
    finished = secrets.token_hex(16)
    program = (
        program_for(
            prompt=inputs["prompt"],
            completion=answer,
            test=verifier["test"],
            entry_point=verifier["entry_point"],
        )
        + f"print({finished!r})\n"
    )
    timeout_s = settings.COEVO_VERIFIER_TIMEOUT_S
    result = _run_python(program, timeout_s=timeout_s, max_output_bytes=8 * 1024)
    output = (result.stdout + result.stderr).decode(errors="replace")
    if result.timed_out:
        return Verdict(False, 0.0, f"the hidden tests timed out after {timeout_s}s", output)
    if result.returncode == 0 and result.stdout.rstrip().endswith(finished.encode()):
        # The marker is a fresh random string that means nothing to a reader of the trace:
        # show what its printing proved instead.
        return Verdict(True, 1.0, "all hidden tests passed", output.replace(finished, PASSED_LINE))
    if result.returncode == 0:
        return Verdict(False, 0.0, "the program exited before the hidden tests finished", output)
    last_line = (
        output.strip().splitlines()[-1] if output.strip() else f"exit code {result.returncode}"
    )
    return Verdict(False, 0.0, f"hidden tests failed: {last_line[:300]}", output)


def check(*, inputs: dict[str, Any], params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run ``prompt + completion`` against the prompt's visible ``>>>`` examples.

    Returns ``{"passed", "examples", "failed", "output", "timed_out"}``: ``passed`` is True
    when the code ran and every visible example gave its shown result (with no examples in
    the prompt, when the code merely ran).
    """
    completion = params.get("completion")
    if not isinstance(completion, str):
        raise InvalidHelperCall(
            f"completion must be a string (the code that continues the prompt), "
            f"got {type(completion).__name__}"
        )
    if len(completion) > MAX_CHECK_CODE:
        raise InvalidHelperCall(f"completion is longer than {MAX_CHECK_CODE} characters")
    if set(params) - {"completion"}:
        raise InvalidHelperCall(f"unknown parameters {sorted(set(params) - {'completion'})}")
    prompt = inputs["prompt"]
    program = f"{prompt}{completion}\n" + _CHECK_RUNNER.format(marker=CHECK_MARKER, prompt=prompt)
    result = _run_python(program, timeout_s=timeout_s, max_output_bytes=64 * 1024)
    stdout = result.stdout.decode(errors="replace")
    stderr = result.stderr.decode(errors="replace")
    summary = None
    head, found, tail = stdout.rpartition(CHECK_MARKER)
    if found and result.returncode == 0:
        try:
            summary = json.loads(tail.splitlines()[0])
        except (ValueError, IndexError):
            summary = None
    if summary is None:
        output = (stdout + stderr).strip()
        if result.timed_out:
            output = f"timed out after {timeout_s:.0f}s\n{output}"
        return {
            "passed": False,
            "examples": None,
            "failed": None,
            "output": output[-MAX_CHECK_OUTPUT:],
            "timed_out": result.timed_out,
        }
    output = (summary["report"] + head.strip() + stderr).strip()
    return {
        "passed": summary["failed"] == 0,
        "examples": summary["examples"],
        "failed": summary["failed"],
        "output": output[-MAX_CHECK_OUTPUT:],
        "timed_out": False,
    }


def _run_python(program: str, *, timeout_s: float, max_output_bytes: int) -> sandbox.SandboxRun:
    return sandbox.run(
        [sandbox.python_executable(), "-s", "-"],
        stdin=program.encode(),
        timeout_s=timeout_s,
        limits=sandbox.SandboxLimits(cpu_s=max(1, math.ceil(timeout_s)), memory_bytes=2 * 1024**3),
        max_output_bytes=max_output_bytes,
    )


@register_environment
class HumanEvalEnvironment(Environment):
    """HumanEval problems: the harness answers a completion, the hidden tests judge it; the
    ``check`` helper runs the visible docstring examples."""

    kind = "humaneval"
    helpers = {"check": check}
    harness_view = staticmethod(harness_view)
    verify = staticmethod(verify)

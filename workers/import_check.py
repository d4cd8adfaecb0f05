"""The ``imports`` validation stage: does the candidate's code load, in the sandbox?

A proposal's code is untrusted like any harness, so the check runs under the same sandbox as a
rollout (workers.sandbox: no network, read-only harness, limits, a timeout): a module that
fails at import time, or lacks the entrypoint function, is rejected before any evaluation
spends a rollout on it. The verdict is the traceback's last line, which names the error.
It checks a directory; coevo/campaigns/import_checks.py exports a stored candidate into one.

A program harness has no entrypoint to import, and running its command would need a task and
the model boundary, which is the smoke rollout's job. What can fail before any task is
checked instead: that the command's program is there (a file the harness ships, executable,
or a name on the PATH the program gets, built dependencies included) and, when the program
is an interpreter this check knows (Python, Node, a POSIX shell) and the command names a
script of the harness, that the script parses: the syntax error a proposer's edit most
often leaves. Nothing of the program runs here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from coevo.errors import InvalidManifest, SandboxUnavailable
from harness_store.manifest import load_manifest
from workers import sandbox
from workers.channel import RUNTIME_DIR
from workers.harness_env import harness_env_binds, harness_env_vars

IMPORT_TIMEOUT_S = 30
_RESULT_PREFIX = "COEVO-IMPORT-CHECK "

# Runs inside the sandbox with the harness as the working directory. The last stdout line is
# the verdict, so whatever the module prints at import time cannot forge one before it.
_CHECK = r"""
import importlib, json, os, sys, traceback
module_name, _, function_name = sys.argv[1].partition(":")
sys.path.insert(0, os.getcwd())
try:
    module = importlib.import_module(module_name)
except BaseException as exc:
    lines = traceback.format_exception_only(type(exc), exc)
    result = {"ok": False, "reason": lines[-1].strip(), "traceback": traceback.format_exc()}
else:
    function = getattr(module, function_name or "run", None)
    if function is None:
        result = {"ok": False, "reason": f"{module_name} has no function {function_name!r}"}
    elif not callable(function):
        result = {"ok": False, "reason": f"{sys.argv[1]} is not callable"}
    else:
        result = {"ok": True, "reason": f"{sys.argv[1]} imports"}
sys.stdout.flush()
sys.stdout.write("\n" + PREFIX + json.dumps(result) + "\n")
sys.stdout.flush()
os._exit(0)
""".replace("PREFIX", repr(_RESULT_PREFIX))


# Runs inside the sandbox for a program harness: argv[1] is its command, as JSON. The PATH is
# the one coevo_runtime.program gives the program (the worker's interpreter first).
_PROGRAM_CHECK = r"""
import json, os, shutil, subprocess, sys
command = json.loads(sys.argv[1])
program, args = command[0], command[1:]
path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
SYNTAX = {
    "python": lambda exe, script: [exe, "-c",
        "import sys; compile(open(sys.argv[1], 'rb').read(), sys.argv[1], 'exec')", script],
    "node": lambda exe, script: [exe, "--check", script],
    "sh": lambda exe, script: [exe, "-n", script],
}
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")

def interpreter(name):
    name = os.path.basename(name)
    if name.startswith("python") or name.startswith("pypy"):
        return "python"
    if name in ("node", "nodejs"):
        return "node"
    return "sh" if name in SHELLS else None

def verdict():
    if "/" in program:
        found = os.path.join(os.getcwd(), program)
        if not os.path.isfile(found):
            where = "the sandbox" if os.path.isabs(program) else "the harness"
            return False, f"the command's program {program} is not a file in {where}"
        if not os.access(found, os.X_OK):
            return False, (f"the command's program {program} is not executable: make it so "
                           f"(git update-index --chmod=+x {program.removeprefix('./')}) and "
                           "commit, or run it through its interpreter (e.g. bash run.sh)")
    else:
        found = shutil.which(program, path=path)
        if found is None:
            return False, (f"the command's program {program!r} is not on the sandbox's PATH "
                           "(the system's programs and the harness's declared dependencies): "
                           "name one the worker has (python, node, bash), or ship it in the "
                           "harness and name it by its path (./bin/agent)")
    kind = interpreter(program)
    script = next((a for a in args if not a.startswith("-")), None)
    if kind is None or script is None or not os.path.isfile(script):
        return True, f"the command's program {program} is there ({found})"
    run = subprocess.run(SYNTAX[kind](found, script), capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    if run.returncode != 0:
        lines = [line.strip() for line in (run.stderr or run.stdout).splitlines() if line.strip()]
        error = next((l for l in reversed(lines) if "Error" in l), lines[-1] if lines else "")
        return False, f"{script} does not parse: {error}"
    return True, f"{program} is there and {script} parses"

try:
    ok, reason = verdict()
    result = {"ok": ok, "reason": reason}
except BaseException as exc:
    result = {"ok": False, "reason": f"checking the command failed: {type(exc).__name__}: {exc}"}
sys.stdout.flush()
sys.stdout.write("\n" + PREFIX + json.dumps(result) + "\n")
sys.stdout.flush()
os._exit(0)
""".replace("PREFIX", repr(_RESULT_PREFIX))


@dataclass(frozen=True)
class ImportCheck:
    ok: bool
    reason: str
    traceback: str = ""


def import_check(
    *, harness_dir: Path, timeout_s: float = IMPORT_TIMEOUT_S, harness_env: Path | None = None
) -> ImportCheck:
    """Import the manifest's entrypoint from ``harness_dir`` in the sandbox (a program
    harness: check its command, see the module docstring), with the harness's built
    dependencies (``harness_env``, workers/harness_env.py) mounted as a rollout has them.

    Raises SandboxUnavailable when the sandbox cannot run (an infrastructure problem, never
    the candidate's fault).
    """
    try:
        manifest = load_manifest(harness_dir)
    except InvalidManifest as exc:
        return ImportCheck(False, str(exc))
    if manifest.is_program:
        check, what = _PROGRAM_CHECK, json.dumps(list(manifest.command))
        subject = f"checking the command {list(manifest.command)!r}"
        # The program's own address-space limit: Node reserves far more than it touches.
        memory = {"memory_bytes": settings.COEVO_PROGRAM_ADDRESS_SPACE_BYTES}
    else:
        check, what, memory = _CHECK, manifest.entrypoint, {}
        subject = f"importing {manifest.entrypoint}"
    run = sandbox.run(
        [sandbox.python_executable(), "-s", "-c", check, what],
        timeout_s=timeout_s,
        ro_binds={
            RUNTIME_DIR: "/opt/coevo",
            harness_dir.resolve(): "/harness",
            **harness_env_binds(harness_env),
        },
        env=harness_env_vars(harness_env, pythonpath="/opt/coevo"),
        cwd="/harness",
        limits=sandbox.SandboxLimits(cpu_s=int(timeout_s) + 5, **memory),
        max_output_bytes=256 * 1024,
        output_limit_bytes=8 * 1024 * 1024,
    )
    stderr = run.stderr.decode(errors="replace")
    if run.timed_out:
        return ImportCheck(False, f"{subject} did not finish within {timeout_s:g}s")
    if stderr.startswith("bwrap:"):
        raise SandboxUnavailable(f"the sandbox failed to start: {stderr[:500]}")
    for line in reversed(run.stdout.decode(errors="replace").splitlines()):
        if line.startswith(_RESULT_PREFIX):
            try:
                result = json.loads(line[len(_RESULT_PREFIX) :])
                return ImportCheck(
                    bool(result["ok"]), str(result["reason"])[:2000], result.get("traceback", "")
                )
            except (ValueError, KeyError, TypeError):
                break
    # No verdict: the import killed the process (os._exit, a signal, a resource limit).
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    how = (
        f"was killed by signal {-run.returncode}"
        if run.returncode is not None and run.returncode < 0
        else f"exited with code {run.returncode}"
    )
    return ImportCheck(
        False,
        f"{subject}: the process {how} before finishing" + (f" ({last[:300]})" if last else ""),
    )

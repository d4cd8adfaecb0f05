"""The ``imports`` validation stage: does the candidate's entrypoint import, in the sandbox?

A proposal's code is untrusted like any harness, so the import runs under the same sandbox as a
rollout (workers.sandbox: no network, read-only harness, limits, a timeout): a module that
fails at import time, or lacks the entrypoint function, is rejected before any evaluation
spends a rollout on it. The verdict is the traceback's last line, which names the error.
It checks a directory; coevo/campaigns/import_checks.py exports a stored candidate into one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class ImportCheck:
    ok: bool
    reason: str
    traceback: str = ""


def import_check(
    *, harness_dir: Path, timeout_s: float = IMPORT_TIMEOUT_S, harness_env: Path | None = None
) -> ImportCheck:
    """Import the manifest's entrypoint from ``harness_dir`` in the sandbox, with the harness's
    built dependencies (``harness_env``, workers/harness_env.py) mounted as a rollout has them.

    Raises SandboxUnavailable when the sandbox cannot run (an infrastructure problem, never
    the candidate's fault).
    """
    try:
        manifest = load_manifest(harness_dir)
    except InvalidManifest as exc:
        return ImportCheck(False, str(exc))
    run = sandbox.run(
        [sandbox.python_executable(), "-s", "-c", _CHECK, manifest.entrypoint],
        timeout_s=timeout_s,
        ro_binds={
            RUNTIME_DIR: "/opt/coevo",
            harness_dir.resolve(): "/harness",
            **harness_env_binds(harness_env),
        },
        env=harness_env_vars(harness_env, pythonpath="/opt/coevo"),
        cwd="/harness",
        limits=sandbox.SandboxLimits(cpu_s=int(timeout_s) + 5),
        max_output_bytes=256 * 1024,
        output_limit_bytes=8 * 1024 * 1024,
    )
    stderr = run.stderr.decode(errors="replace")
    if run.timed_out:
        return ImportCheck(
            False, f"importing {manifest.entrypoint} did not finish within {timeout_s:g}s"
        )
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
        f"importing {manifest.entrypoint}: the process {how} before finishing"
        + (f" ({last[:300]})" if last else ""),
    )

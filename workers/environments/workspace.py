"""Workspace tasks (Harbor's task format): the harness works in a directory, hidden tests judge
what it leaves there.

Each rollout gets a fresh copy of the task's starting files, bound writable at ``/app`` (the
working directory Harbor's tasks use) in the harness's sandbox: the only place it may write
besides its private /tmp. The harness reads ``task["instruction"]``, looks at the files, edits
them and runs commands, in its own sandbox or through the ``exec`` helper
(``ctx.shell(command)`` / ``POST $COEVO_HELPERS_URL/exec``), which runs the command in a sandbox
of its own on the same workspace and puts the command, its exit code and output in the trace.
The workspace's size is watched while anything runs in it (``Workspace.over_limit``).

When the harness is done, the worker reads the final state without following links, stores its
diff against the starting files with the rollout, and verifies a copy: the task's ``tests/``
(from the suite, never from the workspace, never visible to the harness) read-only at
``/tests``, the copy writable at ``/app``, an empty ``/logs/verifier``, then ``bash
/tests/test.sh`` in a fresh sandbox with a timeout. The reward is what test.sh writes to
``/logs/verifier/reward.txt`` (a number) or ``reward.json`` (``{"reward": x, ...}``), in
[0, 1]; 1 passes. A harness that edits or deletes test files in its workspace, or writes a
reward file there, changes nothing of this. docs/threat-model.md says what it does not stop
(code under test that forges the result from inside the verifier's process).

Task data (coevo/suites/harbor.py writes it): ``inputs = {"instruction", "files" (the starting
tree, workers/environments/workspace_files.py), "metadata", "agent_timeout_s"}``;
``verifier = {"tests": tree, "solution": tree, "timeout_s"}``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from workers import sandbox
from workers.containers.engine import ContainerUnavailable
from workers.containers.host_runtime import HostRuntime, host_runtime
from workers.containers.images import TaskImage, image_for_task
from workers.containers.run import container_run, snapshot_remove
from workers.containers.session import TaskContainer, container_settings, image_app_check
from workers.environments.base import (
    Environment,
    InvalidHelperCall,
    Verdict,
    register_environment,
)
from workers.environments.workspace_files import (
    FinalTree,
    WorkspaceRefused,
    tree_changes,
    tree_chown,
    tree_copy,
    tree_diff,
    tree_read_final,
    tree_usage,
    tree_write,
)
from workers.harness_env import ENV_MOUNT
from workers.outcomes import LimitExceeded

MOUNT = "/app"
TESTS_MOUNT = "/tests"
SOLUTION_MOUNT = "/solution"
LOGS_MOUNT = "/logs/verifier"
# Commands start by their path inside the sandbox (a root worker's drops its privileges with
# execv, which does not search PATH).
BASH = "/bin/bash"
MAX_REWARD_FILE_BYTES = 4096
MAX_COMMAND_CHARS = 16 * 1024
MAX_OUTPUT_CHARS = 16 * 1024
# What the verifier's output keeps for reviewers (the tail).
MAX_VERIFIER_OUTPUT_CHARS = 32 * 1024
DEFAULT_EXEC_TIMEOUT_S = 60.0
# Of a container's changes outside /app, how many paths the trace lists (all are counted).
MAX_OUTSIDE_SHOWN = 200
_OUTSIDE_IGNORED = (
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/tmp",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/etc/mtab",
)
# Where a task container holds the harness's own files (read-only binds): the worker's
# interpreters (workers/containers/host_runtime.py), the coevo runtime, the harness's tree and
# its built dependencies, and the rollout's run directory (the model boundary's socket). Not
# the agent's changes: the container's diff leaves them out.
HARNESS_RUN = "/run/coevo"
HARNESS_MOUNTS = ("/opt/coevo-host", "/opt/coevo", "/harness", ENV_MOUNT, HARNESS_RUN)
# How often the workspace's size is checked while the harness runs.
WATCH_S = 0.5
# Size checks in a row that the harness may spoil by renaming or removing what they were
# measuring (a build tool's churn does, now and then); more and it is stopped, since a tree
# that cannot be measured cannot be bounded.
MAX_INCOMPLETE_CHECKS = 10
# How long sealing waits for the workspace's commands to die after they are killed.
SEAL_TIMEOUT_S = 30.0
MAX_EXEC_TIMEOUT_S = 600.0
# pytest's last line ("2 failed, 3 passed in 0.1s"), shown as the verdict's detail.
_PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error)[^=\n]*?)\s*=*$", re.M)
# pytest's short summary: "FAILED /tests/test_x.py::test_y - AssertionError: ...".
_PYTEST_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S.*)$", re.M)


def harness_view(inputs: dict[str, Any]) -> dict[str, Any]:
    """The task as the harness sees it: the instruction and the starting files' names (their
    content is in the workspace itself); never the tests or the solution. Nor task.toml's
    metadata: a Harbor agent sees only instruction.md, and metadata may hold hints (a
    difficulty explanation) meant for the task's readers."""
    return {
        "instruction": inputs["instruction"],
        "files": sorted(inputs.get("files") or {}),
        "workspace": MOUNT,
    }


def task_wall_s(inputs: dict[str, Any]) -> int | None:
    """task.toml's ``[agent] timeout_sec``, when the task sets one."""
    timeout = inputs.get("agent_timeout_s")
    return max(1, math.ceil(float(timeout))) if timeout else None


def sandbox_path() -> str:
    """PATH in the workspace's sandboxes: the worker's interpreter (``python``, ``pytest``)
    first, as for program harnesses."""
    return f"{os.path.dirname(sandbox.python_executable())}:{sandbox.SANDBOX_PATH}"


def sandbox_env() -> dict[str, str]:
    """The variables of every sandbox that works on a workspace (harness, commands, solution,
    tests). The worker's pytest plugins are the worker's, not the task's: pytest loads none
    of them unless a task's command asks (``-p NAME``); with a test runner's plugins installed
    (pytest-django, hypothesis) each run would otherwise import them, seconds each time."""
    return {"PATH": sandbox_path(), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def task_image(environment: Mapping[str, Any]) -> TaskImage:
    """The image of a task that needs its container, from its stored ``environment``: its
    ``docker_image`` when it names one (as Harbor, over a Dockerfile), else its Dockerfile
    built with its context (``image_for_task``: cached per content on this machine)."""
    docker_image = environment.get("docker_image") or None
    return image_for_task(
        dockerfile=None if docker_image else environment.get("dockerfile"),
        context=environment.get("context") or {},
        docker_image=docker_image,
        build_timeout_s=environment.get("build_timeout_s"),
    )


def limits() -> tuple[int, int]:
    """(files, bytes) a workspace may hold."""
    return settings.COEVO_WORKSPACE_MAX_FILES, settings.COEVO_WORKSPACE_MAX_BYTES


class WorkspaceSealed(Exception):
    """A command was asked of a workspace whose rollout is over (its sandboxes are dead)."""


@dataclass
class Workspace:
    """One rollout's workspace on the worker's disk; every sandbox of the rollout runs as
    ``uid`` (root workers), so each may change what another wrote.

    It is read back only once sealed (``seal``): no command may start on it any more, every
    command still running on it has been killed and has returned, and on a root worker no
    process of the rollout's uid is left anywhere. The harness's own sandbox is killed by its
    runner before; a command started through the exec helper is not the harness's process and
    may outlive it, which is why the workspace, not the harness, keeps the list."""

    root: Path
    start: Mapping[str, Mapping[str, Any]]
    uid: int | None
    # Read-only material beside the workspace, in the harness's sandbox only (a proposer's
    # history: coevo/campaigns/proposers/agentic.py): host directory -> where it appears.
    ro_binds: dict[Path, str] = field(default_factory=dict)
    _state: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _running: int = field(default=0, repr=False)
    _sealed: bool = field(default=False, repr=False)
    # Set on sealing: every command's sandbox.run kills its sandbox when it sees it.
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _incomplete_checks: int = field(default=0, repr=False)
    # A task that needs its container (``inputs["environment"]``): its commands run there, and
    # ``start_tree`` is the image's /app as the rollout began (what the diff compares with).
    container: TaskContainer | None = None
    start_tree: FinalTree | None = None
    # What was applied of the task's environment (the trace's "environment" step).
    applied: dict[str, Any] = field(default_factory=dict)
    # A task's own storage bound ([environment] storage_mb), below the operator's.
    max_bytes: int | None = None
    _outside: list[tuple[str, str]] | None = field(default=None, repr=False)
    # A task container the harness runs in (``for_task`` with ``harness``): the worker's
    # interpreters there, and the host directory bound at HARNESS_RUN.
    runtime: HostRuntime | None = None
    run_dir: Path | None = None
    # The workspace's own directory on the worker's disk (``root``'s parent, but for a task
    # container, whose /app is the engine's volume): removed by ``close``.
    base: Path | None = None

    @classmethod
    def for_task(
        cls, inputs: Mapping[str, Any], *, harness: Mapping[Path, str] | None = None
    ) -> Workspace:
        """The workspace of a task: its image's container when the task needs one (its data
        holds an ``environment``: coevo/suites/harbor_tasks.py), else a bubblewrap workspace
        of its starting files. ``harness`` (host path -> target) are the harness's own files
        (workers/channel.py, ``harness_binds``): given, the harness runs in the container too,
        on the worker's interpreters (workers/containers/host_runtime.py). Raises
        ImageUnavailable or ImageBuildFailed (the task's image cannot be had),
        ContainerUnavailable (the engine failed, or the interpreters cannot be brought in),
        WorkspaceTooLarge (the image's /app is past the workspace's limits)."""
        environment = inputs.get("environment")
        if not environment:
            return cls.create(inputs["files"])
        started = time.monotonic()
        image = task_image(environment)
        applied = container_settings(environment)
        # The rollout's run directory (the boundary's socket, for a harness in the container);
        # /app is the container's own volume, filled by the engine from the image's /app.
        base = Path(tempfile.mkdtemp(prefix="coevo-workspace-"))
        container = None
        try:
            image_app_check(image.image)
            runtime = run_dir = None
            binds: dict[Path, str] = {}
            if harness is not None:
                runtime = host_runtime()
                run_dir = base / "run"
                run_dir.mkdir()
                run_dir.chmod(0o755)
                binds = {**runtime.binds, **harness, run_dir: HARNESS_RUN}
            container = TaskContainer.start(image.image, rollout=None, binds=binds, **applied)
            assert container.app_path is not None
            root = container.app_path
            # Owned as in the image: the harness and its commands all run as root in the
            # container, so no sandbox uid shares the files (the workspace has none).
            max_files, max_bytes = limits()
            start_tree = tree_read_final(root, max_files=max_files, max_bytes=max_bytes)
        except BaseException:
            if container is not None:
                container.remove()
            shutil.rmtree(base, ignore_errors=True)
            raise
        return cls(
            root=root,
            start={},
            uid=None,
            container=container,
            start_tree=start_tree,
            runtime=runtime,
            run_dir=run_dir,
            base=base,
            applied={
                "backend": "container",
                # Where the harness itself runs: in the container, or beside it (a bubblewrap
                # sandbox of the worker's, its commands sent to the container).
                "harness": "container" if runtime is not None else "sandbox",
                "image": image.image,
                "image_cached": image.cached,
                "network": "internet" if applied["network"] else "none",
                "cpus": applied["cpus"],
                "memory_bytes": applied["memory_bytes"],
                "ready_s": round(time.monotonic() - started, 3),
                # The build this call ran (none on a cache hit): the worker task records it for
                # the suite's page (coevo/suites/image_builds.py), with the log's last 16 KiB.
                **(
                    {}
                    if image.cached
                    else {
                        "build": {
                            "seconds": round(image.seconds, 3),
                            "content_hash": image.content_hash,
                            "log": image.log[-16 * 1024 :],
                        }
                    }
                ),
            },
            max_bytes=environment.get("storage_bytes") or None,
        )

    @classmethod
    def create(
        cls,
        start: Mapping[str, Mapping[str, Any]],
        *,
        ro_binds: dict[Path, str] | None = None,
    ) -> Workspace:
        base = Path(tempfile.mkdtemp(prefix="coevo-workspace-"))
        root = base / "app"
        root.mkdir()
        tree_write(start, root)
        uid = sandbox.sandbox_uid()
        if uid is not None:
            tree_chown(root, uid)
        return cls(root=root, start=start, uid=uid, ro_binds=dict(ro_binds or {}))

    @property
    def binds(self) -> dict[Path, str]:
        return {self.root: MOUNT}

    def env(self) -> dict[str, str]:
        return {**sandbox_env(), "COEVO_WORKSPACE": MOUNT}

    def command_env(self) -> dict[str, str]:
        """The variables of a command run on the workspace: in a task's container, the
        image's own (its PATH, its ENV lines) and COEVO_WORKSPACE; else the sandbox's."""
        if self.container is not None:
            return {"COEVO_WORKSPACE": MOUNT}
        return self.env()

    def sandbox_options(self, *, harness_env: Path | None) -> dict[str, Any]:
        """What the harness's sandbox (workers/channel.py) gets of the workspace: the writable
        bind, its variables (PATH with the harness's declared dependencies first, then the
        worker's interpreter and ``pytest``), the identity its commands share. A harness in
        the task's container gets the container instead, and the image's PATH: what it runs
        is the image's."""
        in_container = self.container is not None and self.runtime is not None
        if in_container:
            # Every sandbox's variables but its HOME and PATH: the image's.
            env = {k: v for k, v in sandbox.sandbox_env(None).items() if k != "HOME"}
            env.update(COEVO_WORKSPACE=MOUNT, PATH=self.container.image_path())
        else:
            env = self.env()
        if harness_env is not None:
            env["PATH"] = f"{ENV_MOUNT}/bin:{env['PATH']}"
        if in_container:
            return {"container": self.container, "runtime": self.runtime, "env": env}
        return {"rw_binds": self.binds, "ro_binds": self.ro_binds, "env": env, "uid": self.uid}

    def harness_command(self, argv: list[str]) -> list[str]:
        """A program harness's command as it starts: in the task's container, ``python`` and
        ``node`` are the worker's own (the harness's dependencies were built for them), not
        whatever the image has. Raises ContainerUnavailable for Node.js on a worker without."""
        if self.runtime is None or not argv:
            return list(argv)
        name = argv[0]
        if name in ("python", "python3") or name == os.path.basename(self.runtime.python):
            return [self.runtime.python, *argv[1:]]
        if name == "node":
            if self.runtime.node is None:
                raise ContainerUnavailable(
                    "this program harness runs `node`, and the worker has no Node.js to run "
                    "it with in the task's container"
                )
            return [self.runtime.node, *argv[1:]]
        return list(argv)

    def boundary_dirs(self) -> tuple[Path, str] | None:
        """Where a program's model boundary makes its socket directory when the harness runs
        in the task's container: the run directory, and where the container sees it."""
        if self.run_dir is None:
            return None
        return self.run_dir, HARNESS_RUN

    def watch(self, stop: Callable[[LimitExceeded], None]) -> threading.Event:
        """Poll the size every ``WATCH_S`` while the harness runs: past the limits, ``stop``
        once (with the fault) and no more polling. Set the returned event to end it. Nothing
        ends the poll but these two: a check that fails counts as over the limits."""
        done = threading.Event()

        def poll() -> None:
            while not done.wait(WATCH_S):
                problem = self.over_limit()
                if problem:
                    stop(LimitExceeded(problem))
                    return

        threading.Thread(target=poll, daemon=True, name="workspace-watch").start()
        return done

    def over_limit(self) -> str:
        """Why the workspace is over its limits, or "" (lstat only: cheap enough to poll).

        Never raises: a tree that cannot be measured (too deep, a directory made unreadable, a
        check spoiled by renames ``MAX_INCOMPLETE_CHECKS`` times in a row) is over them."""
        max_files, max_bytes = self.limits()
        try:
            usage = tree_usage(self.root, max_files=max_files)
        except WorkspaceRefused as exc:
            return f"limit exceeded: {exc}"
        except OSError as exc:
            return f"limit exceeded: the workspace's size could not be checked ({exc.strerror})"
        if usage.files > max_files:
            return f"limit exceeded: the workspace holds more than {max_files} files"
        if usage.bytes > max_bytes:
            return (
                f"limit exceeded: the workspace holds more than {max_bytes // 1024**2} MiB of files"
            )
        with self._state:
            self._incomplete_checks = self._incomplete_checks + 1 if usage.incomplete else 0
            spoiled = self._incomplete_checks >= MAX_INCOMPLETE_CHECKS
        if spoiled:
            return (
                "limit exceeded: the workspace changed under every size check for "
                f"{MAX_INCOMPLETE_CHECKS * WATCH_S:.0f}s, so its size could not be bounded"
            )
        return ""

    def limits(self) -> tuple[int, int]:
        """(files, bytes) this workspace may hold: the operator's, or a task's storage bound
        below them."""
        max_files, max_bytes = limits()
        return max_files, min(max_bytes, self.max_bytes or max_bytes)

    def run(self, argv: list[str], **options: Any) -> sandbox.SandboxRun:
        """``sandbox.run`` on this workspace, as a command sealing will kill and wait for;
        raises WorkspaceSealed once the rollout is over."""
        with self._state:
            if self._sealed:
                raise WorkspaceSealed("the rollout is over: no command may run in its workspace")
            self._running += 1
        try:
            if self.container is None:
                return sandbox.run(argv, cancel=self._cancel, **options)
            return self._container_run(argv, **options)
        finally:
            with self._state:
                self._running -= 1
                self._state.notify_all()

    def _container_run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        cwd: str = MOUNT,
        max_output_bytes: int = MAX_OUTPUT_CHARS,
        watch: Callable[[], bool] | None = None,
        **_bubblewrap: Any,
    ) -> Any:
        """A command in the task's container (``TaskContainer.exec``; the bubblewrap options
        (binds, uid, limits) have the container's own), as root, as the harness runs there:
        what it makes is root's, as in the image."""
        assert self.container is not None
        return self.container.exec(
            argv,
            timeout_s=timeout_s,
            env=env,
            workdir=cwd,
            max_output_bytes=max_output_bytes,
            cancel=self._cancel,
            watch=watch,
        )

    def seal(self) -> None:
        """Make sure nothing of the rollout can change the workspace any more (see the class
        doc); idempotent. Raises RuntimeError if a command outlives ``SEAL_TIMEOUT_S``: then
        the worker itself is broken, and nothing is read back."""
        with self._state:
            self._sealed = True
            self._cancel.set()
            if not self._state.wait_for(lambda: self._running == 0, timeout=SEAL_TIMEOUT_S):
                raise RuntimeError(
                    f"a command in the workspace was still running {SEAL_TIMEOUT_S:.0f}s after "
                    "it was killed"
                )
        if self.container is not None:
            # Every process in the task's container, whatever command started it, ends here.
            self.container.stop()
        if self.uid is not None:
            # A root worker's sandboxes of one rollout, and nothing else, run as this uid: when
            # none is left, nothing the harness started is.
            sandbox.uid_kill(self.uid, timeout_s=SEAL_TIMEOUT_S)

    def final(self) -> FinalTree:
        """The state the harness left (raises WorkspaceRefused), once sealed."""
        self.seal()
        max_files, max_bytes = self.limits()
        return tree_read_final(self.root, max_files=max_files, max_bytes=max_bytes)

    def changes(self, *, max_files: int, max_bytes: int) -> dict[str, bytes | None]:
        """What the workspace holds that its starting tree did not (``tree_changes``), once
        sealed."""
        self.seal()
        return tree_changes(self.start, self.root, max_files=max_files, max_bytes=max_bytes)

    def diff(self, final: FinalTree) -> dict[str, Any]:
        diff = tree_diff(self.start_tree if self.start_tree is not None else self.start, final)
        if self.container is not None:
            changes = self.outside_changes()
            counts = {kind: 0 for kind in ("added", "changed", "deleted")}
            for _path, kind in changes:
                counts[kind] += 1
            diff["outside_app"] = {
                **counts,
                "paths": [f"{kind} {path}" for path, kind in changes[:MAX_OUTSIDE_SHOWN]],
                "tampered": verifier_tampering(changes),
            }
        return diff

    def outside_changes(self) -> list[tuple[str, str]]:
        """What the task's container changed outside /app (its engine's diff), once sealed;
        the system's own files (/proc, /sys, /dev, the engine's /etc/hosts and resolv.conf,
        /tmp) are left out. Read once and kept."""
        assert self.container is not None
        self.seal()
        if self._outside is None:
            self._outside = [
                (path, kind)
                for path, kind in self.container.changes()
                if not path.startswith(_OUTSIDE_IGNORED)
                and path != "/app"
                and not path.startswith("/app/")
                and path not in HARNESS_MOUNTS
                and not path.startswith(tuple(f"{m}/" for m in HARNESS_MOUNTS))
            ]
        return self._outside

    def close(self) -> None:
        if self.container is not None:
            self.container.remove()  # and /app's volume with it
        shutil.rmtree(self.base or self.root.parent, ignore_errors=True)


# --- the exec helper ------------------------------------------------------------------------


def exec_command(*, workspace: Workspace, params: dict[str, Any], timeout_s: float) -> dict:
    """``ctx.shell(command)``: run ``command`` (a shell string, or an argv list) in the
    workspace, in a sandbox of its own, within ``timeout_s`` (the rollout's remaining time, at
    most; ``params["timeout_s"]`` may ask for less).

    Returns ``{"exit_code", "stdout", "stderr", "timed_out", "duration_ms"}`` (the output's
    tails, at most 16 KiB each); ``exit_code`` is None when it was killed, and ``killed``
    says so when the rollout's end killed it. Raises InvalidHelperCall once the rollout is
    over (its workspace sealed).
    """
    unknown = set(params) - {"command", "timeout_s"}
    if unknown:
        raise InvalidHelperCall(f"unknown parameters {sorted(unknown)}")
    command = params.get("command")
    if isinstance(command, str):
        argv = [BASH, "-c", command]
        size = len(command)
    elif isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        # Looked up on the sandbox's PATH by bash: the sandbox starts a command by its path.
        argv = [BASH, "-c", 'exec "$@"', "coevo-exec", *command]
        size = sum(len(a) for a in command)
    else:
        raise InvalidHelperCall("command must be a shell string or a non-empty list of strings")
    if size > MAX_COMMAND_CHARS or any("\x00" in a for a in argv):
        raise InvalidHelperCall(f"command is longer than {MAX_COMMAND_CHARS} characters or has NUL")
    asked = params.get("timeout_s", DEFAULT_EXEC_TIMEOUT_S)
    if isinstance(asked, bool) or not isinstance(asked, int | float) or not asked > 0:
        raise InvalidHelperCall("timeout_s must be a positive number of seconds")
    timeout = max(0.1, min(float(asked), MAX_EXEC_TIMEOUT_S, timeout_s))
    started = time.monotonic()
    stopped = [""]

    def watch() -> bool:
        stopped[0] = workspace.over_limit()
        return bool(stopped[0])

    try:
        result = workspace.run(
            argv,
            timeout_s=timeout,
            rw_binds=workspace.binds,
            uid=workspace.uid,
            env=workspace.command_env(),
            cwd=MOUNT,
            limits=sandbox.SandboxLimits(cpu_s=max(1, math.ceil(timeout)) + 1, processes=64),
            max_output_bytes=MAX_OUTPUT_CHARS,
            watch=watch,
        )
    except WorkspaceSealed as exc:
        raise InvalidHelperCall(str(exc)) from None
    if result.watch_stopped:
        # The command filled the workspace: the rollout ends (a limit), as for the harness.
        raise LimitExceeded(stopped[0])
    killed = result.timed_out or result.output_exceeded or result.cancelled
    reply = {
        "exit_code": None if killed else result.returncode,
        "stdout": result.stdout.decode(errors="replace")[-MAX_OUTPUT_CHARS:],
        "stderr": result.stderr.decode(errors="replace")[-MAX_OUTPUT_CHARS:],
        "timed_out": result.timed_out,
        "duration_ms": int((time.monotonic() - started) * 1000),
    }
    if result.cancelled:
        # Only a program's command can still run when its rollout ends: the trace says so.
        reply["killed"] = "the rollout ended while the command ran"
    return reply


# --- verification ---------------------------------------------------------------------------


def verify(
    *, inputs: dict[str, Any], verifier: dict[str, Any], answer: Any, workspace: Workspace
) -> Verdict:
    """Run the task's tests on a copy of the final workspace (the answer is not used: the
    workspace is what is judged), once nothing of the rollout can change it."""
    workspace.seal()
    if workspace.container is None:
        return verify_tree(verifier=verifier, source=workspace.root)
    resources = {
        "cpus": workspace.applied["cpus"],
        "memory_bytes": workspace.applied["memory_bytes"],
    }
    network = workspace.applied.get("network") == "internet"
    if settings.COEVO_CONTAINER_VERIFY_ON == "image":
        # The operator's choice: the task's image as built, with the agent's /app only.
        return verify_tree(
            verifier=verifier,
            source=workspace.root,
            image=workspace.applied["image"],
            network=network,
            resources=resources,
        )
    # The tests run in an image of the container's final state: what the agent installed or
    # changed outside /app is there too; /app is the copy, as for bubblewrap. That state is the
    # agent's to shape, the programs the tests run with included: a change to those is caught
    # here, before anything runs (the rest is the threat model's "Containers").
    tampered = verifier_tampering(workspace.outside_changes())
    if tampered:
        return Verdict(
            False,
            0.0,
            f"not verified: the agent changed {', '.join(tampered[:3])}"
            f"{f' (and {len(tampered) - 3} more)' if len(tampered) > 3 else ''}, which the tests "
            "would run with, so what they report could be the agent's; a task whose state "
            "outside /app does not matter is verified on its image instead with "
            "COEVO_CONTAINER_VERIFY_ON=image",
        )
    snapshot = workspace.container.commit()
    try:
        return verify_tree(
            verifier=verifier,
            source=workspace.root,
            image=snapshot,
            network=network,
            resources=resources,
        )
    finally:
        snapshot_remove(snapshot)


# Where a container's programs are found (PATH's usual directories).
_BIN_DIRS = ("/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
# The programs the verifier itself starts (``bash /tests/test.sh``, its ``#!`` line, ``env``):
# no package an agent installs replaces these.
_VERIFIER_PROGRAMS = frozenset({"bash", "sh", "dash", "env"})


def verifier_tampering(changes: list[tuple[str, str]]) -> list[str]:
    """The paths among a container's changes that the tests' own start depends on: the shell
    and ``env`` in any program directory (a copy put first on PATH shadows the image's), the
    dynamic loader's preload and configuration, Python's start-up hooks (``sitecustomize``,
    ``usercustomize``), and the verifier's own mounts. Deletions count too (a shell removed
    and a link left in its place)."""
    found = []
    for path, _kind in changes:
        directory, _, name = path.rpartition("/")
        if (
            (directory in _BIN_DIRS and name in _VERIFIER_PROGRAMS)
            or path == "/etc/ld.so.preload"
            or path.startswith(("/etc/ld.so.conf", "/logs", "/tests"))
            or name in ("sitecustomize.py", "usercustomize.py")
        ):
            found.append(path)
    return found


def verify_tree(
    *,
    verifier: Mapping[str, Any],
    source: Path,
    image: str | None = None,
    network: bool = False,
    resources: Mapping[str, Any] | None = None,
) -> Verdict:
    """``bash /tests/test.sh`` on a copy of ``source`` (see the module docstring): in a
    bubblewrap sandbox, or with ``image`` in a container of it (the task's ``[verifier] env``
    set, the network only with ``network``)."""
    max_files, max_bytes = limits()
    base = Path(tempfile.mkdtemp(prefix="coevo-verify-"))
    try:
        uid = sandbox.sandbox_uid()
        app, tests, logs = base / "app", base / "tests", base / "logs"
        for directory in (app, tests, logs):
            directory.mkdir()
        try:
            tree_copy(source, app, owner=uid, max_files=max_files, max_bytes=max_bytes)
        except WorkspaceRefused as exc:
            return Verdict(False, 0.0, f"not verified: {exc}")
        tree_write(verifier["tests"], tests)
        if uid is not None:
            os.lchown(logs, uid, uid)
        timeout = min(
            float(verifier.get("timeout_s") or settings.COEVO_WORKSPACE_VERIFIER_TIMEOUT_S),
            float(settings.COEVO_WORKSPACE_VERIFIER_TIMEOUT_S),
        )
        stopped = [""]

        def watch() -> bool:
            try:
                usage_app = tree_usage(app, max_files=max_files)
                usage_logs = tree_usage(logs, max_files=max_files)
            except (WorkspaceRefused, OSError):
                stopped[0] = "the tests left a tree whose size could not be checked"
                return True
            over = (
                usage_app.files + usage_logs.files > 2 * max_files
                or usage_app.bytes + usage_logs.bytes > 2 * max_bytes
            )
            stopped[0] = "the tests filled the disk past the workspace's limits" if over else ""
            return over

        if image is None:
            result: Any = sandbox.run(
                [BASH, f"{TESTS_MOUNT}/test.sh"],
                timeout_s=timeout,
                ro_binds={tests: TESTS_MOUNT},
                rw_binds={app: MOUNT, logs: LOGS_MOUNT},
                uid=uid,
                env=sandbox_env(),
                cwd=MOUNT,
                limits=sandbox.SandboxLimits(cpu_s=max(1, math.ceil(timeout)) + 5, processes=128),
                max_output_bytes=MAX_VERIFIER_OUTPUT_CHARS,
                watch=watch,
            )
        else:
            result = container_run(
                image,
                ["bash", f"{TESTS_MOUNT}/test.sh"],
                timeout_s=timeout,
                binds={tests: TESTS_MOUNT},
                rw_binds={app: MOUNT, logs: LOGS_MOUNT},
                env=dict(verifier.get("env") or {}),
                workdir=MOUNT,
                network=network,
                max_output_bytes=MAX_VERIFIER_OUTPUT_CHARS,
                **dict(resources or {}),
            )
        output = (result.stdout + result.stderr).decode(errors="replace")
        output = output[-MAX_VERIFIER_OUTPUT_CHARS:]
        if getattr(result, "watch_stopped", False):
            return Verdict(False, 0.0, f"not verified: {stopped[0]}", output)
        if result.timed_out:
            return Verdict(False, 0.0, f"the tests timed out after {timeout:.0f}s", output)
        reward, problem = read_reward(logs)
        offline = _offline_failure(output) if image is not None and not network else ""
        if offline and (reward is None or reward < 1.0):
            return Verdict(
                False,
                0.0,
                f"not verified: the tests needed the network, which the verifier does not have "
                f"({offline}); a task that needs it sets allow_internet, and the operator "
                "allows it with COEVO_CONTAINER_ALLOW_INTERNET",
                output,
            )
        if reward is None:
            return Verdict(False, 0.0, f"no reward: {problem}", output)
        passed = reward >= 1.0
        return Verdict(passed, reward, _detail(reward, output, result.returncode), output)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# What a command prints when it could not resolve a host name (no network at all).
_OFFLINE = re.compile(
    r"(Temporary failure in name resolution|Could not resolve host:? ?\S*|"
    r"Name or service not known|getaddrinfo (?:ENOTFOUND|EAI_AGAIN)\S*|"
    r"Failed to establish a new connection: \[Errno -3\][^\n]{0,80}|"
    r"Network is unreachable)"
)


def _offline_failure(output: str) -> str:
    """The line that says the tests tried to reach the network, or ""."""
    found = _OFFLINE.search(output)
    return found.group(1)[:160] if found else ""


def read_reward(logs: Path) -> tuple[float | None, str]:
    """The reward test.sh wrote, or (None, why there is none)."""
    for name in ("reward.txt", "reward.json"):
        path = logs / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue
        except OSError:
            return None, f"{name} is not a regular file"
        try:
            if not os.fstat(fd).st_mode & 0o100000:
                return None, f"{name} is not a regular file"
            text = os.read(fd, MAX_REWARD_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(text) > MAX_REWARD_FILE_BYTES:
            return None, f"{name} is longer than {MAX_REWARD_FILE_BYTES} bytes"
        return _parse_reward(name, text.decode(errors="replace"))
    return None, "test.sh wrote neither /logs/verifier/reward.txt nor reward.json"


def _parse_reward(name: str, text: str) -> tuple[float | None, str]:
    try:
        if name == "reward.txt":
            value: Any = float(text.strip())
        else:
            data = json.loads(text)
            numbers = {
                k: v
                for k, v in (data.items() if isinstance(data, dict) else [])
                if isinstance(v, int | float) and not isinstance(v, bool)
            }
            if "reward" in numbers:
                value = numbers["reward"]
            elif len(numbers) == 1:
                value = next(iter(numbers.values()))
            else:
                return None, 'reward.json must hold {"reward": number} (or exactly one number)'
    except (ValueError, RecursionError):
        return None, f"{name} does not hold a number ({text.strip()[:60]!r})"
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None, f"{name} holds {value}, outside [0, 1]"
    return float(value), ""


def _detail(reward: float, output: str, returncode: int | None) -> str:
    """What the verdict says: pytest's summary line when the output has one, and the first
    failing test (the failure patterns of a campaign group rollouts by it)."""
    summaries = _PYTEST_SUMMARY.findall(output)
    tail = f" ({summaries[-1]})" if summaries else ""
    if reward >= 1.0:
        return f"the hidden tests passed{tail}"
    failed = _PYTEST_FAILED.search(output)
    first = f": {failed.group(1)[:300]}" if failed else ""
    if reward > 0:
        return f"the hidden tests passed in part, reward {reward:g}{first}{tail}"
    return f"the hidden tests failed{first}{tail}"


# --- a task's own solution (the import's check) ---------------------------------------------


@dataclass(frozen=True)
class SolutionCheck:
    start: Verdict  # the untouched starting files
    solution: Verdict | None  # after solution/solve.sh; None when the task has no solution
    solve_output: str = ""


def solution_check(*, inputs: Mapping[str, Any], verifier: Mapping[str, Any]) -> SolutionCheck:
    """Verify the starting state as it is, then run ``solution/solve.sh`` on a fresh one (the
    solution read-only at ``/solution``, with the task's ``[solution] env``, the workspace's
    limits and the task's agent timeout) and verify what it leaves: in bubblewrap, or in the
    task's container exactly as a rollout's would be."""
    start = Workspace.for_task(inputs)
    try:
        untouched = verify(
            inputs=dict(inputs), verifier=dict(verifier), answer=None, workspace=start
        )
    finally:
        start.close()
    solution = verifier.get("solution") or {}
    if "solve.sh" not in solution:
        return SolutionCheck(untouched, None)
    workspace = Workspace.for_task(inputs)
    base = Path(tempfile.mkdtemp(prefix="coevo-solution-"))
    try:
        ro_binds: dict[Path, str] = {}
        if workspace.container is not None:
            workspace.container.put_tree(solution, SOLUTION_MOUNT)
        else:
            # The sandbox's uid reads it: not the private (0700) temporary directory itself.
            solution_dir = base / "solution"
            solution_dir.mkdir()
            solution_dir.chmod(0o755)  # whatever the worker's umask
            tree_write(solution, solution_dir)
            ro_binds = {solution_dir: SOLUTION_MOUNT}
        wall = task_wall_s(dict(inputs)) or settings.COEVO_WORKSPACE_VERIFIER_TIMEOUT_S
        timeout = float(min(wall, settings.COEVO_ROLLOUT_WALL_S))  # no more than a harness gets
        result = workspace.run(
            [BASH, f"{SOLUTION_MOUNT}/solve.sh"],
            timeout_s=timeout,
            ro_binds=ro_binds,
            rw_binds=workspace.binds,
            uid=workspace.uid,
            env={**workspace.command_env(), **dict(verifier.get("solution_env") or {})},
            cwd=MOUNT,
            limits=sandbox.SandboxLimits(cpu_s=max(1, math.ceil(timeout)) + 5),
            max_output_bytes=MAX_OUTPUT_CHARS,
            watch=lambda: bool(workspace.over_limit()),
        )
        output = (result.stdout + result.stderr).decode(errors="replace")
        if result.timed_out or result.watch_stopped or result.returncode != 0:
            how = "timed out" if result.timed_out else f"exited with {result.returncode}"
            if result.watch_stopped:
                how = "filled the workspace past its limits"
            return SolutionCheck(untouched, Verdict(False, 0.0, f"solve.sh {how}", output), output)
        verdict = verify(
            inputs=dict(inputs), verifier=dict(verifier), answer=None, workspace=workspace
        )
        return SolutionCheck(untouched, verdict, output)
    finally:
        workspace.close()
        shutil.rmtree(base, ignore_errors=True)


@register_environment
class WorkspaceEnvironment(Environment):
    """Workspace tasks (Harbor's format; see the module doc): the harness works in /app (in
    the task's container when it has one), hidden tests judge what it leaves there."""

    kind = "workspace"
    workspace = True
    helpers = {"exec": exec_command}
    harness_view = staticmethod(harness_view)
    verify = staticmethod(verify)
    wall_s = staticmethod(task_wall_s)

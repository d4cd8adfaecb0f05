"""Workspace tasks on the rollout page: the shell commands a harness ran through the ``exec``
helper, the files it left (the ``workspace_diff`` step) and the hidden tests' output (the
verdict), as workers/environments/workspace.py and workers/rollout.py record them.

Payloads come from the trace, written by a worker that ran untrusted code: every key is
checked for its type here, and every string reaches the page through autoescaping or Pygments.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.traces import TraceSummary, trace_step_payload
from coevo.web.highlight import FileDiff, diff_files
from harness_store.diffs import FilePatch
from workers.trace import Environment, HelperCall, StepKind, Verdict, WorkspaceDiff

# Longer outputs start collapsed: a build log would push the next command off the screen.
COLLAPSE_OVER_LINES = 20
EXEC_HELPER = "exec"


@dataclass(frozen=True)
class OutputView:
    name: str  # stdout | stderr
    text: str
    lines: int

    @property
    def collapsed(self) -> bool:
        return self.lines > COLLAPSE_OVER_LINES


@dataclass(frozen=True)
class ExecView:
    command: str  # as one would type it: an argv list shell-quoted
    exit_code: int | None
    timed_out: bool
    duration_ms: int | None
    timeout_s: float | None  # what the harness asked for, if it did
    outputs: list[OutputView]  # stdout, then stderr

    @property
    def badge(self) -> str:
        """The badge class (coevo.css): pass, fail, or infra for a command that ran out of
        time (the harness's choice of timeout, not the command's failure)."""
        if self.timed_out:
            return "infra"
        return "pass" if self.exit_code == 0 else "fail"

    @property
    def label(self) -> str:
        if self.timed_out:
            return "timed out"
        # No exit code and no timeout: the sandbox killed it (its output went over the limit).
        return "killed" if self.exit_code is None else f"exit {self.exit_code}"


@dataclass(frozen=True)
class WorkspaceFileView:
    path: str
    status: str  # added | modified | deleted
    note: str  # why there is no diff (binary, a link, too large, the size bound), or ""
    diff: FileDiff | None


@dataclass(frozen=True)
class WorkspaceDiffView:
    files: list[WorkspaceFileView]
    added: int
    modified: int
    deleted: int
    truncated: bool
    error: str  # the workspace was over its limits: no diff was taken
    # A task container's changes outside /app (its engine's diff), when it ran in one.
    outside: OutsideView | None = None

    @property
    def changed(self) -> int:
        return self.added + self.modified + self.deleted

    @property
    def summary(self) -> str:
        """ "3 files changed: 1 added, 2 modified, 0 deleted"."""
        files = "file" if self.changed == 1 else "files"
        return (
            f"{self.changed} {files} changed: {self.added} added, {self.modified} modified, "
            f"{self.deleted} deleted"
        )


@dataclass(frozen=True)
class WorkspaceView:
    """What a workspace rollout ended with: its final diff and the hidden tests' verdict
    (None when the rollout ended before the tests ran), both from one attempt."""

    attempt: int
    index: int  # the diff step's, for its link in the trace
    diff: WorkspaceDiffView
    verdict: Verdict | None
    # Where it ran, when in a task's container (the trace's ``environment`` step).
    container: ContainerView | None = None


@dataclass(frozen=True)
class ContainerView:
    image: str
    network: str  # "none" or "internet"
    cpus: float | None
    memory_mib: int | None
    cached: bool
    # Whether the harness itself ran in the container (else beside it, in its sandbox: traces
    # from before harnesses ran there).
    harness_inside: bool = False


def container_view(step: Environment) -> ContainerView | None:
    if step.backend != "container":
        return None
    cpus, memory = step.cpus, step.memory_bytes
    return ContainerView(
        image=str(step.image or "")[:200],
        network="internet" if step.network == "internet" else "none",
        cpus=float(cpus) if isinstance(cpus, int | float) else None,
        memory_mib=int(memory) // 1024**2 if isinstance(memory, int) else None,
        cached=step.image_cached is True,
        harness_inside=step.harness == "container",
    )


def workspace_step_views(steps: Iterable[Any], *, shown: WorkspaceView | None = None) -> None:
    """Set ``step.shell`` (an ``ExecView``) on each ``exec`` helper call of a page and
    ``step.workspace`` (a ``WorkspaceDiffView``) on each workspace diff; the diff ``shown``
    in the page's Workspace section is not highlighted a second time."""
    for step in steps:
        if step.kind == StepKind.HELPER_CALL:
            helper = HelperCall.from_payload(step.payload)
            if helper.name == EXEC_HELPER:
                step.shell = exec_view(helper)
        elif step.kind == StepKind.WORKSPACE_DIFF:
            if shown is not None and (step.attempt, step.index) == (shown.attempt, shown.index):
                step.workspace = shown.diff
            else:
                step.workspace = workspace_diff_view(WorkspaceDiff.from_payload(step.payload))


def rollout_workspace(*, rollout: Rollout, summary: TraceSummary) -> WorkspaceView | None:
    """The last workspace diff of the trace and its attempt's verdict, in one query that
    reads only those steps; None (and no query) when the trace has no workspace diff."""
    if StepKind.WORKSPACE_DIFF not in summary.kinds:
        return None
    # Newest first: in an attempt the verdict follows the diff, so the first two rows are the
    # last attempt's diff and verdict (or a diff and an older attempt's verdict, dropped).
    rows = list(
        TraceStep.objects.filter(
            rollout=rollout, kind__in=(StepKind.WORKSPACE_DIFF, StepKind.VERDICT)
        ).order_by("-attempt", "-index")[:2]
    )
    diff = next((row for row in rows if row.kind == StepKind.WORKSPACE_DIFF), None)
    if diff is None:
        return None
    verdict = next(
        (
            r
            for r in rows
            if r.kind == StepKind.VERDICT and r.attempt == diff.attempt and r.index > diff.index
        ),
        None,
    )
    container = None
    if StepKind.ENVIRONMENT in summary.kinds:
        step = (
            TraceStep.objects.filter(
                rollout=rollout, kind=StepKind.ENVIRONMENT, attempt=diff.attempt
            )
            .order_by("-index")
            .first()
        )
        if step is not None:
            container = container_view(Environment.from_payload(trace_step_payload(step)))
    return WorkspaceView(
        attempt=diff.attempt,
        index=diff.index,
        diff=workspace_diff_view(WorkspaceDiff.from_payload(trace_step_payload(diff))),
        verdict=_verdict(verdict),
        container=container,
    )


def _verdict(row: TraceStep | None) -> Verdict | None:
    """The verdict row's step; None without one, or when its payload is not an object (as
    stored: the worker's trace is not trusted to have written one)."""
    if row is None:
        return None
    payload = trace_step_payload(row)
    return Verdict.from_payload(payload) if isinstance(payload, dict) else None


def exec_view(step: HelperCall) -> ExecView:
    params = step.params if isinstance(step.params, dict) else {}
    result = step.result if isinstance(step.result, dict) else {}
    command = params.get("command")
    if isinstance(command, list):
        command = shlex.join(str(arg) for arg in command)
    timeout_s = params.get("timeout_s")
    return ExecView(
        command=str(command or ""),
        exit_code=_int(result.get("exit_code")),
        timed_out=result.get("timed_out") is True,
        duration_ms=_int(result.get("duration_ms")),
        timeout_s=timeout_s if isinstance(timeout_s, int | float) else None,
        outputs=[_output(name, result.get(name)) for name in ("stdout", "stderr")],
    )


@dataclass(frozen=True)
class OutsideView:
    added: int
    changed: int
    deleted: int
    paths: list[str]
    tampered: list[str]

    @property
    def total(self) -> int:
        return self.added + self.changed + self.deleted


def outside_view(outside: Any) -> OutsideView | None:
    """A workspace diff's ``outside_app`` (the task container's changes outside /app)."""
    if not isinstance(outside, dict):
        return None
    paths = [str(p)[:500] for p in outside.get("paths") or [] if isinstance(p, str)]
    tampered = [str(p)[:500] for p in outside.get("tampered") or [] if isinstance(p, str)]
    return OutsideView(
        added=_int(outside.get("added")) or 0,
        changed=_int(outside.get("changed")) or 0,
        deleted=_int(outside.get("deleted")) or 0,
        paths=paths[:200],
        tampered=tampered[:50],
    )


def workspace_diff_view(step: WorkspaceDiff) -> WorkspaceDiffView:
    if step.error:
        return WorkspaceDiffView([], 0, 0, 0, False, error=str(step.error))
    rows = [f for f in step.files or [] if isinstance(f, dict)]
    texts = [f.get("diff") if isinstance(f.get("diff"), str) else "" for f in rows]
    paths = [str(f.get("path", "")) for f in rows]
    # One highlighting pass for the files that have a diff, in the payload's order.
    highlighted = iter(diff_files([_patch(p, t) for p, t in zip(paths, texts, strict=True) if t]))
    files = [
        WorkspaceFileView(
            path=path,
            status=str(f.get("status", "")),
            note=str(f.get("note") or ""),
            diff=next(highlighted) if text else None,
        )
        for f, path, text in zip(rows, paths, texts, strict=True)
    ]
    return WorkspaceDiffView(
        files,
        added=_int(step.added) or 0,
        modified=_int(step.modified) or 0,
        deleted=_int(step.deleted) or 0,
        truncated=step.truncated is True,
        error="",
        outside=outside_view(step.outside_app),
    )


def _patch(path: str, text: str) -> FilePatch:
    """A file's unified diff (difflib's) as ``harness_store.diffs`` shapes a git diff's part,
    so the candidate diff page's highlighting applies; its +/− counts skip the header."""
    added = removed = 0
    in_hunk = False
    for line in text.splitlines():
        if line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith("+"):
            added += 1
        elif in_hunk and line.startswith("-"):
            removed += 1
    return FilePatch(
        old_path=path,
        new_path=path,
        added=added,
        removed=removed,
        binary=False,
        text=text.rstrip("\n"),
    )


def _output(name: str, text: Any) -> OutputView:
    text = text if isinstance(text, str) else ""
    return OutputView(name=name, text=text, lines=len(text.splitlines()))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

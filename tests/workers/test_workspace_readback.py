"""What a harness leaves in its workspace is read back safely: nothing of the rollout still runs
when it is read (a command started through the exec helper included), no path component is
ever followed (a directory swapped for a link to a host directory is refused, not read), trees
past PATH_MAX are read and copied, and the size watch never dies on what it meets."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.services import evaluation_create
from coevo.suites.harbor import suite_import_harbor
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from tests.support.harbor import write_harbor_task
from workers.environments import workspace as ws_env
from workers.environments import workspace_files
from workers.environments.workspace import Workspace
from workers.environments.workspace_files import (
    MAX_TREE_DEPTH,
    WorkspaceTooLarge,
    WorkspaceUnreadable,
    tree_copy,
    tree_read_final,
    tree_usage,
)
from workers.outcomes import LimitExceeded, RolloutOutcome


@pytest.fixture
def host_secret(tmp_path: Path) -> tuple[Path, str]:
    """A host directory only root may read, holding a secret no rollout may carry out."""
    secret = f"HOST-SECRET-{secrets.token_hex(8)}"
    directory = tmp_path / "host-only"
    directory.mkdir(mode=0o700)
    (directory / "secret.txt").write_text(secret)
    (directory / "secret.txt").chmod(0o600)
    return directory, secret


def make_tree(root: Path) -> None:
    """A file read first, then a directory ``d``."""
    root.mkdir()
    (root / "a_trigger").write_text("first\n")
    (root / "d").mkdir()
    (root / "d" / "inner.txt").write_text("inner\n")


def swap(root: Path, target: Path) -> None:
    """What a command racing the read-back does: ``d`` becomes a link to ``target``."""
    if not (root / "d").is_symlink():
        os.rename(root / "d", root / "d_moved")
        os.symlink(target, root / "d")


def swap_on_reading_a_file(monkeypatch, root: Path, target: Path) -> None:
    """Swap once the walk has listed the root and reads its first file."""
    original = workspace_files._open_regular

    def open_and_swap(*args, **kwargs):
        fd = original(*args, **kwargs)
        swap(root, target)
        return fd

    monkeypatch.setattr(workspace_files, "_open_regular", open_and_swap)


def swap_after_seeing_a_directory(monkeypatch, root: Path, target: Path) -> None:
    """Swap in the narrowest window: ``d`` was measured a directory, and is not yet opened."""
    original = os.stat

    def stat_and_swap(path, *args, **kwargs):
        result = original(path, *args, **kwargs)
        if path == "d" and kwargs.get("dir_fd") is not None:
            swap(root, target)
        return result

    monkeypatch.setattr(workspace_files.os, "stat", stat_and_swap)


def read_all(root: Path) -> bytes:
    """Everything the read-back takes from ``root``, or b"" when it refuses the tree."""
    try:
        final = tree_read_final(root, max_files=100, max_bytes=10**6)
    except WorkspaceUnreadable:
        return b""
    return b"".join((f.data or b"") + f.target.encode() for f in final.files.values())


@pytest.mark.parametrize("when", [swap_on_reading_a_file, swap_after_seeing_a_directory])
def test_a_directory_swapped_for_a_link_during_the_read_is_never_followed(
    tmp_path, monkeypatch, host_secret, when
):
    target, secret = host_secret
    root = tmp_path / "app"
    make_tree(root)
    when(monkeypatch, root, target)

    taken = read_all(root)
    monkeypatch.undo()

    assert (root / "d").is_symlink()  # the swap happened
    assert secret.encode() not in taken


@pytest.mark.parametrize("when", [swap_on_reading_a_file, swap_after_seeing_a_directory])
def test_a_directory_swapped_for_a_link_during_the_copy_is_never_followed(
    tmp_path, monkeypatch, host_secret, when
):
    target, secret = host_secret
    root = tmp_path / "app"
    make_tree(root)
    when(monkeypatch, root, target)
    copy = tmp_path / "copy"
    copy.mkdir()

    with contextlib.suppress(WorkspaceUnreadable):
        tree_copy(root, copy, owner=None, max_files=100, max_bytes=10**6)
    monkeypatch.undo()

    assert (root / "d").is_symlink()
    for path in copy.rglob("*"):
        assert path.is_symlink() or path.is_dir() or secret not in path.read_text()


def deep_tree(root: Path, *, levels: int, name_chars: int = 255) -> str:
    """``levels`` nested directories of long names (made relative to each other, as a harness
    would with mkdir and chdir), a file at the bottom; returns that file's relative path."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    parts = []
    try:
        for level in range(levels):
            name = f"{level:03d}".ljust(name_chars, "x")
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
            parts.append(name)
        out = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"at the bottom\n" + b"y" * 3 * 1024**2)
        os.close(out)
    finally:
        os.close(fd)
    return "/".join([*parts, "bottom.txt"])


def test_a_tree_deeper_than_path_max_is_measured_read_and_copied(tmp_path):
    root = tmp_path / "app"
    bottom = deep_tree(root, levels=20)
    assert len(str(root / bottom)) > os.pathconf("/", "PC_PATH_MAX")

    usage = tree_usage(root, max_files=1000)
    assert usage.files == 21 and usage.bytes >= 3 * 1024**2
    final = tree_read_final(root, max_files=1000, max_bytes=10 * 1024**2)
    assert final.files[bottom].size == len(b"at the bottom\n") + 3 * 1024**2
    copy = tmp_path / "copy"
    copy.mkdir()
    tree_copy(root, copy, owner=None, max_files=1000, max_bytes=10 * 1024**2)
    assert tree_read_final(copy, max_files=1000, max_bytes=10 * 1024**2).files.keys() == {bottom}


def test_a_tree_nested_past_the_depth_bound_is_over_the_limits(tmp_path, settings):
    root = tmp_path / "app"
    deep_tree(root, levels=MAX_TREE_DEPTH + 1, name_chars=1)

    with pytest.raises(WorkspaceTooLarge, match=f"more than {MAX_TREE_DEPTH} levels"):
        tree_read_final(root, max_files=10_000, max_bytes=10**8)
    workspace = Workspace(root=root, start={}, uid=None)
    assert f"more than {MAX_TREE_DEPTH} levels" in workspace.over_limit()


def test_the_size_watch_sees_a_deep_tree_past_its_limit(tmp_path, settings):
    """The path past PATH_MAX used to kill the watch's thread: the limit then stopped applying."""
    settings.COEVO_WORKSPACE_MAX_BYTES = 2 * 1024**2
    root = tmp_path / "app"
    deep_tree(root, levels=20)
    workspace = Workspace(root=root, start={}, uid=None)

    assert "MiB of files" in workspace.over_limit()


def test_a_size_check_that_fails_stops_the_harness_instead_of_ending_the_watch(
    tmp_path, monkeypatch
):
    root = tmp_path / "app"
    root.mkdir()
    workspace = Workspace(root=root, start={}, uid=None)

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(root / "locked"))

    monkeypatch.setattr(ws_env, "tree_usage", unreadable)
    monkeypatch.setattr(ws_env, "WATCH_S", 0.01)
    stopped: list[LimitExceeded] = []
    done = workspace.watch(stopped.append)
    deadline = time.monotonic() + 5
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    done.set()

    assert stopped and "could not be checked (Permission denied)" in str(stopped[0])


def test_a_tree_that_keeps_changing_under_every_check_is_over_the_limits(tmp_path, monkeypatch):
    root = tmp_path / "app"
    root.mkdir()
    workspace = Workspace(root=root, start={}, uid=None)
    monkeypatch.setattr(
        ws_env, "tree_usage", lambda *a, **k: workspace_files.Usage(files=1, incomplete=True)
    )

    verdicts = [workspace.over_limit() for _ in range(ws_env.MAX_INCOMPLETE_CHECKS)]
    assert verdicts[:-1] == [""] * (ws_env.MAX_INCOMPLETE_CHECKS - 1)
    assert "changed under every size check" in verdicts[-1]


def test_a_sealed_workspace_kills_its_running_commands_and_takes_no_more(tmp_path):
    workspace = Workspace.create({"a.txt": {"text": "a\n"}})
    try:
        results = []

        def run_long() -> None:
            results.append(
                ws_env.exec_command(
                    workspace=workspace, params={"command": "sleep 60"}, timeout_s=60
                )
            )

        thread = threading.Thread(target=run_long)
        thread.start()
        time.sleep(1)  # the command is running
        started = time.monotonic()
        workspace.seal()

        assert time.monotonic() - started < 10
        thread.join(timeout=5)
        assert not thread.is_alive()
        (result,) = results
        assert result["exit_code"] is None and result["killed"].startswith("the rollout ended")
        with pytest.raises(ws_env.InvalidHelperCall, match="rollout is over"):
            ws_env.exec_command(workspace=workspace, params={"command": "true"}, timeout_s=5)
    finally:
        workspace.close()


# --- the race, for real: a program harness, its exec command, a Celery worker ----------------

FLIP = """
import ctypes, os, struct, sys
target = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
libc.inotify_add_watch(fd, b"/app", 0x20)  # IN_OPEN of anything in /app
open("/app/started", "w").close()
while True:
    events = os.read(fd, 65536)
    at = 0
    while at < len(events):
        _wd, _mask, _cookie, size = struct.unpack_from("iIII", events, at)
        name = events[at + 16 : at + 16 + size].rstrip(b"\\0")
        at += 16 + size
        # The worker opens a_trigger between listing /app and reading d: swap d now.
        if name == b"a_trigger" and not os.path.islink("/app/d"):
            os.rename("/app/d", "/app/d_moved")
            os.symlink(target, "/app/d")
        elif name == b"zz_last" and os.path.islink("/app/d"):
            # and back, for the next read (the verifier's copy).
            os.unlink("/app/d")
            os.rename("/app/d_moved", "/app/d")
"""

AGENT = """
import json, os, threading, time, urllib.request

open("/app/flip.py", "w").write({flip!r})
open("/app/a_trigger", "wb").write(b"t" * 1024 * 1024)
for i in range(6):  # read between a_trigger and d: the flip's time to act
    open(f"/app/b_pad{{i}}", "wb").write(os.urandom(2 * 1024 * 1024))
os.mkdir("/app/d")
open("/app/d/inner.txt", "w").write("inner\\n")
open("/app/zz_last", "w").write("last\\n")


def exec_in_background():
    request = urllib.request.Request(
        os.environ["COEVO_HELPERS_URL"] + "/exec",
        data=json.dumps({{"command": ["python", "/app/flip.py", {target!r}], "timeout_s": 60}}).encode(),
        headers={{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}},
    )
    try:
        urllib.request.urlopen(request, timeout=120)
    except Exception:
        pass


threading.Thread(target=exec_in_background, daemon=True).start()
while not os.path.exists("/app/started"):
    time.sleep(0.05)
os._exit(0)  # the program ends; its command goes on
"""


def test_a_command_that_outlives_its_program_cannot_swap_host_files_into_the_trace(
    celery_worker_thread, project, policy_version, tmp_path, host_secret, settings
):
    target, secret = host_secret
    settings.COEVO_WORKSPACE_MAX_BYTES = 64 * 1024**2
    write_harbor_task(tmp_path / "tasks", "race")
    suite, _, _ = suite_import_harbor(project=project, name="race", directory=tmp_path / "tasks")
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        '[harness]\nname = "race"\ncommand = ["python", "agent.py"]\n'
        "[limits]\nwall_time_s = 120\nmax_steps = 5\n"
    )
    (harness / "agent.py").write_text(AGENT.format(flip=FLIP, target=str(target)))
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="races the read-back", author_name="t"
    )
    split = suite.tasks.get().split
    evaluation = evaluation_create(
        candidate=candidate, suite=suite, split=split, policy_version=policy_version
    )
    wait_until_final(evaluation, timeout_s=300)

    rollout = Rollout.objects.get(evaluation=evaluation)
    # Scored on what it left (answer.txt untouched: the hidden test fails), never an error.
    assert rollout.outcome == RolloutOutcome.TASK_FAILURE, rollout.detail
    payloads = json.dumps(
        list(TraceStep.objects.filter(rollout=rollout).values_list("payload", flat=True))
    )
    assert secret not in payloads
    (diff,) = TraceStep.objects.filter(rollout=rollout, kind="workspace_diff")
    paths = {row["path"] for row in diff.payload["files"]}
    assert "d/inner.txt" in paths and not any("secret" in path for path in paths)
    # The command was killed with its program: it records its end, never a swap.
    (command,) = TraceStep.objects.filter(rollout=rollout, kind="helper_call")
    assert command.payload["name"] == "exec"
    assert command.payload["result"]["killed"] == "the rollout ended while the command ran"

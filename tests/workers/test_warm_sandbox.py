"""Warm sandboxes (workers/warm.py, coevo_runtime/zygote.py): rollouts of a tree fork from its
zygote into fresh sandboxes, and nothing of one rollout reaches another.

Real bubblewrap, real zygotes, the real runner (``execute_rollout``) on HumanEval/2. The escape
suite runs every attack on the cold path (test_escape.py, the default) and again on warm
sandboxes (test_escape_warm.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.harnesses import CORRECT
from tests.support.harnesses import humaneval_rollout as rollout
from workers import metrics, sandbox, warm
from workers.rollout import RolloutOutcome

# Under CI (root, bubblewrap installed, its environment outside /tmp: scripts/lib.sh) they
# always run.
pytestmark = pytest.mark.skipif(
    (os.geteuid() != 0 or not sandbox.shutil.which("bwrap") or not warm.warm_possible({}))
    and not os.environ.get("CI"),
    reason="warm sandboxes need bubblewrap, a root worker and a Python not under /tmp",
)

MANIFEST = """
[harness]
name = "warm"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 4
wall_time_s = {wall}
"""

# What a rollout can see of the world, logged for the test; then it leaves traces of its own
# (a file in /tmp and /dev/shm, a process, a listening socket, a module global) for the next.
PROBE = """
import json, os, resource, socket, subprocess, sys, time

IMPORTS = globals().get("IMPORTS", 0) + 1
STATE = []


def run(task, ctx):
    mark = "m%d" % ctx.knobs["mark"]
    seen = {
        "uid": os.getuid(),
        "pid": os.getpid(),
        "tmp": sorted(os.listdir("/tmp")),
        "shm": sorted(os.listdir("/dev/shm")),
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "imports": IMPORTS,
        "state": list(STATE),
        "nice": os.nice(0),
        "limits": {name: resource.getrlimit(getattr(resource, name))[0] for name in (
            "RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC")},
        "status": {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status"))
                   if k in ("CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd", "NoNewPrivs")},
        "fds": sorted(os.listdir("/proc/self/fd")),
        "cwd": os.getcwd(),
        "env": sorted(os.environ),
    }
    seen["connected"] = []
    for port in [ctx.knobs["port"]] if ctx.knobs["port"] else []:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            seen["connected"].append(port)
        except OSError:
            pass
    # Leave traces for the next rollout.
    STATE.append(mark)
    for place in ("/tmp", "/dev/shm"):
        with open(os.path.join(place, mark), "w") as f:
            f.write(mark)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    seen["port"] = listener.getsockname()[1]
    subprocess.Popen(["sleep", "30"], start_new_session=True)
    ctx.log("seen:" + json.dumps(seen))
    if ctx.knobs["linger"]:
        time.sleep(ctx.knobs["linger"])
    return "    return number % 1.0\\n"
"""


def make_harness(tmp_path: Path, agent: str, *, wall: int = 20, knobs: str = "") -> Path:
    harness = tmp_path / "harness"
    harness.mkdir(parents=True)
    harness.chmod(0o755)
    (harness / "harness.toml").write_text(MANIFEST.format(wall=wall) + knobs)
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    return harness


PROBE_KNOBS = """
[knobs.mark]
type = "int"
default = 0
[knobs.port]
type = "int"
default = 0
max = 65535
[knobs.linger]
type = "int"
default = 0
"""


def seen(result) -> dict:
    for step in result.steps:
        if step.kind == "log" and step.payload["message"].startswith("seen:"):
            return json.loads(step.payload["message"][len("seen:") :])
    raise AssertionError(f"the harness reported nothing: {result.outcome} {result.detail}")


def warm_starts() -> float:
    return metrics.SANDBOX_STARTS.labels("warm")._value.get()


@pytest.fixture(autouse=True)
def fresh_pool(settings):
    settings.COEVO_WARM_SANDBOXES = True
    warm.pool().close()
    yield
    warm.pool().close()


@pytest.fixture
def probe(tmp_path, scripted_policy):
    scripted_policy.rules.append(("def truncate_number", CORRECT))
    return make_harness(tmp_path, PROBE, knobs=PROBE_KNOBS)


def test_rollouts_of_a_tree_fork_from_one_zygote(probe, scripted_policy):
    before = warm_starts()

    first = rollout(probe, scripted_policy.url, knobs={"mark": 1})
    zygotes = warm.pool().zygote_pids()
    second = rollout(probe, scripted_policy.url, knobs={"mark": 2})

    assert first.outcome == second.outcome == RolloutOutcome.PASSED
    assert len(zygotes) == 1
    assert warm.pool().zygote_pids() == zygotes
    assert warm_starts() == before + 2


def test_nothing_of_one_rollout_reaches_the_next(probe, scripted_policy):
    first = seen(rollout(probe, scripted_policy.url, knobs={"mark": 1}))
    second = seen(rollout(probe, scripted_policy.url, knobs={"mark": 2, "port": first["port"]}))

    for report in (first, second):
        assert report["tmp"] == [] and report["shm"] == []
        # Its own PID namespace: its init (1) and itself, nothing else.
        assert report["pids"] == [1, report["pid"]]
        assert report["imports"] == 1 and report["state"] == []
    assert second["connected"] == []  # the first rollout's loopback is not the second's
    assert first["uid"] != second["uid"]
    assert 0 not in (first["uid"], second["uid"])


def test_concurrent_rollouts_cannot_see_each_other(probe, scripted_policy):
    with ThreadPoolExecutor(2) as pool:
        lingering = pool.submit(rollout, probe, scripted_policy.url, knobs={"mark": 3, "linger": 3})
        time.sleep(1.5)
        first = seen(lingering.result()) if lingering.done() else None
        other = seen(rollout(probe, scripted_policy.url, knobs={"mark": 4}))
        first = first or seen(lingering.result())

    # The other ran while the first was still running, its files and process alive.
    assert other["tmp"] == [] and other["shm"] == []
    assert other["pids"] == [1, other["pid"]]
    assert other["uid"] != first["uid"]


def test_a_warm_rollout_gets_the_cold_sandboxs_limits_identity_and_descriptors(
    probe, scripted_policy, settings
):
    settings.COEVO_WARM_SANDBOXES = False
    cold = seen(rollout(probe, scripted_policy.url, knobs={"mark": 5}))
    settings.COEVO_WARM_SANDBOXES = True
    hot = seen(rollout(probe, scripted_policy.url, knobs={"mark": 6}))

    assert warm.pool().zygote_pids()  # it did run warm
    assert hot["limits"] == cold["limits"]
    assert hot["limits"]["RLIMIT_NPROC"] == sandbox.SandboxLimits().processes
    assert hot["nice"] == cold["nice"] == sandbox.SANDBOX_NICE
    for key in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        assert int(hot["status"][key], 16) == 0
    assert hot["status"]["CapBnd"] == cold["status"]["CapBnd"]
    assert hot["status"]["NoNewPrivs"] == "1"
    assert hot["fds"] == ["0", "1", "2", "3"]  # 3: the listing's own descriptor
    assert hot["cwd"] == cold["cwd"] == "/harness"
    assert hot["env"] == cold["env"]


def test_the_wall_time_kills_a_warm_rollouts_whole_sandbox(tmp_path, scripted_policy):
    harness = make_harness(
        tmp_path,
        """
        import os, subprocess

        def run(task, ctx):
            subprocess.Popen(["sleep", "60"], start_new_session=True)
            ctx.log("uid", os.getuid())
            while True:
                pass
        """,
        wall=2,
    )

    result = rollout(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 2s"
    uid = int(next(s for s in result.steps if s.kind == "log").payload["message"].split()[1])
    time.sleep(0.5)  # a dead PID namespace is reaped asynchronously
    assert _processes_of(uid) == []
    assert warm.pool().in_flight() == 0


def test_a_dead_zygote_ends_its_rollouts_and_the_next_rollout_starts_another(
    tmp_path, scripted_policy
):
    scripted_policy.rules.append(("def truncate_number", CORRECT))
    harness = make_harness(
        tmp_path,
        """
        import time

        def run(task, ctx):
            time.sleep(ctx.knobs["sleep"])
            return ctx.llm.complete(task["prompt"], max_tokens=64).text
        """,
        knobs='[knobs.sleep]\ntype = "int"\ndefault = 0\n',
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(rollout, harness, scripted_policy.url, knobs={"sleep": 30})
        deadline = time.monotonic() + 10
        while warm.pool().in_flight() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        (zygote,) = warm.pool().zygote_pids()
        os.killpg(zygote, signal.SIGKILL)
        result = running.result(timeout=15)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "killed by signal 9" in result.detail
    assert rollout(harness, scripted_policy.url).outcome == RolloutOutcome.PASSED
    (again,) = warm.pool().zygote_pids()
    assert again != zygote
    # The dead one was reaped, not left a zombie (kill(pid, 0) still finds a zombie).
    with pytest.raises(ProcessLookupError):
        os.kill(zygote, 0)


def test_where_a_zygote_cannot_start_rollouts_run_cold_after_one_warning(
    probe, scripted_policy, monkeypatch, caplog
):
    # Without CAP_SYS_ADMIN the zygote's probe sandbox cannot unshare its namespaces.
    monkeypatch.setattr(sandbox, "ZYGOTE_CAPABILITIES", ("CAP_SETUID", "CAP_SETGID"))
    monkeypatch.setattr(warm, "_pool", None)
    before = warm_starts()

    results = [rollout(probe, scripted_policy.url, knobs={"mark": i}) for i in range(2)]

    assert [r.outcome for r in results] == [RolloutOutcome.PASSED, RolloutOutcome.PASSED]
    assert warm_starts() == before
    assert "unshare" in warm.pool().unavailable
    warnings = [r for r in caplog.records if "Warm sandboxes are unavailable" in r.message]
    assert len(warnings) == 1


def test_a_zygote_too_slow_to_start_leaves_that_rollout_cold_and_the_next_tries_again(
    probe, scripted_policy, monkeypatch
):
    monkeypatch.setattr(warm, "START_TIMEOUT_S", 0.001)
    before = warm_starts()
    assert rollout(probe, scripted_policy.url, knobs={"mark": 10}).outcome == RolloutOutcome.PASSED
    assert warm_starts() == before and warm.pool().unavailable == ""

    monkeypatch.setattr(warm, "START_TIMEOUT_S", 20.0)
    assert rollout(probe, scripted_policy.url, knobs={"mark": 11}).outcome == RolloutOutcome.PASSED
    assert warm_starts() == before + 1


def test_anything_under_tmp_keeps_the_cold_path(monkeypatch):
    # A rollout's fresh /tmp would cover it: the cold sandbox builds its /tmp around it.
    assert warm.warm_possible({Path("/srv/tree"): "/harness"})
    assert not warm.warm_possible({Path("/srv/tree"): "/tmp/tree"})
    monkeypatch.setattr(warm.sys, "prefix", "/tmp/checkout/.venv")
    assert not warm.warm_possible({})


def test_idle_zygotes_are_closed(probe, scripted_policy, settings):
    settings.COEVO_WARM_SANDBOX_IDLE_S = 1
    assert rollout(probe, scripted_policy.url, knobs={"mark": 7}).outcome == RolloutOutcome.PASSED
    (zygote,) = warm.pool().zygote_pids()

    deadline = time.monotonic() + 10
    while warm.pool().zygote_pids() and time.monotonic() < deadline:
        time.sleep(0.2)

    assert warm.pool().zygote_pids() == []
    with pytest.raises(ProcessLookupError):
        os.kill(zygote, 0)


def test_at_most_the_maximum_zygotes_live(tmp_path, scripted_policy, settings):
    settings.COEVO_WARM_SANDBOXES_MAX = 2
    scripted_policy.rules.append(("def truncate_number", CORRECT))
    for i in range(3):
        harness = make_harness(tmp_path / str(i), PROBE, knobs=PROBE_KNOBS)
        assert rollout(harness, scripted_policy.url).outcome == RolloutOutcome.PASSED

    assert len(warm.pool().zygote_pids()) == 2


def test_the_zygote_runs_no_harness_code_and_holds_no_open_socket_to_it(probe, scripted_policy):
    """The zygote imports nothing from the tree: an import-time side effect runs per rollout."""
    (probe / "agent.py").write_text(
        "import os, socket\n"
        "socket.socket().bind(('127.0.0.1', 0))\n"
        "COUNT = [os.getpid()]\n" + (probe / "agent.py").read_text()
    )
    first = seen(rollout(probe, scripted_policy.url, knobs={"mark": 8}))
    second = seen(rollout(probe, scripted_policy.url, knobs={"mark": 9}))
    assert first["imports"] == second["imports"] == 1
    (zygote,) = warm.pool().zygote_pids()
    # The zygote's own process (bwrap's child's child) listens on nothing.
    assert not any(_listening_sockets(pid) for pid in _descendants(zygote, depth=2))


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _descendants(pid: int, *, depth: int) -> list[int]:
    found, level = [], [pid]
    for _ in range(depth):
        level = [
            int(child)
            for parent in level
            for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        ]
        found += level
    return found


def _listening_sockets(pid: int) -> list[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            inodes.add(target[len("socket:[") : -1])
    listening = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:
                    listening.append(parts[1])
    return listening


def test_socket_module_is_usable_here() -> None:
    # Sanity: the helpers above read /proc as the test expects.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert _listening_sockets(os.getpid())

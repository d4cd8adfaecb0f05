"""container_run on the real engine: output and exit status, the timeout, the output bound,
no network, the capabilities kept, binds, snapshots, and nothing left behind."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

import pytest

from tests.containers.conftest import REGISTRY, containers_of
from workers.containers import (
    CONTAINER_CAPABILITIES,
    ImageUnavailable,
    container_run,
    snapshot_remove,
)
from workers.containers.engine import engine_client

# Bit numbers of the capabilities (linux/capability.h).
CAPABILITY_BITS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "NET_BIND_SERVICE": 10,
}


def _status(stdout: bytes) -> dict[str, str]:
    lines = stdout.decode().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_it_runs_a_command_and_returns_its_output_and_exit_code(base_image, rollout):
    run = container_run(
        base_image,
        ["sh", "-c", "cat; echo to-stderr >&2; exit 7"],
        stdin=b"from stdin\n",
        timeout_s=60,
        rollout=rollout,
    )

    assert (run.returncode, run.stdout, run.stderr) == (7, b"from stdin\n", b"to-stderr\n")
    assert not (run.timed_out or run.output_exceeded or run.cancelled)
    assert containers_of(rollout) == []  # removed once it ended


def test_the_timeout_kills_the_container_and_removes_it(base_image, rollout):
    started = time.monotonic()

    run = container_run(
        base_image, ["sh", "-c", "echo started; exec sleep 600"], timeout_s=2, rollout=rollout
    )

    assert run.timed_out and run.returncode is None and run.stdout == b"started\n"
    assert time.monotonic() - started < 15
    assert containers_of(rollout) == []


def test_a_cancel_from_another_thread_kills_it(base_image, rollout):
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()

    run = container_run(base_image, ["sleep", "600"], timeout_s=60, cancel=cancel, rollout=rollout)

    assert run.cancelled and not run.timed_out
    assert containers_of(rollout) == []


def test_output_past_the_bound_is_cut_and_the_container_killed(base_image, rollout):
    run = container_run(
        base_image,
        ["sh", "-c", "yes flood | head -c 200000000; echo finished"],
        timeout_s=60,
        max_output_bytes=1000,
        output_limit_bytes=1_000_000,
        rollout=rollout,
    )

    assert run.output_exceeded and not run.timed_out
    assert len(run.stdout) == 1000 and b"finished" not in run.stdout
    assert containers_of(rollout) == []


@pytest.fixture
def host_listener():
    """A TCP listener on every host address that records who connected."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list[tuple] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    done.set()
    thread.join()
    server.close()


def _gateway() -> str:
    """The host's address on the engine's default bridge (an engine that does not list it
    gives the subnet's first address, which it takes)."""
    config = engine_client().api.inspect_network("bridge")["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


PROBE = (
    "for target in {targets}; do "
    'if timeout 5 bash -c "exec 3<>/dev/tcp/$target" 2>/dev/null; '
    'then echo "$target open"; else echo "$target closed"; fi; done; '
    "echo interfaces; tail -n +3 /proc/net/dev"
)


def test_a_container_has_no_network(base_image, host_listener, rollout, egress_network):
    port, accepted = host_listener
    # The host's loopback, the host as the engine's bridge reaches it, and an outside address.
    targets = f"127.0.0.1/{port} {_gateway()}/{port} 151.101.2.132/80"

    run = container_run(
        base_image, ["bash", "-c", PROBE.format(targets=targets)], timeout_s=60, rollout=rollout
    )

    probes, _, devices = run.stdout.decode().partition("interfaces\n")
    assert "open" not in probes and probes.count("closed") == 3, probes
    assert [line.split(":")[0].strip() for line in devices.splitlines()] == ["lo"]
    assert accepted == []
    # With network=True (the egress-only network) the internet answers, so the probe can
    # succeed; the host and the engine's bridge stay out of reach all the same.
    registry = "{}/{}".format(*REGISTRY)
    opened = container_run(
        base_image,
        ["bash", "-c", PROBE.format(targets=f"{registry} {_gateway()}/{port} 127.0.0.1/{port}")],
        timeout_s=60,
        network=True,
        rollout=rollout,
    )
    assert f"{registry} open" in opened.stdout.decode(), opened.stdout
    assert opened.stdout.decode().count("closed") == 2 and accepted == []


def test_root_in_a_container_keeps_only_the_listed_capabilities(base_image, rollout):
    script = (
        "grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status; "
        "mount -t tmpfs none /mnt 2>/dev/null && echo mount-worked; "
        "mknod /tmp/dev c 1 3 2>/dev/null && echo mknod-worked; "
        "touch /tmp/f && chown 4242:4242 /tmp/f && echo chown-worked; "
        # An unprivileged user gets nothing back: no capabilities, and no setuid gain.
        "setpriv --reuid=65534 --regid=65534 --clear-groups grep CapEff /proc/self/status | "
        "sed s/CapEff/NobodyCapEff/"
    )

    run = container_run(base_image, ["bash", "-c", script], timeout_s=60, rollout=rollout)

    status = _status(run.stdout)
    expected = sum(1 << CAPABILITY_BITS[name] for name in CONTAINER_CAPABILITIES)
    assert set(CONTAINER_CAPABILITIES) == set(CAPABILITY_BITS)
    assert int(status["CapEff"], 16) == expected == int(status["CapBnd"], 16)
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"  # the engine's filter
    assert int(status["NobodyCapEff"], 16) == 0
    out = run.stdout.decode()
    assert "mount-worked" not in out and "mknod-worked" not in out  # SYS_ADMIN, MKNOD dropped
    assert "chown-worked" in out  # CHOWN kept: package managers need it


def test_binds_are_the_only_host_paths_and_read_only_unless_asked(base_image, tmp_path, rollout):
    (tmp_path / "ro").mkdir()
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro" / "given.txt").write_text("given")
    script = (
        "cat /given/given.txt; echo; "
        "echo x > /given/new 2>/dev/null && echo ro-written; "
        "echo x > /out/new && echo rw-written"
    )

    run = container_run(
        base_image,
        ["sh", "-c", script],
        timeout_s=60,
        binds={tmp_path / "ro": "/given"},
        rw_binds={tmp_path / "rw": "/out"},
        rollout=rollout,
    )

    assert run.stdout.decode().split() == ["given", "rw-written"]
    assert not (tmp_path / "ro" / "new").exists() and (tmp_path / "rw" / "new").exists()


def test_a_commit_keeps_the_final_state_for_the_next_container(base_image, rollout):
    first = container_run(
        base_image,
        ["sh", "-c", "echo final > /root/state; exit 1"],
        timeout_s=60,
        commit=True,
        rollout=rollout,
    )
    try:
        assert first.returncode == 1 and first.snapshot
        second = container_run(first.snapshot, ["cat", "/root/state"], timeout_s=60)
        assert second.stdout == b"final\n"
        labels = engine_client().api.inspect_image(first.snapshot)["Config"]["Labels"]
        assert labels["coevo.kind"] == "snapshot" and labels["coevo.rollout"] == rollout
    finally:
        snapshot_remove(first.snapshot)
    assert containers_of(rollout) == []


def test_an_image_the_engine_lacks_is_a_clear_error(engine, rollout):
    with pytest.raises(ImageUnavailable, match="coevo-missing:none is not on the Docker engine"):
        container_run("coevo-missing:none", ["true"], timeout_s=10, rollout=rollout)

"""The escape suite for the container backend: hostile commands in a task's container, and
hostile Dockerfiles, on the real Docker engine.

Each attack runs for real, as a command the harness sends through the exec helper
(``exec_command``: root in the task's container) or as a ``RUN`` step of a task's Dockerfile,
and the test checks what it could reach: no engine socket, no host network, no other
rollout's processes, files or loopback, root with only CONTAINER_CAPABILITIES, no host file,
links in /app recorded as links and never followed by the worker, a hostile image's /app
refused, a privileged build step that changes nothing on the host. Where a check could pass
for a reason other than the containment (a probe that never ran), a positive control runs
the same probe where it must succeed. After every test no container of this process is
left on the engine.

docs/threat-model.md ("Containers (foundation)") is the prose version; tests/workers/
test_escape.py is the bubblewrap suite.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import struct
import textwrap
from pathlib import Path

import docker.errors
import pytest
from django.test import override_settings

from tests.containers.conftest import IMAGE_MAP, REGISTRY, TASK_BASE
from workers.containers import ImageBuildFailed, image_for_task
from workers.containers.engine import LABEL_WORKER, engine_client, worker_id
from workers.containers.run import CONTAINER_CAPABILITIES
from workers.environments.workspace import Workspace, exec_command, verify
from workers.environments.workspace_files import WorkspaceRefused

# No nonce: every session reuses this image (builds are cached by content).
DOCKERFILE = f"""\
FROM {TASK_BASE}
WORKDIR /app
RUN echo 'the task' > /app/readme.txt
"""

# linux/capability.h
CAP_NUMBERS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "DAC_READ_SEARCH": 2,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "LINUX_IMMUTABLE": 9,
    "NET_BIND_SERVICE": 10,
    "NET_BROADCAST": 11,
    "NET_ADMIN": 12,
    "NET_RAW": 13,
    "SYS_CHROOT": 18,
    "SYS_PTRACE": 19,
    "SYS_ADMIN": 21,
    "MKNOD": 27,
    "AUDIT_WRITE": 29,
    "SETFCAP": 31,
}


def inputs(dockerfile: str = DOCKERFILE, **environment) -> dict:
    return {
        "instruction": "Do the task.",
        "files": {},
        "environment": {
            "dockerfile": dockerfile,
            "context": {},
            "docker_image": None,
            "build_timeout_s": 300,
            "allow_internet": False,
            **environment,
        },
    }


def shell(workspace: Workspace, command: str, timeout_s: float = 60) -> dict:
    return exec_command(
        workspace=workspace, params={"command": textwrap.dedent(command)}, timeout_s=timeout_s
    )


def my_containers() -> list[dict]:
    """Every container this test process made that the engine still has."""
    return engine_client().api.containers(
        all=True, filters={"label": f"{LABEL_WORKER}={worker_id()}"}
    )


def host_addresses() -> list[str]:
    """The host's IPv4 addresses, loopback, the engine's bridge and its own among them."""
    found = []
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                # SIOCGIFADDR
                packed = fcntl.ioctl(
                    probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
            found.append(socket.inet_ntoa(packed[20:24]))
    return found


def stat_of(path: str) -> tuple[int, int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, st.st_mode, st.st_mtime_ns


@pytest.fixture(autouse=True)
def nothing_left(engine):
    """After every attack, no container of this test process is left on the engine."""
    assert my_containers() == []
    yield
    assert [c["Id"][:12] for c in my_containers()] == []


@pytest.fixture
def open_workspace(base_image, image_map):
    """Opens task workspaces; each is closed after the test, and its container must be gone."""
    opened: list[Workspace] = []

    def make(dockerfile: str = DOCKERFILE, **environment) -> Workspace:
        workspace = Workspace.for_task(inputs(dockerfile, **environment))
        opened.append(workspace)
        return workspace

    yield make
    for workspace in opened:
        workspace.close()
        assert workspace.container is not None
        with pytest.raises(docker.errors.NotFound):
            engine_client().api.inspect_container(workspace.container.id)
        assert not workspace.root.exists()


@pytest.fixture
def workspace(open_workspace) -> Workspace:
    return open_workspace()


@pytest.fixture
def listener():
    """A TCP server on every host address that records whether anything connected."""
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def accepted(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


# --- the engine ------------------------------------------------------------------------------


def test_it_gives_the_container_no_docker_socket_nor_engine_port(workspace):
    gateway_probes = " ".join(
        f"{host}/{port}" for host in host_addresses() for port in (2375, 2376)
    )
    reply = shell(
        workspace,
        f"""
        for p in /run/docker.sock /var/run/docker.sock /run/coevo-docker \\
                 /run/coevo-docker/docker.sock /var/lib/coevo-docker /run/containerd; do
          [ -e "$p" ] && echo "found $p"
        done
        find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null \\
          | sed 's/^/socket /'
        for target in {gateway_probes} 169.254.169.254/2375; do
          timeout 3 bash -c "exec 3<>/dev/tcp/$target" 2>/dev/null && echo "engine at $target"
        done
        echo probed
        """,
    )

    assert reply["stdout"] == "probed\n", reply


# --- the worker's environment ----------------------------------------------------------------


def test_it_gives_the_container_none_of_the_workers_environment_variables(
    open_workspace, monkeypatch
):
    secret = f"planted-{secrets.token_hex(8)}"
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "COEVO_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, f"postgres://coevo:{secret}@db/{name}")
    workspace = open_workspace()  # started after the worker's environment holds the secret

    reply = shell(workspace, "cat /proc/[0-9]*/environ | tr '\\0' '\\n'")

    assert reply["exit_code"] == 0 and "COEVO_WORKSPACE=/app" in reply["stdout"], reply
    assert secret not in reply["stdout"]
    assert not [line for line in reply["stdout"].splitlines() if "DATABASE" in line]


# --- the host network ------------------------------------------------------------------------


def test_it_gives_the_container_only_a_loopback_interface(workspace):
    reply = shell(workspace, "tail -n +3 /proc/net/dev | cut -d: -f1; echo --; ls /sys/class/net")

    devices, _, listed = reply["stdout"].partition("--\n")
    assert devices.split() == ["lo"]
    assert listed.split() == ["lo"]


PROBE = """\
for target in {targets}; do
  timeout 3 bash -c "exec 3<>/dev/tcp/$target" 2>/dev/null && echo "reached $target"
done
echo probed
"""


def test_it_reaches_no_host_listener_nor_the_metadata_address(
    open_workspace, listener, settings, egress_network
):
    port = listener.getsockname()[1]
    addresses = host_addresses()
    assert "127.0.0.1" in addresses and len(addresses) > 1  # loopback and a real address
    targets = " ".join(f"{address}/{port}" for address in addresses)
    probe = PROBE.format(targets=f"{targets} 169.254.169.254/80 169.254.169.254/443")

    reply = shell(open_workspace(), probe)

    assert reply["stdout"] == "probed\n", reply
    assert not accepted(listener)
    # A task allowed the internet (the egress-only network) reaches it, and still neither the
    # host, its other networks nor the metadata address: what keeps them out is the network's
    # rules, and the probe can succeed.
    settings.COEVO_CONTAINER_ALLOW_INTERNET = True
    registry = "{}/{}".format(*REGISTRY)
    egress = shell(
        open_workspace(allow_internet=True),
        PROBE.format(targets=f"{registry} {targets} 169.254.169.254/80 172.17.0.1/{port}"),
    )
    assert egress["stdout"] == f"reached {registry}\nprobed\n", egress
    assert not accepted(listener)


# --- other rollouts' containers ------------------------------------------------------------


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_another_rollouts_processes_files_and_loopback_are_out_of_reach(open_workspace):
    marker = f"coevo-marker-{secrets.token_hex(6)}"
    secret = f"secret-{secrets.token_hex(8)}"
    a, b = open_workspace(), open_workspace()
    started = shell(
        a,
        f"""
        (exec -a {marker} sleep 300) >/dev/null 2>&1 </dev/null &
        echo {secret} > /app/secret.txt
        perl -MIO::Socket::INET -e '
          $s = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => 8765, Listen => 5,
                                     ReuseAddr => 1) or die "listen: $!";
          while ($c = $s->accept) {{ print $c "{secret}\\n"; close $c }}
        ' >/dev/null 2>&1 </dev/null &
        for i in $(seq 50); do
          answer=$(timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8765 && cat <&3' 2>/dev/null)
          [ -n "$answer" ] && break; sleep 0.1
        done
        echo "$answer"
        cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c {marker}
        """,
    )
    # A sees its own process and its own listener answers it: the probes below work.
    assert started["stdout"].split()[:1] == [secret], started
    assert int(started["stdout"].split()[-1]) >= 1, started
    host_pids = processes_with(marker)
    # B's own namespace holds a handful of pids (checked below): A's, as the host sees them,
    # are none of those, so B's kill of them can only miss.
    assert host_pids and min(host_pids) > 10

    spied = shell(
        b,
        f"""
        cd /proc && echo [0-9]* && cd /app
        for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f"; echo; done
        echo "=$((6 * 7))="
        cat {a.root}/secret.txt /proc/1/root{a.root}/secret.txt 2>&1
        grep -rl "{secret[:10]}""{secret[10:]}" /app /tmp /root /run /var/tmp /home /opt /srv \\
          /mnt 2>/dev/null
        kill -9 {" ".join(map(str, host_pids))}
        timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8765 && echo "reached A" && cat <&3'
        echo "=$((6 * 8))="
        """,
    )

    output = spied["stdout"] + spied["stderr"]
    assert marker not in output
    assert secret not in output
    processes, _, files = spied["stdout"].partition("=42=\n")
    # Its own init, `sleep infinity` and the command's shell (the list was made by a subshell).
    assert len(processes.splitlines()[0].split()) <= 5, processes
    assert "reached" not in files and files.endswith("=48=\n")
    assert spied["stderr"].count("No such process") == len(host_pids)
    assert processes_with(marker) == host_pids  # B's kill reached nothing of A's


# --- privileges ------------------------------------------------------------------------------


def test_root_in_the_container_holds_only_the_listed_capabilities(workspace):
    expected = f"{sum(1 << CAP_NUMBERS[name] for name in CONTAINER_CAPABILITIES):016x}"
    assert expected == "00000000000004eb"  # CHOWN DAC_OVERRIDE FOWNER KILL SETGID SETUID NBS

    reply = shell(
        workspace,
        """
        grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status
        mount -t tmpfs none /mnt 2>/dev/null && echo "ATTACK mounted"
        mount --bind /app /mnt 2>/dev/null && echo "ATTACK bound"
        unshare -m true 2>/dev/null && echo "ATTACK mount namespace"
        unshare -Ur true 2>/dev/null && echo "ATTACK user namespace"
        mknod /tmp/disk b 254 0 2>/dev/null && echo "ATTACK mknod"
        echo h 2>/dev/null > /proc/sysrq-trigger && echo "ATTACK sysrq"
        echo 1 2>/dev/null > /proc/sys/kernel/panic && echo "ATTACK proc/sys"
        echo 1 2>/dev/null > /sys/kernel/mm/ksm/run && echo "ATTACK sys"
        touch /sys/coevo 2>/dev/null && echo "ATTACK sys"
        grep ' /sys ' /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1
        """,
    )

    fields = dict(line.split(":\t") for line in reply["stdout"].splitlines() if ":\t" in line)
    assert fields == {
        "CapPrm": expected,
        "CapEff": expected,
        "CapBnd": expected,
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }
    assert "ATTACK" not in reply["stdout"], reply
    assert reply["stdout"].splitlines()[-1] == "ro"  # /sys


def test_a_setuid_binary_gives_nothing(workspace):
    reply = shell(
        workspace,
        """
        cp /bin/cat /tmp/suid-cat && chown root /tmp/suid-cat && chmod 4755 /tmp/suid-cat
        stat -c %A /tmp/suid-cat
        setpriv --reuid=65534 --regid=65534 --clear-groups \\
          /tmp/suid-cat /proc/self/status | grep -E '^(Uid|CapEff):'
        setpriv --reuid=65534 --regid=65534 --clear-groups \\
          mount -t tmpfs none /mnt 2>/dev/null && echo "ATTACK mounted"
        echo done
        """,
    )

    lines = reply["stdout"].splitlines()
    assert lines[0] == "-rwsr-xr-x"  # the setuid bit is set: the attack is real
    assert lines[1].split() == ["Uid:", "65534", "65534", "65534", "65534"]
    assert lines[2].split() == ["CapEff:", "0000000000000000"]
    assert lines[3:] == ["done"]


def test_the_hosts_files_and_mounts_are_not_in_the_container(workspace):
    secret = f"host-secret-{secrets.token_hex(8)}"
    name = f"coevo-escape-{secrets.token_hex(6)}"
    planted = [Path("/tmp") / name, Path("/root") / name]
    for path in planted:
        path.write_text(secret)
    root_device = os.stat("/").st_dev
    device = f"{os.major(root_device)}:{os.minor(root_device)}"
    try:
        reply = shell(
            workspace,
            f"""
            cat /tmp/{name} /root/{name} /proc/1/root/tmp/{name} /proc/1/root/root/{name} 2>&1
            grep -rl "{secret[:10]}""{secret[10:]}" /tmp /root /run /var /home /opt /srv /mnt \\
              /etc /app 2>&1
            echo --mounts--
            # Every mount whose files come from the host's root file system: mount point, root
            awk '$3 == "{device}" {{print $5, $4}}' /proc/self/mountinfo
            """,
        )
    finally:
        for path in planted:
            path.unlink()

    assert secret not in reply["stdout"] + reply["stderr"]
    _, _, mounts = reply["stdout"].partition("--mounts--\n")
    binds = dict(line.split(" ", 1) for line in mounts.splitlines())
    container = workspace.container.id
    assert binds.pop("/app") == str(workspace.root)
    assert binds.pop("/usr/sbin/docker-init").endswith("/tini-static")  # the engine's init
    # The engine's own files of this container, and nothing else of the host.
    for target in ("/etc/resolv.conf", "/etc/hostname", "/etc/hosts"):
        assert binds.pop(target).endswith(f"/containers/{container}/{target.rsplit('/', 1)[1]}")
    assert binds == {}


# --- /app tricks -----------------------------------------------------------------------------


def test_links_out_of_app_are_recorded_as_links_and_never_followed(workspace):
    watched = ["/", "/etc", "/etc/shadow", "/etc/passwd"]
    before = {path: stat_of(path) for path in watched}
    shadow = Path("/etc/shadow").read_text()

    reply = shell(
        workspace,
        """
        ln -s /etc/shadow /app/link
        ln -s / /app/dir
        ln -s ../../../../../../etc/passwd /app/up
        mkdir /app/sub && ln -s /etc /app/sub/etc
        """,
    )
    assert reply["exit_code"] == 0, reply
    # Made by root in the container, they are root's: no ownership change follows them.
    assert workspace.uid is None and os.lstat(workspace.root / "link").st_uid == 0
    assert {path: stat_of(path) for path in watched} == before

    final = workspace.final()
    links = {path: entry.target for path, entry in final.files.items() if entry.kind == "symlink"}
    assert links == {
        "link": "/etc/shadow",
        "dir": "/",
        "up": "../../../../../../etc/passwd",
        "sub/etc": "/etc",
    }
    assert all(entry.data is None for entry in final.files.values() if entry.kind == "symlink")
    diff = workspace.diff(final)
    rows = {row["path"]: row for row in diff["files"]}
    assert set(rows) == set(links)
    assert rows["link"] == {
        "path": "link",
        "status": "added",
        "note": "a symbolic link to /etc/shadow",
    }
    assert not any(line and line in str(diff) for line in shadow.splitlines())
    assert {path: stat_of(path) for path in watched} == before


def test_a_link_swapped_in_app_between_commands_changes_nothing_on_the_host(workspace):
    """A process left running in the container swaps a directory of /app for a link to the
    host's /etc while commands come and go: the worker changes no owner after a command (the
    harness and its commands are all root in the container), so nothing of the host is
    touched through the link."""
    watched = ["/", "/etc", "/etc/shadow", "/etc/passwd", "/root"]
    before = {path: stat_of(path) for path in watched}
    reply = shell(
        workspace,
        """
        setsid bash -c 'while :; do
          mkdir -p /app/d/e/f && touch /app/d/e/f/g; rm -rf /app/d; ln -s /etc /app/d
          rm -f /app/d; mkdir /app/d; ln -s /root /app/d/e; rm -rf /app/d
        done' >/dev/null 2>&1 </dev/null &
        sleep 0.2
        """,
    )
    assert reply["exit_code"] == 0, reply

    for _ in range(40):
        shell(workspace, "true")

    after = {path: stat_of(path) for path in watched}
    # /root's time moves with whatever else runs on the machine (other test lanes' caches):
    # its owner and mode are what a change through the link would move.
    assert after["/root"][:3] == before.pop("/root")[:3]
    assert {path: stat for path, stat in after.items() if path != "/root"} == before
    entries = [os.path.join(d, name) for d, ds, fs in os.walk("/etc") for name in ds + fs]
    entries += [os.path.join("/root", name) for name in os.listdir("/root")]
    assert not [path for path in entries if os.lstat(path).st_uid >= 100_000]


# --- the verdict ---------------------------------------------------------------------------

UNSOLVABLE = {
    "tests": {
        "test.sh": {
            "text": "#!/bin/bash\nmkdir -p /logs/verifier\necho 0 > /logs/verifier/reward.txt\n"
            'echo "1 failed"\n',
            "executable": True,
        }
    },
    "timeout_s": 60,
}


@pytest.mark.parametrize(
    "forge",
    [
        "printf '#!/bin/sh\\nmkdir -p /logs/verifier\\necho 1 > /logs/verifier/reward.txt\\n' "
        "> /usr/local/bin/bash && chmod 755 /usr/local/bin/bash",
        "cp /bin/true /usr/local/bin/env",
        "echo /tmp/forge.so > /etc/ld.so.preload",
        "mkdir -p /usr/lib/python3/dist-packages && echo 'import os' "
        "> /usr/lib/python3/dist-packages/sitecustomize.py",
    ],
    ids=["shadowed-bash", "shadowed-env", "ld-preload", "sitecustomize"],
)
def test_a_command_cannot_forge_the_verdict_by_replacing_what_the_tests_start_with(
    workspace, forge
):
    """The tests run in an image of the agent's final container, whose programs the agent may
    replace as root: a change to what the tests' own start depends on is caught before they
    run, and the verdict says why."""
    reply = shell(workspace, forge)
    assert reply["exit_code"] == 0, reply

    verdict = verify(inputs={}, verifier=UNSOLVABLE, answer=None, workspace=workspace)

    assert not verdict.passed and verdict.score == 0.0
    assert verdict.detail.startswith("not verified: the agent changed "), verdict.detail


def test_installing_programs_is_not_taken_for_tampering(workspace):
    reply = shell(
        workspace,
        "printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/mytool && chmod 755 "
        "/usr/local/bin/mytool && mkdir -p /opt/x && echo data > /opt/x/data",
    )
    assert reply["exit_code"] == 0, reply
    verdict = verify(inputs={}, verifier=UNSOLVABLE, answer=None, workspace=workspace)
    assert not verdict.passed and "not verified" not in verdict.detail  # the tests ran
    diff = workspace.diff(workspace.final())
    outside = diff["outside_app"]
    assert "added /usr/local/bin/mytool" in outside["paths"]
    assert "added /opt/x/data" in outside["paths"] and outside["tampered"] == []


def test_the_operator_can_verify_on_the_image_with_the_agents_app_only(workspace, settings):
    settings.COEVO_CONTAINER_VERIFY_ON = "image"
    reply = shell(
        workspace,
        "printf '#!/bin/sh\\nmkdir -p /logs/verifier\\necho 1 > /logs/verifier/reward.txt\\n' "
        "> /usr/local/bin/bash && chmod 755 /usr/local/bin/bash",
    )
    assert reply["exit_code"] == 0, reply
    verdict = verify(inputs={}, verifier=UNSOLVABLE, answer=None, workspace=workspace)
    # The forged shell is not in the image: the tests ran, and failed as they always do.
    assert not verdict.passed and "not verified" not in verdict.detail


# --- hostile images --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "links",
    [
        "ln -s /etc /app/escape && ln -s /etc/passwd /app/abs",
        "ln -s ../etc /app/escape",
        "mkdir -p /app/a && ln -s ../../etc/passwd /app/a/up",
    ],
    ids=["absolute", "relative", "nested"],
)
def test_a_hostile_images_links_out_of_app_are_links_the_worker_never_follows(
    base_image, image_map, links
):
    """The engine fills /app's volume from the image as it is, links included: they lead to
    the container's own files there, and the worker reads them as links, never through."""
    before = {path: stat_of(path) for path in ("/etc", "/etc/passwd")}
    listed = sorted(os.listdir("/etc"))
    passwd = Path("/etc/passwd").read_text()
    dockerfile = f"FROM {TASK_BASE}\nWORKDIR /app\nRUN echo ok > /app/ok.txt && {links}\n"

    workspace = Workspace.for_task(inputs(dockerfile=dockerfile))
    try:
        start = workspace.start_tree
        assert start is not None and start.files["ok.txt"].kind == "file"
        assert {p for p, f in start.files.items() if f.kind == "symlink"}
        final = workspace.final()
        assert all(f.data is None for f in final.files.values() if f.kind == "symlink")
        assert passwd.splitlines()[0] not in str(workspace.diff(final))
    finally:
        workspace.close()
    assert {path: stat_of(path) for path in ("/etc", "/etc/passwd")} == before
    assert sorted(os.listdir("/etc")) == listed


@pytest.mark.parametrize(
    "target", ["/etc", "../../../../etc", "file"], ids=["absolute", "relative", "file"]
)
def test_an_image_whose_app_is_not_a_directory_is_refused(open_workspace, image_map, target):
    """Where the image's /app leads is where the engine would bind the workspace (resolved in
    the container's own root): a link or a file there is refused before any container runs."""
    listed = sorted(os.listdir("/etc"))
    passwd = stat_of("/etc/passwd")
    make = f"ln -s {target} /app" if target != "file" else "echo x > /app"
    dockerfile = f"FROM {TASK_BASE}\nRUN rm -rf /app && {make}\n"
    with pytest.raises(WorkspaceRefused, match="not a directory"):
        open_workspace(dockerfile=dockerfile)
    assert sorted(os.listdir("/etc")) == listed
    assert stat_of("/etc/passwd") == passwd


# --- builds ----------------------------------------------------------------------------------


def test_a_privileged_run_step_at_build_time_changes_nothing_on_the_host(base_image):
    """The build's RUN has Docker's default capabilities (never privileged) and the default
    bridge: it may try everything a root process there can."""
    secret = f"host-secret-{secrets.token_hex(8)}"
    name = f"coevo-escape-{secrets.token_hex(6)}"
    planted = Path("/root") / name
    planted.write_text(secret)
    written = Path("/tmp") / f"{name}-written"
    root_device = os.stat("/").st_dev
    major, minor = os.major(root_device), os.minor(root_device)
    ksm = Path("/sys/kernel/mm/ksm/run")
    ksm_before = ksm.read_text() if ksm.exists() else None
    dockerfile = textwrap.dedent(
        f"""\
        FROM {TASK_BASE}
        ENV COEVO_ESCAPE_NONCE={secrets.token_hex(8)}
        RUN mount -t tmpfs none /mnt && echo "ATTACK mounted" ; \\
            unshare -m true && echo "ATTACK mount namespace" ; \\
            cat /proc/1/root/root/{name} /root/{name} ; \\
            echo pwned > /proc/1/root{written} && cat {written} ; \\
            echo 2 > /sys/kernel/mm/ksm/run && echo "ATTACK sys" ; \\
            echo h > /proc/sysrq-trigger && echo "ATTACK sysrq" ; \\
            mknod /tmp/disk b {major} {minor} && head -c 512 /tmp/disk | wc -c \\
              | grep -qx 512 && echo "ATTACK read the host's disk" ; \\
            echo "build ran"
        """
    )

    try:
        with override_settings(COEVO_IMAGE_MAP=IMAGE_MAP):
            image = image_for_task(dockerfile=dockerfile, context={}, build_timeout_s=120)
    finally:
        planted.unlink()
    try:
        assert not image.cached
        assert "build ran" in image.log
        assert [line for line in image.log.splitlines() if line.startswith("ATTACK")] == []
        assert secret not in image.log
        assert not written.exists()
        assert (ksm.read_text() if ksm.exists() else None) == ksm_before
    finally:
        engine_client().api.remove_image(image.image, force=True)


@pytest.mark.parametrize(
    ("step", "refusal"),
    [
        ("RUN --security=insecure touch {written}", "Unknown flag: security"),
        ("RUN --network=host touch {written}", "Unknown flag: network"),
        (
            "RUN --mount=type=bind,source=/,target=/host,rw touch /host{written}",
            "requires BuildKit",
        ),
    ],
    ids=["security-insecure", "network-host", "bind-mount-of-root"],
)
def test_a_run_step_cannot_ask_for_privileges_network_or_host_mounts(base_image, step, refusal):
    written = Path("/tmp") / f"coevo-escape-{secrets.token_hex(6)}"
    dockerfile = f"FROM {TASK_BASE}\n{step.format(written=written)}\n"

    with (
        override_settings(COEVO_IMAGE_MAP=IMAGE_MAP),
        pytest.raises(ImageBuildFailed, match=refusal),
    ):
        image_for_task(dockerfile=dockerfile, context={}, build_timeout_s=60)

    assert not written.exists()

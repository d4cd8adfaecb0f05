"""The coevo llama.cpp host for tests: in this process (``running_host``, with scripted
children by default) or as its own process (``HostProcess``), plus what tests put under its
adapter root."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from coevo.policies.llamacpp_children import ADAPTER_GGUF, GGUF_MAGIC, ChildPool, PoolConfig
from coevo.policies.llamacpp_host import HostServer
from tests.support.factories import REPO_ROOT
from tests.support.net import free_port

SCRIPTED_CHILD = [sys.executable, "-m", "tests.support.llamacpp_child"]


@dataclass
class Host:
    url: str  # the /v1 base URL
    pool: ChildPool
    adapter_root: Path


def child_environment() -> None:
    """Children run ``-m tests.support.llamacpp_child`` from wherever the test runs."""
    path = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)


@contextlib.contextmanager
def running_host(
    tmp_path: Path,
    *,
    model: Path | None = None,
    alias: str = "base-model",
    command: list[str] = SCRIPTED_CHILD,
    max_adapters: int = 2,
    max_body_bytes: int = 64 * 1024,
    start_timeout_s: float = 30,
    upstream_timeout_s: float = 30,
) -> Iterator[Host]:
    """A host serving on a free port in a thread of this process, its base child started."""
    child_environment()
    if model is None:
        model = tmp_path / "base.gguf"
        model.write_bytes(GGUF_MAGIC + b"\0" * 28)
    adapter_root = tmp_path / "adapters"
    adapter_root.mkdir(exist_ok=True)
    pool = ChildPool(
        PoolConfig(
            command=command,
            model=model,
            alias=alias,
            n_ctx=512,
            log_dir=tmp_path / "logs",
            max_adapters=max_adapters,
            start_timeout_s=start_timeout_s,
        )
    )
    server = HostServer(
        ("127.0.0.1", 0),
        pool=pool,
        adapter_root=adapter_root,
        upstream_timeout_s=upstream_timeout_s,
        max_body_bytes=max_body_bytes,
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        pool.start_base()
        yield Host(f"http://127.0.0.1:{server.server_address[1]}/v1", pool, adapter_root)
    finally:
        server.shutdown()
        server.server_close()
        pool.stop_all()


class HostProcess:
    """``python -m coevo.policies.llamacpp_host`` with scripted children, in its own process."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        alias: str = "base-model",
        child_command: list[str] = SCRIPTED_CHILD,
    ) -> None:
        child_environment()
        model = tmp_path / "base.gguf"
        model.write_bytes(GGUF_MAGIC + b"\0" * 28)
        self.adapter_root = tmp_path / "adapters"
        self.adapter_root.mkdir(exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = tmp_path / "host.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "coevo.policies.llamacpp_host", "--model", str(model),
                 "--alias", alias, "--adapter-root", str(self.adapter_root),
                 "--port", str(self.port), "--log-dir", str(tmp_path / "logs"),
                 "--child-command", shlex.join(child_command)],
                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def children(self) -> list[int]:
        return child_pids(self.process.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def child_pids(pid: int) -> list[int]:
    """The pids of a process's children, whichever of its threads started them (Linux)."""
    pids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting to be reaped is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_for(condition, *, timeout_s: float = 20, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


def make_gguf_adapter(root: Path, name: str, *, content: bytes = b"") -> Path:
    """An installed adapter directory under ``root`` whose ``adapter.gguf`` passes the host's
    checks (the GGUF magic); the scripted child refuses one whose content holds BROKEN."""
    directory = root / name
    directory.mkdir(parents=True)
    (directory / ADAPTER_GGUF).write_bytes(GGUF_MAGIC + b"\3\0\0\0" + content)
    return directory

"""The llama.cpp host's child processes: one ``llama_cpp.server`` for the base model and one
per loaded LoRA adapter, each on a loopback port of its own (coevo/policies/llamacpp_host.py
is the HTTP front that routes to them).

One process per adapter because llama-cpp-python serves one model at a time: its multi-model
configuration reloads the weights whenever the requested model changes, which would thrash
between adapters under a campaign's interleaved requests. A Gemma 3 270M child costs about
450 MB of memory and 2-3 s to start on 2 cores (measured), so a handful fit beside the base.

Invariants: the base child is never evicted; an adapter child with a request in flight is
never stopped by eviction; a child that died is restarted on its next use (which answers 503
meanwhile, naming the log); every child dies with the host (PDEATHSIG, set from one long-lived
spawner thread, because the kernel sends that signal when the *thread* that forked the child
exits, and the front's request threads end after each request).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import logging
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# What an installed adapter directory holds for llama.cpp (coevo/training/adapters.py).
ADAPTER_GGUF = "adapter.gguf"
# Adapter names become model names, log file names and command-line arguments.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
MAX_PATH_CHARS = 4096
STOP_GRACE_S = 10.0
READY_POLL_S = 0.25
PR_SET_PDEATHSIG = 1

# Looked up once in the host, not between fork and exec in the child: loading a library there
# could block on a lock another thread of the host held at fork time.
try:
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: children are still stopped on SIGTERM/SIGINT
    _prctl = None


def die_with_parent() -> None:
    """``preexec_fn`` for a child: the kernel sends it SIGTERM when the thread that started it
    (so also the process) dies without stopping it."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Refused(Exception):
    """A request the host answers with ``status`` and this message (what to do next)."""

    def __init__(self, status: int, message: str, *, code: str = "", param: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        # The request's field at fault, for OpenAI's ``error.param``.
        self.param = param


def adapter_file_resolve(*, root: Path, path: str) -> Path:
    """The GGUF LoRA file to load for ``path`` (an installed adapter directory, whose
    ``adapter.gguf`` is loaded, or a ``.gguf`` file; relative paths are under ``root``).

    Refused (400) unless it resolves inside ``root`` after following every symlink and ``..``,
    exists, and starts with the GGUF magic: the host must not read files the operator did not
    put under the adapter root, and a broken file is better refused here than by llama.cpp.
    Every refusal reads the same: whoever reaches the host learns nothing of its files (where
    a path resolves, whether it exists, how it starts); the host's log says which check failed.
    """
    if not path or len(path) > MAX_PATH_CHARS:
        raise Refused(400, f"lora_path must be a path of 1 to {MAX_PATH_CHARS} characters.")
    root = root.resolve()
    resolved = (root / path).resolve()
    if resolved.is_dir():
        resolved = (resolved / ADAPTER_GGUF).resolve()
    if not resolved.is_relative_to(root):
        _adapter_refused(path, f"it resolves to {resolved}, outside the adapter root {root}")
    if not resolved.is_file():
        _adapter_refused(path, f"{resolved} does not exist")
    with resolved.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        _adapter_refused(path, f"{resolved} starts with {magic!r}, not {GGUF_MAGIC!r}")
    return resolved


def _adapter_refused(path: str, why: str) -> NoReturn:
    logger.warning("refused to load lora_path %r: %s", path, why)
    raise Refused(
        400,
        f"The adapter at {path} was refused: the host loads only a GGUF LoRA under its adapter "
        f"root (COEVO_ADAPTER_DIR), and an installed adapter needs its GGUF conversion, "
        f"{ADAPTER_GGUF}, in its directory. The host's log says why this one was refused.",
    )


@dataclass
class Child:
    """One llama_cpp.server process serving ``name`` (the base alias or an adapter name)."""

    name: str
    lora: Path | None
    log_path: Path
    # The adapter's path as its load named it: listed as its ``root`` in /v1/models, as vLLM
    # lists an adapter's path (coevo compares it to tell a stale adapter from the one it wants).
    source: str = ""
    port: int = 0
    process: subprocess.Popen | None = None
    # starting: being (re)started; ready: answered /v1/models; failed: its start failed.
    state: str = "starting"
    reason: str = ""
    in_flight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    started_at: float = 0.0
    settled: threading.Event = field(default_factory=threading.Event)

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()


@dataclass(frozen=True)
class PoolConfig:
    command: list[str]  # the server program; the host appends llama_cpp.server's own flags
    model: Path
    alias: str
    n_ctx: int
    log_dir: Path
    max_adapters: int = 4
    start_timeout_s: float = 120.0


class ChildPool:
    """The children by served name, with their in-flight counts and last use."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._children: dict[str, Child] = {}
        self._closing = False
        # Every Popen happens on this one thread, which lives as long as the host (see above).
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamacpp-spawner")

    # --- what the front asks -----------------------------------------------------------------

    def start_base(self) -> None:
        """Start the base model's child and wait until it serves; Refused if it does not."""
        child = self._child(self.config.alias, lora=None)
        with self._lock:
            self._children[child.name] = child
        self._start(child)
        if child.state != "ready":
            raise Refused(503, child.reason)

    def ready(self) -> list[Child]:
        """The children serving now (one found dead is restarted, so a health probe alone
        brings a crashed base back)."""
        with self._lock:
            return [c for c in self._children.values() if self._revive(c)]

    def base_ready(self) -> bool:
        with self._lock:
            base = self._children.get(self.config.alias)
            return base is not None and self._revive(base)

    def served(self, name: str) -> bool:
        with self._lock:
            return name in self._children

    @contextlib.contextmanager
    def using(self, name: str) -> Iterator[Child]:
        """Hold ``name``'s child for one request (eviction skips it meanwhile). Refused: 404
        for a name not served, 503 while it is (re)starting or after it died."""
        with self._lock:
            child = self._children.get(name)
            if child is None:
                raise Refused(
                    404,
                    f"The model `{name}` does not exist here: this host serves "
                    f"{sorted(self._children)}; load an adapter with POST /v1/load_lora_adapter.",
                    code="model_not_found",
                )
            if not self._revive(child):
                raise Refused(
                    503,
                    f"The llama.cpp server for `{name}` is not serving ({child.reason}); it is "
                    f"being restarted, so retry in a few seconds. Its log: {child.log_path}",
                )
            child.in_flight += 1
            child.last_used = time.monotonic()
        try:
            yield child
        finally:
            with self._lock:
                child.in_flight -= 1
                child.last_used = time.monotonic()

    def adapter_load(
        self, *, name: str, lora: Path, source: str = "", inplace: bool = False
    ) -> str:
        """Start a child serving the base with ``lora`` as ``name`` and wait until it serves;
        evicts the least recently used idle adapter when all --max-adapters are taken.

        A name already loaded is refused (400), as vLLM refuses it, unless ``inplace`` (vLLM's
        ``load_inplace``): then the new weights replace it under the same name (its requests
        meanwhile get 503 until they serve; the old child stops once its requests are
        answered). ``source``: the path as the request named it, listed as the adapter's root.
        """
        evicted: Child | None = None
        replaced: Child | None = None
        with self._lock:
            if self._closing:
                raise Refused(503, "The llama.cpp host is stopping.")
            existing = self._children.get(name)
            if existing is not None and inplace:
                replaced, existing = existing, None
                child = self._child(name, lora=lora, source=source)
                self._children[name] = child
            elif existing is None:
                adapters = [c for c in self._children.values() if c.lora is not None]
                if len(adapters) >= self.config.max_adapters:
                    idle = [c for c in adapters if c.in_flight == 0 and c.state != "starting"]
                    if not idle:
                        raise Refused(
                            503,
                            f"All {self.config.max_adapters} adapter slots are busy serving "
                            "requests or starting: retry shortly, or start the host with a "
                            "larger --max-adapters.",
                        )
                    evicted = min(idle, key=lambda c: c.last_used)
                    del self._children[evicted.name]
                child = self._child(name, lora=lora, source=source)
                self._children[name] = child
        if existing is not None:
            # A second load of a name (another worker's, under way or done): answered once the
            # first settles, with vLLM's refusal, so the caller checks /v1/models and finds it.
            existing.settled.wait(self.config.start_timeout_s)
            if existing.state == "failed":
                raise Refused(400, _load_failed(name))  # its reason was logged as it failed
            raise Refused(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                param="lora_name",
            )
        if evicted is not None:
            logger.info("evicting adapter %s (least recently used) to load %s", evicted.name, name)
            self._stop(evicted)
        if replaced is not None:
            logger.info("replacing adapter %s in place (load_inplace)", name)
            threading.Thread(target=self._stop_when_idle, args=(replaced,), daemon=True).start()
        self._start(child)
        if child.state != "ready":
            with self._lock:
                if self._children.get(name) is child:
                    del self._children[name]
            raise Refused(400, _load_failed(name))  # _start logged the reason and the log
        return f"Success: LoRA adapter '{name}' added successfully."

    def adapter_unload(self, *, name: str) -> str:
        """Stop ``name``'s child: at once when idle, else once its requests are answered (it
        takes no new ones meanwhile)."""
        with self._lock:
            child = self._children.get(name)
            if child is None:
                raise Refused(404, f"The lora adapter '{name}' cannot be found.")
            if child.lora is None:
                raise Refused(400, f"`{name}` is the base model, not an adapter: it stays.")
            del self._children[name]
            busy = child.in_flight > 0
        if busy:
            threading.Thread(target=self._stop_when_idle, args=(child,), daemon=True).start()
        else:
            self._stop(child)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def stop_all(self) -> None:
        with self._lock:
            self._closing = True
            children = list(self._children.values())
            self._children.clear()
        for child in children:
            self._stop(child)
        self._spawner.shutdown(wait=False)

    def _revive(self, child: Child) -> bool:
        """Whether ``child`` serves; one that died or failed to start is restarted in the
        background (its requests answer 503 meanwhile). Called with the lock held."""
        code = child.exited()
        if child.state == "ready" and code is not None:
            child.state, child.reason = "failed", f"it exited with code {code}"
            logger.warning(
                "child %s (pid %s) exited with code %s", child.name, child.process.pid, code
            )
        if child.state == "failed" and not self._closing:
            child.state, child.reason = "starting", f"restarting after: {child.reason}"
            child.settled.clear()
            threading.Thread(target=self._start, args=(child,), daemon=True).start()
        return child.state == "ready"

    # --- processes ---------------------------------------------------------------------------

    def _child(self, name: str, *, lora: Path | None, source: str = "") -> Child:
        return Child(
            name=name, lora=lora, log_path=self.config.log_dir / f"{name}.log", source=source
        )

    def argv(self, child: Child) -> list[str]:
        """The child's command: llama_cpp.server's flags (llama_cpp/server/settings.py)."""
        argv = [
            *self.config.command,
            "--model", str(self.config.model),
            "--model_alias", child.name,
            "--n_ctx", str(self.config.n_ctx),
            "--host", "127.0.0.1",
            "--port", str(child.port),
        ]  # fmt: skip
        if child.lora is not None:
            argv += ["--lora_path", str(child.lora)]
        return argv

    def _start(self, child: Child) -> None:
        """Spawn the child and wait until it answers /v1/models; sets its state either way."""
        started = time.monotonic()
        child.port = _free_port()
        try:
            child.process = self._spawner.submit(self._spawn, child).result()
            reason = self._wait_ready(child)
        except (OSError, RuntimeError) as exc:  # no such program; the spawner shut down
            reason = f"it could not be started: {exc}"
        with self._lock:
            if reason:
                child.state, child.reason = "failed", reason
            else:
                child.state, child.reason = "ready", ""
                child.started_at = time.monotonic()
            closing = self._closing or self._children.get(child.name) is not child
        child.settled.set()
        elapsed = time.monotonic() - started
        if reason:
            logger.warning(
                "child %s failed to start after %.1fs: %s (log %s)",
                child.name, elapsed, reason, child.log_path,
            )  # fmt: skip
            self._stop(child, quiet=True)
        elif closing:
            self._stop(child)  # stopped or unloaded while it was starting
        else:
            logger.info(
                "started child %s (pid %s, port %s, log %s) in %.1fs",
                child.name, child.process.pid, child.port, child.log_path, elapsed,
            )  # fmt: skip

    def _spawn(self, child: Child) -> subprocess.Popen:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        with child.log_path.open("ab") as log:
            return subprocess.Popen(
                self.argv(child), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                # The host's terminal's Ctrl-C reaches the host only; it stops the children.
                start_new_session=True,
                preexec_fn=die_with_parent,
            )  # fmt: skip

    def _wait_ready(self, child: Child) -> str:
        """'' once the child answers ``GET /v1/models``, else why it did not."""
        deadline = time.monotonic() + self.config.start_timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = child.exited()
            if code is not None:
                return f"it exited with code {code} while starting ({_log_tail(child.log_path)})"
            try:
                connection = http.client.HTTPConnection("127.0.0.1", child.port, timeout=2)
                try:
                    connection.request("GET", "/v1/models")
                    response = connection.getresponse()
                    response.read(1 << 16)
                finally:
                    connection.close()
                if response.status == 200:
                    return ""
                last = f"/v1/models answered HTTP {response.status}"
            except OSError as exc:
                last = str(exc)
            time.sleep(READY_POLL_S)
        return f"it did not serve within {self.config.start_timeout_s:.0f}s ({last})"

    def _stop(self, child: Child, *, quiet: bool = False) -> None:
        process = child.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if not quiet:
            served = time.monotonic() - child.started_at if child.started_at else 0.0
            logger.info(
                "stopped child %s (pid %s) after %.1fs of service", child.name, process.pid, served
            )

    def _stop_when_idle(self, child: Child) -> None:
        while True:
            with self._lock:
                if child.in_flight == 0:
                    break
            time.sleep(0.1)
        self._stop(child)


def _load_failed(name: str) -> str:
    # llama.cpp's words name the adapter's resolved path and the child's log: the host's log
    # keeps them for the operator, the body says only that the load failed.
    return (
        f"Loading lora {name} failed: llama.cpp could not load the adapter. The llama.cpp "
        "host's log says why."
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _log_tail(path: Path, limit: int = 600) -> str:
    """The end of a child's log, on one line, for an error message."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - limit))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return "no log"
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-limit:]

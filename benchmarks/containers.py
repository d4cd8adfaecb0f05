"""The container backend's costs (issue 35, item 8), on the real Docker engine:

- **image build**, cold (a Dockerfile whose ``RUN apt-get install`` no layer cache holds: a
  fresh nonce before it) and cached (the same content again);
- **container start and stop**: ``Workspace.for_task`` on a built image (image lookup, the
  container started with /app a volume the engine fills from the image) and ``close`` (removed), p50 and p95;
- **overhead per rollout** at ``--in-flight`` rollouts at once (16 and 64 by default), for the
  same harness on the same task in bubblewrap and in its container: a ``run(task, ctx)``
  harness that runs one command through the exec helper and edits a file, no model call; the
  verifier runs the task's tests. Per rollout: wall time (the runner's, from the harness's
  start to the verdict), and the batch's makespan;
- **verifier time per task**: ``verify`` alone (the snapshot commit, the test container, the
  snapshot removed) against bubblewrap's.

    .venv/bin/python benchmarks/containers.py [--in-flight 16,64] [--starts 20]

Needs root and the engine scripts/lib.sh starts (``ensure_docker_engine``, ``ensure_base_images
bookworm``). Each run is appended as a JSON line to benchmarks/results/containers.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results" / "containers.jsonl"
BASE = "local/debian:bookworm"
FROM = "debian:bookworm-slim"

DOCKERFILE = f"""\
FROM {FROM}
WORKDIR /app
RUN printf 'def add(a, b):\\n    return a - b\\n' > /app/calc.py
"""
COLD_DOCKERFILE = f"""\
FROM {FROM}
ENV COEVO_BENCH={{nonce}}
RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*
WORKDIR /app
"""
TEST_SH = """#!/bin/bash
if grep -q 'a + b' /app/calc.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
VERIFIER = {"tests": {"test.sh": {"text": TEST_SH, "executable": True}}, "timeout_s": 60}
HARNESS = """
def run(task, ctx):
    ctx.shell("cat /app/calc.py")
    with open("/app/calc.py", "w") as f:
        f.write("def add(a, b):\\n    return a + b\\n")
    return "done"
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def task_inputs(container: bool) -> dict:
    inputs = {
        "instruction": "Fix add.",
        "files": {"calc.py": {"text": "def add(a, b):\n    return a - b\n"}},
    }
    if container:
        inputs["environment"] = {
            "dockerfile": DOCKERFILE,
            "context": {},
            "docker_image": None,
            "build_timeout_s": 600,
            "allow_internet": False,
        }
    return inputs


def bench_builds(image_for_task) -> dict:
    nonce = secrets.token_hex(6)
    started = time.monotonic()
    cold = image_for_task(dockerfile=COLD_DOCKERFILE.format(nonce=nonce), context={})
    cold_s = time.monotonic() - started
    started = time.monotonic()
    cached = image_for_task(dockerfile=COLD_DOCKERFILE.format(nonce=nonce), context={})
    cached_s = time.monotonic() - started
    assert cached.cached and cached.image == cold.image
    from workers.containers.engine import engine_client

    engine_client().api.remove_image(cold.image, force=True)
    return {"build_cold_s": round(cold_s, 2), "build_cached_s": round(cached_s, 3)}


def bench_starts(Workspace, count: int) -> dict:
    Workspace.for_task(task_inputs(True)).close()  # the image built once, outside the figures
    starts, stops = [], []
    for _ in range(count):
        started = time.monotonic()
        workspace = Workspace.for_task(task_inputs(True))
        starts.append(time.monotonic() - started)
        started = time.monotonic()
        workspace.close()
        stops.append(time.monotonic() - started)
    return {
        "start_p50_s": round(statistics.median(starts), 3),
        "start_p95_s": round(percentile(starts, 0.95), 3),
        "stop_p50_s": round(statistics.median(stops), 3),
        "stop_p95_s": round(percentile(stops, 0.95), 3),
    }


def bench_verifier(Workspace, verify, count: int) -> dict:
    out = {}
    for name, container in (("bwrap", False), ("container", True)):
        times = []
        for _ in range(count):
            workspace = Workspace.for_task(task_inputs(container))
            try:
                (workspace.root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
                started = time.monotonic()
                verdict = verify(inputs={}, verifier=VERIFIER, answer=None, workspace=workspace)
                times.append(time.monotonic() - started)
                assert verdict.passed, verdict.detail
            finally:
                workspace.close()
        out[f"verify_{name}_p50_s"] = round(statistics.median(times), 3)
        out[f"verify_{name}_p95_s"] = round(percentile(times, 0.95), 3)
    return out


def bench_rollouts(in_flight: int, container: bool, harness: Path) -> dict:
    from coevo.policies.client import PolicyClient
    from workers.environments import workspace as ws_env
    from workers.outcomes import RolloutOutcome
    from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

    def one(_: int) -> float:
        inputs = task_inputs(container)
        rollout_inputs = RolloutInputs(
            harness_dir=harness,
            task_key="fix-add",
            task_view=ws_env.harness_view(inputs),
            knob_overrides={},
            seed=1,
            wall_time_s=300,
        )
        environment = TaskEnvironment(
            adapter=ws_env.WorkspaceEnvironment(), inputs=inputs, verifier=VERIFIER
        )
        started = time.monotonic()
        with PolicyClient("http://127.0.0.1:9/v1", model="none", retries=0) as client:
            result = execute_rollout(rollout_inputs, policy=client, environment=environment)
        assert result.outcome == RolloutOutcome.PASSED, result.detail
        return time.monotonic() - started

    started = time.monotonic()
    with ThreadPoolExecutor(in_flight) as pool:
        walls = list(pool.map(one, range(in_flight)))
    return {
        "backend": "container" if container else "bwrap",
        "in_flight": in_flight,
        "rollout_p50_s": round(statistics.median(walls), 2),
        "rollout_p95_s": round(percentile(walls, 0.95), 2),
        "makespan_s": round(time.monotonic() - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", default="16,64")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--verifies", type=int, default=10)
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    os.environ.setdefault("COEVO_IMAGE_MAP", f"{FROM}={BASE}")
    import django

    django.setup()
    from workers.containers import image_for_task
    from workers.environments.workspace import Workspace, verify

    record: dict = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cores",
    }
    if not args.skip_build:
        record.update(bench_builds(image_for_task))
        print(json.dumps(record), flush=True)
    record.update(bench_starts(Workspace, args.starts))
    print(json.dumps(record), flush=True)
    record.update(bench_verifier(Workspace, verify, args.verifies))
    print(json.dumps(record), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        harness = Path(tmp) / "harness"
        harness.mkdir()
        (harness / "harness.toml").write_text(
            '[harness]\nname = "bench"\nentrypoint = "agent:run"\n[limits]\nwall_time_s = 300\n'
        )
        (harness / "agent.py").write_text(textwrap.dedent(HARNESS))
        record["rollouts"] = []
        for in_flight in [int(n) for n in args.in_flight.split(",")]:
            for container in (False, True):
                row = bench_rollouts(in_flight, container, harness)
                record["rollouts"].append(row)
                print(json.dumps(row), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as handle:
        handle.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()

"""A seed harness on the shipped workspace suite with the embedded policy (llama.cpp serving
Gemma 3 270M): pass rate, mean score and time per rollout, task by task.

Each of the 27 tasks in coevo/suites/data/workspace/ is read as the Harbor import reads it and
run through ``execute_rollout`` in this process, as a worker runs it: the real sandbox, the
workspace at /app, the harness's ``ctx.shell`` commands, the task's own ``tests/test.sh`` in a
sandbox of its own. No Celery, PostgreSQL or Redis. The llama.cpp server is started here (the
model is assembled under COEVO_HOME/models, as the demo does).

    .venv/bin/python benchmarks/workspace_gemma.py                      # examples/workspace-basic
    .venv/bin/python benchmarks/workspace_gemma.py --harness examples/workspace-agent
    .venv/bin/python benchmarks/workspace_gemma.py --tasks fix-off-by-one create-hello-file
    # the shipped tasks that need their container (a Docker engine: docs/deployment.md)
    .venv/bin/python benchmarks/workspace_gemma.py --containers --harness examples/workspace-agent

A harness with declared dependencies gets them built as a worker builds them (from
COEVO_HARNESS_FIND_LINKS, e.g. var/wheelhouse, which scripts/test fills).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", type=Path, default=REPO / "examples" / "workspace-basic")
    parser.add_argument("--tasks", nargs="*", help="task keys (default: every shipped task)")
    parser.add_argument("--knobs", default="{}", help="knob overrides as JSON")
    parser.add_argument("--wall", type=int, default=600, help="wall time per rollout (s)")
    parser.add_argument(
        "--containers",
        action="store_true",
        help="the shipped tasks that need their container (coevo/suites/data/workspace-containers)",
    )
    args = parser.parse_args()
    if args.containers:
        os.environ.setdefault("COEVO_IMAGE_MAP", "debian:bookworm-slim=local/debian:bookworm")

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    os.environ.setdefault("COEVO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.conf import settings

    from coevo.policies.client import PolicyClient
    from coevo.policies.embedded import (
        DEFAULT_MODEL_ALIAS,
        base_model_gguf,
        llamacpp_host_command,
        wait_until_serving,
    )
    from coevo.suites.harbor import WORKSPACE_DATA_DIR
    from coevo.suites.harbor_tasks import harbor_task_read
    from tests.support.net import free_port
    from workers.environments import workspace
    from workers.harness_env import harness_env_prepare
    from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

    data_dir = WORKSPACE_DATA_DIR.with_name("workspace-containers") if args.containers else None
    data_dir = data_dir or WORKSPACE_DATA_DIR
    keys = args.tasks or sorted(p.name for p in data_dir.iterdir() if (p / "task.toml").is_file())
    model = base_model_gguf(DEFAULT_MODEL_ALIAS)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log = open(Path(settings.COEVO_HOME) / "workspace-bench-llama.log", "wb")  # noqa: SIM115
    # The same policy server as the demo and the tests: the coevo llama.cpp host.
    command = llamacpp_host_command(
        model,
        port=port,
        adapter_root=Path(settings.COEVO_ADAPTER_DIR),
        log_dir=Path(settings.COEVO_HOME) / "workspace-bench-models",
    )
    Path(settings.COEVO_ADAPTER_DIR).mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(command, stdout=log, stderr=log)
    rows = []
    try:
        wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=server)
        with (
            PolicyClient(url, model=DEFAULT_MODEL_ALIAS) as policy,
            harness_env_prepare(harness_dir=args.harness.resolve()) as harness_env,
        ):
            for key in keys:
                task, _ = harbor_task_read(
                    key=key, directory=data_dir / key, container_backend=args.containers
                )
                environment = TaskEnvironment(
                    adapter=workspace.WorkspaceEnvironment(),
                    inputs=task.inputs,
                    verifier=task.verifier,
                )
                inputs = RolloutInputs(
                    harness_dir=args.harness.resolve(),
                    task_key=key,
                    task_view=workspace.harness_view(task.inputs),
                    knob_overrides=json.loads(args.knobs),
                    seed=0,
                    wall_time_s=args.wall,
                    policy_version=DEFAULT_MODEL_ALIAS,
                    harness_env=harness_env.path,
                )
                started = time.monotonic()
                result = execute_rollout(inputs, policy=policy, environment=environment)
                seconds = time.monotonic() - started
                category = task.inputs["metadata"].get("category", "")
                rows.append((key, category, result, seconds))
                print(
                    f"{key:30} {category:9} {result.outcome:13} {result.score or 0:5.2f} "
                    f"{seconds:6.1f}s {result.model_calls} calls  {result.detail[:60]}",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()

    passed = sum(1 for _, _, r, _ in rows if r.outcome == "passed")
    scores = [r.score or 0.0 for _, _, r, _ in rows]
    errors = sum(1 for _, _, r, _ in rows if r.outcome not in ("passed", "task_failure"))
    print(
        f"\n{args.harness.name} on {len(rows)} workspace tasks with Gemma 3 270M: "
        f"{passed} passed ({passed / len(rows):.0%}), mean score {statistics.mean(scores):.3f}, "
        f"{errors} harness or infra errors; {statistics.mean(s for *_, s in rows):.1f} s per "
        f"rollout (median {statistics.median(s for *_, s in rows):.1f} s); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Platform overhead per rollout at high concurrency, against a policy of fixed latency.

A real Celery worker process (threads pool) runs N rollouts of a small harness that makes
``--calls`` model calls each, against an OpenAI-compatible test server that answers every call
after exactly ``--latency`` seconds and never queues. Everything else is real: PostgreSQL,
Redis, the bubblewrap sandbox, the JSON-lines runtime, trace recording, the budget ledger, the
per-endpoint concurrency limiter in Redis and the scorer.

Overhead of a rollout = its wall time (claim → finish) minus the time its model calls took,
as a share of its wall time. Makespan efficiency = the ideal time (waves × calls × latency) over
the measured time from the first claim to the last finish.

``--harness program`` runs the same calls from a Python program harness (``command``) through
the worker's OpenAI-compatible model boundary instead of ``ctx.llm`` (workers/boundary.py), so
both kinds are measured the same way. The load average is printed before and after: the
figures are only as good as the machine was quiet.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/coevo_bench \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/13 \\
    .venv/bin/python benchmarks/throughput.py --rollouts 256 --concurrency 64 [--harness program]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

HARNESS_TOML = """\
[harness]
name = "bench"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 16
max_tokens = 4096
wall_time_s = 600
"""

# The harness stamps its own phases (wall clock, shared with the worker): emitted with
# --phases only (a ctx.log step, a stdout line), so the default harness is the one measured
# before.
AGENT = """\
import time
LOADED = time.time()

def run(task, ctx):
    started, calls = time.time(), []
    text = ""
    for _ in range({calls}):
        sent = time.time()
        text = ctx.llm.complete(task["input"], max_tokens=8).text
        calls.append([sent, time.time()])
    if {phases}:
        ctx.log("phases", loaded=LOADED, started=started, calls=calls, ended=time.time())
    return text.strip()
"""

# The same harness as a program: the same calls through the model boundary, with urllib.
PROGRAM_TOML = """\
[harness]
name = "bench"
command = ["python3", "main.py"]

[limits]
max_model_calls = 16
max_tokens = 4096
wall_time_s = 600
"""

PROGRAM = """\
import time
LOADED = time.time()
import json, os, urllib.request

started, calls = time.time(), []
task = json.load(open(os.environ["COEVO_TASK_FILE"]))
body = json.dumps({{"model": "bench", "prompt": task["input"], "max_tokens": 8}}).encode()
headers = {{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
           "Content-Type": "application/json"}}
text = ""
for _ in range({calls}):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/completions", data=body,
                                     headers=headers)
    sent = time.time()
    with urllib.request.urlopen(request) as response:
        text = json.load(response)["choices"][0]["text"]
    calls.append([sent, time.time()])
json.dump(text.strip(), open(os.environ["COEVO_ANSWER_FILE"], "w"))
if {phases}:
    print(json.dumps({{"phases": {{"loaded": LOADED, "started": started, "calls": calls,
                                  "ended": time.time()}}}}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per model call")
    parser.add_argument("--calls", type=int, default=3, help="model calls per rollout")
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes sharing --concurrency"
    )
    parser.add_argument(
        "--harness",
        choices=("ctx", "program"),
        default="ctx",
        help="ctx: a run(task, ctx) harness; program: the same calls from a Python program "
        "through the model boundary",
    )
    parser.add_argument(
        "--phases",
        action="store_true",
        help="the harness stamps its phases; print where each rollout's overhead goes",
    )
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        parser.error("set DATABASE_URL to a PostgreSQL database (it is migrated and reused)")
    if not os.environ.get("CELERY_BROKER_URL", "").startswith("redis"):
        parser.error("set CELERY_BROKER_URL to a Redis URL")
    home = Path(tempfile.mkdtemp(prefix="coevo-bench-"))
    os.environ["COEVO_HOME"] = str(home)
    os.environ["COEVO_LOG_LEVEL"] = "WARNING"

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        max_connections = int(cursor.fetchone()[0])
    # Each of the worker's threads holds a connection of its own, and the heartbeats one each.
    if args.concurrency + 10 > max_connections:
        parser.error(
            f"--concurrency {args.concurrency} needs more PostgreSQL connections than "
            f"max_connections = {max_connections} (one per worker thread, and a few more): raise "
            "it (ALTER SYSTEM SET max_connections = 300; then restart PostgreSQL) or run fewer"
        )

    from django.conf import settings

    from coevo.celery import app
    from coevo.evaluations.models import Rollout, TraceStep
    from coevo.evaluations.services import evaluation_create
    from coevo.policies.models import PolicyEndpoint
    from coevo.policies.services import policy_version_get_default
    from coevo.projects.services import project_get_or_create
    from coevo.suites.jsonl import ScorerSpec
    from coevo.suites.services import suite_import_jsonl
    from harness_store.services import candidate_import_directory
    from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
    from workers.trace import StepKind

    policy = ScriptedPolicy(default="ok", latency_s=args.latency)
    server = ScriptedOpenAIServer(policy)
    server.start()
    settings.COEVO_POLICY_URL = server.url
    settings.COEVO_POLICY_MODEL = "scripted"
    settings.COEVO_HARNESS_STORE_DIR = str(home / "store")
    version = policy_version_get_default()
    PolicyEndpoint.objects.filter(id=version.endpoint_id).update(max_concurrency=args.concurrency)

    stamp = str(time.time_ns())
    project = project_get_or_create(slug=f"bench-{stamp}", name="throughput benchmark")
    harness = home / "harness"
    harness.mkdir()
    if args.harness == "ctx":
        (harness / "harness.toml").write_text(HARNESS_TOML)
        (harness / "agent.py").write_text(AGENT.format(calls=args.calls, phases=args.phases))
    else:
        (harness / "harness.toml").write_text(PROGRAM_TOML)
        (harness / "main.py").write_text(PROGRAM.format(calls=args.calls, phases=args.phases))
    candidate, _ = candidate_import_directory(
        project=project, directory=harness, message="benchmark harness", author_name="bench"
    )
    rows = "\n".join(
        json.dumps({"id": f"t{i}", "input": f"task {i}", "expected": "ok", "split": "search"})
        for i in range(args.rollouts)
    )
    suite, _ = suite_import_jsonl(
        project=project, name="bench", data=rows.encode(), scorer=ScorerSpec(kind="exact")
    )

    app.control.purge()
    load_before = os.getloadavg()
    env = {
        **os.environ,
        "COEVO_WORKER_CONCURRENCY": str(args.concurrency),
        "COEVO_HARNESS_STORE_DIR": str(home / "store"),
    }
    worker_log = open(home / "worker.log", "wb")  # noqa: SIM115 (closed with the workers)
    env["COEVO_WORKER_CONCURRENCY"] = str(max(1, args.concurrency // args.workers))
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "coevo",
                "worker",
                "-Q",
                "rollouts,default",
                "-n",
                f"bench-{stamp}-{i}@%h",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "WARNING",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=worker_log,
        )  # fmt: skip
        for i in range(args.workers)
    ]
    cgroup = CpuGroup.create(f"coevo-bench-{stamp}")
    if cgroup is not None:
        for worker in workers:
            cgroup.add(worker.pid)  # its sandboxes (and their zygotes) are born inside
    try:
        time.sleep(3)
        cpu_before = cgroup.usage_s() if cgroup is not None else None
        own_before = sum(process_cpu_s(worker.pid) for worker in workers)
        machine_before = machine_cpu_s()
        started = time.monotonic()
        evaluation = evaluation_create(
            candidate=candidate,
            suite=suite,
            split="search",
            policy_version=version,
            use_cache=False,
        )
        total = Rollout.objects.filter(evaluation=evaluation).count()
        while True:
            evaluation.refresh_from_db()
            if evaluation.is_final:
                break
            done = Rollout.objects.filter(evaluation=evaluation, state="done").count()
            print(f"\r  {done}/{total} rollouts done", end="", flush=True)
            time.sleep(1)
        elapsed = time.monotonic() - started
        cpu_window = cgroup.usage_s() - cpu_before if cgroup is not None else None
        own_window = sum(process_cpu_s(worker.pid) for worker in workers) - own_before
        machine_window = machine_cpu_s() - machine_before
        print()
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=60)
        worker_log.close()
        server.stop()

    load_after = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = usage.ru_utime + usage.ru_stime
    rollouts = list(Rollout.objects.filter(evaluation=evaluation))
    policy_ms: dict[object, int] = {}
    for rollout_id, latency in TraceStep.objects.filter(
        rollout__evaluation=evaluation, kind=StepKind.MODEL_CALL
    ).values_list("rollout_id", "latency_ms"):
        policy_ms[rollout_id] = policy_ms.get(rollout_id, 0) + latency
    overheads, overheads_ms = [], []
    for rollout in rollouts:
        wall_ms = (rollout.finished_at - rollout.started_at).total_seconds() * 1000
        overheads_ms.append(max(0.0, wall_ms - policy_ms.get(rollout.id, 0)))
        overheads.append(overheads_ms[-1] / wall_ms)
    first = min(r.started_at for r in rollouts)
    last = max(r.finished_at for r in rollouts)
    waves = -(-total // args.concurrency)
    ideal = waves * args.calls * args.latency
    makespan = (last - first).total_seconds()
    outcomes = {
        o: sum(1 for r in rollouts if r.outcome == o) for o in {r.outcome for r in rollouts}
    }
    print(
        f"harness: {args.harness}; load average (1 min) before {load_before[0]:.2f}, "
        f"after {load_after[0]:.2f}"
    )
    print(
        f"rollouts: {total} ({outcomes}), {args.concurrency} in flight "
        f"({args.workers} worker process(es))"
    )
    print(f"policy: {args.calls} calls x {args.latency:.2f}s fixed latency per rollout")
    print(
        "overhead per rollout (wall beyond the policy's latency): "
        f"mean {statistics.mean(overheads):.1%}, median {statistics.median(overheads):.1%}, "
        f"p95 {sorted(overheads)[int(0.95 * len(overheads)) - 1]:.1%}; "
        f"in time: mean {statistics.mean(overheads_ms):.0f} ms, "
        f"p95 {sorted(overheads_ms)[int(0.95 * len(overheads_ms)) - 1]:.0f} ms"
    )
    print(
        f"makespan {makespan:.1f}s vs ideal {ideal:.1f}s ({waves} waves): "
        f"efficiency {ideal / makespan:.1%}; end to end incl. enqueue {elapsed:.1f}s"
    )
    cores = os.cpu_count() or 1
    if cpu_window is not None:
        print(
            f"CPU used by the worker and its sandboxes (a cgroup, while the rollouts ran): "
            f"{cpu_window:.1f}s = {cpu_window / total * 1000:.0f} ms per rollout; "
            f"{cpu_window / (makespan * cores):.0%} of {cores} cores over the makespan; of "
            f"which the worker process(es) themselves {own_window / total * 1000:.0f} ms, the "
            f"sandboxes {(cpu_window - own_window) / total * 1000:.0f} ms"
        )
    else:
        print(
            f"CPU used by the worker and its sandboxes (RUSAGE_CHILDREN, start-up included; it "
            f"misses processes killed before they were reaped): {cpu_s:.1f}s = "
            f"{cpu_s / total * 1000:.0f} ms per rollout"
        )
    print(
        f"CPU used by the whole machine while the rollouts ran (PostgreSQL, Redis, the policy "
        f"server, anything else running): {machine_window:.1f}s = "
        f"{machine_window / total * 1000:.0f} ms per rollout"
    )
    if cgroup is not None:
        cgroup.remove()
    if args.phases:
        print_phases(rollouts, kind=args.harness)
    return 0


class CpuGroup:
    """A cgroup that counts the CPU of the processes put in it and of all they start, reaped
    or not (cgroup v1's cpuacct, or v2); None where this process may not make one."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def create(cls, name: str) -> CpuGroup | None:
        for root, version in ((Path("/sys/fs/cgroup/cpuacct"), 1), (Path("/sys/fs/cgroup"), 2)):
            marker = "cpuacct.usage" if version == 1 else "cgroup.controllers"
            if not (root / marker).exists():
                continue
            try:
                (root / name).mkdir()
            except OSError:
                continue
            return cls(root / name, version)
        return None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def usage_s(self) -> float:
        if self.version == 1:
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # a straggler still in it: left for the kernel
            self.path.rmdir()


def process_cpu_s(pid: int) -> float:
    """User + system CPU-seconds of one process, all its threads (/proc/<pid>/stat), not its
    children."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu_s() -> float:
    """Busy CPU-seconds of the whole machine since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def print_phases(rollouts: list, *, kind: str) -> None:
    """Where each rollout's overhead goes, from the harness's own stamps and the policy
    client's latency per call: start (claim → harness code loaded), prepare (→ first call
    sent), calls (each call as the harness saw it beyond the policy client's time: for a program
    the boundary's hop), between (harness code between calls), finish (last reply → finished:
    answer, exit, scoring, the rollout's rows)."""
    from coevo.evaluations.models import TraceStep
    from coevo.evaluations.traces import trace_step_typed
    from workers.trace import Log, ProgramOutput, StepKind

    stamps: dict[object, dict] = {}
    latencies: dict[object, list[int]] = {}
    steps = TraceStep.objects.filter(
        rollout__in=rollouts, kind__in=[StepKind.LOG, StepKind.PROGRAM_OUTPUT, StepKind.MODEL_CALL]
    ).order_by("rollout_id", "index")
    for step in steps:
        if step.kind == StepKind.MODEL_CALL:
            latencies.setdefault(step.rollout_id, []).append(step.latency_ms)
            continue
        typed = trace_step_typed(step)
        if isinstance(typed, Log) and typed.message == "phases":
            stamps[step.rollout_id] = typed.fields
        elif isinstance(typed, ProgramOutput):
            last = (typed.stdout or "").strip().splitlines()[-1:]
            if last:
                stamps[step.rollout_id] = json.loads(last[0])["phases"]
    parts: dict[str, list[float]] = {
        "start": [],
        "prepare": [],
        "calls": [],
        "between": [],
        "finish": [],
    }
    per_call: list[float] = []
    for rollout in rollouts:
        stamp = stamps.get(rollout.id)
        if stamp is None:
            continue
        claimed, finished = rollout.started_at.timestamp(), rollout.finished_at.timestamp()
        calls = stamp["calls"]
        hops = [
            (end - sent) * 1000 - ms
            for (sent, end), ms in zip(calls, latencies.get(rollout.id, []), strict=True)
        ]
        per_call += hops
        parts["start"].append((stamp["loaded"] - claimed) * 1000)
        parts["prepare"].append((calls[0][0] - stamp["loaded"]) * 1000)
        parts["calls"].append(sum(hops))
        parts["between"].append(
            sum((calls[i + 1][0] - calls[i][1]) * 1000 for i in range(len(calls) - 1))
        )
        parts["finish"].append((finished - calls[-1][1]) * 1000)
    count = len(parts["start"])
    print(f"where the overhead goes ({kind}, {count} rollouts; ms, mean / p95):")
    for name, values in parts.items():
        print(f"  {name:8} {statistics.mean(values):7.0f} / {_p95(values):7.0f}")
    print(
        f"  per call beyond the policy client's time: {statistics.mean(per_call):.1f} / "
        f"{_p95(per_call):.1f} ms"
    )


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(0.95 * len(values)) - 1)]


if __name__ == "__main__":
    raise SystemExit(main())

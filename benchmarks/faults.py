"""Recovery time from single faults (issue 40, item 8): for each fault, a real evaluation on real
processes, with the fault in its middle, beside a no-fault baseline.

Setup, everything of its own: a PostgreSQL cluster (tests/support/postgres.py), a Redis per run
(tests/support/processes.py; with ``--appendonly yes`` for ``redis-aof``, as docker-compose.yml
ships it), two rollout workers (``-Q rollouts,default``, 4 threads each), an ``ops`` worker and
beat (CELERY_TASK_ROUTES), and a scripted policy server answering each completion after
``--latency`` seconds, ``max_concurrency`` 8. The evaluation is ``--tasks`` HumanEval tasks of
the seed harness (examples/humaneval-basic). An API GET of the evaluation
(/api/v1/projects/<slug>/evaluations/<id>/, through Django's test client in the driving process,
on the same database and Redis: no web server) is polled every 0.5 s during the run.

The fault starts once a third of the tasks are done:

- ``kill9``: ``kill -9`` one rollout worker, left dead;
- ``sigterm``: SIGTERM one rollout worker (a warm shutdown), left stopped;
- ``redis-empty``: Redis stopped (SIGKILL) ``--outage`` seconds, back empty;
- ``redis-aof``: Redis stopped (SIGTERM, as ``docker stop``) ``--outage`` seconds, back with its
  append-only file;
- ``postgres``: PostgreSQL stopped (``pg_ctl -m fast``) ``--outage`` seconds;
- ``policy``: the policy server stopped ``--policy-outage`` seconds and started on its port.

Printed per fault: the run's wall time, the time from the fault's end (the signal, or the
dependency back) to the evaluation's end, and that time less what the baseline needed after the
same point; the checks: finished by itself, tasks not scored (lost or ended as an infra error),
tasks scored twice (a verdict from more than one attempt), manual actions (none are made: the
script only waits), API GETs answered 500 (503 while a dependency is down is counted apart).
Each run is appended as a JSON line to benchmarks/results/faults.jsonl.

    .venv/bin/python benchmarks/faults.py [--faults kill9,sigterm,...] [--tasks 24]

Test processes' settings: workers heartbeat every second (COEVO_HEARTBEAT_S=1, as in the fault
tests); everything else is the settings' default.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FAULTS = ("kill9", "sigterm", "redis-empty", "redis-aof", "postgres", "policy")
RESULTS = REPO / "benchmarks" / "results" / "faults.jsonl"
COLUMNS = (
    ("fault", "fault"),
    ("wall_s", "wall s"),
    ("fault_end_s", "fault ends at s"),
    ("recovery_s", "end after fault's end s"),
    ("beyond_baseline_s", "beyond baseline s"),
    ("finished", "finished by itself"),
    ("lost", "lost"),
    ("scored_twice", "scored twice"),
    ("manual_actions", "manual actions"),
    ("api_500", "API 500s"),
    ("api_503", "API 503s"),
    ("policy_calls", "policy calls"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--faults",
        type=fault_list,
        default=list(FAULTS),
        help=f"comma-separated, of {', '.join(FAULTS)} (default: all)",
    )
    parser.add_argument("--tasks", type=int, default=24, help="HumanEval tasks (default 24)")
    parser.add_argument("--latency", type=float, default=2.0, help="seconds per completion")
    parser.add_argument("--outage", type=float, default=20.0, help="Redis/PostgreSQL down, s")
    parser.add_argument("--policy-outage", type=float, default=30.0, help="policy down, s")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a run after")
    parser.add_argument("--results", type=Path, default=RESULTS)
    # One run, in a process of its own (its Redis and Django settings): set by the driver.
    parser.add_argument("--run-one", choices=("none", *FAULTS), help=argparse.SUPPRESS)
    parser.add_argument("--pg-bin", help=argparse.SUPPRESS)
    parser.add_argument("--pg-data", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tasks < 3:
        parser.error("--tasks must be at least 3 (the fault starts once a third are done)")
    return args


def fault_list(text: str) -> list[str]:
    faults = [each.strip() for each in text.split(",") if each.strip()]
    unknown = [each for each in faults if each not in FAULTS]
    if unknown or not faults:
        raise argparse.ArgumentTypeError(
            f"unknown fault {', '.join(unknown) or '(none)'}: choose from {', '.join(FAULTS)}"
        )
    return faults


def with_baseline(rows: list[dict]) -> list[dict]:
    """Each fault row with ``beyond_baseline_s``: its recovery less the time the baseline took
    from the same point (its ``fault_end_s``) to its end."""
    baseline = next((row for row in rows if row["fault"] == "none"), None)
    out = []
    for row in rows:
        row = dict(row)
        if baseline and row["fault"] != "none" and row.get("recovery_s") is not None:
            after = max(0.0, baseline["wall_s"] - row["fault_end_s"])
            row["beyond_baseline_s"] = round(row["recovery_s"] - after, 1)
        else:
            row.setdefault("beyond_baseline_s", None)
        out.append(row)
    return out


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the runs (``with_baseline`` rows)."""

    def cell(value) -> str:
        if value is None:
            return "–"
        if isinstance(value, bool):
            return "yes" if value else "**no**"
        if isinstance(value, float):
            return f"{value:.1f}"
        return str(value)

    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(cell(row.get(key)) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


# --- the driver ---------------------------------------------------------------------------------


def drive(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    from tests.support.postgres import PostgresCluster, postgres_bin_dir

    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        print("needs PostgreSQL's server binaries (apt-get install postgresql)", file=sys.stderr)
        return 2
    cluster = PostgresCluster(bin_dir)
    rows: list[dict] = []
    try:
        cluster.start()
        cluster._run("createdb", "-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres",
                     "coevo")  # fmt: skip
        env = {**os.environ, "DATABASE_URL": cluster.url, "CELERY_BROKER_URL": "memory://"}
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            cwd=REPO, env=env, check=True,
        )  # fmt: skip
        for fault in ["none", *args.faults]:
            print(f"--- {fault}", flush=True)
            done = subprocess.run(
                [sys.executable, __file__, "--run-one", fault, "--tasks", str(args.tasks),
                 "--latency", str(args.latency), "--outage", str(args.outage),
                 "--policy-outage", str(args.policy_outage), "--timeout", str(args.timeout),
                 "--pg-bin", str(bin_dir), "--pg-data", str(cluster.data)],
                cwd=REPO, env={**os.environ, "DATABASE_URL": cluster.url},
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            result = [line for line in done.stdout.splitlines() if line.startswith("{")]
            for line in done.stdout.splitlines():
                if not line.startswith("{"):
                    print("   ", line, flush=True)
            if not result:
                print(f"    {fault}: no result (exit {done.returncode})", flush=True)
                continue
            rows.append(json.loads(result[-1]))
    finally:
        cluster.destroy()
    rows = with_baseline(rows)
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as out:
        for row in rows:
            out.write(json.dumps({"date": stamp, "machine": machine, "tasks": args.tasks,
                                  "latency_s": args.latency, **row}) + "\n")  # fmt: skip
    print(f"\n{stamp}, {machine}, {args.tasks} tasks, {args.latency} s a completion\n")
    print(format_table(rows))
    return 0


# --- one run ------------------------------------------------------------------------------------


class ApiPoller(threading.Thread):
    """GETs the evaluation through the API every 0.5 s and counts the answers by status."""

    def __init__(self, path: str, token: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.token = token
        self.statuses: dict[int, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection
        from django.test import Client

        client = Client(raise_request_exception=False)
        while not self.stopping.wait(0.5):
            try:
                status = client.get(
                    self.path, HTTP_AUTHORIZATION=f"Bearer {self.token}"
                ).status_code
            except Exception:  # noqa: BLE001 (what the client raised is what a user would get)
                status = 500
            self.statuses[status] = self.statuses.get(status, 0) + 1
        connection.close()


def run_one(args: argparse.Namespace) -> int:
    fault = args.run_one
    home = Path(tempfile.mkdtemp(prefix=f"coevo-faults-{fault}-"))
    os.chmod(home, 0o755)
    from tests.support.processes import RedisProcess

    redis_server = RedisProcess(home, appendonly=fault == "redis-aof")
    redis_server.start()
    os.environ.update(
        DJANGO_SETTINGS_MODULE="coevo.settings",
        CELERY_BROKER_URL=redis_server.url,
        COEVO_REDIS_URL=redis_server.url,
        COEVO_HOME=str(home),
        COEVO_HARNESS_STORE_DIR=str(home / "store"),
        COEVO_LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    from django.conf import settings
    from django.db import OperationalError, connection

    from coevo.accounts.models import TokenKind
    from coevo.accounts.services import token_create
    from coevo.evaluations.models import Rollout, RolloutOutcome, RolloutState, TraceStep
    from coevo.evaluations.services import evaluation_create
    from coevo.policies.models import PolicyEndpoint
    from coevo.policies.services import policy_version_get_default
    from coevo.projects.models import Role
    from coevo.projects.services import membership_set, project_get_or_create
    from coevo.suites.models import Split
    from coevo.suites.services import suite_import_humaneval
    from harness_store.services import candidate_import_directory
    from tests.support.factories import SEED_HARNESS, make_user
    from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
    from tests.support.processes import CeleryProcesses
    from workers.trace import StepKind

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    policy = ScriptedPolicy(latency_s=args.latency)
    server = ScriptedOpenAIServer(policy)
    server.start()
    settings.COEVO_POLICY_URL = server.url
    settings.COEVO_POLICY_MODEL = "scripted"
    version = policy_version_get_default()
    PolicyEndpoint.objects.filter(id=version.endpoint_id).update(max_concurrency=8)
    stamp = f"{fault}-{time.time_ns()}"
    project = project_get_or_create(slug=f"faults-{stamp}", name="faults benchmark")
    owner = make_user(f"owner-{stamp}")
    membership_set(project=project, user=owner, role=Role.ADMIN)
    _, token = token_create(
        user=owner, name="faults", kind=TokenKind.PERSONAL, scopes=["read"], created_by=owner
    )
    candidate, _ = candidate_import_directory(
        project=project, directory=SEED_HARNESS, message="seed", author_name="bench"
    )
    suite, _ = suite_import_humaneval(project=project)

    processes = CeleryProcesses(broker_url=redis_server.url, log_dir=home)
    processes.worker("ops", queues="ops")
    processes.beat()
    workers = [processes.worker(f"w{i}-{stamp}", COEVO_WORKER_CONCURRENCY="4") for i in (1, 2)]
    notes: list[str] = []
    poller = None
    try:
        deadline = time.monotonic() + 120
        while not all("ready." in w.log_path.read_text(errors="replace") for w in workers):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start in 120 s")
            time.sleep(0.5)
        started = time.monotonic()
        evaluation = evaluation_create(
            candidate=candidate,
            suite=suite,
            split=Split.SEARCH,
            policy_version=version,
            task_limit=args.tasks,
            use_cache=False,
        )
        tasks = Rollout.objects.filter(evaluation=evaluation).count()
        poller = ApiPoller(f"/api/v1/projects/{project.slug}/evaluations/{evaluation.id}/", token)
        poller.start()

        def done_count() -> int:
            return Rollout.objects.filter(evaluation=evaluation, state=RolloutState.DONE).count()

        while done_count() < max(1, tasks // 3) and time.monotonic() - started < args.timeout:
            time.sleep(0.2)
        fault_start = time.monotonic() - started
        if fault == "kill9":
            workers[0].kill()
        elif fault == "sigterm":
            os.killpg(workers[0].proc.pid, signal.SIGTERM)
        elif fault in ("redis-empty", "redis-aof"):
            redis_server.stop()
            time.sleep(args.outage)
            redis_server.start()
        elif fault == "postgres":
            pg_ctl(args, "stop", "-m", "fast")
            connection.close()
            time.sleep(args.outage)
            pg_ctl(args, "start")
        elif fault == "policy":
            server.stop()
            time.sleep(args.policy_outage)
            server.start()
        fault_end = time.monotonic() - started

        finished = False
        while time.monotonic() - started < args.timeout:
            try:
                evaluation.refresh_from_db()
                if evaluation.is_final:
                    finished = True
                    break
            except OperationalError:
                connection.close()
            time.sleep(0.2)
        wall = time.monotonic() - started
        poller.stopping.set()
        poller.join(timeout=10)

        rollouts = list(Rollout.objects.filter(evaluation=evaluation))
        scored = [
            r
            for r in rollouts
            if r.state == RolloutState.DONE
            and r.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE)
        ]
        verdicts: dict = {}
        for rollout_id, attempt in TraceStep.objects.filter(
            rollout__evaluation=evaluation, kind=StepKind.VERDICT
        ).values_list("rollout_id", "attempt"):
            verdicts.setdefault(rollout_id, set()).add(attempt)
        not_scored = [r for r in rollouts if r not in scored]
        for r in not_scored:
            notes.append(f"rollout {r.id}: {r.state} {r.outcome} {r.detail[:160]!r}")
        if not finished:
            notes.append(f"evaluation still {evaluation.state} after {args.timeout:.0f}s")
        row = {
            "fault": fault,
            "state": evaluation.state,
            "wall_s": round(wall, 1),
            "fault_start_s": round(fault_start, 1),
            "fault_end_s": round(fault_end, 1),
            "recovery_s": round(wall - fault_end, 1) if finished else None,
            "finished": finished and evaluation.state == "finished",
            "tasks": tasks,
            "lost": tasks - len(scored),
            "scored_twice": sum(1 for attempts in verdicts.values() if len(attempts) > 1),
            "max_attempts": max((r.attempts for r in rollouts), default=0),
            "manual_actions": 0,
            "api_500": sum(n for status, n in poller.statuses.items() if status >= 500)
            - poller.statuses.get(503, 0),
            "api_503": poller.statuses.get(503, 0),
            "api_statuses": {str(k): v for k, v in sorted(poller.statuses.items())},
            "policy_calls": len(policy.requests),
            "notes": notes[:12],
        }
        for note in notes[:12]:
            print(note)
        print(json.dumps(row), flush=True)
        return 0
    finally:
        if poller is not None:
            poller.stopping.set()
        processes.stop()
        server.stop()
        redis_server.stop()
        print(f"logs: {home}")


def pg_ctl(args: argparse.Namespace, *command: str) -> None:
    program = [str(Path(args.pg_bin) / "pg_ctl"), "-D", args.pg_data, "-w", *command]
    if command[0] == "start":
        program += ["-l", str(Path(args.pg_data).parent / "server.log")]
    if os.geteuid() == 0:
        program = ["runuser", "-u", "postgres", "--", *program]
    subprocess.run(program, check=True, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.run_one:
        return run_one(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())

"""Traces: ingest throughput and the time to open page 1 of a long trace.

Ingest: one worker-side ``TraceWriter`` (the one ``rollout_execute`` uses, default batch size
and flush interval) writes ``--steps`` steps of a game-like trace into PostgreSQL: a model call
with a ``--prompt-bytes`` prompt and a short completion, then an env step with a ~500-byte
observation, over and over. Reported: steps per second, wall time from the first ``add`` to
the last ``flush``, repeated ``--runs`` times (median).

Open: a rollout with a ``--trace-steps`` trace; the rollout page (page 1, a page in the
middle, and a search) is rendered in-process through Django's test client, logged in as a
member, ``--runs`` times each; reported as the median server time (request in, response out;
no network, no browser).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/coevo_h6_bench \\
    .venv/bin/python benchmarks/traces.py

The database is created if missing and migrated; each run uses a fresh project in it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from workers.trace import StepKind  # noqa: E402  (the repository's, on the path above)

CPU_SECONDS: list[float] = []
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/coevo_h6_bench"


class BenchStep:
    __slots__ = ("kind", "payload", "prompt_tokens", "completion_tokens", "latency_ms")

    def __init__(self, kind: str, payload: dict, tokens: tuple[int, int] = (0, 0), ms: int = 0):
        self.kind = kind
        self.payload = payload
        self.prompt_tokens, self.completion_tokens = tokens
        self.latency_ms = ms


def game_steps(n: int, *, prompt_bytes: int) -> list[BenchStep]:
    """A game's trace, shaped like workers/rollout.py's steps (built before timing starts)."""
    room = "You are in a kitchen. There is a fridge, a counter and a closed door to the north. "
    steps = []
    for i in range(n):
        move = i // 2 + 1
        if i % 2 == 0:
            prompt = (f"[move {move}] " + room * (prompt_bytes // len(room) + 1))[:prompt_bytes]
            payload = {
                "api": "completions",
                "model": "gemma-3-270m",
                "policy_version": "gemma-3-270m",
                "prompt": prompt,
                "sampling": {"max_tokens": 32, "temperature": 0.0, "stop": ["\n"], "seed": move},
                "sample": 0,
                "n": 1,
                "completion": f" open fridge and take the milk, then go north ({move})",
                "finish_reason": "stop",
            }
            steps.append(BenchStep(StepKind.MODEL_CALL, payload, (prompt_bytes // 4, 14), 180))
        else:
            observation = {
                "observation": (f"[move {move}] You open the fridge. " + room * 6)[:500],
                "score": move % 7,
                "max_score": 7,
                "admissible_commands": ["go north", "open fridge", "take milk", "look"],
            }
            payload = {
                "index": move,
                "action": "open fridge",
                "observation": observation,
                "reward": 0.0,
                "done": False,
                "truncated": False,
            }
            steps.append(BenchStep(StepKind.ENV_STEP, payload, ms=2))
    return steps


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1].split("?")[0]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone():
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))


def setup() -> None:
    os.environ.setdefault("DATABASE_URL", DEFAULT_DB)
    os.environ.setdefault("COEVO_HARNESS_STORE_DIR", tempfile.mkdtemp(prefix="coevo-bench-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    if os.environ["DATABASE_URL"].startswith("postgres"):
        ensure_database(os.environ["DATABASE_URL"])
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_rollouts(count: int):
    """A project, a member, the seed candidate, HumanEval and ``count`` running rollouts."""
    from django.contrib.auth import get_user_model

    from coevo.evaluations.models import Evaluation, Rollout, RolloutState
    from coevo.policies.services import policy_version_get_default
    from coevo.projects.models import Role
    from coevo.projects.services import membership_set, project_get_or_create
    from coevo.suites.models import Split, Task
    from coevo.suites.services import suite_import_humaneval
    from harness_store.services import candidate_import_directory

    tag = uuid.uuid4().hex[:8]
    user = get_user_model().objects.create_user(f"bench-{tag}", password="bench")
    project = project_get_or_create(slug=f"bench-{tag}", name="trace benchmark")
    membership_set(project=project, user=user, role=Role.ADMIN)
    candidate, _ = candidate_import_directory(
        project=project,
        directory=REPO / "examples" / "humaneval-basic",
        message="seed",
        author_name="bench",
        created_by=user,
    )
    suite, _ = suite_import_humaneval(project=project)
    evaluation = Evaluation.objects.create(
        project=project,
        candidate=candidate,
        policy_version=policy_version_get_default(),
        suite=suite,
        split=Split.SEARCH,
    )
    tasks = list(Task.objects.filter(suite=suite, split=Split.SEARCH).order_by("position"))
    rollouts = [
        Rollout.objects.create(
            evaluation=evaluation,
            task=tasks[i],
            seed=i,
            state=RolloutState.RUNNING,
            attempts=1,
        )
        for i in range(count)
    ]
    return project, user, rollouts


def ingest(rollout, steps: list[BenchStep], *, use_copy: bool = True) -> float:
    """Wall seconds to write ``steps``; the worker's CPU seconds go to CPU_SECONDS."""
    from coevo.evaluations.traces import TraceWriter

    started, cpu = time.perf_counter(), time.process_time()
    # The batching alone: a worker also writes each model call at once (WRITE_AT_ONCE_KINDS),
    # a COPY beside each policy round trip, which a stream of steps with no model latency
    # would turn into a COPY per move.
    writer = TraceWriter(
        rollout_id=rollout.id,
        attempt=rollout.attempts,
        use_copy=use_copy,
        write_at_once=frozenset(),
    )
    with writer:
        for step in steps:
            writer.add(step)
    CPU_SECONDS.append(time.process_time() - cpu)
    return time.perf_counter() - started


def timed_get(client, url: str, runs: int) -> tuple[float, int]:
    times = []
    size = 0
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200, response.status_code
        size = len(response.content)
    return statistics.median(times) * 1000, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20000, help="steps per ingest run")
    parser.add_argument("--prompt-bytes", type=int, default=2048)
    parser.add_argument("--trace-steps", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    setup()
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from coevo.evaluations.models import TraceStep
    from coevo.evaluations.traces import BATCH_SIZE, FLUSH_INTERVAL_S

    project, user, rollouts = make_rollouts(args.runs + 1)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"database: {connection.vendor} {connection.cursor().connection.info.server_version}")
    print(f"writer: batch {BATCH_SIZE} steps or {FLUSH_INTERVAL_S}s, whichever first")

    steps = game_steps(args.steps, prompt_bytes=args.prompt_bytes)
    for use_copy, label in ((True, "COPY (what workers use)"), (False, "bulk_create (ORM)")):
        rates = []
        CPU_SECONDS.clear()
        for rollout in rollouts[: args.runs]:
            TraceStep.objects.filter(rollout=rollout).delete()
            seconds = ingest(rollout, steps, use_copy=use_copy)
            assert TraceStep.objects.filter(rollout=rollout).count() == args.steps
            rates.append(args.steps / seconds)
            print(f"  {label}: {args.steps} steps in {seconds:.2f}s")
        print(
            f"ingest, {label}: median {statistics.median(rates):,.0f} steps/s "
            f"(min {min(rates):,.0f}, max {max(rates):,.0f}) over {args.runs} runs of "
            f"{args.steps} steps ({args.prompt_bytes}-byte prompts); worker CPU "
            f"{1e6 * statistics.median(CPU_SECONDS) / args.steps:.0f} µs/step"
        )

    viewed = rollouts[-1]
    ingest(viewed, game_steps(args.trace_steps, prompt_bytes=args.prompt_bytes))
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    base = reverse("web:rollout", args=[project.slug, viewed.id])
    client.get(base)  # warm: templates compiled, connection open
    middle = args.trace_steps // 2
    for label, url in (
        ("page 1", base),
        (f"page from step {middle}", f"{base}?from=1.{middle}"),
        ("load more (htmx partial)", f"{base}?from=1.{middle}"),
        ("search 'move 1234]'", f"{base}?q=move%201234%5D"),
    ):
        if label.startswith("load more"):
            client.defaults["HTTP_HX_REQUEST"] = "true"
        ms, size = timed_get(client, url, args.runs)
        client.defaults.pop("HTTP_HX_REQUEST", None)
        print(f"open {args.trace_steps}-step trace, {label}: median {ms:.0f} ms ({size:,} bytes)")


if __name__ == "__main__":
    main()

"""The load benchmark (issue 21, item 2): setup, gunicorn, locust, and the table.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/coevo_load_medium \\
      COEVO_HARNESS_STORE_DIR=/work/main/var/harness-store LOCUST=/work/loadvenv/bin/locust \\
      .venv/bin/python benchmarks/load/run.py --project medium --duration 60s

1. benchmarks/load/setup.py finds (or adds) the targets in the project and writes them, with a
   member's session and API token, to ``<out>/targets.json``.
2. gunicorn serves ``coevo.wsgi:application`` on 127.0.0.1:8088 as in production: DEBUG off,
   ``COEVO_WEB_WORKERS`` sync workers (3, docs/deployment.md's default), its access log giving
   each request's time in the worker (``%(D)s``). The API rate limit is lifted
   (``COEVO_API_RATE``): one token makes all the API requests here.
3. Each target is read three times (warm-up: imports, templates, connections; not counted).
4. locust, headless: ``-u 16 -r 4 -t <duration>``, CSV under ``<out>/run``; locust is not in
   the project's environment: $LOCUST names its binary (default ``locust`` on PATH).
5. gunicorn stops; the table gives per page or endpoint locust's p50/p95/max (client side:
   queueing for a free worker included) and the server's p50/p95 (gunicorn's, the worker's
   time only), and the load average during the run.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BIND = "127.0.0.1:8088"
TARGET_MS = 300
# The request line and the time the worker took, in microseconds.
ACCESS_FORMAT = '"%(r)s" %(s)s %(D)s'


def say(message: str) -> None:
    print(f"[load] {message}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", required=True, help="the project's slug")
    parser.add_argument("--duration", default="60s", help="locust's -t (60s)")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--spawn-rate", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "var" / "load")
    parser.add_argument("--skip-setup", action="store_true", help="reuse <out>/targets.json")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to the PostgreSQL database to measure.")
    args.out.mkdir(parents=True, exist_ok=True)
    before = os.getloadavg()[0]
    env = server_env(args.out)
    python = str(REPO / ".venv" / "bin" / "python")
    targets_path = args.out / "targets.json"
    if not args.skip_setup:
        setup = [python, str(HERE / "setup.py"), "--project", args.project, "--out"]
        subprocess.run([*setup, str(targets_path)], env=env, cwd=REPO, check=True)
    targets: dict[str, Any] = json.loads(targets_path.read_text())

    access_log = args.out / "gunicorn-access.log"
    access_log.unlink(missing_ok=True)
    server = start_gunicorn(env, access_log, args.out / "gunicorn.log")
    try:
        wait_until_up(server)
        alone = warm_up(targets)
        offset = access_log.stat().st_size
        prefix = args.out / "run"
        loads, stop = sample_load()
        locust = run_locust(args, targets_path, prefix)
        stop.set()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    server_ms = server_times(access_log, offset, targets)
    rows = read_stats(Path(f"{prefix}_stats.csv"))
    table = render(rows, server_ms, alone)
    summary = f"load average (1 min) before setup: {before:.2f}"
    if loads:
        summary += (
            f"; during the run {min(loads):.2f}–{max(loads):.2f}, mean "
            f"{sum(loads) / len(loads):.2f} ({len(loads)} samples, {os.cpu_count()} CPUs)"
        )
    print(table)
    say(summary)
    (args.out / "table.md").write_text(f"{table}\n\n{summary}\n")
    say(f"table in {args.out / 'table.md'}; locust CSV {prefix}_stats.csv")
    if locust.returncode not in (0, 1):  # 1: some requests failed, shown in the table
        sys.exit(f"locust exited with {locust.returncode}")


def server_env(out: Path) -> dict[str, str]:
    """Production-like settings for setup and gunicorn alike (the session is signed with the
    secret key both read: COEVO_SECRET_KEY, else the file under COEVO_HOME)."""
    env = dict(os.environ)
    env.setdefault("COEVO_HOME", str(out / "home"))
    env["DJANGO_SETTINGS_MODULE"] = "coevo.settings"
    env["COEVO_DEBUG"] = "0"
    env.setdefault("COEVO_ALLOWED_HOSTS", "127.0.0.1,localhost")
    env["COEVO_API_RATE"] = "1000000/min"
    env.setdefault("COEVO_WEB_WORKERS", "3")
    return env


def start_gunicorn(env: dict[str, str], access_log: Path, error_log: Path) -> subprocess.Popen:
    command = [
        str(REPO / ".venv" / "bin" / "gunicorn"),
        "coevo.wsgi:application",
        f"--bind={BIND}",
        f"--workers={env['COEVO_WEB_WORKERS']}",
        "--timeout=120",
        f"--chdir={REPO}",
        f"--access-logfile={access_log}",
        f"--access-logformat={ACCESS_FORMAT}",
        f"--error-logfile={error_log}",
    ]
    say(f"gunicorn: {shlex.join(command[1:])}")
    return subprocess.Popen(command, env=env, cwd=REPO)


def wait_until_up(server: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"gunicorn exited with {server.returncode} (see its log)")
        try:
            with urllib.request.urlopen(f"http://{BIND}/healthz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    sys.exit(f"gunicorn did not answer /healthz within {timeout_s:.0f} s")


def request(targets: dict[str, Any], target: dict[str, str]) -> int:
    """GET a target as the locust users do; the status (redirects not followed)."""
    req = urllib.request.Request(f"http://{BIND}{target['path']}")
    if target["auth"] == "token":
        req.add_header("Authorization", f"Bearer {targets['token']}")
    else:
        req.add_header("Cookie", f"{targets['cookie_name']}={targets['sessions'][target['auth']]}")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=120) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def warm_up(targets: dict[str, Any], rounds: int = 4) -> dict[str, list[float]]:
    """Each target ``rounds`` times, one request at a time: the first read warms the worker
    (imports, templates, connections), the others are timed (ms) as the table's "alone"
    column: what the page costs with nobody else asking. A target that does not answer 200
    is named now, not only as failures in the table."""
    started = time.monotonic()
    alone: dict[str, list[float]] = {}
    for target in targets["requests"].values():
        statuses = {request(targets, target)}
        for _ in range(rounds - 1):
            begun = time.perf_counter()
            statuses.add(request(targets, target))
            alone.setdefault(target["name"], []).append((time.perf_counter() - begun) * 1000)
        if statuses != {200}:
            say(f"warm-up: {target['name']} answered {sorted(statuses)}")
    say(f"warm-up: {len(targets['requests'])} targets × {rounds} in "
        f"{time.monotonic() - started:.1f} s")  # fmt: skip
    return alone


def sample_load(every_s: float = 5.0) -> tuple[list[float], threading.Event]:
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every_s):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    return loads, stop


def run_locust(
    args: argparse.Namespace, targets: Path, prefix: Path
) -> subprocess.CompletedProcess:
    command = [
        os.environ.get("LOCUST", "locust"),
        "-f", str(HERE / "locustfile.py"),
        "--headless", "-u", str(args.users), "-r", str(args.spawn_rate), "-t", args.duration,
        "--host", f"http://{BIND}", "--csv", str(prefix), "--only-summary",
    ]  # fmt: skip
    say(f"locust: {shlex.join(command)}")
    env = {**os.environ, "COEVO_LOAD_TARGETS": str(targets)}
    return subprocess.run(command, env=env, cwd=REPO)


def server_times(log: Path, offset: int, targets: dict[str, Any]) -> dict[str, list[float]]:
    """Each target's times in the worker (ms), from gunicorn's access log after ``offset``."""
    names = {unquote(t["path"]): t["name"] for t in targets["requests"].values()}
    times: dict[str, list[float]] = {}
    with log.open("rb") as lines:
        lines.seek(offset)
        for line in lines.read().decode(errors="replace").splitlines():
            head, _, rest = line.rpartition('" ')
            parts = head.lstrip('"').split(" ")
            fields = rest.split()
            if len(parts) < 2 or len(fields) != 2:
                continue
            name = names.get(unquote(parts[1]))
            if name is not None:
                times.setdefault(name, []).append(int(fields[1]) / 1000)
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))]


def read_stats(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def render(
    rows: list[dict[str, str]], server_ms: dict[str, list[float]], alone: dict[str, list[float]]
) -> str:
    head = (
        "| page / endpoint | requests | failures | p50 ms | p95 ms | max ms "
        f"| server p50 ms | server p95 ms | alone ms | p95 < {TARGET_MS} ms |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def ms(values: list[float], share: float) -> str:
        return f"{percentile(values, share):.0f}" if values else "–"

    for row in sorted(rows, key=lambda r: (r["Name"] == "Aggregated", r["Name"])):
        name = row["Name"]
        served = server_ms.get(name, [])
        ok = "" if name == "Aggregated" else "yes" if float(row["95%"]) < TARGET_MS else "**no**"
        lines.append(
            f"| {name} | {row['Request Count']} | {row['Failure Count']} | {row['50%']} "
            f"| {row['95%']} | {float(row['Max Response Time']):.0f} | {ms(served, 0.5)} "
            f"| {ms(served, 0.95)} | {ms(alone.get(name, []), 0.5)} | {ok} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

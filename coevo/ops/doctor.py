"""``coevo doctor``: checks of an installation, each with the fix for what it finds.

Each check returns a CheckResult: ``ok``, ``warn`` (works, but look at it), ``fail`` (broken:
the doctor exits 1) or ``skip`` (could not run because an earlier check failed). Checks import
Django models lazily, so this module loads before Django is set up (the CLI reports settings
that do not load as a failed ``configuration`` check instead of a traceback).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

from coevo.config import BASE_DIR, OTHERS_BITS, env_path

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
GIB = 1024**3
MIN_PYTHON = (3, 11)
_DETAIL_WIDTH = 70

# Checked when coevo's own requirements cannot be read (a checkout that is not installed).
_KEY_PACKAGES = (
    "Django>=5.2,<6",
    "celery>=5.7,<6",
    "kombu",
    "GitPython>=3.1.40",
    "djangorestframework>=3.18,<4",
    "drf-spectacular>=0.30",
    "psycopg>=3.2",
    "httpx>=0.27",
    "dj-database-url>=2.2",
    "django-htmx>=1.19",
    "whitenoise>=6.7",
    "prometheus-client>=0.26",
)
_SHOWN = ("Django", "celery", "GitPython", "djangorestframework", "psycopg", "httpx")


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def _redact(url: str) -> str:
    """A URL without its password, for printing."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def _last_line(exc: BaseException) -> str:
    """The most specific line of an error (drivers put the server's reason last)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    line = lines[-1] if lines else repr(exc)
    # libpq: "connection to server at … failed: FATAL:  database "x" does not exist".
    return line[line.index("FATAL:") :] if "FATAL:" in line else line


# --- before Django: is there an installation at all? ------------------------------------


def installation_missing() -> CheckResult | None:
    """A failed ``installation`` check when there is nothing here to check, else None.

    Runs before Django loads settings, because loading them creates COEVO_HOME (0700) and the
    embedded SQLite database: a doctor run in a home that does not exist would make an empty
    installation and report its 59 unapplied migrations instead of saying none is here."""
    try:
        home = env_path("COEVO_HOME", BASE_DIR / "var")
    except ImproperlyConfigured:
        return None  # the configuration check names the bad variable
    fix = "Run scripts/demo, or set COEVO_HOME / DATABASE_URL."
    if not home.is_dir():
        what = f"COEVO_HOME {home} does not exist"
    elif (
        not (os.environ.get("DATABASE_URL") or "").strip() and not (home / "coevo.sqlite3").exists()
    ):
        what = f"the embedded database {home / 'coevo.sqlite3'} does not exist"
    else:
        return None
    return CheckResult(
        "installation",
        FAIL,
        f"no coevo installation here yet ({what}): run scripts/demo, or set COEVO_HOME / "
        "DATABASE_URL",
        fix,
    )


# --- the checks --------------------------------------------------------------------------


def check_python() -> CheckResult:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < MIN_PYTHON:
        return CheckResult(
            "python", FAIL, f"Python {version}", "Install Python 3.11 or newer and reinstall coevo."
        )
    return CheckResult("python", OK, f"Python {version} ({sys.executable})")


def check_packages() -> CheckResult:
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging comes with pip and setuptools
        Requirement = None  # noqa: N806
    try:
        declared = [r for r in metadata.requires("coevo") or [] if "extra ==" not in r]
    except metadata.PackageNotFoundError:
        declared = list(_KEY_PACKAGES)
    problems, shown = [], []
    for text in declared:
        name = text.split(";")[0]
        spec = Requirement(name) if Requirement else None
        dist = spec.name if spec else name.split("<")[0].split(">")[0].split("=")[0].split("[")[0]
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            problems.append(f"{dist} missing")
            continue
        if spec and spec.specifier and not spec.specifier.contains(installed, prereleases=True):
            problems.append(f"{dist} {installed} (needs {spec.specifier})")
        if dist in _SHOWN:
            shown.append(f"{dist} {installed}")
    if problems:
        return CheckResult(
            "packages",
            FAIL,
            "; ".join(problems),
            "Reinstall coevo's dependencies: pip install -e . (or rebuild the image).",
        )
    return CheckResult("packages", OK, ", ".join(shown) or f"{len(declared)} requirements met")


def check_git() -> CheckResult:
    if not shutil.which("git"):
        return CheckResult(
            "git", FAIL, "git is not on PATH", "Install git (Debian/Ubuntu: apt-get install git)."
        )
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, timeout=10)
    return CheckResult("git", OK, out.stdout.strip())


def check_bwrap() -> CheckResult:
    """bubblewrap present, and able to run a program the way rollouts run (same sandbox)."""
    from django.conf import settings

    install = "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
    if not shutil.which("bwrap"):
        if settings.COEVO_ALLOW_UNSANDBOXED:
            return CheckResult(
                "sandbox",
                WARN,
                "bwrap is not on PATH; COEVO_ALLOW_UNSANDBOXED=1 runs harnesses unsandboxed",
                f"{install} and unset COEVO_ALLOW_UNSANDBOXED before running untrusted harnesses.",
            )
        return CheckResult(
            "sandbox",
            FAIL,
            "bwrap (bubblewrap) is not on PATH: workers refuse to run harness code",
            f"{install}; on the worker machines too.",
        )
    from coevo.errors import CoevoError
    from workers import sandbox

    try:
        run = sandbox.run(
            [sandbox.python_executable(), "-I", "-S", "-c", "print('sandbox-ok')"], timeout_s=30
        )
    except CoevoError as exc:
        return CheckResult("sandbox", FAIL, str(exc), "See docs/deployment.md, 'The sandbox'.")
    if run.returncode == 0 and b"sandbox-ok" in run.stdout:
        return CheckResult(
            "sandbox", OK, f"bwrap runs a sandboxed Python ({shutil.which('bwrap')})"
        )
    error = (run.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
    return CheckResult(
        "sandbox",
        FAIL,
        f"bwrap is installed but cannot start a sandbox: {error}",
        "Allow user namespaces for the worker (docs/deployment.md, 'The sandbox: bubblewrap "
        "inside a container').",
    )


def check_database() -> CheckResult:
    from django.conf import settings
    from django.db import connection

    db = settings.DATABASES["default"]
    where = f"{db['ENGINE'].rsplit('.', 1)[-1]} {db.get('HOST') or ''} {db['NAME']}".strip()
    try:
        connection.ensure_connection()
    except Exception as exc:
        return CheckResult(
            "database",
            FAIL,
            f"cannot connect to {where}: {_last_line(exc)}",
            "Start the database server, or fix DATABASE_URL.",
        )
    return CheckResult("database", OK, f"connected to {where}")


def check_migrations() -> CheckResult:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        more = f" and {len(plan) - 5} more" if len(plan) > 5 else ""
        return CheckResult(
            "migrations",
            FAIL,
            f"{len(plan)} unapplied: {names}{more}",
            "Run: python manage.py migrate (before starting the new web and worker processes).",
        )
    return CheckResult("migrations", OK, "all applied")


def check_broker() -> CheckResult:
    from django.conf import settings
    from kombu import Connection

    url = settings.CELERY_BROKER_URL
    try:
        with Connection(
            url,
            transport=getattr(settings, "CELERY_BROKER_TRANSPORT", None),
            transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}),
            connect_timeout=3,
        ) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=5)
    except Exception as exc:
        return CheckResult(
            "broker",
            FAIL,
            f"cannot reach {_redact(url)}: {_last_line(exc)}",
            "Start Redis (or the broker), or fix CELERY_BROKER_URL.",
        )
    return CheckResult("broker", OK, f"reachable at {_redact(url)}")


def check_harness_store() -> CheckResult:
    from django.conf import settings

    from coevo.projects.models import Project
    from harness_store.maintenance import repository_fsck

    root = Path(settings.COEVO_HARNESS_STORE_DIR)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".coevo-doctor"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return CheckResult(
            "harness store",
            FAIL,
            f"{root} is not writable: {exc.strerror}",
            "Give the web process a writable COEVO_HARNESS_STORE_DIR.",
        )
    projects = list(Project.objects.order_by("slug"))
    failed = []
    for project in projects:
        result = repository_fsck(project=project)
        if not result.ok:
            first = result.output.splitlines()[0] if result.output else "git fsck failed"
            failed.append(f"{project.slug} ({project.id}): {first}")
    if failed:
        return CheckResult(
            "harness store",
            FAIL,
            f"{len(failed)} of {len(projects)} repositories fail: " + "; ".join(failed[:3]),
            "Restore them: manage.py harness_restore --from BACKUP --force --project-id ID "
            "(docs/operations.md).",
        )
    return CheckResult("harness store", OK, f"{len(projects)} repositories pass git fsck ({root})")


def check_policy_endpoints() -> CheckResult:
    from django.conf import settings

    from coevo.policies.models import PolicyEndpoint, PolicyVersion
    from coevo.policies.services import policy_endpoint_reachable

    probes: list[tuple[str, PolicyVersion]] = []
    for endpoint in PolicyEndpoint.objects.order_by("name"):
        # /v1/models needs no model name: an endpoint without versions is probed all the same.
        version = endpoint.versions.order_by("created_at").first() or PolicyVersion()
        version.endpoint = endpoint  # loaded here: the probes run in threads, off the database
        probes.append((endpoint.base_url, version))
    configured = not probes
    if configured:
        # Nothing registered yet: probe COEVO_POLICY_URL, without creating rows.
        endpoint = PolicyEndpoint(base_url=settings.COEVO_POLICY_URL, name="configured")
        probes.append((settings.COEVO_POLICY_URL, PolicyVersion(endpoint=endpoint)))
    # Recording an endpoint's health logs "is unhealthy" lines; this check's row says it.
    with _quiet("coevo.policies.services"), ThreadPoolExecutor(min(8, len(probes))) as pool:
        answers = list(
            pool.map(lambda p: policy_endpoint_reachable(version=p[1], timeout_s=5.0), probes)
        )
    down = [url for (url, _), up in zip(probes, answers, strict=True) if not up]
    down_versions = [v for (_, v), up in zip(probes, answers, strict=True) if not up]
    if not down:
        return CheckResult(
            "policy endpoints",
            OK,
            f"{len(probes)} answer /v1/models: " + ", ".join(u for u, _ in probes),
        )
    fix = (
        "Start the policy server (docs/deployment.md, 'The policy servers'), or point "
        "COEVO_POLICY_URL / the endpoint in the admin at one that runs."
    )
    if all(_embedded_policy(v.endpoint) for v in down_versions):
        # The demo's own llama.cpp host runs only while scripts/demo does: stopped, it is not
        # broken, and the fix is to start it again.
        port = urlsplit(down[0]).port or 8089
        return CheckResult(
            "policy endpoints",
            WARN,
            f"the embedded policy server (the demo's llama.cpp host) at {', '.join(down)} is "
            "not running: the demo serves it only while it runs",
            "Start it: scripts/demo, or python -m coevo.policies.llamacpp_host --model "
            f"BASE.gguf --alias gemma-3-270m --port {port} --adapter-root COEVO_ADAPTER_DIR "
            "(docs/deployment.md, 'The policy servers').",
        )
    if configured:
        # No endpoint is in use yet, so nothing is broken: evaluations would fail, though.
        return CheckResult(
            "policy endpoints", WARN, f"COEVO_POLICY_URL {down[0]} does not answer", fix
        )
    return CheckResult(
        "policy endpoints",
        FAIL,
        f"{len(down)} of {len(probes)} do not answer /v1/models: " + ", ".join(down),
        fix,
    )


@contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Drop a logger's records below ERROR while a check runs (its table row says it all)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _embedded_policy(endpoint: object) -> bool:
    """A llama.cpp host on this machine's loopback: what scripts/demo starts and stops."""
    host = urlsplit(str(getattr(endpoint, "base_url", ""))).hostname or ""
    return getattr(endpoint, "kind", "") == "llamacpp" and host in ("127.0.0.1", "localhost", "::1")


def check_disk() -> CheckResult:
    from django.conf import settings

    warn_gib, fail_gib = settings.COEVO_DISK_WARN_GIB, settings.COEVO_DISK_FAIL_GIB
    places = {"COEVO_HOME": Path(settings.COEVO_HOME)}
    places["harness store"] = Path(settings.COEVO_HARNESS_STORE_DIR)
    seen: dict[int, str] = {}
    worst, details = OK, []
    for label, path in places.items():
        while not path.exists() and path != path.parent:
            path = path.parent
        device = path.stat().st_dev
        if device in seen:
            continue
        seen[device] = label
        free_gib = shutil.disk_usage(path).free / GIB
        details.append(f"{label} {free_gib:.1f} GiB free")
        if free_gib < fail_gib:
            worst = FAIL
        elif free_gib < warn_gib and worst != FAIL:
            worst = WARN
    fix = ""
    if worst != OK:
        fix = (
            f"Free space (below {warn_gib:g} GiB warns, below {fail_gib:g} GiB fails): prune "
            "old traces (manage.py prune_traces) or grow the volume."
        )
    return CheckResult("disk", worst, ", ".join(details), fix)


def _home_secrets(home: Path, database: str) -> list[Path]:
    """What in COEVO_HOME holds secrets, and the SQLite database wherever it is: sessions and
    token hashes, the key that signs sessions, the demo's passwords, queued tasks."""
    paths = [home, home / "secret_key", *sorted(home.glob("*-password"))]
    broker = home / "broker"
    paths += [broker, *(broker / sub for sub in ("queue", "processed", "control"))]
    for name in sorted({str(home / "coevo.sqlite3"), database} - {"", ":memory:"}):
        paths += [Path(name + suffix) for suffix in ("", "-wal", "-shm", "-journal")]
    return paths


def check_home_permissions() -> CheckResult:
    """Another local user who can read COEVO_HOME reads the sessions in its SQLite database
    and logs in as whoever holds one (a superuser). coevo makes a new home 0700 and its
    database 0600, and tightens what it owns at start-up; this names what is still open."""
    from django.conf import settings

    home = Path(settings.COEVO_HOME)
    db = settings.DATABASES["default"]
    database = str(db["NAME"]) if db["ENGINE"].endswith("sqlite3") else ""
    open_paths = []
    for path in _home_secrets(home, database):
        try:
            mode = path.stat().st_mode
        except OSError:
            continue  # not made yet, or another owner's directory hides it
        if mode & OTHERS_BITS:
            open_paths.append((path, mode & 0o777))
    if not open_paths:
        return CheckResult(
            "home permissions", OK, f"COEVO_HOME {home} and its secrets are private to its owner"
        )
    shown = ", ".join(f"{path} ({mode:04o})" for path, mode in open_paths)
    # Not chmod -R: harness trees under the home are read by sandboxes running as other uids.
    command = "chmod go= " + " ".join(shlex.quote(str(path)) for path, _ in open_paths)
    return CheckResult(
        "home permissions",
        WARN,
        f"open to the owner's group or other local users: {shown}. A user who reads the "
        "SQLite database logs in with its sessions",
        f"Run: {command} (as their owner: only coevo's own user needs them).",
    )


# Checks that need the database; skipped (not failed again) when it is unreachable.
_NEEDS_DB = (check_migrations, check_harness_store, check_policy_endpoints)
CHECKS: tuple[Callable[[], CheckResult], ...] = (
    check_python,
    check_packages,
    check_git,
    check_bwrap,
    check_database,
    check_migrations,
    check_broker,
    check_harness_store,
    check_policy_endpoints,
    check_disk,
    check_home_permissions,
)


def doctor_run(checks: tuple[Callable[[], CheckResult], ...] = CHECKS) -> list[CheckResult]:
    """Run every check; a check that raises is a failure naming the exception."""
    results: list[CheckResult] = []
    db_down = False
    for check in checks:
        name = check.__name__.removeprefix("check_").replace("_", " ")
        if db_down and check in _NEEDS_DB:
            results.append(CheckResult(name, SKIP, "needs a reachable, migrated database"))
            continue
        try:
            result = check()
        except Exception as exc:
            result = CheckResult(
                name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", ""
            )
        if check in (check_database, check_migrations) and result.failed:
            # An unmigrated database has no tables for the checks that read it.
            db_down = True
        results.append(result)
    return results


def doctor_format(results: list[CheckResult], *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(
            {"ok": not any(r.failed for r in results), "checks": [asdict(r) for r in results]},
            indent=2,
        )
    rows = [("check", "status", "detail", "fix")]
    rows += [(r.name, r.status.upper(), " ".join(r.detail.split()), r.fix) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    detail_width = min(_DETAIL_WIDTH, max(len(row[2]) for row in rows))
    lines = []
    for name, status, detail, fix in rows:
        # Long details wrap within their column, so the fixes stay aligned.
        wrapped = textwrap.wrap(detail, detail_width, break_long_words=True) or [""]
        for i, part in enumerate(wrapped):
            cells = [name if i == 0 else "", status if i == 0 else "", part, fix if i == 0 else ""]
            cells[0], cells[1] = cells[0].ljust(widths[0]), cells[1].ljust(widths[1])
            cells[2] = cells[2].ljust(detail_width)
            lines.append("  ".join(cells).rstrip())
    failed = sum(r.failed for r in results)
    warned = sum(r.status == WARN for r in results)
    lines.append("")
    lines.append(
        f"{failed} failed, {warned} warnings: coevo is broken here."
        if failed
        else f"All good ({warned} warnings)."
    )
    return "\n".join(lines)

"""Django settings for coevo.

Embedded default (nothing set): SQLite and a filesystem broker under COEVO_HOME.
Tests, CI and production: DATABASE_URL (PostgreSQL) and CELERY_BROKER_URL (Redis).
"""

from __future__ import annotations

import dj_database_url
from kombu import Queue

from coevo.config import (
    BASE_DIR,
    env_bool,
    env_int,
    env_list,
    env_str,
    home_dir,
    secret_key,
)

COEVO_HOME = home_dir()

SECRET_KEY = secret_key(COEVO_HOME)
DEBUG = env_bool("COEVO_DEBUG", False)
ALLOWED_HOSTS = env_list("COEVO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("COEVO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "coevo.projects",
    "harness_store",
    "coevo.suites",
    "coevo.policies",
    "coevo.evaluations",
    "coevo.web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "coevo.urls"
WSGI_APPLICATION = "coevo.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_default_db = f"sqlite:///{COEVO_HOME / 'coevo.sqlite3'}"
DATABASES = {
    "default": dj_database_url.parse(env_str("DATABASE_URL", _default_db), conn_max_age=60)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the worker write to the same file: WAL lets readers go on while one
    # writes, and IMMEDIATE transactions take the write lock up front instead of failing with
    # "database is locked" when a read transaction later tries to write.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = COEVO_HOME / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns about a missing STATIC_ROOT
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "web:home"
LOGOUT_REDIRECT_URL = "login"

# --- Celery -------------------------------------------------------------------------------
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = COEVO_HOME / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
else:
    # Above the rollout hard time limit, so a task held by a live worker is never redelivered.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 2 * 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
# Declared, so that workers, purges and queue-depth checks all know both.
CELERY_TASK_QUEUES = (Queue("default"), Queue("rollouts"))
CELERY_TASK_ROUTES = {"workers.tasks.rollout_run": {"queue": "rollouts"}}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
COEVO_WATCHDOG_INTERVAL_S = env_int("COEVO_WATCHDOG_INTERVAL_S", 30, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "rollouts-watchdog": {
        "task": "workers.tasks.rollouts_watchdog",
        "schedule": float(COEVO_WATCHDOG_INTERVAL_S),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(COEVO_HOME / "celerybeat-schedule")

# --- coevo ---------------------------------------------------------------------------------
COEVO_HARNESS_STORE_DIR = env_str("COEVO_HARNESS_STORE_DIR", str(COEVO_HOME / "harness-store"))
COEVO_POLICY_URL = env_str("COEVO_POLICY_URL", "http://127.0.0.1:8089/v1")
COEVO_POLICY_MODEL = env_str("COEVO_POLICY_MODEL", "gemma-3-270m")
COEVO_POLICY_TIMEOUT_S = env_int("COEVO_POLICY_TIMEOUT_S", 300, minimum=1)
COEVO_POLICY_RETRIES = env_int("COEVO_POLICY_RETRIES", 4, minimum=0)
COEVO_ALLOW_UNSANDBOXED = env_bool("COEVO_ALLOW_UNSANDBOXED", False)
COEVO_ROLLOUT_WALL_S = env_int("COEVO_ROLLOUT_WALL_S", 900, minimum=1)
COEVO_ROLLOUT_MAX_ATTEMPTS = env_int("COEVO_ROLLOUT_MAX_ATTEMPTS", 3, minimum=1)
COEVO_ROLLOUT_RETRY_BASE_S = env_int("COEVO_ROLLOUT_RETRY_BASE_S", 10, minimum=0)
COEVO_VERIFIER_TIMEOUT_S = env_int("COEVO_VERIFIER_TIMEOUT_S", 20, minimum=1)
# A running rollout beats every COEVO_HEARTBEAT_S; the watchdog re-runs it once its heartbeat is
# older than COEVO_ROLLOUT_STALE_S (its worker is gone), and sends again pending rollouts that
# waited COEVO_ROLLOUT_RESEND_S with an empty queue (their message was lost).
COEVO_HEARTBEAT_S = env_int("COEVO_HEARTBEAT_S", 15, minimum=1)
COEVO_ROLLOUT_STALE_S = env_int("COEVO_ROLLOUT_STALE_S", 120, minimum=2)
COEVO_ROLLOUT_RESEND_S = env_int("COEVO_ROLLOUT_RESEND_S", 120, minimum=1)
# Policy outages (the server does not answer) an evaluation takes before it pauses itself.
COEVO_INFRA_PAUSE_THRESHOLD = env_int("COEVO_INFRA_PAUSE_THRESHOLD", 3, minimum=1)
# Rollouts one worker process runs at once (threads: rollouts mostly wait on the policy).
COEVO_WORKER_CONCURRENCY = env_int("COEVO_WORKER_CONCURRENCY", 8, minimum=1)
# Threads, not processes: a rollout is a sandboxed child process plus waiting on the policy.
CELERY_WORKER_POOL = "threads"
CELERY_WORKER_CONCURRENCY = COEVO_WORKER_CONCURRENCY
# Redis for coordination across workers (the global per-endpoint concurrency bound). Defaults to
# the broker when that is Redis; without Redis the bound holds per worker process.
COEVO_REDIS_URL = env_str(
    "COEVO_REDIS_URL", CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else ""
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("COEVO_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # The filesystem broker has no hostname, and kombu warns about it on every connection.
        "kombu.connection": {"level": "ERROR"},
    },
}

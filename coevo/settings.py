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
    env_choice,
    env_float,
    env_int,
    env_list,
    env_mapping,
    env_networks,
    env_path,
    env_str,
    env_url,
    home_dir,
    private_dir,
    secret_key,
    sqlite_private,
)

COEVO_HOME = home_dir()

SECRET_KEY = secret_key(COEVO_HOME)
DEBUG = env_bool("COEVO_DEBUG", False)
ALLOWED_HOSTS = env_list("COEVO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("COEVO_CSRF_TRUSTED_ORIGINS", [])

# HTTPS (production, behind a TLS-terminating proxy; docs/deployment.md). Off by default: the
# embedded demo serves plain http on 127.0.0.1, where Secure cookies would never be sent back.
COEVO_HTTPS = env_bool("COEVO_HTTPS", False)
SESSION_COOKIE_SECURE = COEVO_HTTPS
CSRF_COOKIE_SECURE = COEVO_HTTPS
# HSTS is only sent over HTTPS; browsers then refuse plain http to this host for that long.
SECURE_HSTS_SECONDS = env_int("COEVO_HSTS_SECONDS", 31536000 if COEVO_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("COEVO_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("COEVO_HSTS_PRELOAD", False)
# Trust the proxy's X-Forwarded-Proto only when the proxy sets it on every request (and
# clients cannot reach gunicorn directly): anyone else could claim https with it.
if env_bool("COEVO_TRUST_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Redirect plain-http requests to https. Behind a TLS-terminating proxy this needs
# COEVO_TRUST_PROXY_SSL_HEADER, else every request looks like http and redirects forever.
# Probes and scrapers inside the deployment speak plain http to the container.
SECURE_SSL_REDIRECT = env_bool("COEVO_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "coevo.accounts",
    "coevo.projects",
    "harness_store",
    "coevo.suites",
    "coevo.policies",
    "coevo.evaluations",
    "coevo.reviews",
    "coevo.audit",
    "coevo.gates",
    "coevo.campaigns",
    "coevo.exports",
    "coevo.training",
    "coevo.matrices",
    "coevo.api",
    "coevo.ops",
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
    # Last, so it sees a view's exception first: a database or Redis outage is a 503 page.
    "coevo.outages.OutageMiddleware",
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
    "default": dj_database_url.parse(
        env_url("DATABASE_URL", _default_db, schemes=("postgres", "postgresql", "sqlite")),
        conn_max_age=60,
    )
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
    # Sessions, token hashes and held-out data: created 0600 before the first connection.
    sqlite_private(str(DATABASES["default"]["NAME"]))

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Every password check goes through the login throttle (coevo/accounts/login_throttle.py):
# COEVO_LOGIN_MAX_FAILURES failures for one username, or from one client address, within
# COEVO_LOGIN_WINDOW_S seconds block further attempts for that long. Counted in CACHES.
AUTHENTICATION_BACKENDS = ["coevo.accounts.backends.ThrottledModelBackend"]
COEVO_LOGIN_MAX_FAILURES = env_int("COEVO_LOGIN_MAX_FAILURES", 10, minimum=1)
COEVO_LOGIN_WINDOW_S = env_int("COEVO_LOGIN_WINDOW_S", 900, minimum=1)
# The client address is REMOTE_ADDR, unless that is one of these proxies (addresses or CIDR
# networks): then the nearest X-Forwarded-For entry that is not one of them.
COEVO_TRUSTED_PROXIES = env_networks("COEVO_TRUSTED_PROXIES")

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
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", "filesystem://", schemes=("redis", "rediss", "filesystem", "memory")
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = COEVO_HOME / "broker"
    # Queued tasks name evaluations and campaigns: private, like the home around them.
    private_dir(_broker_dir)
    for _sub in ("queue", "processed", "control"):
        private_dir(_broker_dir / _sub)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
    # kombu's filesystem transport with its two races closed (a message read before it was
    # written, a message taken by two workers): coevo/fs_broker.py.
    CELERY_BROKER_TRANSPORT = "coevo.fs_broker:Transport"
else:
    # Above the rollout hard time limit, so a task held by a live worker is never redelivered.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 2 * 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes every database connection before and after each task unless
# this is set: a worker then opened a PostgreSQL connection for every rollout (7% of its CPU,
# and a backend process started each time). Set, it closes only every this many tasks; tasks
# call close_old_connections() first, so CONN_MAX_AGE and broken connections are honoured.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_DEFAULT_QUEUE = "default"
# Declared, so that workers, purges and queue-depth checks all know them all.
CELERY_TASK_QUEUES = (Queue("default"), Queue("rollouts"), Queue("training"), Queue("ops"))
CELERY_TASK_ROUTES = {
    "coevo.evaluations.tasks.rollout_run": {"queue": "rollouts"},
    # Beat's housekeeping on a queue of its own, consumed by a small worker that runs nothing
    # else: on `default` the watchdog and the endpoint checks waited behind rollouts whenever
    # every rollout worker thread was busy (or stuck), which is when they are needed.
    # campaigns-advance stays on `default`: it drafts proposals (model calls of minutes, a
    # sandbox for agentic proposers), campaign work like the campaigns' own tasks.
    **dict.fromkeys(
        (
            "coevo.evaluations.tasks.rollouts_watchdog",
            "coevo.policies.tasks.policy_endpoints_check",
            "coevo.training.tasks.training_runs_watchdog",
            "coevo.gates.tasks.gates_advance_ready",
            "coevo.reviews.tasks.promotions_refresh_open",
            "coevo.exports.tasks.trajectory_exports_resend",
            "coevo.audit.tasks.webhooks_requeue_due",
            "coevo.ops.tasks.traces_prune",
            "coevo.ops.tasks.harness_store_fsck",
        ),
        {"queue": "ops"},
    ),
}
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
COEVO_WATCHDOG_INTERVAL_S = env_int("COEVO_WATCHDOG_INTERVAL_S", 5, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "rollouts-watchdog": {
        "task": "coevo.evaluations.tasks.rollouts_watchdog",
        "schedule": float(COEVO_WATCHDOG_INTERVAL_S),
    },
    # Finishes gates whose evaluation_finished signal was missed (coevo.gates).
    "gates-advance": {
        "task": "coevo.gates.tasks.gates_advance_ready",
        "schedule": float(COEVO_WATCHDOG_INTERVAL_S),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(COEVO_HOME / "celerybeat-schedule")

# --- coevo ---------------------------------------------------------------------------------
COEVO_HARNESS_STORE_DIR = env_str("COEVO_HARNESS_STORE_DIR", str(COEVO_HOME / "harness-store"))
COEVO_POLICY_URL = env_str("COEVO_POLICY_URL", "http://127.0.0.1:8089/v1")
COEVO_POLICY_MODEL = env_str("COEVO_POLICY_MODEL", "gemma-3-270m")
# The default endpoint's kind (vllm: LoRA adapters load at run time, so campaigns may
# alternate) and its weights as a trainer loads them (a Hugging Face id or a path).
COEVO_POLICY_KIND = env_choice(
    "COEVO_POLICY_KIND",
    "openai-compatible",
    ("vllm", "llamacpp", "openai-compatible", "openai", "anthropic"),
)
COEVO_POLICY_BASE_MODEL = env_str("COEVO_POLICY_BASE_MODEL", "") or COEVO_POLICY_MODEL
# Fernet keys (comma-separated; the first encrypts, each decrypts) that encrypt policy endpoints'
# API keys at rest (coevo/policies/secrets.py). Unset: no endpoint can be given an API key.
COEVO_SECRETS_KEY = env_str("COEVO_SECRETS_KEY", "")
COEVO_POLICY_TIMEOUT_S = env_int("COEVO_POLICY_TIMEOUT_S", 300, minimum=1)
COEVO_POLICY_RETRIES = env_int("COEVO_POLICY_RETRIES", 4, minimum=0)
# Concurrency slots per endpoint (coevo/policies/concurrency.py): a slot's lease, renewed by its
# holder every third of it, so a dead holder's slot is free within one lease; and how long a
# request waits for a slot before its rollout ends as an infrastructure error.
COEVO_POLICY_SLOT_LEASE_S = env_int("COEVO_POLICY_SLOT_LEASE_S", 30, minimum=3)
COEVO_POLICY_SLOT_WAIT_S = env_int("COEVO_POLICY_SLOT_WAIT_S", 900, minimum=1)
# The context window (tokens) an llm-patch proposer's prompt is fitted to when its server does
# not report one (llama-cpp-python does not; vLLM and llama.cpp's server do) and the campaign
# gives no context_tokens option. 4096 is the embedded server's n_ctx; a smaller guess only
# shortens the workspace, a larger one gets prompts refused. 0: unknown (workspace_chars alone).
COEVO_PROPOSER_CONTEXT_TOKENS = env_int("COEVO_PROPOSER_CONTEXT_TOKENS", 4096, minimum=0)
COEVO_ALLOW_UNSANDBOXED = env_bool("COEVO_ALLOW_UNSANDBOXED", False)
# Warm sandboxes (workers/warm.py): a zygote per candidate tree forks each run(task, ctx)
# rollout into a fresh sandbox, on root workers; opt-in for now. Idle zygotes close after the
# idle time; at most the maximum live at once.
COEVO_WARM_SANDBOXES = env_bool("COEVO_WARM_SANDBOXES", False)
COEVO_WARM_SANDBOX_IDLE_S = env_int("COEVO_WARM_SANDBOX_IDLE_S", 60, minimum=1)
COEVO_WARM_SANDBOXES_MAX = env_int("COEVO_WARM_SANDBOXES_MAX", 16, minimum=1)
# A program harness's address-space limit (RLIMIT_AS: virtual memory, not resident). Node's
# WebAssembly, the JVM and Go reserve far more than they touch: 4 GiB (the run(task, ctx)
# harnesses' limit) breaks Node's fetch; 12 GiB is the least that was measured to work.
COEVO_PROGRAM_ADDRESS_SPACE_BYTES = env_int(
    "COEVO_PROGRAM_ADDRESS_SPACE_BYTES", 16 * 1024**3, minimum=1024**3
)
COEVO_ROLLOUT_WALL_S = env_int("COEVO_ROLLOUT_WALL_S", 900, minimum=1)
COEVO_ROLLOUT_MAX_ATTEMPTS = env_int("COEVO_ROLLOUT_MAX_ATTEMPTS", 3, minimum=1)
COEVO_ROLLOUT_RETRY_BASE_S = env_int("COEVO_ROLLOUT_RETRY_BASE_S", 10, minimum=0)
COEVO_VERIFIER_TIMEOUT_S = env_int("COEVO_VERIFIER_TIMEOUT_S", 20, minimum=1)
# Workspace tasks (workers/environments/workspace.py): what a rollout's workspace may hold, and
# the most a task's test.sh may take (task.toml's [verifier] timeout_sec, capped here).
COEVO_WORKSPACE_MAX_FILES = env_int("COEVO_WORKSPACE_MAX_FILES", 20000, minimum=10)
COEVO_WORKSPACE_MAX_BYTES = env_int("COEVO_WORKSPACE_MAX_BYTES", 256 * 1024**2, minimum=1024**2)
COEVO_WORKSPACE_VERIFIER_TIMEOUT_S = env_int("COEVO_WORKSPACE_VERIFIER_TIMEOUT_S", 600, minimum=1)
# Containers (workers/containers/): the Docker engine (coevo's own by default, started by
# scripts/lib.sh), image names mapped to local images (mirrors, air-gapped sites), whether a
# missing image may be pulled, the extra CA certificates put in every task image (a TLS-inspecting
# proxy), and where a worker keeps its build locks and logs. docs/configuration.md, "Containers".
COEVO_DOCKER_HOST = env_url(
    "COEVO_DOCKER_HOST",
    "unix:///run/coevo-docker/docker.sock",
    schemes=("unix", "tcp", "ssh", "http", "https"),
)
COEVO_IMAGE_MAP = env_mapping("COEVO_IMAGE_MAP")
COEVO_CONTAINER_PULL = env_choice("COEVO_CONTAINER_PULL", "if-missing", ("never", "if-missing"))
COEVO_CONTAINER_CA_CERTS = env_str("COEVO_CONTAINER_CA_CERTS", "/usr/local/share/ca-certificates")
COEVO_CONTAINER_DIR = env_path("COEVO_CONTAINER_DIR", COEVO_HOME / "containers")
COEVO_CONTAINER_BUILD_TIMEOUT_S = env_int("COEVO_CONTAINER_BUILD_TIMEOUT_S", 1800, minimum=1)
COEVO_CONTAINER_BUILD_MEMORY_BYTES = env_int(
    "COEVO_CONTAINER_BUILD_MEMORY_BYTES", 4 * 1024**3, minimum=64 * 1024**2
)
COEVO_CONTAINER_RUNTIME = env_str("COEVO_CONTAINER_RUNTIME", "")
# Tasks that need their container (a Harbor task's docker_image or a Dockerfile that runs
# commands) import and run in one only with the backend on (web process and workers alike);
# a task's allow_internet applies only where the operator allows it; a task's [environment]
# resources are capped by the operator's maximums (and default to them where it sets none).
COEVO_CONTAINER_BACKEND = env_bool("COEVO_CONTAINER_BACKEND", False)
COEVO_CONTAINER_ALLOW_INTERNET = env_bool("COEVO_CONTAINER_ALLOW_INTERNET", False)
# The network of those containers: public addresses only (scripts/lib.sh, ensure_egress_network).
COEVO_CONTAINER_EGRESS_NETWORK = env_str("COEVO_CONTAINER_EGRESS_NETWORK", "coevo-egress")
COEVO_CONTAINER_MAX_CPUS = env_float("COEVO_CONTAINER_MAX_CPUS", 2.0, minimum=0.1)
COEVO_CONTAINER_MAX_MEMORY_BYTES = env_int(
    "COEVO_CONTAINER_MAX_MEMORY_BYTES", 4 * 1024**3, minimum=64 * 1024**2
)
COEVO_CONTAINER_MAX_PIDS = env_int("COEVO_CONTAINER_MAX_PIDS", 1024, minimum=16)
# Where a container task's tests run: "final", an image of the agent's final container (what it
# installed is there; Harbor's way), or "image", the task's image as built with the agent's /app.
COEVO_CONTAINER_VERIFY_ON = env_choice("COEVO_CONTAINER_VERIFY_ON", "final", ("final", "image"))
# Harnesses' declared dependencies (workers/harness_env.py): built with uv from wheels only, from
# COEVO_HARNESS_FIND_LINKS (a local wheel directory; then no index is asked) or else
# COEVO_HARNESS_INDEX_URL; cached per content hash under COEVO_HARNESS_ENV_DIR, least recently
# used first evicted past COEVO_HARNESS_ENV_MAX_BYTES; a build is stopped after
# COEVO_HARNESS_ENV_BUILD_TIMEOUT_S.
COEVO_HARNESS_INDEX_URL = env_str("COEVO_HARNESS_INDEX_URL", "https://pypi.org/simple")
COEVO_HARNESS_FIND_LINKS = env_str("COEVO_HARNESS_FIND_LINKS", "")
# Harnesses' declared Node dependencies (an npm lock: workers/harness_env.py): installed by
# `npm ci` from COEVO_HARNESS_NPM_CACHE (an npm cache directory prefilled with every tarball,
# `npm cache add`; then npm is never online) or else COEVO_HARNESS_NPM_REGISTRY, into the same
# cache, bounds and timeout as the Python environments.
COEVO_HARNESS_NPM_CACHE = env_str("COEVO_HARNESS_NPM_CACHE", "")
COEVO_HARNESS_NPM_REGISTRY = env_str("COEVO_HARNESS_NPM_REGISTRY", "https://registry.npmjs.org/")
# Candidate trees exported on a worker (harness_store/tree_cache.py): shared by the tree's
# rollouts, the least recently used beyond the maximum removed.
COEVO_HARNESS_TREE_DIR = env_path("COEVO_HARNESS_TREE_DIR", COEVO_HOME / "harness-trees")
COEVO_HARNESS_TREES_MAX = env_int("COEVO_HARNESS_TREES_MAX", 256, minimum=1)
COEVO_HARNESS_ENV_DIR = env_path("COEVO_HARNESS_ENV_DIR", COEVO_HOME / "harness-envs")
COEVO_HARNESS_ENV_MAX_BYTES = env_int("COEVO_HARNESS_ENV_MAX_BYTES", 10 * 1024**3, minimum=1024**2)
COEVO_HARNESS_ENV_BUILD_TIMEOUT_S = env_int("COEVO_HARNESS_ENV_BUILD_TIMEOUT_S", 600, minimum=1)
# A running rollout beats every COEVO_HEARTBEAT_S (one UPDATE per worker process for all its
# rollouts); the watchdog re-runs it once its heartbeat is older than COEVO_ROLLOUT_STALE_S (its
# worker is gone: four beats missed), and sends again pending rollouts that waited
# COEVO_ROLLOUT_RESEND_S with an empty queue (their message was lost). Together with the
# watchdog's interval: a dead worker's rollouts run again within about 25 s.
COEVO_HEARTBEAT_S = env_int("COEVO_HEARTBEAT_S", 5, minimum=1)
COEVO_ROLLOUT_STALE_S = env_int("COEVO_ROLLOUT_STALE_S", 20, minimum=2)
COEVO_ROLLOUT_RESEND_S = env_int("COEVO_ROLLOUT_RESEND_S", 10, minimum=1)
# A worker that cannot reach PostgreSQL waits (coevo/evaluations/dbwait.py) this long, holding
# its rollout's message or finished result, before it gives up: a rollout not yet claimed is
# then retried later by Celery; a finished one is left to the watchdog.
COEVO_DB_OUTAGE_WAIT_S = env_int("COEVO_DB_OUTAGE_WAIT_S", 600, minimum=1)
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

# --- REST API (coevo/api) -------------------------------------------------------------------
# Uploads (bundles, tarballs, suite files) are refused above this size before the body is read;
# JSON bodies above COEVO_API_MAX_JSON_BYTES likewise.
COEVO_API_MAX_UPLOAD_MB = env_int("COEVO_API_MAX_UPLOAD_MB", 50, minimum=1)
COEVO_API_MAX_JSON_BYTES = 1024**2
# Requests per token (DRF rate syntax: N/s, N/min, N/hour, N/day).
COEVO_API_RATE = env_str("COEVO_API_RATE", "600/min")
# Limits on an uploaded tarball's content (harness_store checks them while extracting).
COEVO_MAX_ARCHIVE_FILES = env_int("COEVO_MAX_ARCHIVE_FILES", 2000, minimum=1)
COEVO_MAX_ARCHIVE_BYTES = env_int("COEVO_MAX_ARCHIVE_BYTES", 50 * 1024**2, minimum=1)
# Throttle counters must be shared by every web process: Redis when there is one.
CACHES = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": COEVO_REDIS_URL,
            # A Redis that stops answering (no timeout by default) would hold every API request
            # and login; after 2 s the rate limit lets the request through (api/throttling.py).
            "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
        }
        if COEVO_REDIS_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["coevo.api.authentication.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["coevo.api.permissions.TokenHasScope"],
    "DEFAULT_THROTTLE_CLASSES": ["coevo.api.throttling.TokenRateThrottle"],
    "DEFAULT_PAGINATION_CLASS": "coevo.api.pagination.CreatedCursorPagination",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "rest_framework.parsers.JSONParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "coevo.api.schema.ResourceAutoSchema",
    "EXCEPTION_HANDLER": "coevo.api.exceptions.api_exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "coevo API",
    "DESCRIPTION": "Evolving LLM-agent harnesses: candidates, suites, evaluations, comparisons. "
    "See docs/api.md.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    # One tag per resource (coevo.api.schema.ResourceAutoSchema derives it from the path), in
    # the order a new user meets them; tests/api/test_schema.py requires one for every tag.
    "TAGS": [
        {
            "name": "projects",
            "description": "The projects the token's user is a member of, with the user's role. "
            "Every other resource but trainers lives under `projects/{slug}/`.",
        },
        {
            "name": "candidates",
            "description": "Harness candidates: git commits of the project's harness repository, "
            "named by SHA. Import them as a git bundle (keeps their SHAs) or a tarball (a new "
            "commit); read their files and diffs.",
        },
        {
            "name": "suites",
            "description": "Task suites (HumanEval, TextWorld, workspace tasks, or your own JSONL "
            "or Harbor tasks), versioned by content and split into search, validation and "
            "held-out tasks.",
        },
        {
            "name": "evaluations",
            "description": "Evaluations run one candidate under one policy version on one split "
            "of a suite (rollouts on the workers, 202 and a status URL); read their progress, "
            "summary and per-task results. Held-out evaluations run only inside promotions.",
        },
        {
            "name": "comparisons",
            "description": "The paired comparison of two evaluations on the same suite and "
            "split: the difference, its interval, the test and the tasks fixed or broken.",
        },
        {
            "name": "gates",
            "description": "CI gates: evaluate a candidate against a channel's holder or a SHA "
            "and answer pass, fail or inconclusive by the thresholds given (minimum score, "
            "allowed regression, critical tasks, error rate).",
        },
        {
            "name": "matrices",
            "description": "Compatibility matrices: candidates × policy versions on one suite "
            "split, one evaluation per cell, flagging a harness that loses under a policy it was "
            "not tuned for.",
        },
        {
            "name": "campaigns",
            "description": "Campaigns evolve a seed candidate: proposers write proposals, each "
            "validated and evaluated on search then validation, and the best is chosen on "
            "validation. Start, pause, resume, stop, submit candidates, list proposals.",
        },
        {
            "name": "training",
            "description": "Trainers (registered by an operator, shared by all projects) and "
            "training runs: one trainer on one trajectory export, registering a policy version "
            "when it succeeds.",
        },
        {
            "name": "exports",
            "description": "Trajectory exports: finished rollouts' model calls as JSONL "
            "training data (chat or prompt/completion), one line per call with its provenance; "
            "never held-out rollouts.",
        },
        {
            "name": "channels",
            "description": "Deployment channels (such as `production`): which candidate and "
            "policy version each holds and the history of its moves. Read-only; promotions move "
            "them.",
        },
        {
            "name": "promotions",
            "description": "Promotion requests: run held-out evaluations of a candidate and its "
            "reference, assemble the evidence, and move the channel when a reviewer other than "
            "the requester approves.",
        },
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "EvaluationStateEnum": "coevo.evaluations.models.EvaluationState",
        "SplitEnum": "coevo.suites.models.Split",
        "GateStateEnum": "coevo.gates.models.GateState",
        "VerdictEnum": "coevo.gates.models.GateVerdict",
        "CampaignStateEnum": "coevo.campaigns.models.CampaignState",
        "ProposalStateEnum": "coevo.campaigns.models.ProposalState",
        "ProposerKindEnum": "coevo.campaigns.models.ProposerKind",
        "ExportStateEnum": "coevo.exports.models.ExportState",
        "TrainingStateEnum": "coevo.training.models.TrainingState",
        "MatrixStateEnum": "coevo.matrices.models.MatrixState",
        "OpenSplitEnum": "coevo.api.matrices.OPEN_SPLITS",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "coevo.api.schema.add_error_responses",
    ],
}

# --- Operations (coevo/ops) -----------------------------------------------------------------
# (owned by the operations work: health, metrics, logs, retention, backups)
# Workers: a heartbeat row every COEVO_WORKER_HEARTBEAT_S; shown as stale (died, or cut off
# from the database) after COEVO_WORKER_STALE_S without one.
COEVO_WORKER_HEARTBEAT_S = env_int("COEVO_WORKER_HEARTBEAT_S", 30, minimum=1)
COEVO_WORKER_STALE_S = env_int("COEVO_WORKER_STALE_S", 120, minimum=2)
# Each worker process serves its in-process metrics on the first free port of
# COEVO_WORKER_METRICS_PORTS ports from COEVO_WORKER_METRICS_PORT (0 disables), so workers
# on one host take 9808, 9809, …; docs/monitoring.md.
COEVO_WORKER_METRICS_PORT = env_int("COEVO_WORKER_METRICS_PORT", 9808, minimum=0)
COEVO_WORKER_METRICS_PORTS = env_int("COEVO_WORKER_METRICS_PORTS", 16, minimum=1, maximum=1024)
COEVO_WORKER_METRICS_ADDR = env_str("COEVO_WORKER_METRICS_ADDR", "0.0.0.0")
# The web /metrics and each worker's metrics port answer only "Authorization: Bearer <token>"
# when this is set; without it they serve nobody unless COEVO_METRICS_PUBLIC (the labels name
# projects, worker hosts and policy endpoints: coevo/ops/metrics.py).
COEVO_METRICS_TOKEN = env_str("COEVO_METRICS_TOKEN", "")
COEVO_METRICS_PUBLIC = env_bool("COEVO_METRICS_PUBLIC", False)
# Database figures on /metrics are read at most once per this many seconds.
COEVO_METRICS_CACHE_S = env_int("COEVO_METRICS_CACHE_S", 10, minimum=0)
# /readyz: each dependency's timeout, and how long a policy endpoint's answer is reused.
COEVO_READYZ_TIMEOUT_S = env_int("COEVO_READYZ_TIMEOUT_S", 3, minimum=1)
COEVO_READYZ_POLICY_CACHE_S = env_int("COEVO_READYZ_POLICY_CACHE_S", 10, minimum=0)
# The system page: how long it waits for workers to answer a ping, and its refresh interval.
COEVO_SYSTEM_PING_TIMEOUT_S = env_float("COEVO_SYSTEM_PING_TIMEOUT_S", 1.0, minimum=0.1)
COEVO_SYSTEM_REFRESH_S = env_int("COEVO_SYSTEM_REFRESH_S", 15, minimum=2)
# One JSON object per log line (for a log pipeline) instead of plain text.
COEVO_LOG_JSON = env_bool("COEVO_LOG_JSON", False)
# Trace bodies (TraceStep rows) of final, unprotected evaluations older than this many days are
# deleted by the retention beat job (scores and summaries stay); 0 keeps them forever.
COEVO_TRACE_RETENTION_DAYS = env_int("COEVO_TRACE_RETENTION_DAYS", 90, minimum=0)
COEVO_TRACE_RETENTION_INTERVAL_S = env_int("COEVO_TRACE_RETENTION_INTERVAL_S", 86400, minimum=60)
COEVO_FSCK_INTERVAL_S = env_int("COEVO_FSCK_INTERVAL_S", 86400, minimum=60)
COEVO_BACKUP_DIR = env_path("COEVO_BACKUP_DIR", COEVO_HOME / "backups")
COEVO_EXPORT_DIR = env_path("COEVO_EXPORT_DIR", COEVO_HOME / "exports")  # coevo/exports files
# `coevo doctor`: free space under COEVO_HOME and the harness store below these warns / fails.
COEVO_DISK_WARN_GIB = env_float("COEVO_DISK_WARN_GIB", 5.0, minimum=0)
COEVO_DISK_FAIL_GIB = env_float("COEVO_DISK_FAIL_GIB", 1.0, minimum=0)
# Webhooks (coevo/audit): attempts per delivery, and the first retry delay (doubles each time).
COEVO_WEBHOOK_MAX_ATTEMPTS = env_int("COEVO_WEBHOOK_MAX_ATTEMPTS", 6, minimum=1, maximum=20)
COEVO_WEBHOOK_BACKOFF_S = env_float("COEVO_WEBHOOK_BACKOFF_S", 30.0, minimum=0)
COEVO_WEBHOOK_TIMEOUT_S = env_float("COEVO_WEBHOOK_TIMEOUT_S", 10.0, minimum=0.1)
# Webhooks go to public addresses only (coevo/audit/outbound.py); these host names, addresses
# or networks (comma-separated, e.g. "hooks.internal,10.0.5.0/24") may be internal.
COEVO_WEBHOOK_ALLOWED_HOSTS = env_list("COEVO_WEBHOOK_ALLOWED_HOSTS", [])
CELERY_BEAT_SCHEDULE["webhooks-requeue-due"] = {
    "task": "coevo.audit.tasks.webhooks_requeue_due",
    "schedule": 300.0,
}
CELERY_BEAT_SCHEDULE["traces-retention"] = {
    "task": "coevo.ops.tasks.traces_prune",
    "schedule": float(COEVO_TRACE_RETENTION_INTERVAL_S),
}
CELERY_BEAT_SCHEDULE["harness-store-fsck"] = {
    "task": "coevo.ops.tasks.harness_store_fsck",
    "schedule": float(COEVO_FSCK_INTERVAL_S),
}
# Campaigns advance on evaluation_finished; this catches a lost signal or a killed worker.
CELERY_BEAT_SCHEDULE["campaigns-advance"] = {
    "task": "coevo.campaigns.tasks.campaigns_advance_running",
    "schedule": 30.0,
}
# Promotion requests finish on evaluation_finished; this catches a lost signal.
CELERY_BEAT_SCHEDULE["promotions-refresh"] = {
    "task": "coevo.reviews.tasks.promotions_refresh_open",
    "schedule": float(COEVO_WATCHDOG_INTERVAL_S),
}
# Policy endpoints: health from GET /v1/models every COEVO_ENDPOINT_HEALTH_S (unhealthy ones get
# no rollouts); LoRA adapters coevo loaded on vLLM are unloaded after COEVO_ADAPTER_IDLE_S unused.
COEVO_ENDPOINT_HEALTH_S = env_int("COEVO_ENDPOINT_HEALTH_S", 30, minimum=1)
COEVO_ADAPTER_IDLE_S = env_int("COEVO_ADAPTER_IDLE_S", 1800, minimum=1)
CELERY_BEAT_SCHEDULE["policy-endpoints-check"] = {
    "task": "coevo.policies.tasks.policy_endpoints_check",
    "schedule": float(COEVO_ENDPOINT_HEALTH_S),
}

# Policy training (coevo/training): runs' files on the training worker, installed adapters
# (a directory the vLLM server reads at the same path), the log tail kept in the database, and
# how long a running run may go without a heartbeat before the watchdog fails it.
COEVO_TRAINING_DIR = env_path("COEVO_TRAINING_DIR", COEVO_HOME / "training")
COEVO_ADAPTER_DIR = env_path("COEVO_ADAPTER_DIR", COEVO_HOME / "adapters")
COEVO_TRAINING_LOG_TAIL = env_int("COEVO_TRAINING_LOG_TAIL", 65536, minimum=1024)
COEVO_TRAINING_STALE_S = env_int("COEVO_TRAINING_STALE_S", 120, minimum=10)
# Base models as GGUF files for llama.cpp (serving and LoRA conversion; the CPU trainer loads
# them too): <COEVO_GGUF_DIR>/<name>.gguf, the shipped Gemma 3 270M assembled there on first use.
COEVO_GGUF_DIR = env_path("COEVO_GGUF_DIR", COEVO_HOME / "models")
# Exports still pending after 5 minutes (a lost build message) are sent again.
CELERY_BEAT_SCHEDULE["exports-resend"] = {
    "task": "coevo.exports.tasks.trajectory_exports_resend",
    "schedule": 300.0,
}
CELERY_BEAT_SCHEDULE["training-watchdog"] = {
    "task": "coevo.training.tasks.training_runs_watchdog",
    "schedule": float(COEVO_WATCHDOG_INTERVAL_S),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # coevo.logs: the ids bound to the current rollout/task on every line, secrets and
    # held-out contents masked; JSON lines with COEVO_LOG_JSON=1.
    "filters": {"context": {"()": "coevo.logs.ContextFilter"}},
    "formatters": {
        "plain": {"()": "coevo.logs.PlainFormatter"},
        "json": {"()": "coevo.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if COEVO_LOG_JSON else "plain",
            "filters": ["context"],
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env_choice(
            "COEVO_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), upper=True
        ),
    },
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # The filesystem broker has no hostname, and kombu warns about it on every connection.
        "kombu.connection": {"level": "ERROR"},
    },
}

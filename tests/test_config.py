"""Configuration: a bad value of any type stops start-up with an error naming the variable, and
every COEVO_* variable the code reads is documented in docs/configuration.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from coevo.config import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_path,
    env_url,
)
from tests.conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "configuration.md"


@pytest.mark.parametrize(
    ("read", "value", "message"),
    [
        (lambda: env_int("COEVO_X", 1), "ten", "COEVO_X='ten' is not an integer"),
        (lambda: env_int("COEVO_X", 1, minimum=1), "0", "COEVO_X=0 is below its minimum of 1"),
        (lambda: env_int("COEVO_X", 1, maximum=9), "10", "COEVO_X=10 is above its maximum of 9"),
        (lambda: env_float("COEVO_X", 1.0), "1,5", "COEVO_X='1,5' is not a number"),
        (lambda: env_float("COEVO_X", 1.0), "nan", "COEVO_X='nan' is not a finite number"),
        (lambda: env_float("COEVO_X", 1.0, minimum=0), "-1", "below its minimum of 0"),
        (lambda: env_bool("COEVO_X"), "maybe", "COEVO_X='maybe' is not a boolean"),
        (lambda: env_choice("COEVO_X", "a", ("a", "b")), "c", "COEVO_X='c' is not one of: a, b"),
        (
            lambda: env_url("COEVO_X", "redis://h", schemes=("redis",)),
            "mysql://h/db",
            "COEVO_X='mysql://h/db' is not a URL coevo can use",
        ),
    ],
)
def test_a_bad_value_raises_improperly_configured_naming_the_variable(
    monkeypatch, read, value, message
):
    monkeypatch.setenv("COEVO_X", value)
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        read()


def test_unset_or_blank_means_the_default(monkeypatch):
    monkeypatch.delenv("COEVO_X", raising=False)
    assert env_int("COEVO_X", 3) == 3 and env_float("COEVO_X", 0.5) == 0.5
    monkeypatch.setenv("COEVO_X", " ")
    assert env_int("COEVO_X", 3) == 3 and env_choice("COEVO_X", "a", ("a",)) == "a"


def test_good_values_are_parsed(monkeypatch, tmp_path):
    monkeypatch.setenv("COEVO_X", "warning")
    assert env_choice("COEVO_X", "INFO", ("INFO", "WARNING"), upper=True) == "WARNING"
    monkeypatch.setenv("COEVO_X", "2.5")
    assert env_float("COEVO_X", 1.0, minimum=0) == 2.5
    monkeypatch.setenv("COEVO_X", "a, b,,c")
    assert env_list("COEVO_X", []) == ["a", "b", "c"]
    monkeypatch.setenv("COEVO_X", str(tmp_path / "x" / ".." / "y"))
    assert env_path("COEVO_X", "/nowhere") == tmp_path / "y"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("COEVO_HEARTBEAT_S", "soon"),
        ("COEVO_SYSTEM_PING_TIMEOUT_S", "fast"),
        ("COEVO_DEBUG", "perhaps"),
        ("COEVO_LOG_LEVEL", "loud"),
        ("DATABASE_URL", "mysql://db/coevo"),
        ("CELERY_BROKER_URL", "amqp-ish"),
        ("COEVO_TRUSTED_PROXIES", "10.0.0.1, the-proxy"),
        ("COEVO_HTTPS", "perhaps"),
        ("COEVO_LOGIN_MAX_FAILURES", "0"),
        ("COEVO_IMAGE_MAP", "python:3.13"),
        ("COEVO_CONTAINER_PULL", "always"),
        ("COEVO_DOCKER_HOST", "/run/docker.sock"),
    ],
)
def test_settings_refuse_a_bad_value_at_start_up(tmp_path, variable, value):
    env = {**os.environ, "COEVO_HOME": str(tmp_path), variable: value}
    env["DJANGO_SETTINGS_MODULE"] = "coevo.settings"
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: ") and variable in last


def _django(tmp_path, code: str, **variables: str) -> subprocess.CompletedProcess:
    """``code`` run after django.setup() in a fresh process, with only these COEVO_ switches."""
    switches = ("COEVO_HTTPS", "COEVO_HSTS", "COEVO_SSL_REDIRECT", "COEVO_TRUST_PROXY_SSL_HEADER")
    env = {k: v for k, v in os.environ.items() if not k.startswith(switches)}
    env.update(COEVO_HOME=str(tmp_path), DJANGO_SETTINGS_MODULE="coevo.settings", **variables)
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup()\n{code}"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


SECURITY = (
    "from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE,"
    " s.SECURE_HSTS_SECONDS, getattr(s, 'SECURE_PROXY_SSL_HEADER', None), s.SECURE_SSL_REDIRECT)"
)


def test_it_serves_plain_http_by_default_and_secure_cookies_and_hsts_with_coevo_https(tmp_path):
    # The embedded demo: plain http on 127.0.0.1, where a Secure cookie would never come back.
    plain = _django(tmp_path, SECURITY)
    production = _django(
        tmp_path,
        SECURITY,
        COEVO_HTTPS="1",
        COEVO_TRUST_PROXY_SSL_HEADER="1",
        COEVO_SSL_REDIRECT="1",
    )

    assert plain.stdout.split() == ["False", "False", "0", "None", "False"], plain.stderr
    assert production.stdout.split() == [
        "True",
        "True",
        "31536000",
        "('HTTP_X_FORWARDED_PROTO',",
        "'https')",
        "True",
    ], production.stderr


def test_check_deploy_leaves_only_the_domain_wide_hsts_choices_in_production(tmp_path):
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "COEVO_HOME": str(tmp_path),
            "COEVO_SECRET_KEY": "k" * 10 + "-a-long-random-production-key-" + "x7Q2" * 8,
            "COEVO_ALLOWED_HOSTS": "coevo.example.com",
            "COEVO_HTTPS": "1",
            "COEVO_TRUST_PROXY_SSL_HEADER": "1",
            "COEVO_SSL_REDIRECT": "1",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    warnings = set(re.findall(r"\(security\.(W\d+)\)", done.stdout + done.stderr))
    # W005/W021: includeSubDomains and preload, decisions about the operator's whole domain.
    assert warnings == {"W005", "W021"}, done.stdout + done.stderr


def _names_in_code() -> set[str]:
    names: set[str] = set()
    roots = ["coevo", "harness_store", "workers", "templates"]
    files = [p for root in roots for p in (REPO_ROOT / root).rglob("*") if p.is_file()]
    files += [REPO_ROOT / "docker-compose.yml", REPO_ROOT / "Dockerfile", REPO_ROOT / "manage.py"]
    for path in files:
        if path.suffix not in {".py", ".html", ".yml", ""} or "migrations" in path.parts:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        names.update(re.findall(r"\bCOEVO_[A-Z0-9_]*[A-Z0-9]\b", text))
    return names


def test_every_coevo_variable_in_the_code_is_documented():
    documented = set(re.findall(r"`(COEVO_[A-Z0-9_]+)`", DOC.read_text()))
    names = _names_in_code()
    assert "COEVO_TRACE_RETENTION_DAYS" in names  # the scan itself works
    missing = sorted(names - documented)
    assert not missing, f"add these to docs/configuration.md: {', '.join(missing)}"


# The oldest Python the image may use: the 3.11 release with the latest tarfile fixes known
# when it was pinned (see the Dockerfile's comment). Raise both together.
MINIMUM_IMAGE_PYTHON = (3, 11, 18)


def test_it_pins_the_image_python_to_a_patch_release_with_the_tarfile_fixes():
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    pinned = re.search(r"^ARG PYTHON_IMAGE=python:(\S+)$", dockerfile, re.MULTILINE)
    assert pinned, "the Dockerfile sets ARG PYTHON_IMAGE=python:<tag>"
    version = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)-slim-bookworm", pinned.group(1))
    assert version, f"python:{pinned.group(1)} floats: pin a patch release (3.11.N-slim-bookworm)"
    assert tuple(int(part) for part in version.groups()) >= MINIMUM_IMAGE_PYTHON
    # Every stage starts from that one argument: none names its own, floating, image.
    stages = re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE)
    assert {s for s in stages if "python" in s} <= {"${PYTHON_IMAGE}"}

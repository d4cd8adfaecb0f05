"""Structured logs: ids bound to lines, JSON output, and what must never reach a log (secrets,
held-out task contents), the latter through a real held-out rollout."""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coevo.logs import (
    ContextFilter,
    JsonFormatter,
    PlainFormatter,
    log_bind,
    log_context,
    redact,
    secret_values_reload,
)
from tests.conftest import REPO_ROOT


class Capture:
    """A handler on the root logger configured like settings.LOGGING's console handler."""

    def __init__(self, formatter: logging.Formatter) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)
        self.handler.addFilter(ContextFilter())

    def __enter__(self) -> Capture:
        root = logging.getLogger()
        self._level = root.level
        root.addHandler(self.handler)
        root.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        root = logging.getLogger()
        root.removeHandler(self.handler)
        root.setLevel(self._level)

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def json_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.text.splitlines() if line.strip()]


def test_it_binds_ids_to_every_line_logged_inside_a_context():
    log = logging.getLogger("coevo.test")
    with Capture(JsonFormatter()) as capture:
        with log_context(project="demo", evaluation="e1"):
            log.info("first")
            with log_context(rollout="r1"):
                log_bind(candidate="abc123")
                log.info("second")
            log.info("third")
        log.info("outside")
    first, second, third, outside = capture.json_lines()
    assert (first["project"], first["evaluation"]) == ("demo", "e1") and "rollout" not in first
    assert second["rollout"] == "r1" and second["candidate"] == "abc123"
    assert second["project"] == "demo"
    # What the inner context bound ends with it.
    assert "rollout" not in third and "candidate" not in third and third["project"] == "demo"
    assert "project" not in outside
    assert first["message"] == "first" and first["level"] == "INFO"
    assert first["logger"] == "coevo.test"


def test_it_appends_ids_to_plain_lines():
    with Capture(PlainFormatter()) as capture, log_context(project="demo", rollout="r9"):
        logging.getLogger("coevo.test").warning("hello %s", "world")
    assert capture.text.rstrip().endswith("hello world [project=demo rollout=r9]")


def test_it_writes_json_lines_when_coevo_log_json_is_set(tmp_path):
    script = textwrap.dedent(
        """
        import logging, django
        django.setup()
        from coevo.logs import log_context
        with log_context(project="demo", worker="w1"):
            logging.getLogger("coevo.x").warning("ready for %s", "work")
        """
    )
    env = {**os.environ, "COEVO_LOG_JSON": "1", "COEVO_HOME": str(tmp_path)}
    env["DJANGO_SETTINGS_MODULE"] = "coevo.settings"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    line = json.loads(out.stderr.strip().splitlines()[-1])
    assert line["message"] == "ready for work"
    assert line["project"] == "demo" and line["worker"] == "w1" and line["level"] == "WARNING"

    env["COEVO_LOG_JSON"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    plain = out.stderr.strip().splitlines()[-1]
    assert plain.endswith("ready for work [project=demo worker=w1]")


@pytest.mark.parametrize(
    "leak",
    [
        "Authorization: Bearer {s}",
        "headers={{'authorization': 'Bearer {s}'}}",
        "connecting to postgres://coevo:{s}@db:5432/coevo",
        "redis://:{s}@redis:6379/0",
        "retrying with password={s}",
        "api_key: {s}",
        "token={s}",
    ],
)
def test_it_redacts_secrets_in_messages(leak):
    secret = "s3cr3t-" + secrets.token_hex(8)
    text = leak.format(s=secret)
    assert secret in text
    assert secret not in redact(text)
    assert "[redacted]" in redact(text)


def test_it_keeps_token_counts_readable():
    text = "rollout done: prompt_tokens=120 completion_tokens=30 max_tokens=256"
    assert redact(text) == text


def test_it_redacts_secret_values_from_the_environment_and_the_traceback(monkeypatch):
    token = "tok-" + secrets.token_hex(12)
    monkeypatch.setenv("COEVO_SOME_API_TOKEN", token)
    secret_values_reload()
    try:
        with Capture(JsonFormatter()) as capture:
            try:
                raise RuntimeError(f"the server refused {token}")
            except RuntimeError:
                logging.getLogger("coevo.test").exception("calling out with %s", token)
    finally:
        monkeypatch.delenv("COEVO_SOME_API_TOKEN")
        secret_values_reload()
    (line,) = capture.json_lines()
    assert token not in capture.text
    assert "RuntimeError" in line["exc"] and "[redacted]" in line["exc"]


MARKER = "HELDOUT-MARKER-" + secrets.token_hex(6)

HARNESS_MANIFEST = """
[harness]
name = "leaky"
entrypoint = "agent:run"
policy_api = "completions"
"""

# Asks the model about the task, then fails with the task's input in its error: the rollout's
# detail then holds held-out contents, and the worker logs the detail.
LEAKY_AGENT = """
def run(task, ctx):
    ctx.llm.complete(task["input"], max_tokens=8)
    raise RuntimeError("could not solve: " + task["input"])
"""


@pytest.mark.django_db(transaction=True)
def test_it_never_logs_held_out_contents_or_a_token(
    project, owner, settings, scripted_policy, monkeypatch, tmp_path
):
    from coevo.celery import app
    from coevo.evaluations.models import Rollout
    from coevo.evaluations.services import evaluation_create, rollout_execute
    from coevo.policies.services import policy_version_get_default
    from coevo.suites.jsonl import scorer_spec_build
    from coevo.suites.services import suite_import_jsonl
    from harness_store.services import candidate_import_directory

    token = "tok-" + secrets.token_hex(16)
    monkeypatch.setenv("COEVO_POLICY_API_TOKEN", token)
    secret_values_reload()
    # The token travels as the policy URL's credentials (sent as Basic auth), so any log line
    # that names the policy's URL (the client's errors, an HTTP library's request log, if one
    # is ever turned on) carries it unless it is redacted.
    host = scripted_policy.url.removeprefix("http://")
    settings.COEVO_POLICY_URL = f"http://coevo:{token}@{host}"
    settings.COEVO_POLICY_MODEL = "scripted"
    version = policy_version_get_default()

    rows = [{"id": "sealed-1", "input": f"What is {MARKER} backwards?", "expected": "x",
             "split": "heldout"}]  # fmt: skip
    suite, _ = suite_import_jsonl(
        project=project, name="sealed", data=json.dumps(rows[0]).encode(),
        scorer=scorer_spec_build(kind="exact"),
    )  # fmt: skip
    harness = tmp_path / "leaky"
    harness.mkdir()
    (harness / "harness.toml").write_text(HARNESS_MANIFEST)
    (harness / "agent.py").write_text(LEAKY_AGENT)
    candidate, _ = candidate_import_directory(
        project=project, directory=Path(harness), message="leaky", author_name="Owner",
        author_email="owner@example.com", created_by=owner,
    )  # fmt: skip
    app.control.purge()
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split="heldout",
        policy_version=version,
        purpose="promotion",
    )
    rollout = Rollout.objects.get(evaluation=evaluation)

    try:
        with Capture(JsonFormatter()) as as_json, Capture(PlainFormatter()) as as_plain:
            rollout_execute(rollout_id=rollout.id, worker="test-worker")
    finally:
        app.control.purge()
        monkeypatch.delenv("COEVO_POLICY_API_TOKEN")
        secret_values_reload()

    rollout.refresh_from_db()
    assert rollout.outcome == "harness_error"
    assert MARKER in rollout.detail  # the leak path was there: the detail holds the input
    assert len(scripted_policy.requests) == 1
    lines = as_json.json_lines()
    assert scripted_policy.headers[-1]["Authorization"].startswith("Basic ")  # the token's path ran
    finished = [line for line in lines if line.get("rollout") == str(rollout.id)]
    assert finished, "no line carried the rollout's id"
    assert {line["project"] for line in finished} == {project.slug}
    assert {line["evaluation"] for line in finished} == {str(evaluation.id)}
    for text in (as_json.text, as_plain.text):
        assert MARKER not in text
        assert token not in text

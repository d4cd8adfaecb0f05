"""Structured logs: ids bound to every line, JSON on request, secrets and sealed data masked.

``log_context(project=…, rollout=…)`` binds ids (a contextvar, so each thread and each Celery
task sees its own) to every line logged inside it; ``log_bind`` adds ids to the current one
(a Celery task starts each run with a fresh context, see ``coevo.ops.heartbeats``).
``COEVO_LOG_JSON=1`` selects ``JsonFormatter`` (one object per line) in settings.LOGGING;
otherwise ``PlainFormatter`` appends the ids as ``key=value``.

Both formatters redact the finished line, exception text included, because a secret can reach
a log through any argument or traceback: bearer tokens and Authorization headers, passwords in
URLs (DATABASE_URL), ``password=``/``token=``-style pairs, and the literal values of secret
settings and environment variables. A rollout of the held-out split binds ``sealed`` with the
task's own strings: those are masked wherever they appear, and free-text arguments of the lines
it logs are replaced, since a held-out input can reach a log inside an error message
(issue 9: no held-out contents in logs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from typing import Any

# The ids a line may carry, in the order they are printed.
LOG_IDS = ("project", "candidate", "evaluation", "rollout", "campaign", "worker", "task_id")

_context: ContextVar[dict[str, Any]] = ContextVar("coevo_log_context", default={})  # noqa: B039 (never mutated: replaced)

SEALED_MASK = "[sealed]"
SECRET_MASK = "[redacted]"

# Fragments shorter than this are not masked: "1 + 1 =" would otherwise blank out every "1".
_MIN_SEALED_FRAGMENT = 8
_MIN_SECRET_VALUE = 8

_SECRET_PATTERNS = [
    # Authorization: Bearer abc / Authorization: Token abc / "authorization": "…"
    (
        re.compile(
            r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:bearer\s+|token\s+|basic\s+)?[^\s\"',}]+"
        ),
        r"\1" + SECRET_MASK,
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1" + SECRET_MASK),
    # scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@"), r"\1" + SECRET_MASK + "@"),
    # password=…, token: …, api_key=…, secret=…
    (
        re.compile(
            r"(?i)\b((?:[a-z0-9]+_)*(?:password|passwd|secret|token|api[_-]?key)(?:_[a-z0-9]+)*"
            r"[\"']?\s*[:=]\s*[\"']?)(?!\d+(?:[\s\"',}&]|$))[^\s\"',}&]+"
        ),
        r"\1" + SECRET_MASK,
    ),
]

# Setting and environment names whose values are secrets.
_SECRET_NAME = re.compile(r"(?i)(secret|token|password|passwd|api[_-]?key|credential)")
# Arguments that stay readable in a sealed rollout's lines: ids, task keys, outcomes, numbers.
_PLAIN_ARG = re.compile(r"^[\w.:/@+-]{0,100}$")


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[dict[str, Any]]:
    """Bind ``ids`` (None values are skipped) to every line logged inside the block."""
    token = _context.set({**_context.get(), **_clean(ids)})
    try:
        yield _context.get()
    finally:
        _context.reset(token)


def log_bind(**ids: Any) -> None:
    """Add ids to the current context (until the enclosing ``log_context`` or task ends)."""
    _context.set({**_context.get(), **_clean(ids)})


def log_context_push(**ids: Any) -> Token[dict[str, Any]]:
    """``log_context`` for callers that cannot use a with block (Celery's task_prerun and
    task_postrun signals): pass the token to ``log_context_pop``."""
    return _context.set({**_context.get(), **_clean(ids)})


def log_context_pop(token: Token[dict[str, Any]]) -> None:
    try:
        _context.reset(token)
    except ValueError:  # set in another context (should not happen): start afresh
        _context.set({})


def log_context_current() -> dict[str, Any]:
    return dict(_context.get())


def rollout_log_ids(rollout: Any) -> dict[str, Any]:
    """The ids of a claimed rollout (its evaluation, candidate and project loaded), and for a
    held-out rollout the task's strings to mask."""
    evaluation = rollout.evaluation
    ids: dict[str, Any] = {
        "project": evaluation.candidate.project.slug,
        "candidate": evaluation.candidate.sha[:12],
        "evaluation": evaluation.id,
        "rollout": rollout.id,
        "campaign": getattr(evaluation, "campaign_id", None),
    }
    if evaluation.split == "heldout":
        ids["sealed"] = sealed_fragments(rollout.task.inputs, rollout.task.verifier)
    return ids


def sealed_fragments(*values: Any) -> tuple[str, ...]:
    """Every string in ``values`` (nested), and each of its lines, long enough to mask."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str):
            for piece in (value, *value.splitlines()):
                piece = piece.strip()
                if len(piece) >= _MIN_SEALED_FRAGMENT:
                    found.add(piece)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    for value in values:
        walk(value)
    # Longest first, so a line inside a masked prompt does not leave the rest behind.
    return tuple(sorted(found, key=len, reverse=True))


def redact(text: str, *, sealed: tuple[str, ...] = ()) -> str:
    """``text`` without secrets (and without the sealed fragments)."""
    for fragment in sealed:
        if fragment in text:
            text = text.replace(fragment, SEALED_MASK)
    for value in _secret_values():
        if value in text:
            text = text.replace(value, SECRET_MASK)
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record; in a sealed context, masks free-text arguments
    before the message is formatted (the traceback is masked by the formatter)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _context.get()
        record.coevo_ids = {k: context[k] for k in LOG_IDS if k in context}  # type: ignore[attr-defined]
        sealed = context.get("sealed") or ()
        record.coevo_sealed = sealed  # type: ignore[attr-defined]
        if sealed and record.args:
            record.args = _mask_args(record.args)
        return True


class PlainFormatter(logging.Formatter):
    default_format = "%(asctime)s %(levelname)s %(name)s %(message)s"

    def __init__(self, fmt: str | None = None, datefmt: str | None = None, **kwargs: Any) -> None:
        super().__init__(fmt or self.default_format, datefmt, **kwargs)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = _record_ids(record)
        if ids:
            suffix = " ".join(f"{k}={v}" for k, v in ids.items())
            head, sep, rest = line.partition("\n")
            line = f"{head} [{suffix}]{sep}{rest}"
        return redact(line, sealed=getattr(record, "coevo_sealed", ()))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the bound ids, exc."""

    def format(self, record: logging.LogRecord) -> str:
        sealed = getattr(record, "coevo_sealed", ())
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage(), sealed=sealed),
            **_record_ids(record),
            "pid": record.process,
            "thread": record.threadName,
        }
        if record.exc_info:
            body["exc"] = redact(self.formatException(record.exc_info), sealed=sealed)
        elif record.exc_text:
            body["exc"] = redact(record.exc_text, sealed=sealed)
        return json.dumps(body, default=str)


def _record_ids(record: logging.LogRecord) -> dict[str, str]:
    ids = getattr(record, "coevo_ids", None)
    if ids is None:  # a handler without ContextFilter: read the context directly
        context = _context.get()
        ids = {k: context[k] for k in LOG_IDS if k in context}
    return {k: str(v) for k, v in ids.items()}


def _clean(ids: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ids.items() if v is not None and v != ""}


def _mask_args(args: Any) -> Any:
    def mask(value: Any) -> Any:
        if isinstance(value, int | float | bool) or value is None:
            return value
        text = str(value)
        return value if _PLAIN_ARG.match(text) else SEALED_MASK

    if isinstance(args, dict):
        return {k: mask(v) for k, v in args.items()}
    return tuple(mask(a) for a in args)


_secrets_lock = threading.Lock()
_secrets_cache: tuple[str, ...] | None = None


def _secret_values() -> tuple[str, ...]:
    """Literal secret values known to this process: secret-named settings and environment
    variables, and the database password. Read once (they do not change while it runs)."""
    global _secrets_cache
    if _secrets_cache is not None:
        return _secrets_cache
    with _secrets_lock:
        values: set[str] = set()
        for name, value in os.environ.items():
            if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_VALUE:
                values.add(value)
        try:
            from django.conf import settings

            for name in dir(settings):
                if name.isupper() and _SECRET_NAME.search(name):
                    value = getattr(settings, name, None)
                    if isinstance(value, str) and len(value) >= _MIN_SECRET_VALUE:
                        values.add(value)
            for database in settings.DATABASES.values():
                password = database.get("PASSWORD") or ""
                if len(password) >= 4:
                    values.add(password)
        except Exception:  # settings not configured (a bare script): environment only
            return tuple(sorted(values, key=len, reverse=True))
        _secrets_cache = tuple(sorted(values, key=len, reverse=True))
        return _secrets_cache


def secret_values_reload() -> None:
    """Forget the cached secret values (tests that change settings or the environment)."""
    global _secrets_cache
    with _secrets_lock:
        _secrets_cache = None

"""Trace storage: how a rollout's steps are written (batched) and read (page by page).

A trace can run to thousands of steps (a multi-step game with a model call per move), so
nothing here loads a whole trace: the worker buffers steps and writes them with one
``COPY`` (or ``bulk_create``) per batch, and readers walk the steps in (attempt, index) order
with a cursor, a page at a time, over the ``trace_step_unique_index`` constraint's index.

An attempt's start and each of its model calls are written the moment they are recorded (with
the steps waiting before them), so a worker killed mid-rollout leaves, under that attempt's
number, that it ran and every policy call it made; the rollout's next attempt writes under
its own number (the claim's), so the two never share an index.

Payloads over ``COMPRESS_OVER_BYTES`` of JSON are stored zlib-compressed in ``payload_zlib``;
``payload`` then keeps an excerpt (every string cut to ``EXCERPT_CHARS``), which is what the
search matches and what a reader that does not go through ``trace_step_payload`` sees.
"""

from __future__ import annotations

import json
import logging
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from django.db import InterfaceError, OperationalError, connection
from django.db.models import Count, Q, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from coevo.evaluations.dbwait import database_connection_drop, database_down
from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.storable import MAX_DEPTH, Unstorable, storable_json
from workers.trace import StepKind, TypedStep, UnknownStep, parse_step

logger = logging.getLogger(__name__)

# Why 16 KB: PostgreSQL already TOAST-compresses values over ~2 KB, so this is not about disk
# on PostgreSQL; it keeps huge bodies (long few-shot prompts, whole observations) out of the
# search scan and out of SQLite's pages. Log lines (at most 10,000 characters) stay below it.
COMPRESS_OVER_BYTES = 16 * 1024
EXCERPT_CHARS = 2000
PAGE_SIZE = 100
BATCH_SIZE = 500
FLUSH_INTERVAL_S = 0.5
# Written at once rather than batched: the start says the attempt ran at all, a model call what
# it cost and what the policy said; both must survive a kill -9 of the worker. A model call
# already takes the policy's round trip, so one more write beside it costs little (unlike a
# write per log line or per env step, which stay batched).
WRITE_AT_ONCE_KINDS = frozenset({StepKind.START, StepKind.MODEL_CALL})
# While the database is down, a running rollout's steps wait in memory, and a write is tried
# again this long after a failed one (not at every step: a harness may log hundreds a second).
OUTAGE_RETRY_S = 5.0
MAX_QUERY_CHARS = 200


class StepLike(Protocol):
    kind: str
    payload: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int


# --- payload packing -----------------------------------------------------------------------


def payload_pack(payload: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    """(what goes in ``payload``, what goes in ``payload_zlib``) for one step's payload."""
    stored, _text, payload_zlib = _pack(payload)
    return stored, payload_zlib


def _pack(payload: dict[str, Any]) -> tuple[dict[str, Any], str, bytes | None]:
    """(stored payload, its JSON text, the compressed full JSON or None)."""
    payload, text = _payload_json(payload)
    # len(text) is a cheap lower bound of the UTF-8 size: most steps skip the encode.
    if len(text) <= COMPRESS_OVER_BYTES // 4 or len(data := text.encode()) <= COMPRESS_OVER_BYTES:
        return payload, text, None
    excerpt = _excerpt(payload)
    return excerpt, _payload_json(excerpt)[1], zlib.compress(data, 6)


def _payload_json(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The payload as stored and its JSON text. A payload PostgreSQL would refuse (a NUL, a
    lone surrogate, NaN: coevo.evaluations.storable says why each) is stored with those
    replaced, rather than failing the whole batch; one nested too deep to store at all becomes
    a note saying so. Most payloads need neither, and skip the walk."""
    try:
        text = json.dumps(
            payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str
        )
    except (TypeError, ValueError, RecursionError):  # a key json refuses; NaN; too deep
        text = None
    if text is None or "\\u0000" in text or _SURROGATE.search(text):
        try:
            payload = storable_json(payload, max_depth=_PAYLOAD_MAX_DEPTH)
        except Unstorable as exc:
            payload = {"unstorable": f"this step cannot be stored: {exc}"}
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return payload, text


_SURROGATE = re.compile("[\ud800-\udfff]")
# A step wraps the harness's values a few levels deep (a model call's messages, their content
# parts): an answer the rollout can store is never refused in its trace.
_PAYLOAD_MAX_DEPTH = MAX_DEPTH + 8


def payload_unpack(payload: dict[str, Any], payload_zlib: bytes | memoryview | None) -> Any:
    """The full payload of a step, whichever way it was stored."""
    if payload_zlib is None:
        return payload
    return json.loads(zlib.decompress(bytes(payload_zlib)))


def trace_step_payload(step: TraceStep) -> Any:
    return payload_unpack(step.payload, step.payload_zlib)


def trace_step_typed(step: TraceStep) -> TypedStep | UnknownStep:
    """A stored step as its kind's type (workers/trace.py), its payload unpacked."""
    return parse_step(step.kind, trace_step_payload(step))


def _excerpt(value: Any, depth_left: int = _PAYLOAD_MAX_DEPTH) -> Any:
    if isinstance(value, str):
        return value if len(value) <= EXCERPT_CHARS else value[:EXCERPT_CHARS] + " …"
    if isinstance(value, dict | list | tuple) and depth_left <= 0:
        # A payload json could encode may still be too deep to walk here (or to store whole).
        return "…"
    if isinstance(value, dict):
        return {key: _excerpt(item, depth_left - 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [_excerpt(item, depth_left - 1) for item in value[:50]]
        return items + ([f"… {len(value) - 50} more"] if len(value) > 50 else [])
    return value


# --- writing -------------------------------------------------------------------------------


_COPY_COLUMNS = ", ".join(
    f'"{name}"'
    for name in (
        "rollout_id", "attempt", "index", "kind", "payload", "payload_zlib",
        "prompt_tokens", "completion_tokens", "latency_ms", "created_at",
    )
)  # fmt: skip


def _copy_text(value: str) -> str:
    """A value in COPY's text format: backslash and the row/column separators escaped."""
    return (
        value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    )


class _Row(NamedTuple):
    index: int
    kind: str
    payload: dict[str, Any]
    text: str
    payload_zlib: bytes | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int


class TraceWriter:
    """Buffers one attempt's steps and writes them in batches.

    A batch is written once a step of a ``write_at_once`` kind arrives, ``batch_size`` steps
    are waiting or the oldest waiting step is ``flush_interval_s`` old (checked as steps
    arrive), and always by ``flush``/``close``: the rollout runner flushes before it records
    the outcome, and on cancel or error, so no step is lost and a finished rollout's trace is
    complete when its row says done. A killed worker loses only the steps recorded since its
    last write, none of them a model call (unless the database was down meanwhile: steps
    recorded during an outage wait in memory, and the runner's last flush waits for it).
    """

    def __init__(
        self,
        *,
        rollout_id: Any,
        attempt: int,
        start_index: int = 0,
        batch_size: int = BATCH_SIZE,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        write_at_once: frozenset[str] = WRITE_AT_ONCE_KINDS,
        use_copy: bool = True,
    ) -> None:
        self.rollout_id = rollout_id
        # COPY on PostgreSQL; ``use_copy=False`` (or another database) writes with bulk_create.
        self.use_copy = use_copy
        self.attempt = attempt
        self.next_index = start_index
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.write_at_once = write_at_once
        self.written = 0
        self._buffer: list[_Row] = []
        self._oldest = 0.0
        self._retry_at = 0.0  # no write before then (monotonic), after one an outage failed
        # The index after the last step of a write that failed: it may have landed all the same
        # (a connection lost while the server committed it).
        self._unsure_upto: int | None = None

    def add(self, step: StepLike) -> None:
        payload, text, payload_zlib = _pack(step.payload)
        if not self._buffer:
            self._oldest = time.monotonic()
        self._buffer.append(
            _Row(
                self.next_index,
                step.kind,
                payload,
                text,
                payload_zlib,
                step.prompt_tokens,
                step.completion_tokens,
                step.latency_ms,
            )
        )
        self.next_index += 1
        now = time.monotonic()
        if now >= self._retry_at and (
            step.kind in self.write_at_once
            or len(self._buffer) >= self.batch_size
            or now - self._oldest >= self.flush_interval_s
        ):
            self._flush_unless_database_down()

    def _flush_unless_database_down(self) -> None:
        """A write while the attempt runs. The harness and the policy do not need the database:
        an outage keeps the steps here for a later write rather than ending a rollout that is
        working (and whose policy calls would be paid again)."""
        try:
            self.flush()
        except (OperationalError, InterfaceError) as exc:
            if not database_down(exc):
                raise
            database_connection_drop()
            self._retry_at = time.monotonic() + OUTAGE_RETRY_S
            logger.warning(
                "rollout %s: the database is unreachable; %d trace steps of attempt %d are kept "
                "in memory until it answers (%s)",
                self.rollout_id,
                len(self._buffer),
                self.attempt,
                type(exc).__name__,
            )

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def flush(self) -> int:
        """Write the waiting steps; returns how many were written."""
        if self._unsure_upto is not None and self._buffer:
            self._drop_landed()
        if not self._buffer:
            return 0
        batch = self._buffer
        self._unsure_upto = batch[-1].index + 1
        if self.use_copy and connection.vendor == "postgresql":
            self._copy(batch)
        else:
            TraceStep.objects.bulk_create(
                [
                    TraceStep(
                        rollout_id=self.rollout_id,
                        attempt=self.attempt,
                        index=row.index,
                        kind=row.kind,
                        payload=row.payload,
                        payload_zlib=row.payload_zlib,
                        prompt_tokens=row.prompt_tokens,
                        completion_tokens=row.completion_tokens,
                        latency_ms=row.latency_ms,
                    )
                    for row in batch
                ],
                batch_size=self.batch_size,
            )
        # Cleared only once written: a failed write leaves the steps for the next flush.
        self._buffer = []
        self._unsure_upto = None
        self.written += len(batch)
        return len(batch)

    def _drop_landed(self) -> None:
        """Forget the steps of the last failed write if it landed after all: a write is one
        statement (COPY) or one transaction (bulk_create), so its first step tells."""
        assert self._unsure_upto is not None
        first = self._buffer[0].index
        if TraceStep.objects.filter(
            rollout_id=self.rollout_id, attempt=self.attempt, index=first
        ).exists():
            landed = [row for row in self._buffer if row.index < self._unsure_upto]
            self._buffer = self._buffer[len(landed) :]
            self.written += len(landed)
        self._unsure_upto = None

    def _copy(self, batch: list[_Row]) -> None:
        """PostgreSQL's COPY, with the rows formatted here in COPY's text format: about 4× the
        rows per second of bulk_create (measured in benchmarks/traces.py), which is what
        lets one worker keep up with a fast game."""
        now = timezone.now().isoformat()
        head = f"{self.rollout_id}\t{self.attempt}\t"
        lines = []
        for row in batch:
            blob = "\\\\x" + row.payload_zlib.hex() if row.payload_zlib is not None else "\\N"
            lines.append(
                f"{head}{row.index}\t{_copy_text(row.kind)}\t{_copy_text(row.text)}\t{blob}\t"
                f"{row.prompt_tokens}\t{row.completion_tokens}\t{row.latency_ms}\t{now}\n"
            )
        sql = f'COPY "{TraceStep._meta.db_table}" ({_COPY_COLUMNS}) FROM STDIN'
        # psycopg's own copy() is not behind Django's cursor: wrapped, its errors are Django's
        # (a lost connection an OperationalError, as from any query) and mark the connection.
        with (
            connection.wrap_database_errors,
            connection.cursor() as cursor,
            cursor.cursor.copy(sql) as copy,
        ):
            copy.write("".join(lines))

    def flush_after_failure(self) -> None:
        """Flush on a path that is already failing: log a write error instead of raising it,
        so the original failure is the one reported."""
        try:
            self.flush()
        except Exception:
            logger.exception(
                "rollout %s: %d trace steps of attempt %d could not be written",
                self.rollout_id,
                len(self._buffer),
                self.attempt,
            )

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.flush()
        else:
            self.flush_after_failure()


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """A position in a trace: the step (attempt, index) a page starts at."""

    attempt: int
    index: int

    def __str__(self) -> str:
        return f"{self.attempt}.{self.index}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """``"2.150"`` → Cursor(2, 150); anything else (absent, malformed) → None: page 1."""
        match = re.fullmatch(r"(\d{1,5})\.(\d{1,9})", (text or "").strip())
        return cls(int(match[1]), int(match[2])) if match else None


@dataclass(frozen=True)
class AttemptSummary:
    number: int
    steps: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int


@dataclass(frozen=True)
class TraceSummary:
    attempts: list[AttemptSummary]
    kinds: dict[str, int]

    @property
    def steps(self) -> int:
        return sum(a.steps for a in self.attempts)


@dataclass
class TracePage:
    steps: list[TraceStep]
    cursor: Cursor | None
    next_cursor: Cursor | None
    previous_cursor: Cursor | None
    query: str = ""
    matches: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_first(self) -> bool:
        return self.previous_cursor is None


def trace_summary(*, rollout: Rollout) -> TraceSummary:
    """Step counts, tokens and latency per attempt, and step counts per kind: two aggregate
    queries, no payload read."""
    steps = TraceStep.objects.filter(rollout=rollout)
    attempts = [
        AttemptSummary(
            number=row["attempt"],
            steps=row["n"],
            prompt_tokens=row["prompt"] or 0,
            completion_tokens=row["completion"] or 0,
            latency_ms=row["latency"] or 0,
        )
        for row in steps.values("attempt")
        .annotate(
            n=Count("id"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            latency=Sum("latency_ms"),
        )
        .order_by("attempt")
    ]
    kinds = dict(
        steps.values_list("kind")
        .annotate(n=Count("id"))
        .order_by("-n", "kind")
        .values_list("kind", "n")
    )
    return TraceSummary(attempts=attempts, kinds=kinds)


def trace_search_filter(query: str) -> Q:
    """Steps whose kind or payload text contains ``query`` (case-insensitive), as a database
    filter. Compressed payloads match only on their excerpt; the JSON text escapes newlines
    and quotes, so a query spanning a line break does not match."""
    query = query[:MAX_QUERY_CHARS]
    return Q(kind__icontains=query) | Q(payload_text__icontains=query)


def trace_page(
    *,
    rollout: Rollout,
    cursor: Cursor | None = None,
    query: str = "",
    page_size: int = PAGE_SIZE,
) -> TracePage:
    """One page of steps from ``cursor`` on (page 1 when None), in (attempt, index) order,
    optionally only those matching ``query``; compressed payloads are unpacked."""
    steps = TraceStep.objects.filter(rollout=rollout)
    query = query.strip()[:MAX_QUERY_CHARS]
    if query:
        steps = steps.annotate(payload_text=Cast("payload", TextField())).filter(
            trace_search_filter(query)
        )
    after = steps
    if cursor is not None:
        after = steps.filter(
            Q(attempt__gt=cursor.attempt) | Q(attempt=cursor.attempt, index__gte=cursor.index)
        )
    rows = list(after.order_by("attempt", "index")[: page_size + 1])
    next_cursor = Cursor(rows[-1].attempt, rows[-1].index) if len(rows) > page_size else None
    rows = rows[:page_size]
    previous_cursor = None
    if cursor is not None:
        before = list(
            steps.filter(
                Q(attempt__lt=cursor.attempt) | Q(attempt=cursor.attempt, index__lt=cursor.index)
            )
            .order_by("-attempt", "-index")
            .values_list("attempt", "index")[:page_size]
        )
        if before:
            previous_cursor = Cursor(*before[-1])
    for step in rows:
        if step.payload_zlib is not None:
            step.payload = trace_step_payload(step)
    matches = steps.count() if query else None
    return TracePage(
        steps=rows,
        cursor=cursor,
        next_cursor=next_cursor,
        previous_cursor=previous_cursor,
        query=query,
        matches=matches,
    )

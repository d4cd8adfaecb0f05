"""Trace storage: the batched writer, compression, pages and search (coevo.evaluations.traces),
and that the rollout runner loses no step when a rollout is cancelled or crashes."""

from __future__ import annotations

import json
import math
import textwrap
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from coevo.evaluations.models import EvaluationState, Rollout, RolloutState, TraceStep
from coevo.evaluations.services import evaluation_create, rollout_execute
from coevo.evaluations.traces import (
    COMPRESS_OVER_BYTES,
    Cursor,
    TraceWriter,
    payload_pack,
    trace_page,
    trace_step_payload,
    trace_summary,
)
from coevo.suites.models import Split
from harness_store.services import candidate_import_directory
from tests.support.factories import make_evaluation


@dataclass
class FakeStep:
    """Shaped like workers.rollout.Step."""

    kind: str
    payload: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: int = 0


@pytest.fixture
def rollout(seed_candidate, humaneval_suite, policy_version) -> Rollout:
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    task = humaneval_suite.tasks.filter(split=Split.SEARCH).order_by("position").first()
    return Rollout.objects.create(
        evaluation=evaluation, task=task, seed=1, state=RolloutState.RUNNING, attempts=1
    )


def write_game(rollout: Rollout, *, moves: int, attempt: int = 1) -> None:
    with TraceWriter(rollout_id=rollout.id, attempt=attempt) as writer:
        for move in range(moves):
            writer.add(
                FakeStep(
                    "model_call",
                    {"prompt": f"room {move}", "completion": f"go north {move}"},
                    prompt_tokens=10,
                    completion_tokens=2,
                    latency_ms=5,
                )
            )
            writer.add(FakeStep("env_step", {"action": f"go north {move}", "reward": 0.0}))


# --- writing ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_writes_steps_in_batches_of_the_batch_size(rollout):
    writer = TraceWriter(rollout_id=rollout.id, attempt=1, batch_size=10, flush_interval_s=3600)
    counts = []
    for i in range(25):
        writer.add(FakeStep("log", {"message": f"line {i}"}))
        counts.append(TraceStep.objects.filter(rollout=rollout).count())
    # Written ten at a time; five steps still waiting.
    assert counts == [0] * 9 + [10] * 10 + [20] * 6
    assert writer.pending == 5
    assert writer.flush() == 5
    indexes = list(TraceStep.objects.filter(rollout=rollout).values_list("index", flat=True))
    assert indexes == list(range(25))


@pytest.mark.django_db
def test_it_flushes_a_batch_once_the_oldest_step_waited_the_interval(rollout):
    writer = TraceWriter(rollout_id=rollout.id, attempt=1, batch_size=1000, flush_interval_s=0.2)
    writer.add(FakeStep("log", {"message": "first"}))
    assert TraceStep.objects.filter(rollout=rollout).count() == 0
    time.sleep(0.25)
    writer.add(FakeStep("log", {"message": "second"}))
    assert TraceStep.objects.filter(rollout=rollout).count() == 2


@pytest.mark.django_db
def test_it_writes_a_start_and_each_model_call_at_once_with_the_steps_before_them(rollout):
    # What a worker killed at any moment leaves: that the attempt ran, and every policy call.
    writer = TraceWriter(rollout_id=rollout.id, attempt=3, flush_interval_s=3600)
    written = TraceStep.objects.filter(rollout=rollout).order_by("index")
    writer.add(FakeStep("start", {"task": "t"}))
    assert list(written.values_list("attempt", "index", "kind")) == [(3, 0, "start")]
    writer.add(FakeStep("log", {"message": "thinking"}))
    assert written.count() == 1
    writer.add(FakeStep("model_call", {"completion": "42"}, prompt_tokens=5))
    assert list(written.values_list("index", "kind")) == [
        (0, "start"),
        (1, "log"),
        (2, "model_call"),
    ]
    writer.add(FakeStep("env_step", {"action": "go"}))
    assert written.count() == 3 and writer.pending == 1


@pytest.mark.django_db
def test_it_flushes_the_waiting_steps_when_the_block_raises(rollout):
    with pytest.raises(RuntimeError), TraceWriter(rollout_id=rollout.id, attempt=2) as writer:
        writer.add(FakeStep("log", {"message": "before the crash"}))
        raise RuntimeError("the runner crashed")
    step = TraceStep.objects.get(rollout=rollout)
    assert (step.attempt, step.index, step.payload) == (2, 0, {"message": "before the crash"})


@pytest.mark.django_db
def test_it_stores_any_text_a_harness_may_produce(rollout):
    tricky = 'tab\there\nnew line\r\\N back\\slash \\x00 "quoted" \u00e9\u2028 \\\\'
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        writer.add(FakeStep("log", {"message": tricky, "nested": {"k\tey": [tricky, 1.5, None]}}))
        writer.add(FakeStep("log", {"message": "nul \x00 byte"}))
    first, second = TraceStep.objects.filter(rollout=rollout).order_by("index")
    assert first.payload == {"message": tricky, "nested": {"k\tey": [tricky, 1.5, None]}}
    # jsonb cannot hold NUL: it is replaced, instead of failing the whole batch.
    assert second.payload == {"message": "nul \ufffd byte"}


@pytest.mark.django_db
def test_it_stores_a_lone_surrogate_a_harness_sent_as_a_replacement_character(rollout):
    # json.loads('"\\ud800"') gives a str that UTF-8 cannot encode: a harness can send one.
    lone = json.loads('"half \\ud800 of a pair"')
    large = {"message": lone + "x" * (2 * COMPRESS_OVER_BYTES)}
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        writer.add(FakeStep("log", {"message": lone, "fields": {lone: [lone]}}))
        writer.add(FakeStep("log", large))
    first, second = TraceStep.objects.filter(rollout=rollout).order_by("index")
    fixed = "half \ufffd of a pair"
    assert first.payload == {"message": fixed, "fields": {fixed: [fixed]}}
    assert trace_step_payload(second)["message"].startswith(fixed)


@pytest.mark.django_db
def test_it_stores_non_finite_numbers_a_harness_sent_by_name(rollout):
    # Python's json reads NaN and Infinity from a harness; jsonb refuses them.
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        writer.add(FakeStep("answer", {"answer": [math.nan, math.inf, -math.inf]}))
        writer.add(
            FakeStep("log", {"fields": {"x": math.nan}, "message": "m" * COMPRESS_OVER_BYTES})
        )
    first, second = TraceStep.objects.filter(rollout=rollout).order_by("index")
    assert first.payload == {"answer": ["NaN", "Infinity", "-Infinity"]}
    assert trace_step_payload(second)["fields"] == {"x": "NaN"}


@pytest.mark.django_db
def test_it_stores_a_note_in_place_of_a_step_nested_too_deep_to_store(rollout):
    deep: Any = "leaf"
    for _ in range(50_000):
        deep = [deep]
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        writer.add(FakeStep("answer", {"answer": deep}))
        writer.add(FakeStep("log", {"message": "after"}))
    first, second = TraceStep.objects.filter(rollout=rollout).order_by("index")
    assert first.kind == "answer"
    assert set(first.payload) == {"unstorable"}
    assert first.payload["unstorable"].startswith("this step cannot be stored: it is nested more")
    assert second.payload == {"message": "after"}


@pytest.mark.django_db
def test_it_compresses_a_large_payload_and_reads_it_back_whole(rollout):
    prompt = "".join(f"line {i}: the quick brown fox\n" for i in range(3000))
    assert len(prompt) > COMPRESS_OVER_BYTES
    small = {"prompt": "short", "completion": "x"}
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        writer.add(FakeStep("model_call", {"prompt": prompt, "completion": "ok"}))
        writer.add(FakeStep("model_call", small))
    big_row, small_row = TraceStep.objects.filter(rollout=rollout).order_by("index")
    assert big_row.payload_zlib is not None
    assert len(bytes(big_row.payload_zlib)) < len(prompt) / 5
    # The excerpt keeps the structure, cut short; the full text comes back through the reader.
    assert big_row.payload["prompt"].startswith("line 0:") and len(big_row.payload["prompt"]) < 3000
    assert trace_step_payload(big_row) == {"prompt": prompt, "completion": "ok"}
    assert small_row.payload_zlib is None and trace_step_payload(small_row) == small
    page = trace_page(rollout=rollout)
    assert page.steps[0].payload["prompt"] == prompt


def test_it_leaves_payloads_under_the_threshold_uncompressed():
    payload = {"message": "x" * (COMPRESS_OVER_BYTES - 100)}
    assert payload_pack(payload) == (payload, None)


# --- reading ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_pages_through_a_long_trace_in_order(rollout):
    write_game(rollout, moves=130)  # 260 steps
    write_game(rollout, moves=20, attempt=2)  # 40 more, in a second attempt
    seen = []
    cursor = None
    pages = 0
    while True:
        page = trace_page(rollout=rollout, cursor=cursor, page_size=100)
        assert len(page.steps) <= 100
        seen.extend((s.attempt, s.index) for s in page.steps)
        pages += 1
        if page.next_cursor is None:
            break
        assert page.next_cursor == Cursor(page.steps[-1].attempt, page.steps[-1].index + 1) or (
            page.next_cursor.index == 0
        )
        cursor = page.next_cursor
    assert pages == 3
    assert seen == [(1, i) for i in range(260)] + [(2, i) for i in range(40)]
    last = trace_page(rollout=rollout, cursor=Cursor(2, 0), page_size=100)
    assert last.previous_cursor == Cursor(1, 160)
    assert trace_page(rollout=rollout).previous_cursor is None


@pytest.mark.django_db
def test_it_reads_one_page_with_a_bounded_number_of_queries(rollout):
    write_game(rollout, moves=400)
    with CaptureQueriesContext(connection) as queries:
        page = trace_page(rollout=rollout, cursor=Cursor(1, 300), page_size=50)
    assert [s.index for s in page.steps] == list(range(300, 350))
    assert len(queries.captured_queries) == 2  # the page (+1 row) and the previous cursor
    assert all("LIMIT" in q["sql"] for q in queries.captured_queries)


@pytest.mark.django_db
def test_it_counts_steps_per_attempt_and_per_kind(rollout):
    write_game(rollout, moves=3)
    write_game(rollout, moves=2, attempt=2)
    summary = trace_summary(rollout=rollout)
    assert summary.kinds == {"env_step": 5, "model_call": 5}
    assert [(a.number, a.steps, a.prompt_tokens, a.latency_ms) for a in summary.attempts] == [
        (1, 6, 30, 15),
        (2, 4, 20, 10),
    ]
    assert summary.steps == 10


@pytest.mark.django_db
def test_it_searches_payload_text_and_kinds_in_the_database(rollout):
    write_game(rollout, moves=150)
    page = trace_page(rollout=rollout, query="NORTH 14", page_size=100)
    # "go north 14" and "go north 140".."149", each in a model call and an env step.
    assert page.matches == 22
    assert {s.kind for s in page.steps} == {"model_call", "env_step"}
    assert all(
        "north 14" in s.payload.get("action", s.payload.get("completion")) for s in page.steps
    )
    assert trace_page(rollout=rollout, query="env_st").matches == 150
    assert trace_page(rollout=rollout, query="no such text").steps == []


@pytest.mark.django_db
def test_it_pages_through_search_results(rollout):
    write_game(rollout, moves=150)
    first = trace_page(rollout=rollout, query="env_step", page_size=100)
    second = trace_page(rollout=rollout, query="env_step", cursor=first.next_cursor, page_size=100)
    assert len(first.steps) == 100 and len(second.steps) == 50
    assert second.next_cursor is None
    assert {s.kind for s in first.steps + second.steps} == {"env_step"}


@pytest.mark.django_db
def test_it_searches_the_excerpt_of_a_compressed_payload(rollout):
    head = "needle-at-the-start "
    tail = " needle-at-the-end"
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        writer.add(FakeStep("model_call", {"prompt": head + "x" * 40000 + tail}))
    assert trace_page(rollout=rollout, query="needle-at-the-start").matches == 1
    # The documented limitation: only the excerpt of a compressed payload is searched.
    assert trace_page(rollout=rollout, query="needle-at-the-end").matches == 0


# --- the rollout runner -------------------------------------------------------------------------

MANIFEST = """
[harness]
name = "tracing"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 4
wall_time_s = 60
"""


def run_harness(tmp_path, project, owner, suite, policy_version, agent: str) -> Rollout:
    directory = tmp_path / "harness"
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST)
    (directory / "agent.py").write_text(textwrap.dedent(agent))
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message="tracing", author_name="T", created_by=owner
    )
    evaluation = evaluation_create(
        candidate=candidate,
        suite=suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    return Rollout.objects.get(evaluation=evaluation)


@pytest.mark.django_db(transaction=True)
def test_it_keeps_every_step_of_a_rollout_cancelled_while_it_runs(
    tmp_path, project, owner, humaneval_suite, policy_version, scripted_policy, settings
):
    settings.COEVO_HEARTBEAT_S = 0.1
    scripted_policy.latency_s = 1.5
    rollout = run_harness(
        tmp_path,
        project,
        owner,
        humaneval_suite,
        policy_version,
        """
        def run(task, ctx):
            for i in range(3):
                ctx.log(f"thinking {i}")
            ctx.llm.complete(task["prompt"], max_tokens=8)
            ctx.log("never recorded")
            return "    pass\\n"
        """,
    )

    def cancel() -> None:
        # What evaluation_cancel does to a running rollout, while its model call is out.
        while not scripted_policy.requests:
            time.sleep(0.05)
        Rollout.objects.filter(id=rollout.id).update(state=RolloutState.CANCELLED)
        connection.close()

    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        assert rollout_execute(rollout_id=rollout.id, worker="test") is None
    finally:
        canceller.join()
    kinds = list(
        TraceStep.objects.filter(rollout=rollout).order_by("index").values_list("kind", flat=True)
    )
    # The three log lines were still waiting in the writer's buffer (the model call came
    # right after them, and the start was written at once): the cancel path wrote them.
    assert kinds == ["start", "log", "log", "log"]


@pytest.mark.django_db(transaction=True)
def test_it_writes_each_model_call_at_once_and_batches_the_log_lines(
    tmp_path, project, owner, humaneval_suite, policy_version, scripted_policy, monkeypatch
):
    writes: list[list[str]] = []  # the kinds of the steps of each write
    flush = TraceWriter.flush

    def counted(writer: TraceWriter) -> int:
        kinds = [row.kind for row in writer._buffer]
        if kinds:
            writes.append(kinds)
        return flush(writer)

    monkeypatch.setattr(TraceWriter, "flush", counted)
    rollout = run_harness(
        tmp_path,
        project,
        owner,
        humaneval_suite,
        policy_version,
        """
        def run(task, ctx):
            for i in range(50):
                ctx.log(f"line {i}")
            ctx.llm.complete(task["prompt"], max_tokens=8)
            ctx.llm.complete(task["prompt"], max_tokens=8)
            return "    pass\\n"
        """,
    )
    rollout_execute(rollout_id=rollout.id, worker="test")

    assert writes[0] == ["start"]
    assert [w[-1] for w in writes if "model_call" in w] == ["model_call", "model_call"]
    assert writes[-1] == ["answer", "verdict"]
    # Start, two model calls, the end; a slow machine may add a write or two for a log burst
    # that outlasts FLUSH_INTERVAL_S, never one a line.
    assert 4 <= len(writes) <= 6, writes
    steps = TraceStep.objects.filter(rollout=rollout)
    assert sorted(steps.values_list("index", flat=True)) == list(range(sum(map(len, writes))))


@pytest.mark.django_db(transaction=True)
def test_it_writes_the_whole_trace_before_the_rollout_is_done(
    tmp_path, project, owner, humaneval_suite, policy_version, scripted_policy
):
    rollout = run_harness(
        tmp_path,
        project,
        owner,
        humaneval_suite,
        policy_version,
        """
        def run(task, ctx):
            for i in range(700):
                ctx.log(f"step {i}")
            raise ValueError("gave up")
        """,
    )
    done = rollout_execute(rollout_id=rollout.id, worker="test")
    assert done.state == RolloutState.DONE and done.outcome == "harness_error"
    steps = TraceStep.objects.filter(rollout=rollout).order_by("index")
    assert list(steps.values_list("index", flat=True)) == list(range(steps.count()))
    kinds = list(steps.values_list("kind", flat=True))
    assert kinds[0] == "start" and kinds.count("log") == 700
    assert kinds[-2:] == ["harness_exception", "error"]

"""The rollout page's trace viewer: pages of steps, search, collapsible model calls, the game
timeline, links from a harness's traceback to its source, and the sealed held-out split."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
)
from coevo.suites.models import Split, Task
from tests.support.factories import add_steps, make_evaluation, make_rollout
from tests.web.conftest import model_call_step, start_step
from tests.web.test_pages import plain, text
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


def game_steps(moves: int) -> list:
    steps = [("env_reset", {"observation": {"observation": "You are in a kitchen."}}, {})]
    for move in range(1, moves + 1):
        call = {
            "api": "completions",
            "model": "scripted",
            "prompt": f"what now? (move {move})",
            "sampling": {"max_tokens": 8},
            "completion": f"open fridge-{move}",
            "finish_reason": "stop",
        }
        extra = {"prompt_tokens": 40, "completion_tokens": 3, "latency_ms": 120}
        steps.append(("model_call", call, extra))
        step = {"index": move, "action": f"open fridge-{move}", "reward": 0.0, "done": False}
        step["observation"] = {"observation": f"observation-{move}-marker"}
        steps.append(("env_step", step, {}))
    return steps


@pytest.fixture
def game(project, seed_candidate, humaneval_suite, policy_version) -> Rollout:
    """A rollout with a 301-step trace: a reset, then 150 moves of a model call and a step."""
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    task = Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).first()
    return make_rollout(
        evaluation, task, outcome=RolloutOutcome.TASK_FAILURE, score=0.0, steps=game_steps(150)
    )


def url(project, rollout, **query) -> str:
    base = reverse("web:rollout", args=[project.slug, rollout.id])
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def step_ids(page: str) -> list[str]:
    return re.findall(r'<li class="step step-\w+" id="step-(\d+-\d+)"', page)


def test_it_shows_the_first_page_of_a_long_trace_and_links_the_next(client, owner, project, game):
    client.force_login(owner)
    page = text(client.get(url(project, game)))
    assert step_ids(page) == [f"1-{i}" for i in range(100)]
    assert "301 steps" in plain(client.get(url(project, game)))
    more = re.search(r'<li class="load-more" id="trace-more"><a href="([^"]+)"', page)
    assert more and more[1].startswith("?from=1.100")
    assert 'hx-get="?from=1.100"' in page
    assert 'id="trace-pager"' not in page  # page 1 has no "previous"


def test_it_shows_a_later_page_without_javascript(client, owner, project, game):
    client.force_login(owner)
    page = text(client.get(url(project, game, **{"from": "1.100"})))
    assert step_ids(page) == [f"1-{i}" for i in range(100, 200)]
    assert 'id="trace-pager"' in page and "previous steps" in page
    last = text(client.get(url(project, game, **{"from": "1.300"})))
    assert step_ids(last) == ["1-300"]
    assert 'id="trace-more"' not in last


def test_it_answers_load_more_with_only_the_next_steps(client, owner, project, game):
    client.force_login(owner)
    response = client.get(url(project, game, **{"from": "1.200"}), headers={"HX-Request": "true"})
    body = text(response)
    assert "<html" not in body and "Task prompt" not in body
    assert step_ids(body) == [f"1-{i}" for i in range(200, 300)]
    assert 'hx-get="?from=1.300"' in body
    assert "HX-Request" in response["Vary"]


def test_it_treats_a_malformed_cursor_as_the_first_page(client, owner, project, game):
    client.force_login(owner)
    page = text(client.get(url(project, game, **{"from": "drop table"})))
    assert step_ids(page)[0] == "1-0"


def test_it_shows_a_games_moves_with_tokens_and_latency(client, owner, project, game):
    client.force_login(owner)
    page = plain(client.get(url(project, game)))
    assert "move 1 > open fridge-1 · reward 0.0" in page
    assert "observation-1-marker" in page
    assert "43 tok · 120 ms" in page  # per step: prompt + completion tokens, latency
    assert "model call 150" in page and "env step 150" in page  # counts per kind


def test_it_collapses_model_calls_on_a_long_trace_and_opens_them_on_a_short_one(
    client, owner, project, game, finished_evaluation
):
    client.force_login(owner)
    long_page = text(client.get(url(project, game)))
    assert long_page.count('<details class="model-call">') == 50
    assert '<details class="model-call" open>' not in long_page
    short_page = text(client.get(url(project, finished_evaluation.passed)))
    assert short_page.count('<details class="model-call" open>') == 1


def test_it_searches_within_a_trace(client, owner, project, game):
    client.force_login(owner)
    page = text(client.get(url(project, game, q="fridge-14")))
    # "fridge-14" and "fridge-140".."149": a model call and an env step each.
    assert "22 steps match “fridge-14”." in page
    ids = step_ids(page)
    assert len(ids) == 22 and "1-27" in ids and "1-28" in ids
    assert 'href="?from=1.27#step-1-27">show in context' in page
    assert "observation-1-marker" not in page


def test_it_links_a_harness_exceptions_frames_to_the_candidates_source(
    client, owner, project, finished_evaluation
):
    rollout = finished_evaluation.crashed
    step = rollout.steps.get(kind="harness_exception")
    step.payload["frames"] = [
        {"file": "/usr/lib/python3.11/runpy.py", "line": 88, "function": "_run_code",
         "code": "exec(code)", "in_harness": False},
        {"file": "agent.py", "line": 7, "function": "run", "code": "return 1 / 0",
         "in_harness": True},
    ]  # fmt: skip
    step.save()
    client.force_login(owner)
    page = text(client.get(url(project, rollout)))
    sha = finished_evaluation.evaluation.candidate.sha
    link = reverse("web:candidate_file", args=[project.slug, sha, "agent.py"]) + "#L-7"
    assert f'<a class="frame-link" href="{link}"><code>agent.py:7</code></a>' in page
    assert "runpy.py:88" in page and "files//usr" not in page  # outside frames: no link
    # The target line exists on the file page.
    source = text(client.get(link.split("#")[0]))
    assert 'id="L-7"' in source


def test_it_keeps_a_held_out_trace_sealed_on_every_view(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    marker = "SEALED-TRACE-MARKER"
    task = Task.objects.filter(suite=humaneval_suite, split=Split.HELDOUT).first()
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        split=Split.HELDOUT,
        state=EvaluationState.PENDING,
    )
    rollout = make_rollout(
        evaluation,
        task,
        outcome=RolloutOutcome.PASSED,
        score=1.0,
        steps=[start_step(task), model_call_step(task, marker), ("log", {"message": marker}, {})],
    )
    client.force_login(owner)
    for response in (
        client.get(url(project, rollout)),
        client.get(url(project, rollout, q=marker)),
        client.get(url(project, rollout, **{"from": "1.1"})),
        client.get(url(project, rollout, **{"from": "1.1"}), headers={"HX-Request": "true"}),
    ):
        # Outside a promotion request's pages a held-out rollout is not found at all.
        assert response.status_code == 404
        assert marker not in text(response)
        assert "prompt tokens" not in text(response)


def test_it_never_reads_trace_steps_for_the_evaluation_page(
    client, owner, project, finished_evaluation
):
    client.force_login(owner)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(
            reverse("web:evaluation", args=[project.slug, finished_evaluation.evaluation.id])
        )
    assert response.status_code == 200
    assert queries.captured_queries
    assert not [q for q in queries.captured_queries if "tracestep" in q["sql"].lower()]


def test_it_reads_a_rollout_page_with_a_fixed_number_of_trace_queries(client, owner, project, game):
    client.force_login(owner)
    with CaptureQueriesContext(connection) as queries:
        client.get(url(project, game, **{"from": "1.100"}))
    trace_queries = [q["sql"] for q in queries.captured_queries if "tracestep" in q["sql"].lower()]
    # The page (LIMIT 101), the previous page's cursor, and the two summary aggregates: never
    # a query without a LIMIT that reads payloads.
    assert len(trace_queries) == 4
    assert all("LIMIT" in sql or "payload" not in sql for sql in trace_queries)


def test_it_shows_a_killed_attempts_steps_as_an_earlier_attempt_that_did_not_finish(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    evaluation = make_evaluation(
        candidate=seed_candidate, suite=humaneval_suite, policy_version=policy_version
    )
    task = Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).first()
    # Attempt 1's worker was killed after its model call; attempt 2 ran to the end.
    killed = [start_step(task), model_call_step(task, "    return first_try\n")]
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.TASK_FAILURE, score=0.0, steps=killed
    )
    Rollout.objects.filter(id=rollout.id).update(attempts=2)
    second = killed[:1] + [
        model_call_step(task, "    return second_try\n"),
        ("answer", {"answer": "    return second_try\n"}, {}),
        ("verdict", {"passed": False, "score": 0.0, "detail": "1 of 3 failed"}, {}),
    ]
    add_steps(rollout, second, attempt=2)

    client.force_login(owner)
    response = client.get(url(project, rollout))
    page = text(response)
    assert step_ids(page) == ["1-0", "1-1", "2-0", "2-1", "2-2", "2-3"]
    assert "first_try" in page and "second_try" in page
    shown = plain(response)
    assert "Attempt 1 · an earlier attempt that did not finish; the rollout ran again" in shown
    assert "Attempt 2 · the rollout's result" in shown
    assert "attempt 1 (an earlier attempt that did not finish; the rollout ran again): 2 steps" in (
        shown
    )

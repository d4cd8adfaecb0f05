"""The gate page: verdict, reasons and statistics for members; polling only while it runs."""

from __future__ import annotations

import re

import pytest

from coevo.gates.models import Gate
from coevo.gates.services import gate_advance
from tests.conftest import PASSWORD
from tests.gates.conftest import validation_keys
from tests.support.factories import finish_evaluation
from tests.web.test_pages import plain
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db


def url(gate) -> str:
    return f"/p/{gate.project.slug}/gates/{gate.id}/"


def test_it_polls_while_the_gate_runs_and_stops_when_it_is_final(
    client, owner, make_gate, humaneval_suite
):
    keys = validation_keys(humaneval_suite)
    gate = make_gate(min_score=0.1, critical_tasks=keys[:1])
    client.login(username=owner.username, password=PASSWORD)

    running = client.get(url(gate)).content.decode()
    assert 'hx-get="' + url(gate) in running
    assert 'id="gate-verdict"' not in running
    assert (
        f"?reference={gate.baseline_evaluation_id}&amp;candidate={gate.candidate_evaluation_id}"
        in running
    )

    finish_evaluation(gate.baseline_evaluation, passed=keys)
    finish_evaluation(gate.candidate_evaluation, passed=keys[1:])
    gate_advance(gate_id=gate.id)
    partial = client.get(url(gate), HTTP_HX_REQUEST="true").content.decode()

    assert "<html" not in partial
    assert "hx-get" not in partial
    assert 'id="gate-verdict">fail<' in partial
    assert f"Newly failing critical task(s): {keys[0]}" in partial
    assert f'id="gate-broken">1: {keys[0]}<' in partial
    assert f"/p/demo/e/{gate.candidate_evaluation_id}/" in partial


def test_an_outsider_gets_404(client, outsider, make_gate):
    gate = make_gate(min_score=0.1)
    client.login(username=outsider.username, password=PASSWORD)
    assert client.get(url(gate)).status_code == 404


def test_it_sends_anonymous_visitors_to_the_login_page(client, make_gate):
    gate = make_gate(min_score=0.1)
    response = client.get(url(gate))
    assert response.status_code == 302 and "/login/" in response["Location"]


def two_task_gate(make_gate, suite):
    """A gate judged on two tasks scored on both sides (the rest infra errors): both fixed, an
    exact McNemar p = 0.5 and a bootstrap interval of [+100, +100] pts (issue 38)."""
    keys = validation_keys(suite)
    gate = make_gate(max_regression=0.1)
    lost = {key: RolloutOutcome.INFRA_ERROR for key in keys[2:]}
    finish_evaluation(gate.baseline_evaluation, outcomes=lost)
    finish_evaluation(gate.candidate_evaluation, passed=keys[:2], outcomes=lost)
    return gate_advance(gate_id=gate.id)


def test_it_names_what_decides_and_shows_no_interval_over_two_tasks(
    client, owner, make_gate, humaneval_suite
):
    gate = two_task_gate(make_gate, humaneval_suite)
    client.login(username=owner.username, password=PASSWORD)
    body = plain(client.get(url(gate)))

    assert gate.verdict == "inconclusive"
    assert "too few tasks for the interval this rule is judged on" in body
    assert (
        "paired difference pass rate difference +100.0 pts over 2 tasks · too few tasks (n=2) "
        "for an interval · max_regression is judged on its interval"
    ) in body
    assert (
        "exact McNemar no significant difference (p = 0.5000) · the comparison page's verdict; "
        "no rule of this gate uses it"
    ) in body
    assert "score pass rate" in body
    assert not re.search(r"\[\+100\.0 pts, \+100\.0 pts\]", body)


def test_a_gate_stored_before_its_statistics_were_labelled_still_renders(
    client, owner, make_gate, humaneval_suite
):
    gate = two_task_gate(make_gate, humaneval_suite)
    old = {**gate.statistics, "comparison": dict(gate.statistics["comparison"])}
    for key in ("kind", "significant"):
        old["comparison"].pop(key)
    Gate.objects.filter(id=gate.id).update(statistics=old)
    client.login(username=owner.username, password=PASSWORD)
    body = plain(client.get(url(gate)))
    assert "mean per-task score difference +100.0 pts" in body
    assert "no significant difference (p = 0.5000)" in body

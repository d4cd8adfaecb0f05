"""The gate page: verdict, reasons and statistics for members; polling only while it runs."""

from __future__ import annotations

import pytest

from coevo.gates.services import gate_advance
from tests.conftest import PASSWORD
from tests.gates.conftest import validation_keys
from tests.support.factories import finish_evaluation

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

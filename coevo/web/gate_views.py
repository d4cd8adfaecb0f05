"""The gate page: verdict, reasons, statistics and links to both evaluations and their
comparison. While the gate runs, htmx polls the status partial; its final render stops."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

from coevo.evaluations.selectors import evaluation_progress
from coevo.gates.selectors import gate_get
from coevo.projects.models import Project
from coevo.web.access import project_view
from coevo.web.presenters import gate_statistics, gate_verdict_badge


@project_view
def gate_detail(request: HttpRequest, project: Project, gate_id: UUID) -> HttpResponse:
    gate = gate_get(project=project, gate_id=gate_id)
    candidate_evaluation = gate.candidate_evaluation
    baseline_evaluation = gate.baseline_evaluation
    context = {
        "project": project,
        "gate": gate,
        "verdict_badge": gate_verdict_badge(gate.verdict),
        "candidate_evaluation": candidate_evaluation,
        "baseline_evaluation": baseline_evaluation,
        "candidate_progress": evaluation_progress(evaluation=candidate_evaluation),
        "baseline_progress": evaluation_progress(evaluation=baseline_evaluation),
        "statistics": gate_statistics(gate=gate),
    }
    partial = request.htmx and not request.htmx.history_restore_request
    template = "web/_gate_status.html" if partial else "web/gate.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response

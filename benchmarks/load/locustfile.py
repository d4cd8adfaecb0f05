"""The load benchmark's users (issue 21, item 2): each reads the dashboard's heavy pages and
every list endpoint of the API, one task each, named so that locust's stats give one row per
page or endpoint. Targets (paths, names, the session and token) come from
benchmarks/load/setup.py's JSON, at $COEVO_LOAD_TARGETS.

    COEVO_LOAD_TARGETS=var/load/targets.json locust -f benchmarks/load/locustfile.py \\
      --headless -u 16 -r 4 -t 60s --host http://127.0.0.1:8088 --csv var/load/run --only-summary

Pages send the session cookie, the API ``Authorization: Bearer <token>``; redirects are not
followed, and anything but 200 is a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from locust import HttpUser, between, task

TARGETS: dict[str, Any] = json.loads(
    Path(os.environ.get("COEVO_LOAD_TARGETS", "var/load/targets.json")).read_text()
)


class DashboardAndApiUser(HttpUser):
    wait_time = between(0.5, 1.5)

    def get(self, key: str) -> None:
        """GET the target ``key`` (absent when the project has no such thing: then nothing)."""
        target = TARGETS["requests"].get(key)
        if target is None:
            return
        headers: dict[str, str] = {}
        cookies: dict[str, str] = {}
        if target["auth"] == "token":
            headers["Authorization"] = f"Bearer {TARGETS['token']}"
        else:
            cookies[TARGETS["cookie_name"]] = TARGETS["sessions"][target["auth"]]
        with self.client.get(
            target["path"],
            name=target["name"],
            headers=headers,
            cookies=cookies,
            allow_redirects=False,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
            else:
                response.success()

    # --- pages -------------------------------------------------------------------------------

    @task
    def project(self) -> None:
        self.get("project")

    @task
    def candidates_older(self) -> None:
        self.get("candidates_older")

    @task
    def candidate_search(self) -> None:
        self.get("candidate_search")

    @task
    def campaign(self) -> None:
        self.get("campaign")

    @task
    def evaluation(self) -> None:
        self.get("evaluation")

    @task
    def comparison(self) -> None:
        self.get("comparison")

    @task
    def matrix(self) -> None:
        self.get("matrix")

    @task
    def audit(self) -> None:
        self.get("audit")

    @task
    def global_audit(self) -> None:
        self.get("global_audit")

    @task
    def global_audit_action(self) -> None:
        self.get("global_audit_action")

    @task
    def trace(self) -> None:
        self.get("trace")

    # --- API lists ---------------------------------------------------------------------------

    @task
    def api_projects(self) -> None:
        self.get("api_projects")

    @task
    def api_candidates(self) -> None:
        self.get("api_candidates")

    @task
    def api_suites(self) -> None:
        self.get("api_suites")

    @task
    def api_evaluations(self) -> None:
        self.get("api_evaluations")

    @task
    def api_evaluations_search(self) -> None:
        self.get("api_evaluations_search")

    @task
    def api_evaluation_tasks(self) -> None:
        self.get("api_evaluation_tasks")

    @task
    def api_campaigns(self) -> None:
        self.get("api_campaigns")

    @task
    def api_proposals(self) -> None:
        self.get("api_proposals")

    @task
    def api_channels(self) -> None:
        self.get("api_channels")

    @task
    def api_matrices(self) -> None:
        self.get("api_matrices")

    @task
    def api_gates(self) -> None:
        self.get("api_gates")

    @task
    def api_exports(self) -> None:
        self.get("api_exports")

    @task
    def api_training_runs(self) -> None:
        self.get("api_training_runs")

    @task
    def api_trainers(self) -> None:
        self.get("api_trainers")

    @task
    def api_promotions(self) -> None:
        self.get("api_promotions")


# Every target setup.py wrote has its task (named as its key): none is silently left out.
_untasked = sorted(set(TARGETS["requests"]) - set(vars(DashboardAndApiUser)))
if _untasked:
    raise SystemExit(f"targets without a task in {__file__}: {', '.join(_untasked)}")

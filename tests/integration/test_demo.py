"""The README's first command, minus installation: `coevo demo` on the embedded default (SQLite,
the filesystem broker, a real prefork Celery worker, gunicorn and llama.cpp with Gemma 3 270M),
in a fresh COEVO_HOME, as a separate process, on a small budget: the HumanEval evaluation, the
campaign from the naive TextWorld seed, the promotion of its best candidate to production on
the sealed held-out games (the campaign's own rules checked in its database: it stops by
itself, every proposal is a sampled point, the best is chosen on validation); then, in headless
Chromium, the second demo login (the reviewer) approves it and production moves, as a person
following the demo's printout would."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from coevo.campaigns.models import PROPOSAL_FINAL_STATES, ProposerKind
from coevo.demo.campaign import CAMPAIGN_KNOBS
from tests.support.net import free_port

pytestmark = [pytest.mark.llm, pytest.mark.browser, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "var" / "test-artifacts" / "screenshots"
# One game a split, a few steps a game, two proposals: the naive seed wins nothing, and the
# good setting (order = "priority", drawn by the campaign's sampler with seed 0) takes points
# within these steps (benchmarks/README.md, "Demo campaign").
DEMO_ARGS = ["--tasks", "1", "--campaign-tasks", "1", "--campaign-max-steps", "6",
             "--campaign-proposals", "2"]  # fmt: skip


class Demo:
    """`coevo demo` as a child process whose output is read line by line as it comes."""

    def __init__(self, home: Path, args: list[str]) -> None:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DATABASE_URL", "CELERY_", "COEVO_", "DJANGO_"))
        }
        env["COEVO_HOME"] = str(home)
        self.port = free_port()
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "coevo"), "demo", *args,
             "--port", str(self.port), "--policy-port", str(free_port())],
            env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # Ctrl-C as a person's terminal sends it: a test run in the background (a CI lane
            # started with &) inherits SIGINT ignored, and the demo would never see it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            try:
                line = self._queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                raise AssertionError(
                    f"the demo did not print {text!r} (exit code {self.process.poll()}):\n"
                    + "\n".join(self.lines[-60:])
                )
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def test_the_demo_evolves_the_naive_seed_and_its_reviewer_approves_the_promotion(
    tmp_path, page: Page
):
    home = tmp_path / "home"
    demo = Demo(home, DEMO_ARGS)
    try:
        demo.wait_for("serving until Ctrl-C", timeout_s=780)
        out = demo.output
        assert re.search(r"^Summary: score .* · (\d+)/1 tasks passed .* tokens · \d+m\d\ds$",
                         out, re.MULTILINE), out  # fmt: skip
        assert re.search(r"^Dashboard: http://127\.0\.0\.1:\d+/p/demo/e/[0-9a-f-]{36}/  "
                         r"\(login demo / \S+\)$", out, re.MULTILINE), out  # fmt: skip
        assert "examples/textworld-naive" in out
        campaign = re.search(
            r"^Campaign summary: seed score (\S+) search, (\S+) validation · best validation "
            r"(\S+) \(([0-9a-f]{12})\)",
            out,
            re.MULTILINE,
        )
        assert campaign, f"the campaign found nothing better than the naive seed:\n{out}"
        seed_validation, best_validation = campaign.group(2), campaign.group(3)
        assert float(best_validation.rstrip("%")) > float(seed_validation.rstrip("%")), out
        assert re.search(r"^Best candidate [0-9a-f]{12}: .*order = ", out, re.MULTILINE), out
        assert re.search(r"^Held-out: candidate \S+ on 1 game vs reference \S+: paired "
                         r"difference", out, re.MULTILINE), out  # fmt: skip
        review = re.search(
            r"^Review: (http://127\.0\.0\.1:\d+/p/demo/promotions/[0-9a-f-]{36}/)  "
            r"\(approve as reviewer / (\S+);",
            out,
            re.MULTILINE,
        )
        assert review, out
        url, password = review.groups()
        assert re.search(rf"^Promotion to production: ready · {re.escape(url)}$", out, re.MULTILINE)

        # The reviewer, as the printout tells them.
        base = f"http://127.0.0.1:{demo.port}"
        page.goto(f"{base}/login/")
        page.fill("#id_username", "reviewer")
        page.fill("#id_password", password)
        page.get_by_role("button", name="Log in").click()
        page.goto(url)
        expect(page.locator("#promotion-state")).to_have_text("ready")
        expect(page.locator("#scores")).to_contain_text(campaign.group(4))
        expect(page.locator("#comparison")).to_be_visible()
        expect(page.locator("#gap")).to_be_visible()
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "demo-review.png"), full_page=True)
        page.fill("#decision-comment", "The demo's held-out game confirms the gain.")
        page.locator("#approve").click()
        expect(page.locator("#promotion-state")).to_have_text("approved")
        page.locator("#promotion-meta").get_by_role("link", name="production").click()
        expect(page.locator("#channel-production dd.holder")).to_contain_text(campaign.group(4))
        page.screenshot(path=str(SCREENSHOTS / "demo-approved.png"), full_page=True)
    finally:
        code = demo.stop()
    assert code == 0, demo.output[-3000:]
    with sqlite3.connect(home / "coevo.sqlite3") as db:
        rollouts = db.execute("select state, outcome from evaluations_rollout").fetchall()
        assert db.execute("select state from reviews_promotionrequest").fetchall() == [
            ("approved",)
        ]
        # The demo's policy is the coevo llama.cpp host, registered as the kind that loads
        # LoRA adapters at run time (a policy step's adapters are served through it).
        assert db.execute("select kind from policies_policyendpoint").fetchall() == [("llamacpp",)]
        # The campaign: finished by its own stop rule, the best chosen on validation.
        ((state, stop_reason, best_score, best_candidate),) = db.execute(
            "select state, stop_reason, best_validation_score, best_candidate_id"
            " from campaigns_campaign"
        ).fetchall()
        proposals = db.execute(
            "select kind, state, trial_number, params, validation_score, candidate_id"
            " from campaigns_proposal order by sequence"
        ).fetchall()
    assert (state, stop_reason) == ("finished", "max proposals reached (2)")
    assert [p[0] for p in proposals] == [ProposerKind.SEED] + [ProposerKind.CONFIG] * 2
    assert all(p[1] in PROPOSAL_FINAL_STATES for p in proposals), proposals
    validated = [p for p in proposals if p[4] is not None]
    assert proposals[0] in validated, "the seed is evaluated on validation first"
    # The best is the top validation score (the earliest one on ties), never a search score.
    top = max(p[4] for p in validated)
    assert best_score == top
    assert best_candidate == next(p[5] for p in validated if p[4] == top)
    for _, _, trial_number, params, _, _ in proposals[1:]:
        assert trial_number is not None and set(json.loads(params)) == set(CAMPAIGN_KNOBS)
    assert rollouts and all(
        state == "done" and outcome in ("passed", "task_failure") for state, outcome in rollouts
    ), rollouts

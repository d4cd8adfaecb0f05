"""The demo's long steps print a start line, heartbeats with the elapsed time and what they wait
on, and an end line with the duration (issue 38: 6 and 10 minutes passed without output)."""

from __future__ import annotations

import re
import time

import pytest

from coevo.demo.humaneval import wait_for_evaluation
from coevo.demo.progress import ProgressStep, progress_step
from coevo.evaluations.models import EvaluationState
from tests.support.factories import make_evaluation

HEARTBEAT = re.compile(r"^  … \d+m\d\ds: ")


def test_it_prints_heartbeats_with_the_elapsed_time_while_a_step_blocks():
    lines: list[str] = []
    with progress_step(
        "starting the policy server", waiting_on="its model", every_s=0.05, out=lines.append
    ):
        time.sleep(0.6)  # about 12 heartbeats: the bounds below are generous

    assert lines[0] == "coevo: starting the policy server …"
    beats = lines[1:-1]
    assert 2 <= len(beats) <= 40, lines
    assert all(HEARTBEAT.match(line) and line.endswith(": its model") for line in beats), lines
    assert re.fullmatch(r"coevo: starting the policy server: done in 0m0\ds", lines[-1])


def test_a_polling_loop_prints_each_new_status_once_and_repeats_it_when_a_heartbeat_is_due():
    now = [100.0]
    lines: list[str] = []
    step = ProgressStep("campaign", every_s=30, out=lines.append, clock=lambda: now[0])

    step.update("proposal 2 of 3: search 5/8 games played")
    now[0] += 10
    step.update("proposal 2 of 3: search 5/8 games played")  # unchanged, not due: silent
    step.heartbeat()
    now[0] += 25
    step.heartbeat()  # 35 s since the last line
    now[0] += 5
    step.update("proposal 2 of 3: search 6/8 games played")

    assert lines == [
        "  … 0m00s: proposal 2 of 3: search 5/8 games played",
        "  … 0m35s: proposal 2 of 3: search 5/8 games played",
        "  … 0m40s: proposal 2 of 3: search 6/8 games played",
    ]


def test_a_step_that_raises_says_it_stopped_and_after_how_long():
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt), progress_step("campaign", out=lines.append):
        raise KeyboardInterrupt
    assert re.fullmatch(r"coevo: campaign: stopped after 0m00s \(KeyboardInterrupt\)", lines[-1])


class FinishOnSecondCheck:
    """The demo's services, as the polling loop sees them: the worker finishes the
    evaluation between two polls."""

    def __init__(self, evaluation):
        self.evaluation, self.checks = evaluation, 0

    def check_alive(self) -> None:
        self.checks += 1
        if self.checks == 2:
            type(self.evaluation).objects.filter(id=self.evaluation.id).update(
                state=EvaluationState.FINISHED
            )


def test_the_evaluation_polling_prints_its_status_with_the_elapsed_time(
    seed_candidate, humaneval_suite, policy_version, capsys
):
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.RUNNING,
    )

    wait_for_evaluation(evaluation, FinishOnSecondCheck(evaluation), every_s=0.5)

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "coevo: HumanEval evaluation …"
    statuses = [line for line in lines if "rollouts done" in line]
    # The first poll's status, then (a second later) at least one heartbeat repeating it.
    assert len(statuses) >= 2, lines
    assert all(HEARTBEAT.match(line) for line in statuses), lines
    assert statuses[0].endswith("0/0 rollouts done, 0 passed, 0 harness errors, 0 infra errors")
    assert re.fullmatch(r"coevo: HumanEval evaluation: done in 0m0\ds", lines[-1])

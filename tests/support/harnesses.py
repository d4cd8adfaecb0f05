"""One sandboxed rollout of a harness on HumanEval/2, through the real runner and verifier."""

from __future__ import annotations

from pathlib import Path

from coevo.policies.client import PolicyClient
from coevo.suites.humaneval import humaneval_problems
from workers.environments import humaneval
from workers.rollout import RolloutInputs, execute_rollout

PROBLEM = humaneval_problems()[0][2]  # HumanEval/2: truncate_number
CORRECT = "    return number % 1.0\n"


def humaneval_rollout(
    harness: Path,
    url: str,
    *,
    knobs: dict | None = None,
    test: str | None = None,
    kind: str = "openai-compatible",
):
    """Run ``harness`` on HumanEval/2 against the policy at ``url`` (an endpoint of ``kind``);
    ``test`` replaces the hidden tests."""
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key=PROBLEM.task_id,
        task_view=humaneval.harness_view(
            {"prompt": PROBLEM.prompt, "entry_point": PROBLEM.entry_point}
        ),
        knob_overrides=knobs or {},
        seed=7,
        wall_time_s=60,
    )
    with PolicyClient(url, model="scripted", retries=1, backoff_s=0.01, kind=kind) as client:
        return execute_rollout(
            inputs,
            policy=client,
            verify=lambda answer: humaneval.verify(
                inputs={"prompt": PROBLEM.prompt},
                verifier={"test": test or PROBLEM.test, "entry_point": PROBLEM.entry_point},
                answer=answer,
            ),
        )

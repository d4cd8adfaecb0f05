"""Time a harness's model call spends waiting for a concurrency slot of its endpoint is the
platform's, not the harness's: its wall time (and the timer that kills its sandbox) moves by it,
for a run(task, ctx) harness and for a program. A sandboxed harness, the scripted policy server
and the real Redis."""

from __future__ import annotations

import os
import textwrap
import threading
import uuid
from pathlib import Path

import pytest
import redis

from coevo.policies.client import PolicyClient
from coevo.policies.concurrency import EndpointLimiter, slot_keys
from workers.environments.base import Verdict
from workers.rollout import RolloutInputs, RolloutOutcome, execute_rollout

REDIS_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
WALL_S = 4
HELD_S = 6  # longer than the whole wall time

CTX_AGENT = """
def run(task, ctx):
    return ctx.llm.complete("say ok", max_tokens=4).text
"""
PROGRAM_AGENT = """
import json, os, urllib.request
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/completions",
    data=json.dumps({"model": "m", "prompt": "say ok", "max_tokens": 4}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})
text = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["text"]
json.dump(text, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


@pytest.fixture
def endpoint_id():
    endpoint = f"test-{uuid.uuid4().hex}"
    yield endpoint
    redis.Redis.from_url(REDIS_URL).delete(*slot_keys(endpoint))


def harness(tmp_path: Path, *, program: bool) -> Path:
    directory = tmp_path / "harness"
    directory.mkdir()
    head = (
        'command = ["python", "agent.py"]\n'
        if program
        else 'entrypoint = "agent:run"\npolicy_api = "completions"\n'
    )
    (directory / "harness.toml").write_text(
        f'[harness]\nname = "slots"\n{head}\n[limits]\nwall_time_s = {WALL_S}\n'
    )
    (directory / "agent.py").write_text(textwrap.dedent(PROGRAM_AGENT if program else CTX_AGENT))
    return directory


@pytest.mark.parametrize("program", [False, True], ids=["ctx", "program"])
def test_waiting_for_a_policy_slot_is_not_counted_against_the_wall_time(
    tmp_path, scripted_policy, endpoint_id, program
):
    scripted_policy.rules.append(("say ok", "ok"))
    other = EndpointLimiter(endpoint_id=endpoint_id, limit=1, redis_url=REDIS_URL, lease_s=3)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with other.slot():
            held.set()
            release.wait(HELD_S)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)
    limiter = EndpointLimiter(
        endpoint_id=endpoint_id, limit=1, redis_url=REDIS_URL, lease_s=3, holder="rollout t"
    )
    inputs = RolloutInputs(
        harness_dir=harness(tmp_path, program=program),
        task_key="t",
        task_view={"question": "say ok"},
        knob_overrides={},
        seed=1,
        wall_time_s=60,
    )
    with PolicyClient(scripted_policy.url, model="scripted", limiter=limiter) as client:
        result = execute_rollout(
            inputs,
            policy=client,
            verify=lambda answer: Verdict(answer == "ok", float(answer == "ok"), "checked"),
        )
    release.set()

    # The call waited ~6 s for the slot, past the 4 s wall time, and the harness still passed.
    assert (result.outcome, result.answer) == (RolloutOutcome.PASSED, "ok"), result.detail

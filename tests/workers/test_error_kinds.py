"""Each way a rollout fails carries its kind from where it is raised (workers/outcomes.py):
real sandboxed harnesses, and policies that fail with messages naming no kind at all."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from coevo.errors import PolicyRequestRejected, PolicyUnavailable, SandboxUnavailable
from workers import channel as channel_module
from workers.environments.base import Verdict
from workers.outcomes import ErrorKind, RolloutOutcome
from workers.policy import Completion, Sampling
from workers.rollout import RolloutInputs, RolloutResult, execute_rollout

MANIFEST = """
[harness]
name = "t"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 2
wall_time_s = 20
"""


class StubPolicy:
    """Answers every call with ``text``, or raises ``error``."""

    def __init__(self, *, error: Exception | None = None, text: str = "42") -> None:
        self.error = error
        self.text = text

    def complete(self, prompt: str, sampling: Sampling) -> Completion:
        if self.error is not None:
            raise self.error
        return Completion(
            text=self.text,
            finish_reason="stop",
            prompt_tokens=1,
            completion_tokens=1,
            latency_ms=0,
            model="stub",
        )

    def chat(self, messages: list, sampling: Sampling) -> Completion:
        return self.complete("", sampling)


def rollout(tmp_path: Path, agent: str, *, policy=None, manifest: str = MANIFEST) -> RolloutResult:
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(manifest)
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="t/1",
        task_view={"question": "?"},
        knob_overrides={},
        seed=0,
        wall_time_s=20,
    )
    return execute_rollout(
        inputs,
        policy=policy or StubPolicy(),
        verify=lambda answer: Verdict(answer == "42", float(answer == "42"), "compared"),
    )


ASK = """
def run(task, ctx):
    return ctx.llm.complete(prompt="q", max_tokens=4).text
"""


def agent(*lines: str) -> str:
    return "import os\n\ndef run(task, ctx):\n" + "".join(f"    {line}\n" for line in lines)


# name: (harness source, manifest, kind, the start of the detail: which raise site it was)
HARNESS_FAULTS = {
    "manifest": (agent("return '42'"), "[harness]\n", ErrorKind.MANIFEST, "invalid harness: "),
    "limit": (
        agent("for _ in range(3):", "    ctx.llm.complete(prompt='q', max_tokens=4)"),
        MANIFEST,
        ErrorKind.LIMIT,
        "limit exceeded: max_model_calls = 2",
    ),
    "protocol": (
        agent("print('hi')", "return ''"),
        MANIFEST,
        ErrorKind.PROTOCOL,
        "protocol violation: the harness wrote non-JSON to stdout",
    ),
    "undeclared policy_api": (
        agent("return ctx.llm.chat(messages=[{'role': 'user', 'content': 'q'}]).text"),
        MANIFEST,
        ErrorKind.PROTOCOL,
        "the manifest declares policy_api = 'completions' but the harness called ctx.llm.chat",
    ),
    "invalid argument": (
        agent("return ctx.llm.complete(prompt=3).text"),
        MANIFEST,
        ErrorKind.OTHER,
        "ctx.llm.complete: prompt must be a string, got int",
    ),
    "exception": (
        agent("raise ValueError('nope')"),
        MANIFEST,
        ErrorKind.EXCEPTION,
        "the harness raised ValueError: nope",
    ),
    "exited": (
        agent("os._exit(3)"),
        MANIFEST,
        ErrorKind.EXITED,
        "the harness process exited with code 3 before answering",
    ),
}


@pytest.mark.parametrize(
    ("source", "manifest", "kind", "detail"), HARNESS_FAULTS.values(), ids=HARNESS_FAULTS
)
def test_it_gives_each_harness_fault_the_kind_of_its_raise_site(
    tmp_path, source, manifest, kind, detail
):
    result = rollout(tmp_path, source, manifest=manifest)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail.startswith(detail), result.detail
    assert result.error_kind == kind


def test_it_classifies_a_harness_exception_by_its_kind_not_by_the_words_in_its_message(tmp_path):
    agent = """
    def run(task, ctx):
        raise RuntimeError("limit exceeded: protocol violation in the sandbox (policy)")
    """

    result = rollout(tmp_path, agent)

    assert result.detail.startswith("the harness raised RuntimeError: limit exceeded")
    assert result.error_kind == ErrorKind.EXCEPTION


def test_it_gives_a_scored_rollout_no_kind(tmp_path):
    result = rollout(tmp_path, ASK)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.error_kind == ErrorKind.NONE == ""


# Messages that name no kind: the kind comes from the exception's type alone.
POLICY_FAILURES = {
    "unavailable": (PolicyUnavailable("no answer from 127.0.0.1:9"), RolloutOutcome.INFRA_ERROR),
    "rejected": (
        PolicyRequestRejected("HTTP 400: too long", status=400),
        RolloutOutcome.HARNESS_ERROR,
    ),
}


@pytest.mark.parametrize(("error", "outcome"), POLICY_FAILURES.values(), ids=POLICY_FAILURES)
def test_it_gives_a_failed_model_call_the_policy_kind(tmp_path, error, outcome):
    result = rollout(tmp_path, ASK, policy=StubPolicy(error=error))

    assert result.outcome == outcome
    assert result.detail == str(error)
    assert result.error_kind == ErrorKind.POLICY


def test_it_gives_a_sandbox_that_cannot_start_the_sandbox_kind(tmp_path, monkeypatch):
    def no_sandbox(*args, **kwargs):
        raise SandboxUnavailable("bwrap is missing")

    # Both ways a harness's sandbox starts ask for the sandbox mode first: cold and warm.
    monkeypatch.setattr(channel_module.sandbox, "sandbox_mode", no_sandbox)

    result = rollout(tmp_path, ASK)

    assert (result.outcome, result.detail) == (RolloutOutcome.INFRA_ERROR, "bwrap is missing")
    assert result.error_kind == ErrorKind.SANDBOX

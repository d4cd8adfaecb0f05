"""The harness contract end to end: real sandboxed harness processes, the scripted policy server.

``ctx.llm.chat`` and ``complete`` with samples, every limit the worker enforces, multi-step
episodes through ``ctx.env`` (a counter game implementing the Episode protocol), suite helpers
(HumanEval's ``ctx.check``), malformed requests, and the structured traceback of a crash.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from coevo.policies.client import PolicyClient
from coevo.suites.humaneval import humaneval_problems
from workers.environments import humaneval
from workers.environments.base import Environment, StepResult, Verdict
from workers.rollout import RolloutInputs, RolloutOutcome, TaskEnvironment, execute_rollout

PROBLEM = humaneval_problems()[0][2]  # HumanEval/2: truncate_number
CORRECT = "    return number % 1.0\n"
WRONG = "    return number\n"
GOAL = 3


def make_harness(
    tmp_path: Path,
    agent: str,
    *,
    api: str = "completions",
    limits: str = "",
    wall: int = 30,
    files: dict[str, str] | None = None,
) -> Path:
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "harness.toml").write_text(
        f'[harness]\nname = "t"\nentrypoint = "agent:run"\npolicy_api = "{api}"\n'
        f"[limits]\nwall_time_s = {wall}\n{limits}\n"
    )
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    for name, text in (files or {}).items():
        (harness / name).parent.mkdir(parents=True, exist_ok=True)
        (harness / name).write_text(textwrap.dedent(text))
    return harness


# --- a multi-step suite: reach 3 by stepping "inc" ------------------------------------------


class CounterEpisode:
    def __init__(self, *, inputs: dict[str, Any], seed: int) -> None:
        self.max_moves = inputs.get("max_moves")
        self.count = 0
        self.moves = 0
        self.closed = False
        self.seed = seed

    def reset(self) -> dict[str, Any]:
        self.count = self.moves = 0
        return {"observation": "count 0", "objective": f"reach {GOAL}"}

    def step(self, action: str) -> StepResult:
        self.moves += 1
        reward = 0.0
        if action == "inc":
            self.count += 1
            reward = 1.0
        out_of_moves = self.max_moves is not None and self.moves >= self.max_moves
        done = self.count >= GOAL or out_of_moves
        return StepResult({"observation": f"count {self.count}"}, reward, done)

    def verdict(self) -> Verdict:
        won = self.count >= GOAL
        return Verdict(won, self.count / GOAL, "won" if won else f"reached {self.count}")

    def close(self) -> None:
        self.closed = True


class CounterEnvironment(Environment):
    """A multi-step environment of the test's own: it keeps the episodes it opened."""

    multi_step = True

    def __init__(self) -> None:
        self.episodes: list[CounterEpisode] = []

    def harness_view(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"goal": GOAL}

    def open_episode(self, *, inputs: dict[str, Any], verifier: dict[str, Any], seed: int):
        episode = CounterEpisode(inputs=inputs, seed=seed)
        self.episodes.append(episode)
        return episode


def counter_adapter() -> CounterEnvironment:
    return CounterEnvironment()


def humaneval_environment() -> TaskEnvironment:
    return TaskEnvironment(
        adapter=humaneval.HumanEvalEnvironment(),
        inputs={"prompt": PROBLEM.prompt, "entry_point": PROBLEM.entry_point},
        verifier={"test": PROBLEM.test, "entry_point": PROBLEM.entry_point},
    )


def run(harness: Path, url: str, environment: TaskEnvironment | None = None):
    environment = environment or humaneval_environment()
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key="t-1",
        task_view=environment.adapter.harness_view(environment.inputs),
        knob_overrides={},
        seed=11,
        wall_time_s=60,
        policy_version="base-v1",
    )
    with PolicyClient(url, model="scripted", retries=1, backoff_s=0.01) as client:
        return execute_rollout(inputs, policy=client, environment=environment)


def steps_of(result, kind: str) -> list:
    return [step for step in result.steps if step.kind == kind]


# --- ctx.llm ------------------------------------------------------------------------------


def test_it_answers_ctx_llm_chat_with_samples_and_records_each_call(scripted_policy, tmp_path):
    scripted_policy.rules.append(("capital of France", "Paris\n"))
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            reply = ctx.llm.chat(
                [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "The capital of France?"}],
                max_tokens=8, temperature=0.5, top_p=0.9, stop=["\\n\\n"], n=2, seed=40,
            )
            return {"texts": reply.texts, "text": reply.text, "model": reply.model,
                    "reasons": reply.finish_reasons}
        """,
        api="chat",
    )

    result = run(harness, scripted_policy.url)

    assert result.answer == {
        "texts": ["Paris\n", "Paris\n"],
        "text": "Paris\n",
        "model": "scripted",
        "reasons": ["stop", "stop"],
    }
    assert [r["path"] for r in scripted_policy.requests] == ["/v1/chat/completions"] * 2
    assert [r["seed"] for r in scripted_policy.requests] == [40, 41]
    assert scripted_policy.requests[0]["messages"][1]["content"] == "The capital of France?"
    assert scripted_policy.requests[0]["stop"] == ["\n\n"]
    calls = steps_of(result, "model_call")
    assert [c.payload["sample"] for c in calls] == [0, 1]
    first = calls[0].payload
    assert first["api"] == "chat"
    assert first["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["sampling"]["temperature"] == 0.5 and first["sampling"]["top_p"] == 0.9
    assert first["completion"] == "Paris\n" and first["finish_reason"] == "stop"
    assert first["model"] == "scripted" and first["policy_version"] == "base-v1"
    assert calls[0].prompt_tokens > 0 and calls[0].completion_tokens == 1
    assert result.model_calls == 2


def test_it_draws_n_completion_samples_as_n_recorded_calls(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            return ctx.llm.complete("def f():", n=3, max_tokens=16).texts
        """,
        limits="max_model_calls = 3",
    )

    result = run(harness, scripted_policy.url)

    assert result.answer == ["    pass\n"] * 3
    assert [r["path"] for r in scripted_policy.requests] == ["/v1/completions"] * 3
    assert len({r["seed"] for r in scripted_policy.requests}) == 3
    calls = steps_of(result, "model_call")
    assert [(c.payload["sample"], c.payload["n"]) for c in calls] == [(0, 3), (1, 3), (2, 3)]
    assert all(c.payload["prompt"] == "def f():" for c in calls)


@pytest.mark.parametrize(
    ("api", "call", "expected"),
    [
        (
            "completions",
            'ctx.llm.chat([{"role": "user", "content": "hi"}])',
            "policy_api = 'completions' but the harness called ctx.llm.chat",
        ),
        (
            "chat",
            'ctx.llm.complete("hi")',
            "policy_api = 'chat' but the harness called ctx.llm.complete",
        ),
    ],
)
def test_it_refuses_the_policy_api_the_manifest_does_not_declare(
    scripted_policy, tmp_path, api, call, expected
):
    harness = make_harness(tmp_path, f"def run(task, ctx):\n    return {call}\n", api=api)

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert expected in result.detail
    assert scripted_policy.requests == []


@pytest.mark.parametrize(
    ("api", "call", "expected"),
    [
        ("completions", 'ctx.llm.complete("x", temperature="hot")', "temperature must be a number"),
        ("completions", 'ctx.llm.complete("x", max_tokens=0)', "max_tokens must be positive"),
        ("completions", 'ctx.llm.complete("x", n=17)', "n must be between 1 and 16"),
        ("completions", 'ctx.llm.complete("x", stop=[3])', "stop must be a list"),
        ("completions", "ctx.llm.complete(42)", "prompt must be a string"),
        (
            "chat",
            'ctx.llm.chat([{"role": "robot", "content": "x"}])',
            "messages[0].role must be one of",
        ),
        ("chat", 'ctx.llm.chat([{"role": "user", "content": 5}])', "messages[0].content"),
        ("chat", "ctx.llm.chat([])", "messages must be a non-empty list"),
    ],
)
def test_it_ends_a_malformed_model_call_naming_the_call_and_field(
    scripted_policy, tmp_path, api, call, expected
):
    harness = make_harness(tmp_path, f"def run(task, ctx):\n    return {call}\n", api=api)

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail.startswith(f"ctx.llm.{'chat' if api == 'chat' else 'complete'}: ")
    assert expected in result.detail
    assert scripted_policy.requests == []


def test_it_ends_a_call_whose_params_are_not_an_object_as_a_protocol_violation(
    scripted_policy, tmp_path
):
    harness = make_harness(
        tmp_path,
        """
        import json, sys

        def run(task, ctx):
            sys.stdout.write(json.dumps({"type": "call", "id": 1, "method": "llm.complete",
                                         "params": ["p"]}) + "\\n")
            sys.stdout.flush()
            sys.stdin.readline()
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "protocol violation: the params of llm.complete must be an object"


# --- limits -------------------------------------------------------------------------------


def test_it_stops_a_harness_at_its_token_limit(scripted_policy, tmp_path):
    # The scripted server counts words: 10 prompt + 1 completion tokens per call.
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            for _ in range(10):
                ctx.llm.complete("one two three four five six seven eight nine ten")
            return ""
        """,
        limits="max_tokens = 30\nmax_model_calls = 10",
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == (
        "limit exceeded: max_tokens = 30 (33 prompt and completion tokens used)"
    )
    assert len(scripted_policy.requests) == 3
    assert result.prompt_tokens + result.completion_tokens == 33


def test_it_stops_samples_at_the_model_call_limit_mid_request(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        'def run(task, ctx):\n    return ctx.llm.complete("p", n=5).texts\n',
        limits="max_model_calls = 2",
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: max_model_calls = 2"
    assert len(scripted_policy.requests) == 2


def test_it_ends_a_harness_that_keeps_talking_at_its_wall_time(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        import time

        def run(task, ctx):
            while True:
                ctx.log("tick")
                ctx.llm.complete("p", max_tokens=1)
                time.sleep(0.05)
        """,
        limits="max_model_calls = 1000\nmax_tokens = 100000",
        wall=2,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: wall time of 2s"


# --- multi-step suites: ctx.env -----------------------------------------------------------

COUNTER_AGENT = """
def run(task, ctx):
    assert ctx.env and task == {"goal": 3}
    first = ctx.env.reset()
    ctx.log("objective", objective=first["objective"])
    steps = 0
    done = False
    while not done:
        result = ctx.env.step("inc")
        done = result["done"]
        steps += 1
    return {"steps": steps, "last": result}
"""


def counter_environment(**inputs: Any) -> TaskEnvironment:
    return TaskEnvironment(adapter=counter_adapter(), inputs=inputs, verifier={"secret": 1})


def test_it_plays_a_multi_step_episode_to_a_win(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, COUNTER_AGENT, limits="max_steps = 10")
    environment = counter_environment()

    result = run(harness, scripted_policy.url, environment)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.score == 1.0
    assert [s.kind for s in result.steps] == [
        "start", "env_reset", "log", "env_step", "env_step", "env_step", "answer", "verdict",
    ]  # fmt: skip
    assert steps_of(result, "env_reset")[0].payload["observation"]["objective"] == "reach 3"
    assert steps_of(result, "log")[0].payload == {
        "message": "objective",
        "fields": {"objective": "reach 3"},
    }
    last = steps_of(result, "env_step")[-1].payload
    assert last == {
        "index": 3,
        "action": "inc",
        "observation": {"observation": "count 3"},
        "reward": 1.0,
        "done": True,
        "truncated": False,
    }
    assert result.answer["steps"] == 3
    (episode,) = environment.adapter.episodes
    assert episode.closed is True
    assert episode.seed == 11


def test_it_scores_an_episode_the_harness_left_early_by_its_verdict(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            ctx.env.reset()
            ctx.env.step("inc")
            return "giving up"
        """,
    )

    result = run(harness, scripted_policy.url, counter_environment())

    assert result.outcome == RolloutOutcome.TASK_FAILURE
    assert result.score == pytest.approx(1 / 3)
    assert result.detail == "reached 1"
    assert result.answer == "giving up"


def test_it_ends_the_episode_at_max_steps_and_scores_it(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, COUNTER_AGENT, limits="max_steps = 2")

    result = run(harness, scripted_policy.url, counter_environment())

    assert result.outcome == RolloutOutcome.TASK_FAILURE
    assert result.score == pytest.approx(2 / 3)
    last = steps_of(result, "env_step")[-1].payload
    assert last["done"] is True and last["truncated"] is True
    assert result.answer["last"]["truncated"] is True


def test_it_ends_a_harness_that_steps_past_max_steps_as_a_harness_error(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            ctx.env.reset()
            for _ in range(5):
                ctx.env.step("wait")
        """,
        limits="max_steps = 2",
    )
    environment = counter_environment()

    result = run(harness, scripted_policy.url, environment)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "limit exceeded: max_steps = 2"
    assert result.score == 0.0
    assert len(steps_of(result, "env_step")) == 2
    # Where the episode stood is in the trace, but not counted.
    (verdict,) = steps_of(result, "verdict")
    assert verdict.payload["counted"] is False
    assert environment.adapter.episodes[0].closed is True


def test_it_refuses_a_step_after_the_adapter_ended_the_episode(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            ctx.env.reset()
            ctx.env.step("wait")
            ctx.env.step("wait")
        """,
    )

    result = run(harness, scripted_policy.url, counter_environment(max_moves=1))

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "protocol violation: ctx.env.step() after the episode ended" in result.detail


def test_it_refuses_a_step_before_reset(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, 'def run(task, ctx):\n    ctx.env.step("inc")\n')

    result = run(harness, scripted_policy.url, counter_environment())

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "protocol violation: ctx.env.step() before ctx.env.reset()"


def test_it_refuses_an_action_that_is_not_a_string(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path, "def run(task, ctx):\n    ctx.env.reset()\n    ctx.env.step(3)\n"
    )

    result = run(harness, scripted_policy.url, counter_environment())

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == "ctx.env.step: action must be a string, got int"


def test_it_refuses_ctx_env_on_a_single_answer_suite(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            ctx.log("env available:", bool(ctx.env))
            ctx.env.reset()
        """,
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "protocol violation: ctx.env.reset() on a single-answer suite" in result.detail
    assert steps_of(result, "log")[0].payload["message"] == "env available: False"


# --- helpers ------------------------------------------------------------------------------

CHECK_AGENT = """
def run(task, ctx):
    assert ctx.helpers == ("check",)
    return ctx.check(task["body"])
"""


@pytest.mark.parametrize(("body", "passed"), [(CORRECT, True), (WRONG, False)])
def test_it_runs_ctx_check_against_the_prompts_visible_examples(
    scripted_policy, tmp_path, body, passed
):
    harness = make_harness(tmp_path, CHECK_AGENT)
    environment = humaneval_environment()
    inputs = RolloutInputs(
        harness_dir=harness,
        task_key=PROBLEM.task_id,
        task_view={**humaneval.harness_view(environment.inputs), "body": body},
        knob_overrides={},
        seed=1,
        wall_time_s=60,
    )
    with PolicyClient(scripted_policy.url, model="scripted") as client:
        result = execute_rollout(inputs, policy=client, environment=environment)

    check = result.answer
    assert check["passed"] is passed
    assert check["examples"] == 1
    assert check["failed"] == (0 if passed else 1)
    if not passed:
        assert "truncate_number(3.5)" in check["output"]
    (call,) = steps_of(result, "helper_call")
    assert call.payload["name"] == "check"
    assert call.payload["params"] == {"completion": body}
    assert call.payload["result"] == check
    # The hidden tests never reach the harness: only the prompt's own example is run.
    assert "METADATA" not in str(check) and "def check(candidate)" not in str(check)


def test_it_reports_a_check_of_code_that_does_not_compile(settings):
    result = humaneval.check(
        inputs={"prompt": PROBLEM.prompt},
        params={"completion": "    return (\n"},
        timeout_s=10,
    )

    assert result["passed"] is False
    assert result["examples"] is None
    assert "SyntaxError" in result["output"]


@pytest.mark.parametrize("task_id", ["HumanEval/65", "HumanEval/156"])
def test_it_reads_humanevals_loose_examples_as_a_person_would(task_id):
    # "21" shown for '21' (65), and bare `f(19) == 'xix'` lines with no output (156).
    (problem,) = [p for p in humaneval_problems()[0] if p.task_id == task_id]

    result = humaneval.check(
        inputs={"prompt": problem.prompt},
        params={"completion": problem.canonical_solution},
        timeout_s=10,
    )

    assert result["passed"] is True, result["output"]
    assert result["examples"] >= 2


def test_it_refuses_a_helper_the_suite_does_not_offer(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, "def run(task, ctx):\n    ctx.helper('peek')\n")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail == (
        "protocol violation: ctx.helper('peek'): this suite offers no such helper (offered: check)"
    )


def test_it_refuses_a_helper_call_with_bad_parameters(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, "def run(task, ctx):\n    ctx.helper('check', code=1)\n")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert result.detail.startswith("ctx.helper('check'): completion must be a string")


# --- what the harness sees, and how its crashes are recorded ------------------------------


def test_it_gives_the_harness_its_limits_knobs_and_helpers(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        def run(task, ctx):
            return {"limits": ctx.limits, "helpers": list(ctx.helpers), "env": bool(ctx.env)}
        """,
        limits="max_steps = 7",
    )

    result = run(harness, scripted_policy.url)

    assert result.answer == {
        "limits": {"max_model_calls": 16, "max_tokens": 16384, "max_steps": 7, "wall_time_s": 30},
        "helpers": ["check"],
        "env": False,
    }


def test_it_records_traceback_frames_relative_to_the_harness_root(scripted_policy, tmp_path):
    harness = make_harness(
        tmp_path,
        """
        from tools.util import explode

        def run(task, ctx):
            return explode(task)
        """,
        files={
            "tools/__init__.py": "",
            "tools/util.py": """
            def explode(task):
                raise KeyError("missing")
            """,
        },
    )

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    (exception,) = steps_of(result, "harness_exception")
    harness_frames = [f for f in exception.payload["frames"] if f["in_harness"]]
    assert harness_frames == [
        {
            "file": "agent.py",
            "line": 5,
            "function": "run",
            "code": "return explode(task)",
            "in_harness": True,
        },
        {
            "file": "tools/util.py",
            "line": 3,
            "function": "explode",
            "code": 'raise KeyError("missing")',
            "in_harness": True,
        },
    ]
    assert exception.payload["frames"][-1]["file"] == "tools/util.py"


def test_it_records_the_file_and_line_of_a_syntax_error(scripted_policy, tmp_path):
    harness = make_harness(tmp_path, "def run(task, ctx):\n    return (\n")

    result = run(harness, scripted_policy.url)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    assert "could not load entrypoint" in result.detail
    (exception,) = steps_of(result, "harness_exception")
    last = exception.payload["frames"][-1]
    assert last["file"] == "agent.py" and last["line"] == 2 and last["in_harness"] is True


def test_it_keeps_the_runtime_free_of_third_party_imports():
    # The runtime runs inside the sandbox with the harness; it may use the standard library only.
    import ast
    import sys

    from workers.channel import RUNTIME_DIR

    imported = set()
    for path in (RUNTIME_DIR / "coevo_runtime").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])

    assert imported, "no imports found: the runtime moved?"
    assert imported - set(sys.stdlib_module_names) == {"coevo_runtime"}

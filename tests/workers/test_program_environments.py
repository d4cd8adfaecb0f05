"""Program harnesses on multi-step suites and with suite helpers: ``$COEVO_ENV_URL/reset`` and
``/step`` and ``$COEVO_HELPERS_URL/<name>`` at the boundary are ctx.env and ctx.helper, with
the same step limits, trace steps and scoring. Real TextWorld games, real sandbox."""

from __future__ import annotations

import json
import textwrap

from coevo.policies.client import PolicyClient
from coevo.suites.textworld import task_payload
from tests.support.harnesses import PROBLEM
from tests.workers.test_textworld_env import game_for
from workers.environments import humaneval
from workers.environments import textworld as tw_env
from workers.outcomes import ErrorKind, RolloutOutcome
from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout

# Plays the moves it is given in $COEVO_KNOB_MOVES (JSON), then stops: no answer file needed.
PLAYER = """
import json, os, urllib.request

def post(path, body):
    request = urllib.request.Request(
        os.environ["COEVO_ENV_URL"] + path, data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    return json.load(urllib.request.urlopen(request))

first = post("/reset", {})
assert "cookbook" in first["objective"] and os.environ["COEVO_MULTI_STEP"] == "1"
for move in json.loads(os.environ["COEVO_KNOB_MOVES"]):
    step = post("/step", {"action": move})
    if step["done"]:
        break
"""


def harness(tmp_path, script: str, *, moves: list[str], max_steps: int = 50):
    directory = tmp_path / "player"
    directory.mkdir()
    (directory / "harness.toml").write_text(
        '[harness]\nname = "player"\ncommand = ["python", "player.py"]\n'
        f'[knobs.moves]\ntype = "choice"\ndefault = {json.dumps(json.dumps(moves))}\n'
        f"choices = [{json.dumps(json.dumps(moves))}]\n"
        f"[limits]\nmax_steps = {max_steps}\nwall_time_s = 60\n"
    )
    (directory / "player.py").write_text(textwrap.dedent(script))
    return directory


def play(directory, game, url):
    payload = task_payload(game, admissible_commands=True, max_steps=50)
    environment = TaskEnvironment(
        adapter=tw_env.TextWorldEnvironment(),
        inputs=payload["inputs"],
        verifier=payload["verifier"],
    )
    inputs = RolloutInputs(
        harness_dir=directory,
        task_key=game.key,
        task_view=tw_env.harness_view(payload["inputs"]),
        knob_overrides={},
        seed=3,
        wall_time_s=120,
    )
    with PolicyClient(url, model="scripted", retries=0) as client:
        return execute_rollout(inputs, policy=client, environment=environment)


def test_a_program_wins_a_textworld_game_through_the_boundary(tmp_path, scripted_policy):
    game = game_for("cooking-easy")
    result = play(harness(tmp_path, PLAYER, moves=game.walkthrough), game, scripted_policy.url)

    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    played = [s.payload["action"] for s in result.steps if s.kind == "env_step"]
    assert played == game.walkthrough
    assert [s.kind for s in result.steps].count("env_reset") == 1


def test_the_manifests_step_limit_holds_at_the_boundary(tmp_path, scripted_policy):
    game = game_for("cooking-easy")
    moves = ["look"] * 5
    # The step that reaches max_steps comes back done (truncated); a step past it ends the
    # rollout as a harness_error naming the limit, as for ctx.env.
    script = PLAYER.replace('    if step["done"]:\n        break\n', "")
    result = play(harness(tmp_path, script, moves=moves, max_steps=3), game, scripted_policy.url)

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.LIMIT)
    assert "max_steps = 3" in result.detail
    assert [s.payload["index"] for s in result.steps if s.kind == "env_step"] == [1, 2, 3]


def test_a_program_calls_a_suite_helper(tmp_path, scripted_policy):
    directory = tmp_path / "checker"
    directory.mkdir()
    (directory / "harness.toml").write_text(
        '[harness]\nname = "checker"\ncommand = ["python", "check.py"]\n'
    )
    (directory / "check.py").write_text(
        textwrap.dedent(
            """
            import json, os, urllib.request
            completion = "    return number % 1.0\\n"
            request = urllib.request.Request(
                os.environ["COEVO_HELPERS_URL"] + "/check",
                data=json.dumps({"completion": completion}).encode(),
                headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
            checked = json.load(urllib.request.urlopen(request))
            assert os.environ["COEVO_HELPERS"] == "check" and checked["passed"], checked
            json.dump(completion, open(os.environ["COEVO_ANSWER_FILE"], "w"))
            """
        )
    )
    environment = TaskEnvironment(
        adapter=humaneval.HumanEvalEnvironment(),
        inputs={"prompt": PROBLEM.prompt, "entry_point": PROBLEM.entry_point},
        verifier={"test": PROBLEM.test, "entry_point": PROBLEM.entry_point},
    )
    inputs = RolloutInputs(
        harness_dir=directory,
        task_key=PROBLEM.task_id,
        task_view=humaneval.harness_view(
            {"prompt": PROBLEM.prompt, "entry_point": PROBLEM.entry_point}
        ),
        knob_overrides={},
        seed=7,
        wall_time_s=60,
    )
    with PolicyClient(scripted_policy.url, model="scripted", retries=0) as client:
        result = execute_rollout(inputs, policy=client, environment=environment)
    assert (result.outcome, result.score) == (RolloutOutcome.PASSED, 1.0), result.detail
    (helper,) = [s.payload for s in result.steps if s.kind == "helper_call"]
    assert helper["name"] == "check" and helper["result"]["passed"]

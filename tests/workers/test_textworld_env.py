"""The TextWorld environment adapter: real games from the shipped suite, played by TextWorld."""

from __future__ import annotations

import re

import pytest

from coevo.errors import InvalidState
from coevo.policies.client import PolicyClient
from coevo.suites.textworld import LEVELS, task_payload, textworld_games
from tests.conftest import REPO_ROOT
from workers.environments import environment_for
from workers.environments import textworld as tw_env
from workers.rollout import RolloutInputs, RolloutOutcome, TaskEnvironment, execute_rollout

TEXTWORLD_HARNESS = REPO_ROOT / "examples" / "textworld-basic"


def game_for(level: str):
    games, _ = textworld_games()
    return next(g for g in games if g.level == level)


def open_game(
    level: str = "cooking-easy", *, admissible_commands: bool = True, max_steps: int = 50
):
    game = game_for(level)
    payload = task_payload(game, admissible_commands=admissible_commands, max_steps=max_steps)
    episode = tw_env.open_episode(inputs=payload["inputs"], verifier=payload["verifier"], seed=0)
    return game, episode


@pytest.fixture
def cooking():
    game, episode = open_game()
    yield game, episode
    episode.close()


def test_it_is_registered_as_the_multi_step_environment_of_textworld_suites():
    environment = environment_for("textworld")

    assert type(environment) is tw_env.TextWorldEnvironment
    assert environment.multi_step


def test_it_shows_the_harness_no_game_data():
    payload = task_payload(game_for("cooking-easy"), admissible_commands=True, max_steps=50)

    view = tw_env.harness_view(payload["inputs"])

    assert view == {"level": "cooking-easy", "max_steps": 50, "admissible_commands": True}


def test_it_starts_with_the_objective_and_the_admissible_commands(cooking):
    _, episode = cooking

    first = episode.reset()

    assert "cookbook" in first["objective"]
    assert "kitchen" in first["observation"].lower()
    assert "$$" not in first["observation"], "the ASCII-art banner is noise for a model"
    assert "look" in first["admissible_commands"]
    assert first["max_steps"] == 50 and first["moves"] == 0 and first["score"] == 0
    assert first["max_score"] > 0


@pytest.mark.parametrize("level", [level.name for level in LEVELS])
def test_it_wins_a_game_of_every_level_by_its_walkthrough(level):
    game, episode = open_game(level)
    try:
        episode.reset()
        rewards = []
        for i, command in enumerate(game.walkthrough):
            result = episode.step(command)
            rewards.append(result.reward)
            assert result.done == (i == len(game.walkthrough) - 1), (i, command)
        verdict = episode.verdict()
    finally:
        episode.close()

    assert verdict.passed
    assert verdict.score == 1.0
    assert sum(rewards) == game.max_score > 0
    assert verdict.detail.startswith(f"won in {len(game.walkthrough)} steps")


def test_it_answers_an_action_the_game_does_not_understand_without_points(cooking):
    _, episode = cooking
    episode.reset()

    result = episode.step("dance wildly with the fridge")

    assert not result.done
    assert result.reward == 0.0
    assert result.observation["observation"]
    assert result.observation["moves"] == 1
    verdict = episode.verdict()
    assert (verdict.passed, verdict.score) == (False, 0.0)


def test_it_runs_one_command_per_step_even_with_newlines_in_the_action(cooking):
    _, episode = cooking
    episode.reset()

    episode.step("look\ninventory\ninventory")
    reply = episode.step("inventory")

    # Had the newlines reached the interpreter, this step would answer a queued command.
    assert "carrying" in reply.observation["observation"].lower()
    assert "-= kitchen =-" not in reply.observation["observation"].lower()


def test_it_ends_the_episode_at_its_step_limit():
    _, episode = open_game(max_steps=3)
    try:
        episode.reset()
        results = [episode.step("look") for _ in range(3)]
        with pytest.raises(InvalidState):
            episode.step("look")
        verdict = episode.verdict()
    finally:
        episode.close()

    assert [r.done for r in results] == [False, False, True]
    assert not verdict.passed
    assert verdict.detail.startswith("step limit of 3 reached")


def test_it_counts_steps_across_restarts():
    _, episode = open_game(max_steps=2)
    try:
        episode.reset()
        episode.step("look")
        episode.reset()
        assert episode.step("look").done
    finally:
        episode.close()


def test_it_gives_a_verdict_at_any_time(cooking):
    game, episode = cooking

    assert episode.verdict().score == 0.0 and not episode.verdict().passed
    episode.reset()
    points = 0
    for command in game.walkthrough[:-1]:
        points += episode.step(command).reward
    verdict = episode.verdict()

    assert 0 < points < game.max_score
    assert not verdict.passed
    assert verdict.score == pytest.approx(points / game.max_score)
    assert f"{int(points)}/{game.max_score} points" in verdict.detail


def test_it_refuses_a_step_before_reset(cooking):
    _, episode = cooking

    with pytest.raises(InvalidState):
        episode.step("look")


def test_it_hides_the_admissible_commands_when_the_suite_says_so():
    _, episode = open_game(admissible_commands=False)
    try:
        first = episode.reset()
        after = episode.step("look").observation
    finally:
        episode.close()

    assert "admissible_commands" not in first
    assert "admissible_commands" not in after
    assert first["objective"]


def test_it_removes_the_game_files_when_closed():
    _, episode = open_game()
    episode.reset()
    game_dir = episode._dir
    assert (game_dir / "game.z8").is_file()

    episode.close()

    assert not game_dir.exists()


def test_it_cleans_the_prompt_and_status_line_from_the_game_text():
    raw = "\nYou take the milk.\n\n\n>          -= Kitchen =-1/3"

    assert tw_env.clean_feedback(raw) == "You take the milk."


# --- the seed harness, sandboxed, through the rollout runner --------------------------------


def play_with_seed_harness(url, game, *, admissible_commands=True, knobs=None):
    payload = task_payload(game, admissible_commands=admissible_commands, max_steps=50)
    environment = TaskEnvironment(
        adapter=tw_env.TextWorldEnvironment(),
        inputs=payload["inputs"],
        verifier=payload["verifier"],
    )
    inputs = RolloutInputs(
        harness_dir=TEXTWORLD_HARNESS,
        task_key=game.key,
        task_view=tw_env.harness_view(payload["inputs"]),
        knob_overrides=knobs or {},
        seed=3,
        wall_time_s=120,
    )
    with PolicyClient(url, model="scripted", retries=1, backoff_s=0.01) as client:
        return execute_rollout(inputs, policy=client, environment=environment)


def listed_commands(prompt):
    return dict(re.findall(r"^(\d+)\. (.+)$", prompt.rsplit("Commands:", 1)[-1], re.MULTILINE))


def test_it_wins_a_game_when_the_model_picks_the_walkthrough_by_number(scripted_policy):
    game = game_for("cooking-easy")
    plan = iter(game.walkthrough)

    def pick_next_walkthrough_command(prompt):
        wanted = next(plan)
        numbers = [n for n, command in listed_commands(prompt).items() if command == wanted]
        return f" {numbers[0]}" if numbers else " 0"

    scripted_policy.reply_for = pick_next_walkthrough_command

    result = play_with_seed_harness(scripted_policy.url, game, knobs={"max_listed": 60})

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert result.score == 1.0
    played = [s.payload["action"] for s in result.steps if s.kind == "env_step"]
    assert played == game.walkthrough
    assert result.model_calls == len(game.walkthrough)
    first_prompt = scripted_policy.requests[0]["prompt"]
    assert "Goal: You are hungry!" in first_prompt
    assert first_prompt.endswith("Best command number:")
    assert "$$" not in first_prompt
    assert result.steps[-1].kind == "verdict"
    assert result.steps[-1].payload["detail"].startswith(f"won in {len(game.walkthrough)} steps")


def test_it_plays_the_first_listed_command_when_the_model_names_no_number(scripted_policy):
    game = game_for("simple-dense")
    scripted_policy.default = " I think we should go"

    result = play_with_seed_harness(
        scripted_policy.url, game, knobs={"history": 1, "order": "game", "max_listed": 5}
    )

    assert result.outcome in (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE), result.detail
    env_steps = [s for s in result.steps if s.kind == "env_step"]
    assert len(env_steps) == 50, "the suite's step limit ends the game"
    assert env_steps[-1].payload["done"] is True
    for request, step in zip(scripted_policy.requests, env_steps, strict=True):
        assert step.payload["action"] == listed_commands(request["prompt"])["1"]
    assert any("no listed number" in s.payload["message"] for s in result.steps if s.kind == "log")


def test_it_writes_commands_itself_when_the_suite_lists_none(scripted_policy):
    game = game_for("cooking-easy")
    plan = iter(game.walkthrough)
    scripted_policy.reply_for = lambda prompt: f" {next(plan)}"

    result = play_with_seed_harness(scripted_policy.url, game, admissible_commands=False)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert "Commands:" not in scripted_policy.requests[0]["prompt"]
    played = [s.payload["action"] for s in result.steps if s.kind == "env_step"]
    assert played == game.walkthrough


def test_it_shows_an_episode_in_the_trace_viewer(cooking):
    from types import SimpleNamespace

    from django.template.loader import render_to_string

    game, episode = cooking
    first = episode.reset()
    result = episode.step(game.walkthrough[0])
    steps = [
        SimpleNamespace(kind="env_reset", index=1, attempt=1, payload={"observation": first}),
        SimpleNamespace(
            kind="env_step",
            index=2,
            attempt=1,
            payload={
                "index": 1,
                "action": game.walkthrough[0],
                "observation": result.observation,
                "reward": result.reward,
                "done": result.done,
                "truncated": False,
            },
        ),
    ]

    html = "".join(render_to_string("web/_trace_step.html", {"step": step}) for step in steps)

    assert "objective</strong>: You are hungry!" in html
    assert f"&gt; {game.walkthrough[0]}</code>" in html
    assert f"points {result.observation['score']}/{game.max_score}" in html
    assert "examine cookbook" in html, "the admissible commands are listed"


def test_it_wins_an_easy_cooking_game_by_its_priority_order_alone(scripted_policy):
    # A small model mostly answers "1": the seed's default order must make that a good move.
    game = game_for("cooking-easy")
    scripted_policy.default = " 1"

    result = play_with_seed_harness(scripted_policy.url, game)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    played = [s.payload["action"] for s in result.steps if s.kind == "env_step"]
    assert played[0] == "examine cookbook"
    assert played[-2:] == ["prepare meal", "eat meal"]
    assert len(played) <= len(game.walkthrough)

"""TextWorld: 60 shipped games in six levels, imported once per content, seed and config."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter

import pytest

from coevo.errors import CoevoError, InvalidInput
from coevo.suites.models import Split, Suite, SuiteKind, Task
from coevo.suites.splits import split_for
from coevo.suites.textworld import (
    DATA_DIR,
    GAMES_PER_LEVEL,
    LEVELS,
    MANIFEST_NAME,
    VERSION,
    suite_import_textworld,
    textworld_build,
    textworld_games,
)
from workers.environments.textworld import decode_blob

# --- the shipped games ------------------------------------------------------------------


def test_it_ships_at_least_sixty_games_across_six_levels():
    games, _ = textworld_games()

    assert len(games) >= 60
    assert len({g.key for g in games}) == len(games)
    assert Counter(g.level for g in games) == {level.name: GAMES_PER_LEVEL for level in LEVELS}
    assert {g.challenge for g in games} == {"tw-cooking", "tw-simple"}
    assert all(g.z8[:1] == b"\x08" for g in games), "z8 files start with version byte 8"
    assert all(g.max_score > 0 and g.walkthrough for g in games)


def test_it_records_how_each_game_was_made():
    manifest = json.loads((DATA_DIR / MANIFEST_NAME).read_text())
    levels = {level.name: level for level in LEVELS}

    assert manifest["textworld"] == "1.7.0"
    for entry in manifest["games"]:
        level = levels[entry["level"]]
        assert entry["challenge"] == level.challenge
        assert tuple(entry["options"]) == level.options
        assert entry["seed"] == level.first_seed + int(entry["key"].rsplit("-", 1)[1])
    # Different seeds make different games.
    assert len({e["z8_sha256"] for e in manifest["games"]}) == len(manifest["games"])


def test_it_refuses_games_that_do_not_match_the_manifest(tmp_path):
    data_dir = tmp_path / "textworld"
    shutil.copytree(DATA_DIR, data_dir)
    manifest = json.loads((data_dir / MANIFEST_NAME).read_text())
    manifest["games"][3]["z8_sha256"] = "0" * 64
    (data_dir / MANIFEST_NAME).write_text(json.dumps(manifest))

    with pytest.raises(CoevoError, match="does not match"):
        textworld_games(data_dir)


def test_it_explains_how_to_rebuild_missing_games(tmp_path):
    with pytest.raises(CoevoError, match="python -m coevo.suites.textworld build"):
        textworld_games(tmp_path)


def test_it_builds_playable_games_with_tw_make(tmp_path):
    # One game of the easiest level: the same code path that made the shipped archive.
    textworld_build(out_dir=tmp_path, levels=LEVELS[:1], games_per_level=1, progress=lambda _: None)

    games, content_hash = textworld_games(tmp_path)

    assert [g.key for g in games] == ["cooking-easy-00"]
    assert games[0].seed == LEVELS[0].first_seed
    assert games[0].walkthrough and games[0].max_score > 0
    assert content_hash != textworld_games()[1]


# --- suite_import_textworld ---------------------------------------------------------------


@pytest.fixture
def textworld_suite(project):
    suite, _ = suite_import_textworld(project=project)
    return suite


def test_it_imports_every_game_as_a_task(textworld_suite):
    games, _ = textworld_games()

    assert textworld_suite.kind == SuiteKind.TEXTWORLD
    assert textworld_suite.name == "textworld"
    assert textworld_suite.version == VERSION
    assert textworld_suite.tasks.count() == len(games) >= 60
    tasks = list(textworld_suite.tasks.order_by("position"))
    assert [t.key for t in tasks] == [g.key for g in games]
    assert "50 steps" in textworld_suite.description


def test_it_splits_the_games_deterministically(textworld_suite, project):
    splits = dict(textworld_suite.tasks.values_list("key", "split"))
    other, _ = suite_import_textworld(project=project, split_seed="1")
    other_splits = dict(other.tasks.values_list("key", "split"))

    assert all(split == split_for(key, seed="0") for key, split in splits.items())
    assert all(split == split_for(key, seed="1") for key, split in other_splits.items())
    assert set(splits.values()) == {Split.SEARCH, Split.VALIDATION, Split.HELDOUT}
    assert splits != other_splits


def test_it_returns_the_same_suite_on_reimport(textworld_suite, project):
    again, created = suite_import_textworld(project=project)

    assert created is False
    assert again.pk == textworld_suite.pk
    assert Suite.objects.filter(project=project).count() == 1
    assert Task.objects.filter(suite__project=project).count() == textworld_suite.tasks.count()


def test_it_makes_the_step_limit_and_the_command_list_part_of_the_suite(textworld_suite, project):
    blind, created_blind = suite_import_textworld(project=project, admissible_commands=False)
    short, created_short = suite_import_textworld(project=project, max_steps=20)

    assert created_blind and created_short
    assert len({textworld_suite.content_hash, blind.content_hash, short.content_hash}) == 3
    assert (blind.name, short.name) == ("textworld-no-commands", "textworld-20-steps")
    assert blind.tasks.first().inputs["admissible_commands"] is False
    assert short.tasks.first().inputs["max_steps"] == 20


def test_it_keeps_the_game_files_in_the_verifier_only(textworld_suite):
    games = {g.key: g for g in textworld_games()[0]}

    for task in textworld_suite.tasks.all():
        game = games[task.key]
        assert task.inputs == {
            "level": game.level,
            "challenge": game.challenge,
            "admissible_commands": True,
            "max_steps": 50,
        }
        assert decode_blob(task.verifier["z8"]) == game.z8
        assert decode_blob(task.verifier["json"]) == game.game_json
        assert task.verifier["max_score"] == game.max_score


def test_it_hashes_the_game_files_into_the_suite(textworld_suite):
    manifest = json.loads((DATA_DIR / MANIFEST_NAME).read_text())
    games_hash = hashlib.sha256(VERSION.encode())
    for entry in manifest["games"]:
        games_hash.update(
            f"{entry['key']}\x00{entry['z8_sha256']}\x00{entry['json_sha256']}\n".encode()
        )

    assert textworld_games()[1] == games_hash.hexdigest()
    assert textworld_suite.content_hash != games_hash.hexdigest(), "the config is hashed in too"


@pytest.mark.parametrize("max_steps", [0, 501, "50", True])
def test_it_refuses_a_step_limit_out_of_range(project, max_steps):
    with pytest.raises(InvalidInput, match="step limit"):
        suite_import_textworld(project=project, max_steps=max_steps)

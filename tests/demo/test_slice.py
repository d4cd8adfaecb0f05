"""The demo's TextWorld slice (coevo.demo.campaign.demo_textworld_suite): which games it takes,
and that its held-out games stay sealed."""

from __future__ import annotations

import pytest

from coevo.demo.campaign import demo_textworld_suite
from coevo.suites.models import Split, Suite

pytestmark = pytest.mark.django_db


def test_the_slice_holds_more_held_out_games_than_the_demos_levels(project):
    suite = demo_textworld_suite(project=project, games=2, max_steps=12, heldout_games=6)
    heldout = list(suite.tasks.filter(split=Split.HELDOUT).order_by("position"))
    assert len(heldout) == 6
    # The first two are what the demo's slice always took (easy and medium in turn).
    assert [t.key.rsplit("-", 1)[0] for t in heldout[:3]] == [
        "cooking-easy", "cooking-medium", "cooking-medium"
    ]  # fmt: skip
    assert suite.tasks.filter(split=Split.SEARCH).count() == 2
    assert suite.source is not None and suite.source.tasks.count() == 60


def test_its_description_names_no_held_out_game(project):
    suite = demo_textworld_suite(project=project, games=2, max_steps=12, heldout_games=3)
    for task in suite.tasks.all():
        if task.split == Split.HELDOUT:
            assert task.key not in suite.description
        else:
            assert task.key in suite.description
    assert "3 sealed held-out games" in suite.description


def test_it_seals_the_description_of_a_slice_made_before(project):
    suite = demo_textworld_suite(project=project, games=1, max_steps=12)
    heldout_key = suite.tasks.get(split=Split.HELDOUT).key
    Suite.objects.filter(id=suite.id).update(description=f"games: {heldout_key}")

    again = demo_textworld_suite(project=project, games=1, max_steps=12)

    assert again.id == suite.id
    again.refresh_from_db()
    assert heldout_key not in again.description

"""The comparison page's flip table (coevo.web.presenters.flip_table): one kind or all, the
first rows unless all are asked for, each with links to a rollout of either side."""

from __future__ import annotations

import uuid

from django.urls import reverse

from coevo.evaluations.selectors import EvaluationComparison, FlipRow
from coevo.projects.models import Project
from coevo.web.presenters import flip_table

PROJECT = Project(slug="demo")


def comparison(kinds: list[str]) -> EvaluationComparison:
    rows = [
        FlipRow(f"t{i}", kind, 0.0, 1.0, uuid.uuid4(), None if i == 0 else uuid.uuid4())
        for i, kind in enumerate(kinds)
    ]
    return EvaluationComparison(None, None, None, rows)


def test_it_lists_the_first_rows_of_every_kind_unless_all_are_asked_for():
    flips = comparison(["broken", "broken", "fixed", "fixed", "fixed"])
    table = flip_table(project=PROJECT, comparison=flips, flip=None, show_all=False, size=2)
    assert [line.row.task_key for line in table.lines] == ["t0", "t1"]
    assert table.total == 5 and table.flip is None
    every = flip_table(project=PROJECT, comparison=flips, flip=None, show_all=True, size=2)
    assert len(every.lines) == 5


def test_it_filters_one_kind_and_ignores_an_unknown_one():
    flips = comparison(["broken", "fixed", "fixed", "fixed"])
    table = flip_table(project=PROJECT, comparison=flips, flip="fixed", show_all=False, size=2)
    assert [line.row.flip for line in table.lines] == ["fixed", "fixed"]
    assert table.total == 3 and table.flip == "fixed"
    unknown = flip_table(project=PROJECT, comparison=flips, flip="<b>", show_all=True)
    assert unknown.flip is None and unknown.total == 4


def test_its_links_are_the_rollout_pages():
    flips = comparison(["broken", "fixed"])
    first, second = flip_table(project=PROJECT, comparison=flips, flip=None, show_all=True).lines
    row = flips.flips[1]
    assert second.reference_href == reverse("web:rollout", args=["demo", row.reference_rollout])
    assert second.candidate_href == reverse("web:rollout", args=["demo", row.candidate_rollout])
    assert first.candidate_href is None  # no rollout on that side

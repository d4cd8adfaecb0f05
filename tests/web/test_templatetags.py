"""The dashboard's template filters (coevo/web/templatetags/coevo_web.py)."""

from __future__ import annotations

import pytest

from coevo.web.templatetags.coevo_web import flip_label


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("both_pass", "passed by both"),
        ("both_fail", "failed by both"),
        ("fixed", "fixed"),
        ("regressed", "regressed"),
        ("some_new_kind", "some new kind"),
        (None, ""),
    ],
)
def test_it_names_a_flip_in_words(kind, words):
    assert flip_label(kind) == words

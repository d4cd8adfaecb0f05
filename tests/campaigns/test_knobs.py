"""Editing knob defaults in harness.toml as text."""

from __future__ import annotations

import tomllib

import pytest

from coevo.campaigns.proposers.config import knob_defaults_set, search_space
from coevo.errors import InvalidManifest
from harness_store.manifest import parse_manifest
from tests.conftest import SEED_HARNESS

TEXT = (SEED_HARNESS / "harness.toml").read_text()


def test_it_changes_only_the_default_lines_of_the_knobs():
    edited = knob_defaults_set(
        TEXT, {"temperature": 0.25, "samples": 4, "check_with_worker": True, "stop_style": "none"}
    )

    changed = [
        (a, b) for a, b in zip(TEXT.splitlines(), edited.splitlines(), strict=True) if a != b
    ]
    assert len(TEXT.splitlines()) == len(edited.splitlines())
    assert [b.strip() for _, b in changed] == [
        "default = 0.25",
        "default = 4",
        "default = true",
        'default = "none"',
    ]
    manifest = parse_manifest(tomllib.loads(edited))
    assert manifest.knobs["temperature"].default == 0.25
    assert manifest.knobs["samples"].default == 4
    assert manifest.knobs["stop_style"].default == "none"
    # Everything else of the file is byte-identical, comments included.
    assert (
        knob_defaults_set(
            edited,
            {
                "temperature": 0.0,
                "samples": 1,
                "check_with_worker": False,
                "stop_style": "function",
            },
        )
        == TEXT
    )


def test_it_keeps_a_trailing_comment_on_the_default_line():
    text = '[harness]\nname = "x"\nentrypoint = "agent:run"\n\n[knobs.k]\ntype = "int"\ndefault = 3  # why 3\nmin = 1\nmax = 9\n'
    assert "default = 7  # why 3\n" in knob_defaults_set(text, {"k": 7})


def test_it_refuses_an_inline_knob_table():
    text = '[harness]\nname = "x"\nentrypoint = "agent:run"\n\n[knobs]\nk = {type = "int", default = 3, min = 1, max = 9}\n'
    with pytest.raises(InvalidManifest, match=r"no \[knobs.k\] table"):
        knob_defaults_set(text, {"k": 7})


def test_it_searches_only_knobs_with_a_range():
    text = TEXT + '\n[knobs.unbounded]\ntype = "int"\ndefault = 3\n'
    manifest = parse_manifest(tomllib.loads(text))
    space = search_space(manifest)
    assert "unbounded" not in space
    assert set(space) == {
        "temperature",
        "max_tokens",
        "samples",
        "sample_temperature",
        "check_with_worker",
        "stop_style",
    }

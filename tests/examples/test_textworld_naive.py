"""examples/textworld-naive: textworld-basic with naive knob defaults, the evolution
benchmark's and the demo's starting point. Only the documented defaults may differ, so config
or random search over the same knobs and ranges can find textworld-basic's setting."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from harness_store.manifest import load_manifest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASIC = EXAMPLES / "textworld-basic"
NAIVE = EXAMPLES / "textworld-naive"
NAIVE_DEFAULTS = {"order": "game", "history": 1, "max_listed": 60}


def toml_literal(value: int | str) -> str:
    return json.dumps(value)


def files(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != "harness.toml" and "__pycache__" not in path.parts
    }


def test_its_defaults_differ_from_textworld_basic_only_in_the_documented_knobs():
    basic, naive = load_manifest(BASIC), load_manifest(NAIVE)

    assert naive.name == "textworld-naive"
    assert set(naive.knobs) == set(basic.knobs)
    changed = {
        name: knob.default
        for name, knob in naive.knobs.items()
        if knob.default != basic.knobs[name].default
    }
    assert changed == NAIVE_DEFAULTS
    for name, knob in naive.knobs.items():
        # Same type, range and choices: the good setting is in the search space.
        assert dataclasses.replace(knob, default=basic.knobs[name].default) == basic.knobs[name]
    assert (naive.entrypoint, naive.components, naive.limits, naive.policy_api) == (
        basic.entrypoint,
        basic.components,
        basic.limits,
        basic.policy_api,
    )


def test_its_code_and_prompts_are_textworld_basics():
    assert files(NAIVE) == files(BASIC)


def test_its_header_names_the_naive_and_the_good_settings():
    header = "".join(
        line
        for line in (NAIVE / "harness.toml").read_text().splitlines(keepends=True)
        if line.startswith("#")
    )
    basic = load_manifest(BASIC)
    assert "deliberately naive" in header
    for name, value in NAIVE_DEFAULTS.items():
        assert f"{name} = {toml_literal(value)}" in header
        assert f"{name} = {toml_literal(basic.knobs[name].default)}" in header

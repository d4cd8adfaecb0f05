"""harness.toml: a valid manifest loads; every invalid one raises InvalidManifest naming the key."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from coevo.errors import InvalidInput, InvalidManifest
from harness_store.manifest import Knob, Limits, load_manifest, parse_manifest
from tests.conftest import SEED_HARNESS

VALID = """
[harness]
name = "tiny"
entrypoint = "agent:run"
policy_api = "chat"
components = ["agent.py"]

[knobs.temperature]
type = "float"
default = 0.2
min = 0.0
max = 1.0

[knobs.max_tokens]
type = "int"
default = 64
min = 16
max = 512

[knobs.verbose]
type = "bool"
default = false

[knobs.style]
type = "choice"
default = "short"
choices = ["short", "long"]

[limits]
max_model_calls = 4
max_tokens = 2048
max_steps = 30
wall_time_s = 60
"""


def _harness(tmp_path: Path, toml: str, files: tuple[str, ...] = ("agent.py",)) -> Path:
    directory = tmp_path / "harness"
    directory.mkdir(exist_ok=True)
    (directory / "harness.toml").write_text(textwrap.dedent(toml))
    for name in files:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def run(task):\n    return None\n")
    return directory


def _load(tmp_path: Path, toml: str, files: tuple[str, ...] = ("agent.py",)):
    return load_manifest(_harness(tmp_path, toml, files))


def _with_harness(**fields: str) -> str:
    """A minimal manifest whose [harness] table has the given TOML values."""
    values = {"name": '"tiny"', "entrypoint": '"agent:run"', **fields}
    lines = [f"{key} = {value}" for key, value in values.items() if value is not None]
    return "[harness]\n" + "\n".join(lines) + "\n"


@pytest.fixture
def manifest(tmp_path):
    return _load(tmp_path, VALID)


# --- valid manifests ----------------------------------------------------------------------


def test_it_loads_the_seed_harness_manifest():
    manifest = load_manifest(SEED_HARNESS)

    assert manifest.name == "humaneval-basic"
    assert manifest.entrypoint == "agent:run"
    assert manifest.policy_api == "completions"
    assert manifest.components == ("agent.py", "harness.toml")
    assert set(manifest.knobs) == {
        "temperature",
        "max_tokens",
        "samples",
        "sample_temperature",
        "check_with_worker",
        "stop_style",
    }
    assert manifest.knobs["max_tokens"] == Knob(
        name="max_tokens", type="int", default=192, min=16, max=1024
    )
    assert manifest.knobs["stop_style"].choices == ("function", "none")
    assert manifest.limits == Limits(max_model_calls=8, max_tokens=16384, wall_time_s=300)


def test_it_gives_the_seed_harness_defaults_as_knob_values():
    assert load_manifest(SEED_HARNESS).knob_values() == {
        "temperature": 0.0,
        "max_tokens": 192,
        "samples": 1,
        "sample_temperature": 0.6,
        "check_with_worker": False,
        "stop_style": "function",
    }


def test_it_loads_every_field_of_a_full_manifest(manifest):
    assert manifest.name == "tiny"
    assert manifest.policy_api == "chat"
    assert manifest.components == ("agent.py",)
    assert manifest.knobs["verbose"] == Knob(name="verbose", type="bool", default=False)
    assert manifest.limits == Limits(
        max_model_calls=4, max_tokens=2048, max_steps=30, wall_time_s=60
    )
    assert manifest.limits.as_dict() == {
        "max_model_calls": 4,
        "max_tokens": 2048,
        "max_steps": 30,
        "wall_time_s": 60,
    }


def test_it_fills_in_defaults_for_optional_keys(tmp_path):
    manifest = _load(tmp_path, _with_harness())

    assert manifest.policy_api == "completions"
    assert manifest.components == ()
    assert manifest.knobs == {}
    assert manifest.limits == Limits()
    assert manifest.knob_values() == {}


def test_it_accepts_a_limits_table_with_only_some_keys(tmp_path):
    manifest = _load(tmp_path, _with_harness() + "[limits]\nmax_model_calls = 2\n")

    assert manifest.limits == Limits(max_model_calls=2)


@pytest.mark.parametrize(
    ("entrypoint", "files"),
    [
        ("pkg.agent:run", ("pkg/agent.py",)),
        ("pkg:run", ("pkg/__init__.py",)),
        ("_private_agent:main_2", ("_private_agent.py",)),
    ],
)
def test_it_accepts_an_entrypoint_in_a_package(tmp_path, entrypoint, files):
    manifest = _load(tmp_path, _with_harness(entrypoint=f'"{entrypoint}"'), files)

    assert manifest.entrypoint == entrypoint


def test_it_parses_a_manifest_without_checking_files_when_given_no_directory():
    manifest = parse_manifest({"harness": {"name": "n", "entrypoint": "nowhere:run"}})

    assert manifest.entrypoint == "nowhere:run"


# --- knob_values --------------------------------------------------------------------------


def test_it_applies_overrides_over_the_defaults(manifest):
    values = manifest.knob_values({"temperature": 0.7, "style": "long", "verbose": True})

    assert values == {"temperature": 0.7, "max_tokens": 64, "verbose": True, "style": "long"}


def test_it_converts_overrides_to_the_knobs_type(manifest):
    values = manifest.knob_values({"temperature": 1, "max_tokens": 128.0})

    assert values["temperature"] == 1.0 and isinstance(values["temperature"], float)
    assert values["max_tokens"] == 128 and isinstance(values["max_tokens"], int)


def test_it_accepts_values_on_the_bounds(manifest):
    assert manifest.knob_values({"max_tokens": 16})["max_tokens"] == 16
    assert manifest.knob_values({"max_tokens": 512})["max_tokens"] == 512
    assert manifest.knob_values({"temperature": 1.0})["temperature"] == 1.0


def test_it_leaves_the_defaults_alone_after_overriding(manifest):
    manifest.knob_values({"max_tokens": 100})

    assert manifest.knob_values()["max_tokens"] == 64
    assert manifest.knob_values(None) == manifest.knob_values({})


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"max_tokens": "many"}, "must be an integer"),
        ({"max_tokens": 2.5}, "must be an integer"),
        ({"max_tokens": True}, "must be an integer"),
        ({"max_tokens": None}, "must be an integer"),
        ({"temperature": "hot"}, "must be a number"),
        ({"temperature": False}, "must be a number"),
        ({"verbose": 1}, "must be true or false"),
        ({"verbose": "yes"}, "must be true or false"),
    ],
)
def test_it_refuses_an_override_of_the_wrong_type(manifest, overrides, expected):
    (name,) = overrides

    with pytest.raises(InvalidManifest, match=expected) as caught:
        manifest.knob_values(overrides)

    assert repr(name) in str(caught.value)


@pytest.mark.parametrize(
    "overrides",
    [{"max_tokens": 15}, {"max_tokens": 513}, {"temperature": -0.1}, {"temperature": 1.01}],
)
def test_it_refuses_an_override_out_of_range(manifest, overrides):
    (name,) = overrides

    with pytest.raises(InvalidManifest, match="outside") as caught:
        manifest.knob_values(overrides)

    assert repr(name) in str(caught.value)


def test_it_refuses_an_unknown_knob_and_lists_the_declared_ones(manifest):
    with pytest.raises(InvalidManifest) as caught:
        manifest.knob_values({"top_k": 40})

    message = str(caught.value)
    assert "'top_k'" in message
    assert "max_tokens, style, temperature, verbose" in message


def test_it_says_none_are_declared_when_a_manifest_has_no_knobs(tmp_path):
    manifest = _load(tmp_path, _with_harness())

    with pytest.raises(InvalidManifest, match="declared: none"):
        manifest.knob_values({"top_k": 40})


def test_it_refuses_a_choice_not_in_the_choices(manifest):
    with pytest.raises(InvalidManifest, match="must be one of") as caught:
        manifest.knob_values({"style": "medium"})

    assert "'style'" in str(caught.value)
    assert "'medium'" in str(caught.value)


def test_it_is_an_invalid_input_for_callers_that_catch_those(manifest):
    with pytest.raises(InvalidInput):
        manifest.knob_values({"style": "medium"})


# --- invalid manifests --------------------------------------------------------------------


def test_it_refuses_a_harness_without_a_manifest(tmp_path):
    with pytest.raises(InvalidManifest, match=r"harness\.toml is missing"):
        load_manifest(tmp_path)


def test_it_refuses_a_manifest_that_is_not_toml(tmp_path):
    with pytest.raises(InvalidManifest, match="not valid TOML"):
        _load(tmp_path, '[harness\nname = "x"\n')


def test_it_refuses_a_manifest_that_is_not_text(tmp_path):
    directory = _harness(tmp_path, "")
    (directory / "harness.toml").write_bytes(b"\xff\xfe\x00[harness]")

    with pytest.raises(InvalidManifest, match="not valid TOML"):
        load_manifest(directory)


@pytest.mark.parametrize("toml", ["", "[other]\nx = 1\n", 'harness = "agent:run"\n'])
def test_it_refuses_a_manifest_without_a_harness_table(tmp_path, toml):
    with pytest.raises(InvalidManifest, match=r"\[harness\]"):
        _load(tmp_path, toml)


@pytest.mark.parametrize("key", ["name", "entrypoint"])
@pytest.mark.parametrize("value", [None, '""', '"   "', "3"])
def test_it_refuses_a_missing_or_empty_required_key(tmp_path, key, value):
    expected = rf"\[harness\] {key}: expected a non-empty string"
    if (key, value) == ("entrypoint", None):  # neither entrypoint nor command
        expected = r"\[harness\]: give exactly one of entrypoint .* or command"
    with pytest.raises(InvalidManifest, match=expected):
        _load(tmp_path, _with_harness(**{key: value}))


@pytest.mark.parametrize(
    "entrypoint",
    ["agent.run", "agent", "agent:", ":run", "1agent:run", "agent:run:main", "agent:run()"],
)
def test_it_refuses_an_entrypoint_not_of_the_form_module_colon_function(tmp_path, entrypoint):
    with pytest.raises(InvalidManifest, match="entrypoint") as caught:
        _load(tmp_path, _with_harness(entrypoint=f'"{entrypoint}"'))

    assert "module:function" in str(caught.value)


def test_it_refuses_an_entrypoint_with_a_trailing_newline(tmp_path):
    # A TOML multi-line string keeps its newline; "run\n" is not a function name.
    with pytest.raises(InvalidManifest, match="entrypoint"):
        _load(tmp_path, _with_harness(entrypoint='"""agent:run\n"""'))


@pytest.mark.parametrize(
    ("entrypoint", "files"),
    [
        ("missing:run", ("agent.py",)),
        ("pkg.agent:run", ("agent.py",)),
        ("pkg:run", ("pkg/agent.py",)),
    ],
)
def test_it_refuses_an_entrypoint_whose_module_file_is_missing(tmp_path, entrypoint, files):
    with pytest.raises(InvalidManifest, match="entrypoint") as caught:
        _load(tmp_path, _with_harness(entrypoint=f'"{entrypoint}"'), files)

    assert f"{entrypoint.split(':')[0].replace('.', '/')}.py" in str(caught.value)


@pytest.mark.parametrize("value", ['"responses"', '"Chat"', "1", '["chat"]'])
def test_it_refuses_an_unknown_policy_api(tmp_path, value):
    with pytest.raises(InvalidManifest, match="policy_api") as caught:
        _load(tmp_path, _with_harness(policy_api=value))

    assert "completions, chat" in str(caught.value)


@pytest.mark.parametrize("value", ['"agent.py"', "[1, 2]", '["agent.py", 3]'])
def test_it_refuses_components_that_are_not_a_list_of_paths(tmp_path, value):
    with pytest.raises(InvalidManifest, match="components"):
        _load(tmp_path, _with_harness(components=value))


@pytest.mark.parametrize("key", ["max_model_calls", "max_tokens", "max_steps", "wall_time_s"])
@pytest.mark.parametrize("value", ["0", "-5", "1.5", '"ten"', "true"])
def test_it_refuses_a_limit_that_is_not_a_positive_integer(tmp_path, key, value):
    with pytest.raises(InvalidManifest, match=rf"\[limits\] {key} = .*positive integer"):
        _load(tmp_path, _with_harness() + f"[limits]\n{key} = {value}\n")


def test_it_refuses_an_unknown_limit(tmp_path):
    with pytest.raises(InvalidManifest, match=r"\[limits\].*max_wall"):
        _load(tmp_path, _with_harness() + "[limits]\nmax_wall = 5\n")


def test_it_refuses_limits_that_are_not_a_table(tmp_path):
    with pytest.raises(InvalidManifest, match=r"\[limits\]: expected a table"):
        _load(tmp_path, "limits = 5\n" + _with_harness())


def test_it_refuses_knobs_that_are_not_a_table(tmp_path):
    with pytest.raises(InvalidManifest, match="knobs"):
        _load(tmp_path, "knobs = 5\n" + _with_harness())


def test_it_refuses_a_knob_that_is_not_a_table(tmp_path):
    with pytest.raises(InvalidManifest, match=r"\[knobs\.depth\]"):
        _load(tmp_path, _with_harness() + "[knobs]\ndepth = 3\n")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ('type = "string"\ndefault = "x"', "type = 'string'"),
        ("default = 1", "type = None"),
        ('type = "int"', "default is missing"),
        ('type = "choice"\ndefault = "a"', "non-empty choices"),
        ('type = "choice"\ndefault = "a"\nchoices = []', "non-empty choices"),
        ('type = "choice"\ndefault = "c"\nchoices = ["a", "b"]', "must be one of"),
        ('type = "int"\ndefault = 1.5', "must be an integer"),
        ('type = "int"\ndefault = 100\nmax = 10', "outside"),
        ('type = "float"\ndefault = -1.0\nmin = 0.0', "outside"),
        ('type = "bool"\ndefault = "yes"', "true or false"),
    ],
)
def test_it_refuses_a_badly_declared_knob(tmp_path, spec, expected):
    with pytest.raises(InvalidManifest, match=r"\[knobs\.depth\]") as caught:
        _load(tmp_path, _with_harness() + f"[knobs.depth]\n{spec}\n")

    assert expected in str(caught.value)


@pytest.mark.parametrize(
    "spec",
    [
        'type = "int"\ndefault = 3\nmin = "1"',
        'type = "float"\ndefault = 0.5\nmax = "1.0"',
    ],
)
def test_it_refuses_a_knob_bound_that_is_not_a_number(tmp_path, spec):
    with pytest.raises(InvalidManifest, match=r"\[knobs\.depth\]"):
        _load(tmp_path, _with_harness() + f"[knobs.depth]\n{spec}\n")


def test_it_refuses_choices_that_are_not_a_list(tmp_path):
    with pytest.raises(InvalidManifest, match=r"\[knobs\.depth\]"):
        _load(
            tmp_path, _with_harness() + '[knobs.depth]\ntype = "choice"\ndefault = 1\nchoices = 3\n'
        )


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            '[harness]\nname = "t"\nentrypoint = "agent:run"\nentry = "x"\n',
            r"\[harness\]: unknown keys \['entry'\]",
        ),
        (
            '[harness]\nname = "t"\nentrypoint = "agent:run"\n[limit]\nmax_steps = 3\n',
            r"unknown tables \['limit'\]",
        ),
        (
            '[harness]\nname = "t"\nentrypoint = "agent:run"\n'
            '[knobs.depth]\ntype = "int"\ndefault = 1\nmaximum = 3\n',
            r"\[knobs\.depth\]: unknown keys \['maximum'\]",
        ),
    ],
)
def test_it_refuses_unknown_keys_and_tables_naming_them(tmp_path, toml, expected):
    with pytest.raises(InvalidManifest, match=expected) as caught:
        _load(tmp_path, toml)

    assert str(caught.value).startswith("harness.toml")


def test_it_accepts_descriptions_of_the_harness_and_its_knobs(tmp_path):
    toml = (
        _with_harness(description='"a tiny harness"')
        + '[knobs.depth]\ntype = "int"\ndefault = 1\ndescription = "how deep"\n'
    )

    manifest = _load(tmp_path, toml)

    assert manifest.description == "a tiny harness"
    assert manifest.knobs["depth"].description == "how deep"


def test_it_refuses_a_description_that_is_not_a_string(tmp_path):
    with pytest.raises(InvalidManifest, match=r"\[harness\] description: expected a string"):
        _load(tmp_path, _with_harness(description="3"))


@pytest.mark.parametrize("component", ['"/etc/passwd"', '"../other"', '"prompts/../../x"', '""'])
def test_it_refuses_a_component_outside_the_harness(tmp_path, component):
    with pytest.raises(InvalidManifest, match=r"\[harness\] components: .*not a path inside"):
        _load(tmp_path, _with_harness(components=f"[{component}]"))


def test_it_accepts_component_folders(tmp_path):
    manifest = _load(tmp_path, _with_harness(components='["agent.py", "prompts/", "tools"]'))

    assert manifest.components == ("agent.py", "prompts/", "tools")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ('type = "int"\ndefault = 3\nmin = 5\nmax = 1', "min = 5 is above max = 1"),
        ('type = "int"\ndefault = 3\nchoices = [1, 3]', "only a knob of type 'choice'"),
        ('type = "bool"\ndefault = true\nmax = 1', "a bool knob has no min or max"),
        ('type = "choice"\ndefault = "a"\nchoices = ["a"]\nmin = 0', "a choice knob has no min"),
    ],
)
def test_it_refuses_inconsistent_knob_bounds(tmp_path, spec, expected):
    with pytest.raises(InvalidManifest, match=r"\[knobs\.depth\]") as caught:
        _load(tmp_path, _with_harness() + f"[knobs.depth]\n{spec}\n")

    assert expected in str(caught.value)


def test_it_defaults_max_steps_for_harnesses_that_do_not_declare_it(tmp_path):
    assert _load(tmp_path, _with_harness()).limits.max_steps == 100


# --- read from an archive (a candidate's snapshot), without unpacking it -------------------


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_it_reads_the_manifest_from_an_archive_as_from_a_directory(tmp_path):
    from harness_store.manifest import manifest_from_archive

    archived = manifest_from_archive(_tar({"harness.toml": VALID.encode(), "agent.py": b""}))
    assert archived == _load(tmp_path, VALID)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"agent.py": b""}, "harness.toml is missing"),
        ({"harness.toml": VALID.encode()}, "there is no agent.py"),
        ({"harness.toml": b"[harness\n", "agent.py": b""}, "not valid TOML"),
        ({"harness.toml": b"#" * (300 * 1024), "agent.py": b""}, "larger than 256 KiB"),
    ],
)
def test_it_refuses_an_archive_whose_manifest_does_not_validate(files, expected):
    from harness_store.manifest import manifest_from_archive

    with pytest.raises(InvalidManifest, match=expected):
        manifest_from_archive(_tar(files))


@pytest.mark.django_db
def test_a_candidates_manifest_comes_from_its_snapshot_without_an_export(
    seed_candidate, monkeypatch
):
    from harness_store import selectors

    def no_export(*args, **kwargs):
        raise AssertionError("read the manifest without writing the candidate's files")

    monkeypatch.setattr(selectors, "extract_archive", no_export)
    manifest = selectors.candidate_manifest(candidate=seed_candidate)
    assert manifest == load_manifest(SEED_HARNESS)


# --- program harnesses: a command instead of an entrypoint ---------------------------------


def _program(**fields: str) -> str:
    values = {"name": '"prog"', "command": '["python", "main.py"]', **fields}
    lines = [f"{key} = {value}" for key, value in values.items() if value is not None]
    return "[harness]\n" + "\n".join(lines) + "\n"


def test_it_loads_a_program_harness_with_its_knobs_and_limits(tmp_path):
    toml = _program(command='["node", "agent.js", "--fast"]', components='["agent.js"]')
    toml += "[knobs.style]\ntype = 'choice'\ndefault = 'short'\nchoices = ['short', 'long']\n"
    toml += "[limits]\nmax_model_calls = 8\n"
    manifest = _load(tmp_path, toml, files=("agent.js",))
    assert manifest.is_program and manifest.command == ("node", "agent.js", "--fast")
    assert manifest.entrypoint == "" and manifest.components == ("agent.js",)
    assert manifest.knob_values({"style": "long"}) == {"style": "long"}
    assert manifest.limits.max_model_calls == 8


def test_an_entrypoint_harness_is_not_a_program(manifest):
    assert not manifest.is_program and manifest.command == ()


@pytest.mark.parametrize(
    "command",
    [
        "[]",
        '"python main.py"',
        '["python", ""]',
        '["python", 3]',
        "[" + ", ".join(['"a"'] * 65) + "]",
    ],
)
def test_it_refuses_a_command_that_is_not_a_short_list_of_strings(tmp_path, command):
    with pytest.raises(InvalidManifest, match="command: expected a list of 1 to 64"):
        _load(tmp_path, _program(command=command))


def test_it_refuses_both_an_entrypoint_and_a_command(tmp_path):
    with pytest.raises(InvalidManifest, match="exactly one of entrypoint"):
        _load(tmp_path, _program(entrypoint='"agent:run"'))


def test_it_refuses_a_policy_api_on_a_program_harness(tmp_path):
    with pytest.raises(InvalidManifest, match="policy_api: a program harness"):
        _load(tmp_path, _program(policy_api='"chat"'))


def test_it_refuses_a_command_naming_a_script_the_harness_lacks(tmp_path):
    with pytest.raises(InvalidManifest, match=r"there is no \./run\.sh in the harness"):
        _load(tmp_path, _program(command='["./run.sh"]'), files=("main.py",))
    assert _load(tmp_path, _program(command='["./run.sh"]'), files=("run.sh",)).is_program
    # A program on PATH (python, node, bash) is not looked for in the harness.
    assert _load(tmp_path, _program(command='["bash", "-c", "echo"]'), files=()).is_program


# --- declared dependencies: [harness] requirements -----------------------------------------


@pytest.mark.parametrize(
    ("path", "files"),
    [
        ("requirements.txt", ("agent.py", "requirements.txt")),
        ("deps/locked.txt", ("agent.py", "deps/locked.txt")),
        ("pyproject.toml", ("agent.py", "pyproject.toml", "uv.lock")),
        ("deps/pyproject.toml", ("agent.py", "deps/pyproject.toml", "deps/uv.lock")),
    ],
)
def test_it_loads_declared_requirements(tmp_path, path, files):
    manifest = _load(tmp_path, _with_harness(requirements=f'"{path}"'), files=files)
    assert manifest.requirements == path


def test_a_harness_without_requirements_declares_none(manifest, tmp_path):
    assert manifest.requirements == ""
    # A requirements.txt that the manifest does not name is a plain file, not a declaration.
    shipped = _load(tmp_path, _with_harness(), files=("agent.py", "requirements.txt"))
    assert shipped.requirements == ""


def test_a_program_harness_declares_requirements_too(tmp_path):
    toml = _program(requirements='"requirements.txt"')
    manifest = _load(tmp_path, toml, files=("main.py", "requirements.txt"))
    assert manifest.is_program and manifest.requirements == "requirements.txt"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('""', "expected a path such as 'requirements.txt'"),
        ("3", "expected a path such as 'requirements.txt'"),
        ('["requirements.txt"]', "expected a path such as 'requirements.txt'"),
        ('"/etc/requirements.txt"', "expected a relative path inside the harness"),
        ('"../requirements.txt"', "expected a relative path inside the harness"),
        ('"deps//requirements.txt"', "expected a relative path inside the harness"),
        ('"setup.py"', "expected a pinned requirements file"),
        ('"uv.lock"', "expected a pinned requirements file"),
        ('"requirements.in.toml"', "expected a pinned requirements file"),
    ],
)
def test_it_refuses_requirements_that_name_no_requirements_file(tmp_path, value, expected):
    files = ("agent.py", "requirements.txt", "setup.py", "uv.lock")
    with pytest.raises(InvalidManifest, match=re.escape(expected)):
        _load(tmp_path, _with_harness(requirements=value), files=files)


def test_it_refuses_requirements_the_harness_lacks(tmp_path):
    with pytest.raises(InvalidManifest, match="there is no requirements.txt in the harness"):
        _load(tmp_path, _with_harness(requirements='"requirements.txt"'))


def test_it_refuses_a_pyproject_without_its_lock_file(tmp_path):
    toml = _with_harness(requirements='"deps/pyproject.toml"')
    with pytest.raises(InvalidManifest, match="there is no deps/uv.lock beside it"):
        _load(tmp_path, toml, files=("agent.py", "deps/pyproject.toml", "uv.lock"))


def test_it_reads_requirements_from_an_archive_as_from_a_directory(tmp_path):
    from harness_store.manifest import manifest_from_archive

    toml = _with_harness(requirements='"pyproject.toml"')
    files = {"harness.toml": toml.encode(), "agent.py": b"", "pyproject.toml": b""}
    with pytest.raises(InvalidManifest, match="there is no uv.lock beside it"):
        manifest_from_archive(_tar(files))
    archived = manifest_from_archive(_tar({**files, "uv.lock": b""}))
    assert archived.requirements == "pyproject.toml"

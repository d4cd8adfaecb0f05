"""``harness.toml``: the harness manifest, validated with errors that name the file and key.

The bottom of the harness layers: it knows the file format and nothing of the store, the
database or the workers (it imports only ``coevo.errors``), so everything above may use it.
"""

from __future__ import annotations

import io
import re
import tarfile
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.errors import InvalidManifest

MANIFEST_NAME = "harness.toml"
POLICY_APIS = ("completions", "chat")
KNOB_TYPES = ("int", "float", "bool", "choice")
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
TABLES = ("harness", "knobs", "limits")
HARNESS_KEYS = (
    "name",
    "entrypoint",
    "command",
    "policy_api",
    "components",
    "description",
    "requirements",
    "node_lock",
    "node_scripts",
)
# Declared dependencies (docs/harnesses.md): a pinned requirements file, or a pyproject.toml
# with the uv.lock beside it.
LOCK_NAME = "uv.lock"
# Declared Node dependencies: an npm lock (lockfileVersion 3) with its package.json beside it.
NODE_LOCK_NAME = "package-lock.json"
NODE_PACKAGE_NAME = "package.json"
# A program harness's command: argv, run in the harness directory (docs/harnesses.md).
MAX_COMMAND_ARGS = 64
MAX_COMMAND_ARG_CHARS = 4096
KNOB_KEYS = ("type", "default", "min", "max", "choices", "description")
LIMIT_KEYS = ("max_model_calls", "max_tokens", "max_steps", "wall_time_s")
# A manifest is a few hundred bytes; this bounds what is read (and parsed) from an archive.
MAX_MANIFEST_BYTES = 256 * 1024


@dataclass(frozen=True)
class Knob:
    name: str
    type: str
    default: Any
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] = ()
    description: str = ""

    def validate(self, value: Any, *, where: str) -> Any:
        if self.type == "bool":
            if not isinstance(value, bool):
                raise InvalidManifest(
                    f"{where}: knob {self.name!r} must be true or false, got {value!r}."
                )
            return value
        if self.type == "choice":
            if value not in self.choices:
                raise InvalidManifest(
                    f"{where}: knob {self.name!r} must be one of {list(self.choices)!r}, got {value!r}."
                )
            return value
        numeric_ok = isinstance(value, int | float) and not isinstance(value, bool)
        if self.type == "int" and not (numeric_ok and float(value).is_integer()):
            raise InvalidManifest(f"{where}: knob {self.name!r} must be an integer, got {value!r}.")
        if self.type == "float" and not numeric_ok:
            raise InvalidManifest(f"{where}: knob {self.name!r} must be a number, got {value!r}.")
        if self.min is not None and value < self.min or self.max is not None and value > self.max:
            raise InvalidManifest(
                f"{where}: knob {self.name!r} = {value!r} is outside [{self.min}, {self.max}]."
            )
        return int(value) if self.type == "int" else float(value)


@dataclass(frozen=True)
class Limits:
    """Enforced by the worker: exceeding one ends the rollout as a harness_error naming it.

    ``max_tokens`` counts prompt and completion tokens of all model calls together;
    ``max_steps`` counts ``ctx.env.step`` calls (multi-step suites only).
    """

    max_model_calls: int = 16
    max_tokens: int = 16384
    max_steps: int = 100
    wall_time_s: int = 600

    def as_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in LIMIT_KEYS}


@dataclass(frozen=True)
class Manifest:
    """``entrypoint`` (a Python ``module:function`` called as ``run(task, ctx)``) or
    ``command`` (a program of any language, which reaches the model through the worker's
    OpenAI-compatible boundary): exactly one of the two is set."""

    name: str
    entrypoint: str
    policy_api: str
    components: tuple[str, ...]
    knobs: dict[str, Knob] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    description: str = ""
    command: tuple[str, ...] = ()
    # Declared dependencies: the path of a pinned requirements file (``*.txt``) or of a
    # ``pyproject.toml`` with a ``uv.lock`` beside it; "" when the harness declares none.
    requirements: str = ""
    # Declared Node dependencies: the path of a ``package-lock.json`` with its ``package.json``
    # beside it; "" when the harness declares none. ``node_scripts`` lets the packages' install
    # scripts run while they are installed (a trust decision: docs/harnesses.md).
    node_lock: str = ""
    node_scripts: bool = False

    @property
    def is_program(self) -> bool:
        return bool(self.command)

    def knob_values(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The manifest's defaults overridden by an evaluation's settings, each validated."""
        values = {name: knob.default for name, knob in self.knobs.items()}
        for name, value in (overrides or {}).items():
            if name not in self.knobs:
                raise InvalidManifest(
                    f"Knob {name!r} is not declared in {MANIFEST_NAME} "
                    f"(declared: {', '.join(sorted(self.knobs)) or 'none'})."
                )
            values[name] = self.knobs[name].validate(value, where="evaluation settings")
        return values


def load_manifest(harness_dir: Path) -> Manifest:
    """The manifest of a harness written out in ``harness_dir``."""
    path = Path(harness_dir) / MANIFEST_NAME
    if not path.is_file():
        raise InvalidManifest(f"{MANIFEST_NAME} is missing: every harness needs one at its root.")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise InvalidManifest(_too_large())
    return manifest_from_toml(
        path.read_bytes(), has_file=lambda name: (Path(harness_dir) / name).is_file()
    )


def manifest_from_archive(data: bytes) -> Manifest:
    """The manifest of a harness packed as a tar archive (a candidate's snapshot, or a tree's
    ``git archive``), read without unpacking it: only ``harness.toml`` and the member names."""
    files: set[str] = set()
    text: bytes | None = None
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        for member in archive:
            if not member.isfile():
                continue
            name = member.name.removeprefix("./")
            files.add(name)
            if name == MANIFEST_NAME:
                if member.size > MAX_MANIFEST_BYTES:
                    raise InvalidManifest(_too_large())
                handle = archive.extractfile(member)
                text = handle.read() if handle is not None else None
    if text is None:
        raise InvalidManifest(f"{MANIFEST_NAME} is missing: every harness needs one at its root.")
    return manifest_from_toml(text, has_file=files.__contains__)


def manifest_from_toml(
    text: bytes | str, *, has_file: Callable[[str], bool] | None = None
) -> Manifest:
    """Parse and validate ``harness.toml``'s text; ``has_file`` (when given) says whether a path
    exists in the harness, to check that the entrypoint's module is there."""
    try:
        raw = text.decode() if isinstance(text, bytes) else text
        data = tomllib.loads(raw)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidManifest(f"{MANIFEST_NAME} is not valid TOML: {exc}") from None
    return parse_manifest(data, has_file=has_file)


def _too_large() -> str:
    return f"{MANIFEST_NAME} is larger than {MAX_MANIFEST_BYTES // 1024} KiB: it is not a manifest."


def parse_manifest(
    data: dict[str, Any],
    *,
    harness_dir: Path | None = None,
    has_file: Callable[[str], bool] | None = None,
) -> Manifest:
    """Validate a parsed ``harness.toml``. The entrypoint's module is checked against
    ``harness_dir`` or ``has_file`` when either is given."""
    where = MANIFEST_NAME
    if harness_dir is not None and has_file is None:
        root = Path(harness_dir)
        has_file = lambda name: (root / name).is_file()  # noqa: E731
    section = _table(data, "harness", where)
    _refuse_unknown(data, TABLES, where, what="tables")
    _refuse_unknown(section, HARNESS_KEYS, f"{where} [harness]")
    name = _required_str(section, "name", f"{where} [harness]")
    if ("entrypoint" in section) == ("command" in section):
        raise InvalidManifest(
            f"{where} [harness]: give exactly one of entrypoint (a Python 'module:function', "
            'e.g. \'agent:run\') or command (a program, e.g. ["python", "main.py"]).'
        )
    if "command" in section:
        return _program_manifest(data, section, name, has_file=has_file)
    entrypoint = _required_str(section, "entrypoint", f"{where} [harness]")
    if not _ENTRYPOINT.fullmatch(entrypoint):
        raise InvalidManifest(
            f"{where} [harness] entrypoint = {entrypoint!r}: expected 'module:function', e.g. 'agent:run'."
        )
    policy_api = section.get("policy_api", "completions")
    if policy_api not in POLICY_APIS:
        raise InvalidManifest(
            f"{where} [harness] policy_api = {policy_api!r}: expected one of {', '.join(POLICY_APIS)}."
        )
    components = _components(section, where)
    if has_file is not None:
        module_path = entrypoint.split(":")[0].replace(".", "/")
        if not any(
            has_file(candidate) for candidate in (f"{module_path}.py", f"{module_path}/__init__.py")
        ):
            raise InvalidManifest(
                f"{where} [harness] entrypoint = {entrypoint!r}: there is no {module_path}.py in the harness."
            )
    return Manifest(
        name=name,
        entrypoint=entrypoint,
        policy_api=policy_api,
        components=components,
        knobs=_knobs(data, where),
        limits=_limits(data, where),
        description=_optional_str(section, "description", f"{where} [harness]"),
        requirements=_requirements(section, has_file=has_file),
        **_node_dependencies(section, has_file=has_file),
    )


def _program_manifest(
    data: dict[str, Any],
    section: dict[str, Any],
    name: str,
    *,
    has_file: Callable[[str], bool] | None,
) -> Manifest:
    where = f"{MANIFEST_NAME} [harness]"
    command = section["command"]
    if (
        not isinstance(command, list)
        or not command
        or len(command) > MAX_COMMAND_ARGS
        or not all(isinstance(arg, str) and arg and "\0" not in arg for arg in command)
        or any(len(arg) > MAX_COMMAND_ARG_CHARS for arg in command)
    ):
        raise InvalidManifest(
            f"{where} command: expected a list of 1 to {MAX_COMMAND_ARGS} non-empty strings "
            '(the program and its arguments, e.g. ["python", "main.py"] or ["node", "agent.js"]).'
        )
    if "policy_api" in section:
        raise InvalidManifest(
            f"{where} policy_api: a program harness reaches the model through the worker's "
            "OpenAI-compatible endpoint, which serves both completions and chat; leave "
            "policy_api out (it is for entrypoint harnesses)."
        )
    program = command[0]
    # A relative path names a file shipped in the harness ("./run.sh", "bin/agent").
    shipped = "/" in program and not program.startswith("/")
    if has_file is not None and shipped and not has_file(program.removeprefix("./")):
        raise InvalidManifest(
            f"{where} command = {command!r}: there is no {program} in the harness."
        )
    return Manifest(
        name=name,
        entrypoint="",
        policy_api="chat",
        components=_components(section, MANIFEST_NAME),
        knobs=_knobs(data, MANIFEST_NAME),
        limits=_limits(data, MANIFEST_NAME),
        description=_optional_str(section, "description", where),
        command=tuple(command),
        requirements=_requirements(section, has_file=has_file),
        **_node_dependencies(section, has_file=has_file),
    )


def _requirements(section: dict[str, Any], *, has_file: Callable[[str], bool] | None) -> str:
    """``requirements``: a path inside the harness, to a ``*.txt`` requirements file or to a
    ``pyproject.toml`` whose ``uv.lock`` sits beside it (workers/harness_env.py builds them)."""
    where = f"{MANIFEST_NAME} [harness] requirements"
    if "requirements" not in section:
        return ""
    path = section["requirements"]
    if not isinstance(path, str) or not path.strip():
        raise InvalidManifest(f"{where}: expected a path such as 'requirements.txt'.")
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or ".." in parts or "" in parts[:-1]:
        raise InvalidManifest(
            f"{where} = {path!r}: expected a relative path inside the harness, such as "
            "'requirements.txt' or 'deps/pyproject.toml'."
        )
    name = parts[-1]
    if name != "pyproject.toml" and not name.endswith(".txt"):
        raise InvalidManifest(
            f"{where} = {path!r}: expected a pinned requirements file (a .txt file of "
            f"name==version lines) or a pyproject.toml with a {LOCK_NAME} beside it."
        )
    if has_file is not None and not has_file(path):
        raise InvalidManifest(f"{where} = {path!r}: there is no {path} in the harness.")
    lock = "/".join([*parts[:-1], LOCK_NAME])
    if name == "pyproject.toml" and has_file is not None and not has_file(lock):
        raise InvalidManifest(
            f"{where} = {path!r}: there is no {lock} beside it; commit the lock file "
            f"(`uv lock` writes it) so that every worker installs the same versions."
        )
    return path


def _node_dependencies(
    section: dict[str, Any], *, has_file: Callable[[str], bool] | None
) -> dict[str, Any]:
    """``node_lock``: a path inside the harness to a ``package-lock.json`` whose
    ``package.json`` sits beside it; ``node_scripts``: whether install scripts run."""
    where = f"{MANIFEST_NAME} [harness]"
    scripts = section.get("node_scripts", False)
    if not isinstance(scripts, bool):
        raise InvalidManifest(f"{where} node_scripts = {scripts!r}: expected true or false.")
    if "node_lock" not in section:
        if scripts:
            raise InvalidManifest(
                f"{where} node_scripts: there are no Node dependencies whose scripts could "
                f"run; name their lock with node_lock = {NODE_LOCK_NAME!r}."
            )
        return {}
    path = section["node_lock"]
    if not isinstance(path, str) or not path.strip():
        raise InvalidManifest(f"{where} node_lock: expected a path such as {NODE_LOCK_NAME!r}.")
    parts = path.split("/")
    if path.startswith("/") or "\\" in path or ".." in parts or "" in parts[:-1]:
        raise InvalidManifest(
            f"{where} node_lock = {path!r}: expected a relative path inside the harness, such "
            f"as {NODE_LOCK_NAME!r} or 'agent/{NODE_LOCK_NAME}'."
        )
    if parts[-1] != NODE_LOCK_NAME:
        raise InvalidManifest(
            f"{where} node_lock = {path!r}: expected an npm lock file, named {NODE_LOCK_NAME} "
            "(`npm install --package-lock-only` writes it)."
        )
    package = "/".join([*parts[:-1], NODE_PACKAGE_NAME])
    if has_file is not None and not has_file(path):
        raise InvalidManifest(f"{where} node_lock = {path!r}: there is no {path} in the harness.")
    if has_file is not None and not has_file(package):
        raise InvalidManifest(
            f"{where} node_lock = {path!r}: there is no {package} beside it; npm installs a "
            "lock only together with the package.json it was written from."
        )
    return {"node_lock": path, "node_scripts": scripts}


def _components(section: dict[str, Any], where: str) -> tuple[str, ...]:
    components = section.get("components", [])
    if not isinstance(components, list) or not all(isinstance(c, str) for c in components):
        raise InvalidManifest(f"{where} [harness] components: expected a list of paths.")
    for component in components:
        parts = component.replace("\\", "/").split("/")
        if not component.strip() or component.startswith("/") or ".." in parts:
            raise InvalidManifest(
                f"{where} [harness] components: {component!r} is not a path inside the harness "
                "(expected a relative path such as 'agent.py' or 'prompts/')."
            )
    return tuple(components)


def _knobs(data: dict[str, Any], where: str) -> dict[str, Knob]:
    knobs_data = data.get("knobs", {})
    if not isinstance(knobs_data, dict):
        raise InvalidManifest(f"{where} [knobs]: expected a table of knob tables.")
    return {
        knob_name: _knob(knob_name, spec, f"{where} [knobs.{knob_name}]")
        for knob_name, spec in knobs_data.items()
    }


def _limits(data: dict[str, Any], where: str) -> Limits:
    limits_data = data.get("limits", {})
    if not isinstance(limits_data, dict):
        raise InvalidManifest(f"{where} [limits]: expected a table.")
    _refuse_unknown(limits_data, LIMIT_KEYS, f"{where} [limits]")
    return Limits(
        **{
            key: _positive_int(limits_data, key, f"{where} [limits]")
            for key in LIMIT_KEYS
            if key in limits_data
        }
    )


def _refuse_unknown(
    table: dict[str, Any], allowed: tuple[str, ...], where: str, *, what: str = "keys"
) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise InvalidManifest(
            f"{where}: unknown {what} {unknown} (expected some of {', '.join(allowed)})."
        )


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise InvalidManifest(f"{where}: the [{key}] table is missing.")
    return value


def _required_str(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InvalidManifest(f"{where} {key}: expected a non-empty string.")
    return value


def _optional_str(table: dict[str, Any], key: str, where: str) -> str:
    value = table.get(key, "")
    if not isinstance(value, str):
        raise InvalidManifest(f"{where} {key}: expected a string.")
    return value


def _positive_int(table: dict[str, Any], key: str, where: str) -> int:
    value = table[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidManifest(f"{where} {key} = {value!r}: expected a positive integer.")
    return value


def _knob(name: str, spec: Any, where: str) -> Knob:
    if not isinstance(spec, dict):
        raise InvalidManifest(f"{where}: expected a table with type and default.")
    _refuse_unknown(spec, KNOB_KEYS, where)
    kind = spec.get("type")
    if kind not in KNOB_TYPES:
        raise InvalidManifest(f"{where} type = {kind!r}: expected one of {', '.join(KNOB_TYPES)}.")
    if "default" not in spec:
        raise InvalidManifest(f"{where}: default is missing.")
    raw_choices = spec.get("choices", [])
    if not isinstance(raw_choices, list):
        raise InvalidManifest(f"{where} choices: expected a list.")
    choices = tuple(raw_choices)
    for bound in ("min", "max"):
        value = spec.get(bound)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise InvalidManifest(f"{where} {bound} = {value!r}: expected a number.")
    if kind == "choice" and not choices:
        raise InvalidManifest(f"{where}: a choice knob needs a non-empty choices list.")
    if kind != "choice" and choices:
        raise InvalidManifest(f"{where} choices: only a knob of type 'choice' has choices.")
    if kind in ("bool", "choice") and ("min" in spec or "max" in spec):
        raise InvalidManifest(f"{where}: a {kind} knob has no min or max.")
    if spec.get("min") is not None and spec.get("max") is not None and spec["min"] > spec["max"]:
        raise InvalidManifest(f"{where}: min = {spec['min']!r} is above max = {spec['max']!r}.")
    knob = Knob(
        name=name,
        type=kind,
        default=spec["default"],
        min=spec.get("min"),
        max=spec.get("max"),
        choices=choices,
        description=_optional_str(spec, "description", where),
    )
    knob.validate(knob.default, where=where)
    return knob

"""Declared Node dependencies (``[harness] node_lock``): real npm, real sandbox, real runner.

The packages are npm tarballs written here (as test_harness_env.py writes its wheels) and added
to a cache of this module's own with ``npm cache add FILE``: every build is ``npm ci --offline``
from that cache (COEVO_HARNESS_NPM_CACHE), and the registry is set to a closed local port
besides, so no test reaches the network. npm finds a tarball in the cache by the lock's
integrity hash, so the locks name the registry's usual URLs.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from coevo.errors import InvalidManifest
from coevo.policies.client import PolicyClient
from harness_store.manifest import manifest_from_toml
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.workers.test_harness_env import write_wheel
from workers import sandbox
from workers.environments.base import Verdict
from workers.harness_env import (
    ENV_MOUNT,
    HarnessEnv,
    harness_env_binds,
    harness_env_prepare,
    harness_env_vars,
)
from workers.harness_requirements import harness_env_key, harness_requirements
from workers.outcomes import DependencyBuildFailed, RolloutOutcome
from workers.rollout import RolloutInputs, execute_rollout

# Under CI (which installs Node.js and npm) they always run.
pytestmark = pytest.mark.skipif(
    (shutil.which("npm") is None or shutil.which("node") is None) and not os.environ.get("CI"),
    reason="needs Node.js and npm",
)

CLOSED_REGISTRY = "http://127.0.0.1:9/"
# The sandbox starts a command by its path (a root worker's drop to the sandbox uid execs it).
NODE = shutil.which("node") or "node"


def write_tarball(directory: Path, name: str, version: str, files: dict[str, str], **meta) -> dict:
    """An npm package tarball (a gzipped tar of ``package/``), and its lock entry."""
    package = {"name": name, "version": version, **meta}
    members = {"package/package.json": json.dumps(package)}
    members |= {f"package/{path}": text for path, text in files.items()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, text in members.items():
            data = textwrap.dedent(text).encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    path = directory / f"{name}-{version}.tgz"
    path.write_bytes(buffer.getvalue())
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode()
    entry = {
        "version": version,
        "resolved": f"https://registry.npmjs.org/{name}/-/{name}-{version}.tgz",
        "integrity": integrity,
    }
    for key in ("dependencies", "bin"):
        if key in meta:
            entry[key] = meta[key]
    if "postinstall" in meta.get("scripts", {}):
        entry["hasInstallScript"] = True
    return entry


@pytest.fixture(scope="module")
def npm_packages(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    """The cache, filled from tarballs written here, and each package's lock entry."""
    directory = tmp_path_factory.mktemp("tarballs")
    cache = tmp_path_factory.mktemp("npm-cache")
    entries = {
        "coevo-tiny-left": write_tarball(
            directory,
            "coevo-tiny-left",
            "1.0.0",
            {
                "index.js": 'module.exports = "left+" + require("coevo-tiny-right");\n',
                "cli.js": "#!/usr/bin/env node\nconsole.log('tiny says ' + require('./index.js'));\n",
            },
            main="index.js",
            bin={"coevo-tiny": "cli.js"},
            dependencies={"coevo-tiny-right": "2.0.0"},
        ),
        "coevo-tiny-right": write_tarball(
            directory,
            "coevo-tiny-right",
            "2.0.0",
            {"index.js": 'module.exports = "right";\n'},
            main="index.js",
        ),
        # Its postinstall leaves a file in its own directory: proof that it ran.
        "coevo-tiny-hook": write_tarball(
            directory,
            "coevo-tiny-hook",
            "1.0.0",
            {"index.js": 'module.exports = "hook";\n'},
            main="index.js",
            scripts={"postinstall": "node -e \"require('fs').writeFileSync('RAN', 'yes')\""},
        ),
    }
    for tarball in sorted(directory.glob("*.tgz")):
        subprocess.run(
            ["npm", "cache", "add", str(tarball), "--cache", str(cache), "--no-update-notifier"],
            check=True,
            capture_output=True,
            cwd=directory,
            timeout=120,
        )
    return cache, entries


@pytest.fixture(autouse=True)
def offline_npm(settings, tmp_path, npm_packages):
    settings.COEVO_HARNESS_NPM_CACHE = str(npm_packages[0])
    settings.COEVO_HARNESS_NPM_REGISTRY = CLOSED_REGISTRY
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "harness-envs"
    settings.COEVO_HARNESS_ENV_MAX_BYTES = 64 * 1024**2
    settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S = 120


def lock_files(entries: dict[str, dict], top: tuple[str, ...]) -> tuple[str, str]:
    """package.json and its package-lock.json (lockfileVersion 3), as npm writes them."""
    dependencies = {name: entries[name]["version"] for name in top}
    package = {"name": "harness", "version": "1.0.0", "dependencies": dependencies}
    packages = {"": {"name": "harness", "version": "1.0.0", "dependencies": dependencies}}
    packages |= {f"node_modules/{name}": entry for name, entry in entries.items()}
    lock = {
        "name": "harness",
        "version": "1.0.0",
        "lockfileVersion": 3,
        "requires": True,
        "packages": packages,
    }
    return json.dumps(package, indent=2), json.dumps(lock, indent=2)


def node_harness(
    tmp_path: Path,
    entries: dict[str, dict],
    *,
    top: tuple[str, ...] = ("coevo-tiny-left",),
    name: str = "harness",
    agent: str = "",
    extra: str = "",
) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(
        f'[harness]\nname = "node-deps"\ncommand = ["node", "agent.js"]\n'
        f'node_lock = "package-lock.json"\n{extra}'
    )
    (directory / "agent.js").write_text(textwrap.dedent(agent))
    package, lock = lock_files(entries, top)
    (directory / "package.json").write_text(package)
    (directory / "package-lock.json").write_text(lock)
    return directory


def in_sandbox(env: HarnessEnv, script: str) -> sandbox.SandboxRun:
    """``script`` run by node in the sandbox, with the environment mounted as a program
    rollout has it."""
    return sandbox.run(
        [NODE, "-e", textwrap.dedent(script)],
        timeout_s=30,
        ro_binds=harness_env_binds(env.path),
        env=harness_env_vars(env.path, pythonpath="/opt/coevo"),
    )


LEFT_AND_RIGHT = {"coevo-tiny-left", "coevo-tiny-right"}


def only(entries: dict[str, dict], names: set[str]) -> dict[str, dict]:
    return {name: entry for name, entry in entries.items() if name in names}


# --- building and using an environment ---------------------------------------------------


def test_node_requires_the_declared_packages_in_the_sandbox(tmp_path, npm_packages):
    entries = only(npm_packages[1], LEFT_AND_RIGHT)
    with harness_env_prepare(harness_dir=node_harness(tmp_path, entries)) as env:
        assert env.built and env.path is not None
        run = in_sandbox(
            env,
            """
            console.log(require("coevo-tiny-left"));
            console.log(require.resolve("coevo-tiny-left"));
            """,
        )
        meta = json.loads((env.path.parent / "env.json").read_text())
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().split() == [
        "left+right",
        f"{ENV_MOUNT}/node_modules/coevo-tiny-left/index.js",
    ]
    assert meta["node"]["packages"] == ["coevo-tiny-left@1.0.0", "coevo-tiny-right@2.0.0"]
    assert meta["node"]["npm"] == {"cache": str(Path(npm_packages[0]).resolve())}
    assert meta["node"]["node"].startswith("node 20 ") or meta["node"]["node"].startswith("node ")


def test_a_packages_command_is_on_the_sandboxs_path(tmp_path, npm_packages):
    entries = only(npm_packages[1], LEFT_AND_RIGHT)
    with harness_env_prepare(harness_dir=node_harness(tmp_path, entries)) as env:
        run = sandbox.run(
            ["/bin/sh", "-c", "command -v coevo-tiny && coevo-tiny"],
            timeout_s=30,
            ro_binds=harness_env_binds(env.path),
            env=harness_env_vars(env.path, pythonpath="/opt/coevo"),
        )
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().splitlines() == [
        f"{ENV_MOUNT}/bin/coevo-tiny",
        "tiny says left+right",
    ]


def test_the_node_modules_are_read_only_inside_the_sandbox(tmp_path, npm_packages):
    entries = only(npm_packages[1], LEFT_AND_RIGHT)
    with harness_env_prepare(harness_dir=node_harness(tmp_path, entries)) as env:
        run = in_sandbox(
            env,
            f"""
            try {{
              require("fs").appendFileSync("{ENV_MOUNT}/node_modules/coevo-tiny-right/index.js",
                                           "module.exports = 'tampered';");
              console.log("written");
            }} catch (e) {{ console.log(e.code); }}
            """,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.decode().strip() in ("EROFS", "EACCES")
        right = env.path / "node_modules" / "coevo-tiny-right" / "index.js"
        assert "tampered" not in right.read_text()


def test_the_same_lock_hits_the_cache(tmp_path, npm_packages, settings):
    entries = only(npm_packages[1], LEFT_AND_RIGHT)
    first = harness_env_prepare(harness_dir=node_harness(tmp_path, entries, name="a"))
    first.close()
    # Another harness (another candidate) with the same lock: the same environment, at once.
    second = harness_env_prepare(harness_dir=node_harness(tmp_path, entries, name="b"))
    second.close()
    assert first.built and not second.built
    assert second.key == first.key and second.path == first.path
    assert second.seconds < 0.05 and second.seconds < first.seconds / 10, (first, second)
    envs = sorted(path.name for path in (Path(settings.COEVO_HARNESS_ENV_DIR) / "envs").iterdir())
    assert envs == [first.key]


def test_the_key_hashes_the_lock_the_scripts_switch_and_the_npm_source(
    tmp_path, npm_packages, settings
):
    entries = npm_packages[1]
    base = harness_requirements(node_harness(tmp_path, only(entries, LEFT_AND_RIGHT), name="a"))
    assert base is not None and base.source == "" and base.files == ()
    key = harness_env_key(base)
    other_lock = node_harness(
        tmp_path, only(entries, {"coevo-tiny-right"}), name="b", top=("coevo-tiny-right",)
    )
    assert harness_env_key(harness_requirements(other_lock)) != key
    scripts = node_harness(
        tmp_path, only(entries, LEFT_AND_RIGHT), name="c", extra="node_scripts = true\n"
    )
    assert harness_env_key(harness_requirements(scripts)) != key
    settings.COEVO_HARNESS_NPM_CACHE = ""
    assert harness_env_key(base) != key  # the registry instead of the cache


def test_one_harness_declares_python_and_node_packages_in_one_environment(
    tmp_path, npm_packages, settings
):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(
        wheels,
        "tinypy",
        "1.0",
        {"tinypy/__init__.py": "def main():\n    print('py says hello')\n"},
        entry_points="[console_scripts]\ntinypy = tinypy:main\n",
    )
    settings.COEVO_HARNESS_FIND_LINKS = str(wheels)
    directory = node_harness(
        tmp_path, only(npm_packages[1], LEFT_AND_RIGHT), extra='requirements = "requirements.txt"\n'
    )
    (directory / "requirements.txt").write_text("tinypy==1.0\n")
    with harness_env_prepare(harness_dir=directory) as env:
        run = sandbox.run(
            ["/bin/sh", "-c", "tinypy && coevo-tiny"],
            timeout_s=30,
            ro_binds=harness_env_binds(env.path),
            env=harness_env_vars(env.path, pythonpath="/opt/coevo"),
        )
        meta = json.loads((env.path.parent / "env.json").read_text())
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().splitlines() == ["py says hello", "tiny says left+right"]
    assert meta["requirements"] == ["tinypy==1.0"]
    assert meta["node"]["packages"] == ["coevo-tiny-left@1.0.0", "coevo-tiny-right@2.0.0"]

    # A Node command named like a Python script would hide one of them: refused.
    write_wheel(
        wheels,
        "tinyclash",
        "1.0",
        {"tinyclash/__init__.py": "def main():\n    pass\n"},
        entry_points="[console_scripts]\ncoevo-tiny = tinyclash:main\n",
    )
    (directory / "requirements.txt").write_text("tinyclash==1.0\n")
    with pytest.raises(DependencyBuildFailed, match="command 'coevo-tiny' has the name of a"):
        harness_env_prepare(harness_dir=directory)


# --- install scripts ---------------------------------------------------------------------


def test_install_scripts_do_not_run_unless_the_manifest_allows_them(tmp_path, npm_packages):
    entries = only(npm_packages[1], {"coevo-tiny-hook"})
    directory = node_harness(tmp_path, entries, top=("coevo-tiny-hook",), name="default")
    with harness_env_prepare(harness_dir=directory) as env:
        installed = env.path / "node_modules" / "coevo-tiny-hook"
        assert (installed / "index.js").is_file()
        assert not (installed / "RAN").exists()
        meta = json.loads((env.path.parent / "env.json").read_text())
    assert meta["node"]["scripts"] is False
    assert meta["node"]["install_scripts"] == ["coevo-tiny-hook@1.0.0"]

    # The switch, and only the switch, runs it: the same lock with node_scripts = true.
    allowed = node_harness(
        tmp_path, entries, top=("coevo-tiny-hook",), name="allowed", extra="node_scripts = true\n"
    )
    with harness_env_prepare(harness_dir=allowed) as env:
        assert (env.path / "node_modules" / "coevo-tiny-hook" / "RAN").read_text() == "yes"


# --- what is refused -----------------------------------------------------------------------


def broken_lock(tmp_path: Path, npm_packages, change) -> Path:
    entries = json.loads(json.dumps(only(npm_packages[1], LEFT_AND_RIGHT)))
    change(entries["coevo-tiny-right"])
    return node_harness(tmp_path, entries)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda e: e.update(resolved="git+ssh://git@github.com/someone/right.git#0123abcd"),
            "comes from 'git+ssh://git@github.com/someone/right.git#0123abcd', not from a "
            "registry's https tarball: git, file, link and other URLs are refused",
        ),
        (lambda e: e.update(resolved="file:../right"), "comes from 'file:../right'"),
        (
            lambda e: e.update(resolved="https://evil.example/right-2.0.0.tgz"),
            "comes from 'https://evil.example/right-2.0.0.tgz'",
        ),
        (
            lambda e: e.update(resolved="http://registry.npmjs.org/r/-/r-2.0.0.tgz"),
            "comes from 'http://registry.npmjs.org/r/-/r-2.0.0.tgz'",
        ),
        (lambda e: e.pop("integrity"), "(coevo-tiny-right@2.0.0) has no integrity hash"),
        (lambda e: e.pop("resolved"), "(coevo-tiny-right@2.0.0) has no resolved URL"),
        (
            lambda e: e.update(link=True, resolved="packages/right"),
            "is a link to a directory (a workspace or a file: dependency)",
        ),
    ],
)
def test_a_package_not_pinned_to_a_registry_tarball_is_refused_before_npm_runs(
    tmp_path, npm_packages, change, says, monkeypatch, settings
):
    directory = broken_lock(tmp_path, npm_packages, change)
    ran = []
    monkeypatch.setattr("workers.harness_env_build.run_bounded", lambda *a, **k: ran.append(a))
    with pytest.raises(DependencyBuildFailed) as caught:
        harness_env_prepare(harness_dir=directory)
    message = str(caught.value)
    assert message.startswith("declared dependencies: package-lock.json 'node_modules/coevo-tiny")
    assert says in message
    assert ran == []  # npm never started
    assert not list((Path(settings.COEVO_HARNESS_ENV_DIR) / "envs").iterdir())


def test_a_lock_of_another_version_is_refused(tmp_path, npm_packages):
    directory = node_harness(tmp_path, only(npm_packages[1], LEFT_AND_RIGHT))
    lock = json.loads((directory / "package-lock.json").read_text())
    lock["lockfileVersion"] = 1
    (directory / "package-lock.json").write_text(json.dumps(lock))
    with pytest.raises(DependencyBuildFailed, match="has lockfileVersion 1; write it with npm 9"):
        harness_env_prepare(harness_dir=directory)


def test_a_tarball_the_cache_lacks_fails_with_npms_message(tmp_path, npm_packages):
    # The lock pins another tarball than the one the cache holds (a changed integrity): npm
    # looks it up by that hash, finds nothing and, offline, does not look elsewhere.
    other = "sha512-" + base64.b64encode(hashlib.sha512(b"another tarball").digest()).decode()
    directory = broken_lock(tmp_path, npm_packages, lambda e: e.update(integrity=other))
    with pytest.raises(DependencyBuildFailed) as caught:
        harness_env_prepare(harness_dir=directory)
    message = str(caught.value)
    assert message.startswith("declared dependencies (package-lock.json) did not build: code ")
    assert "ENOTCACHED" in message and "coevo-tiny-right-2.0.0.tgz" in message


def test_a_lock_out_of_step_with_its_package_json_fails_with_npms_message(
    tmp_path, npm_packages, settings
):
    directory = node_harness(tmp_path, only(npm_packages[1], LEFT_AND_RIGHT))
    package = json.loads((directory / "package.json").read_text())
    package["dependencies"]["coevo-tiny-right"] = "3.0.0"  # the lock has 2.0.0
    (directory / "package.json").write_text(json.dumps(package))
    with pytest.raises(DependencyBuildFailed) as caught:
        harness_env_prepare(harness_dir=directory)
    # npm ci resolves what the lock does not satisfy, which offline it cannot: it never installs
    # anything but the lock.
    message = str(caught.value)
    assert message.startswith("declared dependencies (package-lock.json) did not build: ")
    assert "ENOTCACHED" in message and "coevo-tiny-right" in message
    assert not list((Path(settings.COEVO_HARNESS_ENV_DIR) / "envs").iterdir())


@pytest.mark.parametrize(
    ("harness_keys", "says"),
    [
        ("node_scripts = true\n", "node_scripts: there are no Node dependencies"),
        ('node_lock = "deps/yarn.lock"\n', "expected an npm lock file, named package-lock.json"),
        ('node_lock = "../package-lock.json"\n', "expected a relative path inside the harness"),
        ('node_lock = "package-lock.json"\nnode_scripts = "yes"\n', "expected true or false"),
        ('node_lock = "agent/package-lock.json"\n', "there is no agent/package.json beside it"),
    ],
)
def test_the_manifest_check_refuses_what_npm_could_not_install(harness_keys, says):
    text = f'[harness]\nname = "n"\ncommand = ["node", "a.js"]\n{harness_keys}'
    files = {"a.js", "package-lock.json", "package.json", "agent/package-lock.json"}
    with pytest.raises(InvalidManifest, match=says.replace("(", r"\(")):
        manifest_from_toml(text, has_file=files.__contains__)


# --- a program harness ---------------------------------------------------------------------

# A Node program that asks the model and answers with its dependency's value and the reply.
AGENT = """
const fs = require("fs");
const value = require("coevo-tiny-left");
const task = JSON.parse(fs.readFileSync(process.env.COEVO_TASK_FILE, "utf8"));
fetch(process.env.OPENAI_BASE_URL + "/chat/completions", {
  method: "POST",
  headers: {"Authorization": "Bearer " + process.env.OPENAI_API_KEY,
            "Content-Type": "application/json"},
  body: JSON.stringify({model: "x", messages: [{role: "user", content: task.question}]}),
}).then(r => r.json()).then(reply => {
  fs.writeFileSync(process.env.COEVO_ANSWER_FILE,
                   JSON.stringify(value + ":" + reply.choices[0].message.content));
});
"""


def run_program(directory: Path, env: HarnessEnv, url: str):
    inputs = RolloutInputs(
        harness_dir=directory,
        task_key="q1",
        task_view={"question": "is the sky blue?"},
        knob_overrides={},
        seed=3,
        wall_time_s=60,
        policy_version="base",
        harness_env=env.path,
    )

    def verify(answer):
        passed = answer == "left+right:yes"
        return Verdict(passed=passed, score=float(passed), detail=f"answer {answer!r}")

    with PolicyClient(url, model="scripted", retries=0, backoff_s=0.01) as client:
        return execute_rollout(inputs, policy=client, verify=verify)


def test_a_node_program_requires_its_declared_package_through_the_runner(tmp_path, npm_packages):
    directory = node_harness(tmp_path, only(npm_packages[1], LEFT_AND_RIGHT), agent=AGENT)
    policy = ScriptedPolicy(rules=[("sky", "yes")], default="no")
    with ScriptedOpenAIServer(policy) as server:
        started = time.monotonic()
        with harness_env_prepare(harness_dir=directory) as env:
            built_s = time.monotonic() - started
            result = run_program(directory, env, server.url)
        # Without its environment the same program cannot find the package.
        without = run_program(directory, HarnessEnv(), server.url)
    assert (result.outcome, result.score, result.answer) == (
        RolloutOutcome.PASSED,
        1.0,
        "left+right:yes",
    )
    assert built_s < 60
    assert without.outcome == RolloutOutcome.HARNESS_ERROR
    (error,) = [step.payload for step in without.steps if step.kind == "error"]
    assert "Cannot find module 'coevo-tiny-left'" in error["stderr"]

"""Declared dependencies (workers/harness_env.py and beside it): real uv, real sandbox, wheels written here.

Every build installs from a local wheel directory (COEVO_HARNESS_FIND_LINKS, so --no-index):
no test reaches a package index. The index URL is set to a closed local port besides, so a
build that asked one would fail rather than reach the network.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest
from uv import find_uv_bin

from coevo.campaigns.import_checks import candidate_import_check
from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.services import evaluation_create, rollout_execute
from coevo.suites.models import Split
from harness_store.services import candidate_import_directory
from tests.conftest import REPO_ROOT
from workers import harness_env_build, sandbox
from workers import harness_requirements as requirements_module
from workers.environments.base import Verdict
from workers.harness_env import (
    ENV_MOUNT,
    HarnessEnv,
    harness_env_binds,
    harness_env_ensure,
    harness_env_prepare,
    harness_env_vars,
    harness_envs_prune,
)
from workers.harness_requirements import harness_env_key, harness_requirements, parse_pins
from workers.outcomes import DependencyBuildFailed, ErrorKind, RolloutOutcome
from workers.rollout import RolloutInputs, execute_rollout

CLOSED_INDEX = "http://127.0.0.1:9/simple"


def write_wheel(
    directory: Path,
    name: str,
    version: str,
    files: dict[str, str],
    *,
    requires: tuple[str, ...] = (),
    entry_points: str = "",
) -> Path:
    """A pure-Python wheel, written by hand (the format is a zip with a dist-info)."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    members = {
        **files,
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: coevo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    if entry_points:
        members[f"{dist_info}/entry_points.txt"] = entry_points
    record = []
    for path, text in members.items():
        digest = hashlib.sha256(text.encode()).digest()
        encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        record.append(f"{path},sha256={encoded},{len(text.encode())}")
    members[f"{dist_info}/RECORD"] = "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in members.items():
            archive.writestr(member, text)
    return path


def write_sdist(directory: Path, name: str, version: str) -> Path:
    """A source distribution only (building it would run its code: never done)."""
    path = directory / f"{name}-{version}.tar.gz"
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo(f"{name}-{version}/PKG-INFO")
        info.size = len(pkg_info)
        archive.addfile(info, io.BytesIO(pkg_info))
    return path


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("wheelhouse")
    write_wheel(
        directory,
        "tinyalpha",
        "1.0",
        {"tinyalpha/__init__.py": "import tinybeta\nVALUE = 'alpha+' + tinybeta.VALUE\n"},
        requires=("tinybeta==2.0",),
    )
    write_wheel(directory, "tinybeta", "2.0", {"tinybeta/__init__.py": "VALUE = 'beta'\n"})
    write_wheel(
        directory,
        "tinygamma",
        "1.0",
        {"tinygamma/__init__.py": "def main():\n    print('gamma says hello')\n"},
        entry_points="[console_scripts]\ntinygamma = tinygamma:main\n",
    )
    # Three of about 200 KiB each, for the size bound.
    for index in range(3):
        write_wheel(
            directory,
            f"bulky{index}",
            "1.0",
            {f"bulky{index}/__init__.py": f"# {os.urandom(100 * 1024).hex()}\n"},
        )
    write_sdist(directory, "sourceonly", "1.0")
    return directory


@pytest.fixture(autouse=True)
def offline_index(settings, tmp_path, wheelhouse):
    settings.COEVO_HARNESS_FIND_LINKS = str(wheelhouse)
    settings.COEVO_HARNESS_INDEX_URL = CLOSED_INDEX
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "harness-envs"
    settings.COEVO_HARNESS_ENV_MAX_BYTES = 64 * 1024**2
    settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S = 120


MANIFEST = '[harness]\nname = "deps"\nentrypoint = "agent:run"\nrequirements = "{requirements}"\n'


def harness(
    tmp_path: Path,
    requirements: str,
    *,
    name: str = "harness",
    agent: str = "def run(task, ctx):\n    return '42'\n",
    path: str = "requirements.txt",
) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(MANIFEST.format(requirements=path))
    (directory / "agent.py").write_text(textwrap.dedent(agent))
    (directory / path).parent.mkdir(parents=True, exist_ok=True)
    (directory / path).write_text(requirements)
    return directory


def in_sandbox(env: HarnessEnv, code: str) -> sandbox.SandboxRun:
    """``code`` run by the worker's Python in the sandbox, with the environment mounted as a
    rollout mounts it."""
    variables = harness_env_vars(env.path, pythonpath="/opt/coevo")
    return sandbox.run(
        [sandbox.python_executable(), "-s", "-c", textwrap.dedent(code)],
        timeout_s=30,
        ro_binds=harness_env_binds(env.path),
        env=variables,
    )


def envs(settings) -> list[str]:
    return sorted(path.name for path in (Path(settings.COEVO_HARNESS_ENV_DIR) / "envs").iterdir())


PINNED = "tinyalpha==1.0\ntinybeta==2.0\n"


# --- building and using an environment ---------------------------------------------------


def test_a_harness_imports_its_declared_packages_in_the_sandbox(tmp_path):
    with harness_env_prepare(harness_dir=harness(tmp_path, PINNED)) as env:
        assert env.built and env.path is not None
        run = in_sandbox(env, "import tinyalpha; print(tinyalpha.VALUE, tinyalpha.__file__)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().split() == ["alpha+beta", f"{ENV_MOUNT}/tinyalpha/__init__.py"]


def test_the_environments_scripts_are_on_the_sandboxs_path(tmp_path):
    with harness_env_prepare(harness_dir=harness(tmp_path, "tinygamma==1.0\n")) as env:
        run = in_sandbox(
            env,
            """
            import os, shutil, subprocess
            print(shutil.which("tinygamma"))
            print(subprocess.run(["tinygamma"], capture_output=True, text=True).stdout)
            """,
        )
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().split("\n")[:2] == [f"{ENV_MOUNT}/bin/tinygamma", "gamma says hello"]


def test_the_environment_is_read_only_inside_the_sandbox(tmp_path):
    with harness_env_prepare(harness_dir=harness(tmp_path, PINNED)) as env:
        run = in_sandbox(
            env,
            f"""
            import errno
            for path in ("{ENV_MOUNT}/tinyalpha/__init__.py", "{ENV_MOUNT}/planted.py"):
                try:
                    open(path, "a").write("VALUE = 'tampered'\\n")
                except OSError as exc:
                    print(errno.errorcode[exc.errno])
                else:
                    print("written")
            for line in open("/proc/self/mountinfo"):
                fields = line.split()
                if fields[4] == "{ENV_MOUNT}":
                    print("mounted", fields[5].split(",")[0])
            """,
        )
        assert run.returncode == 0, run.stderr
        lines = run.stdout.decode().splitlines()
        # Writing fails whoever the sandbox runs as (a root worker's sandbox has another uid,
        # so permissions may refuse first), and the mount itself is read-only.
        assert lines[0] in ("EROFS", "EACCES") and lines[1] == "EROFS"
        assert lines[2:] == ["mounted ro"]
        assert "tampered" not in (env.path / "tinyalpha" / "__init__.py").read_text()
        assert not (env.path / "planted.py").exists()


def test_the_same_requirements_hit_the_cache(tmp_path, settings):
    first = harness_env_prepare(harness_dir=harness(tmp_path, PINNED, name="a"))
    first.close()
    # Another harness (another candidate) with the same file: the same environment.
    second = harness_env_prepare(harness_dir=harness(tmp_path, PINNED, name="b"))
    second.close()
    assert first.built and not second.built
    assert second.key == first.key and second.path == first.path
    assert second.seconds < 0.05 and second.seconds < first.seconds / 10, (first, second)
    assert envs(settings) == [first.key]


def test_a_harness_without_declared_dependencies_gets_no_environment(tmp_path, settings):
    directory = tmp_path / "plain"
    directory.mkdir()
    (directory / "harness.toml").write_text('[harness]\nname = "p"\nentrypoint = "agent:run"\n')
    (directory / "agent.py").write_text("def run(task, ctx):\n    return 1\n")
    (directory / "requirements.txt").write_text("not even pinned\n")  # not declared: ignored
    with harness_env_prepare(harness_dir=directory) as env:
        assert env.path is None and not env.built
    assert harness_env_binds(None) == {}
    assert harness_env_vars(None, pythonpath="/opt/coevo") == {"PYTHONPATH": "/opt/coevo"}


def test_a_manifest_that_does_not_load_is_left_to_the_rollout_to_report(tmp_path):
    directory = tmp_path / "broken"
    directory.mkdir()
    (directory / "harness.toml").write_text("[harness\n")
    assert harness_env_prepare(harness_dir=directory).path is None


def test_it_builds_a_pyproject_from_its_uv_lock(tmp_path, wheelhouse):
    directory = harness(
        tmp_path,
        textwrap.dedent(
            """
            [project]
            name = "locked-harness"
            version = "0"
            requires-python = ">=3.11"
            dependencies = ["tinyalpha==1.0"]

            [dependency-groups]
            dev = ["tinygamma==1.0"]
            """
        ),
        path="deps/pyproject.toml",
    )
    subprocess.run(
        [find_uv_bin(), "lock", "--no-config", "--no-cache", "--offline", "--no-index"]
        + ["--find-links", str(wheelhouse), "--project", str(directory / "deps")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with harness_env_prepare(harness_dir=directory) as env:
        run = in_sandbox(env, "import tinyalpha; print(tinyalpha.VALUE)")
        installed = sorted(path.name for path in env.path.glob("*.dist-info"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.decode().strip() == "alpha+beta"
    # The lock's dependencies, and not its development group.
    assert installed == ["tinyalpha-1.0.dist-info", "tinybeta-2.0.dist-info"]


# --- builds that fail: a harness_error of kind "dependencies" with the resolver's message ----


def failure(tmp_path: Path, requirements: str, **kwargs) -> DependencyBuildFailed:
    with pytest.raises(DependencyBuildFailed) as caught:
        harness_env_prepare(harness_dir=harness(tmp_path, requirements, **kwargs))
    assert caught.value.error_kind == ErrorKind.DEPENDENCIES == "dependencies"
    return caught.value


def test_a_missing_package_fails_with_the_resolvers_message(tmp_path, settings):
    fault = failure(tmp_path, "tinyalpha==1.0\ntinybeta==2.0\nnosuchpackage==1.0\n")
    message = str(fault)
    assert message.startswith("declared dependencies (requirements.txt) did not build: error:")
    assert "nosuchpackage was not found in the provided package locations" in message
    assert envs(settings) == []  # nothing half-built is left to use
    assert list((Path(settings.COEVO_HARNESS_ENV_DIR) / "builds").iterdir()) == []


def test_a_missing_version_fails_with_the_resolvers_message(tmp_path):
    message = str(failure(tmp_path, "tinyalpha==9.9\ntinybeta==2.0\n"))
    assert "tinyalpha==9.9" in message and "unsatisfiable" in message


def test_a_package_with_only_a_source_distribution_is_never_built(tmp_path):
    message = str(failure(tmp_path, "sourceonly==1.0\n"))
    assert "sourceonly==1.0 has no usable wheels" in message
    assert "building from source is disabled" in message


def test_an_unpinned_dependency_of_a_pin_fails_naming_it(tmp_path):
    message = str(failure(tmp_path, "tinyalpha==1.0\n"))
    assert "tinybeta==2.0 was installed as a dependency of the pins but not pinned" in message


@pytest.mark.parametrize(
    "line",
    [
        "tinyalpha>=1.0",
        "tinyalpha",
        "tinyalpha==1.*",
        "tinyalpha===1.0",
        "--index-url https://example.org/simple",
        "--extra-index-url=https://example.org/simple",
        "-r other.txt",
        "-e .",
        "./vendored/tinyalpha-1.0-py3-none-any.whl",
        "tinyalpha @ https://example.org/tinyalpha-1.0-py3-none-any.whl",
        "tinyalpha==1.0 --config-settings=x=y",
        "tinyalpha==1.0 ; python_version >= '3' --index-url x",
    ],
)
def test_anything_but_a_pin_is_refused_before_uv_runs(tmp_path, line, monkeypatch):
    def no_uv(*args, **kwargs):
        raise AssertionError("uv ran on a file that was not all pins")

    monkeypatch.setattr(harness_env_build, "run_bounded", no_uv)
    message = str(failure(tmp_path, f"# pins\ntinybeta==2.0\n{line}\n"))
    assert message.startswith("declared dependencies: requirements.txt line 3: ")
    assert "is not a pinned requirement" in message


def test_it_refuses_a_file_that_pins_nothing_or_a_package_twice(tmp_path):
    assert "pins no package" in str(failure(tmp_path, "# nothing\n\n", name="empty"))
    twice = failure(tmp_path, "tinybeta==2.0\nTinyBeta==2.0\n", name="twice")
    assert "line 2: TinyBeta is pinned twice" in str(twice)


def test_it_refuses_requirements_that_are_a_link_out_of_the_harness(tmp_path):
    secret = tmp_path / "worker-secret.txt"
    secret.write_text("tinybeta==2.0 # the worker's own file\n")
    directory = harness(tmp_path, "")
    (directory / "requirements.txt").unlink()
    (directory / "requirements.txt").symlink_to(secret)
    with pytest.raises(DependencyBuildFailed, match="is not a file inside the harness"):
        harness_env_prepare(harness_dir=directory)


def test_a_build_that_runs_past_its_timeout_is_stopped(tmp_path, settings):
    # An index that accepts connections and never answers.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    settings.COEVO_HARNESS_FIND_LINKS = ""
    settings.COEVO_HARNESS_INDEX_URL = f"http://127.0.0.1:{server.getsockname()[1]}/simple"
    settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S = 2
    started = time.monotonic()
    try:
        message = str(failure(tmp_path, PINNED))
    finally:
        server.close()
    assert time.monotonic() - started < 10
    assert "did not build within 2s (COEVO_HARNESS_ENV_BUILD_TIMEOUT_S)" in message


def test_the_index_urls_credentials_never_reach_the_message(tmp_path, settings):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.close()  # nothing listens there: the build fails at once
    settings.COEVO_HARNESS_FIND_LINKS = ""
    settings.COEVO_HARNESS_INDEX_URL = f"http://builder:s3cret-token@127.0.0.1:{port}/simple"
    message = str(failure(tmp_path, PINNED))
    assert "did not build" in message
    assert "s3cret-token" not in message and "builder" not in message


def test_the_output_of_a_build_step_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(harness_env_build, "MAX_OUTPUT_BYTES", 1024 * 1024)
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    started = time.monotonic()
    run = harness_env_build.run_bounded(
        [sandbox.python_executable(), "-c", flood], env={}, cwd=tmp_path, timeout_s=60
    )
    assert run.flooded and not run.timed_out and run.returncode is None
    assert len(run.output) <= harness_env_build.OUTPUT_TAIL_BYTES
    assert time.monotonic() - started < 30


# --- the key ------------------------------------------------------------------------------


def test_the_key_hashes_the_files_the_python_and_the_index(tmp_path, settings, monkeypatch):
    base = harness_requirements(harness(tmp_path, PINNED, name="a"))
    key = harness_env_key(base)
    # Another harness's other files do not matter; the requirement file's bytes do.
    assert harness_env_key(harness_requirements(harness(tmp_path, PINNED, name="b"))) == key
    reordered = harness_requirements(harness(tmp_path, "tinybeta==2.0\ntinyalpha==1.0\n"))
    assert harness_env_key(reordered) != key
    settings.COEVO_HARNESS_FIND_LINKS = str(tmp_path)
    assert harness_env_key(base) != key
    settings.COEVO_HARNESS_FIND_LINKS = ""
    assert harness_env_key(base) != key
    settings.COEVO_HARNESS_INDEX_URL = "https://mirror.example/simple"
    other_index = harness_env_key(base)
    assert other_index != key
    monkeypatch.setattr(requirements_module.platform, "python_version", lambda: "3.99.0")
    assert harness_env_key(base) != other_index


def test_it_parses_the_pins_uv_and_pip_compile_write():
    text = textwrap.dedent(
        """\
        # This file was autogenerated by uv via the following command:
        tinyalpha[fast, extra_two]==1.0 \\
            --hash=sha256:aaaa \\
            --hash=sha256:bbbb
            # via -r requirements.in
        Tiny.Beta==2.0.post1+local ; python_version >= '3.11' and sys_platform != "win32"
        windowsonly==1.0 ; sys_platform == 'win32'
        windowsonly==2.0 ; sys_platform != 'win32'
        """
    )
    pins = parse_pins(text, source="requirements.txt")
    assert [pin.line() for pin in pins] == [
        "tinyalpha[fast,extra_two]==1.0 --hash=sha256:aaaa --hash=sha256:bbbb",
        "Tiny.Beta==2.0.post1+local ; python_version >= '3.11' and sys_platform != \"win32\"",
        "windowsonly==1.0 ; sys_platform == 'win32'",
        "windowsonly==2.0 ; sys_platform != 'win32'",
    ]
    assert pins[1].normalized_name == "tiny-beta"


# --- the cache: concurrency, half-built directories, the size bound --------------------------


def test_concurrent_ensures_of_one_key_build_once(tmp_path, settings):
    requirements = harness_requirements(harness(tmp_path, PINNED))
    barrier = threading.Barrier(6)
    results: list[HarnessEnv] = []

    def ensure() -> None:
        barrier.wait()
        env = harness_env_ensure(requirements)
        results.append(env)
        env.close()

    threads = [threading.Thread(target=ensure) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 6
    assert sum(env.built for env in results) == 1
    assert {env.path for env in results} == {results[0].path}
    assert envs(settings) == [results[0].key]


_ENSURE_IN_A_WORKER = """
import json, sys
from pathlib import Path
import django
django.setup()
from workers.harness_env import harness_env_ensure
from workers.harness_requirements import harness_requirements
env = harness_env_ensure(harness_requirements(Path(sys.argv[1])))
print(json.dumps([env.built, str(env.path)]))
env.close()
"""


def test_concurrent_ensures_from_worker_processes_build_once(tmp_path, settings):
    # Separate interpreters, as worker processes are (forking this multi-threaded test process
    # could copy a lock some other thread holds, and hang).
    directory = harness(tmp_path, PINNED)
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "coevo.settings",
        "COEVO_HARNESS_FIND_LINKS": str(settings.COEVO_HARNESS_FIND_LINKS),
        "COEVO_HARNESS_INDEX_URL": str(settings.COEVO_HARNESS_INDEX_URL),
        "COEVO_HARNESS_ENV_DIR": str(settings.COEVO_HARNESS_ENV_DIR),
        "COEVO_HARNESS_ENV_BUILD_TIMEOUT_S": str(settings.COEVO_HARNESS_ENV_BUILD_TIMEOUT_S),
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _ENSURE_IN_A_WORKER, str(directory)],
            env=environ,
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(built for built, _ in results) == [False, False, True]
    assert len({path for _, path in results}) == 1
    assert len(envs(settings)) == 1


def test_a_crashed_build_is_never_used_and_is_cleaned_up(tmp_path, settings):
    requirements = harness_requirements(harness(tmp_path, PINNED))
    key = harness_env_key(requirements)
    root = Path(settings.COEVO_HARNESS_ENV_DIR)
    # What a worker killed mid-build leaves: a directory in builds/, nothing in envs/.
    stale = root / "builds" / f"{key}-deadbeef" / "env" / "site" / "tinyalpha"
    stale.mkdir(parents=True)
    (stale / "__init__.py").write_text("VALUE = 'half-built'\n")
    with harness_env_ensure(requirements) as env:
        assert env.built
        assert (env.path / "tinyalpha" / "__init__.py").read_text().startswith("import tinybeta")
    assert list((root / "builds").iterdir()) == []


def test_it_removes_the_least_recently_used_environments_past_the_size_bound(tmp_path, settings):
    keys = []
    for index in range(3):
        directory = harness(tmp_path, f"bulky{index}==1.0\n", name=f"h{index}")
        with harness_env_prepare(harness_dir=directory) as env:
            keys.append(env.key)
    assert envs(settings) == sorted(keys)
    largest = max(env_bytes(settings, key) for key in keys)
    # Room for two of them and a small one: the next build evicts the least recently used,
    # which is bulky1's once bulky0's is used again.
    settings.COEVO_HARNESS_ENV_MAX_BYTES = int(largest * 2.5)
    time.sleep(0.01)
    harness_env_prepare(harness_dir=harness(tmp_path, "bulky0==1.0\n", name="again")).close()
    with harness_env_prepare(harness_dir=harness(tmp_path, PINNED, name="new")) as newest:
        assert newest.built
    assert envs(settings) == sorted([keys[0], keys[2], newest.key])
    kept = sum(env_bytes(settings, key) for key in envs(settings))
    assert kept <= settings.COEVO_HARNESS_ENV_MAX_BYTES
    # The figure each environment records is what it takes on disk.
    site = Path(settings.COEVO_HARNESS_ENV_DIR) / "envs" / keys[0] / "site"
    on_disk = sum(path.lstat().st_blocks * 512 for path in [site, *site.rglob("*")])
    assert env_bytes(settings, keys[0]) == on_disk


def env_bytes(settings, key: str) -> int:
    meta = Path(settings.COEVO_HARNESS_ENV_DIR) / "envs" / key / "env.json"
    return json.loads(meta.read_text())["bytes"]


def test_an_environment_in_use_is_not_removed(tmp_path, settings):
    held = harness_env_prepare(harness_dir=harness(tmp_path, "bulky0==1.0\n", name="held"))
    with harness_env_prepare(harness_dir=harness(tmp_path, "bulky1==1.0\n", name="idle")) as idle:
        pass
    settings.COEVO_HARNESS_ENV_MAX_BYTES = 1  # nothing fits
    try:
        assert harness_envs_prune() == [idle.key]  # the held one is older, and still kept
        assert envs(settings) == [held.key]
        assert (held.path / "bulky0" / "__init__.py").is_file()
    finally:
        held.close()
    assert harness_envs_prune() == [held.key]
    assert envs(settings) == []


def test_an_environment_larger_than_the_whole_bound_does_not_build(tmp_path, settings):
    settings.COEVO_HARNESS_ENV_MAX_BYTES = 64 * 1024
    message = str(failure(tmp_path, "bulky0==1.0\n"))
    assert "more than the 0.1 MiB this worker keeps" in message
    assert "COEVO_HARNESS_ENV_MAX_BYTES" in message
    assert envs(settings) == []


# --- in a rollout, in the import stage, unsandboxed -----------------------------------------

ANSWER_FROM_THE_PACKAGE = """
import tinyalpha

def run(task, ctx):
    return tinyalpha.VALUE
"""


def run_rollout(directory: Path, env: HarnessEnv):
    inputs = RolloutInputs(
        harness_dir=directory,
        task_key="t/1",
        task_view={},
        knob_overrides={},
        seed=0,
        wall_time_s=20,
        harness_env=env.path,
    )
    return execute_rollout(
        inputs,
        policy=None,  # the harness asks no model
        verify=lambda answer: Verdict(answer == "alpha+beta", float(answer == "alpha+beta"), ""),
    )


def test_a_rollout_runs_the_harness_with_its_declared_packages(tmp_path):
    directory = harness(tmp_path, PINNED, agent=ANSWER_FROM_THE_PACKAGE)
    with harness_env_prepare(harness_dir=directory) as env:
        result = run_rollout(directory, env)
    assert result.outcome == RolloutOutcome.PASSED, result.detail
    # Without its environment the same harness cannot import the package.
    without = run_rollout(directory, HarnessEnv())
    assert without.outcome == RolloutOutcome.HARNESS_ERROR
    assert "No module named 'tinyalpha'" in without.detail


def test_an_unsandboxed_rollout_finds_the_environment_too(tmp_path, settings, monkeypatch):
    monkeypatch.setattr("workers.sandbox.shutil.which", lambda name: None)
    settings.COEVO_ALLOW_UNSANDBOXED = True
    directory = harness(tmp_path, PINNED, agent=ANSWER_FROM_THE_PACKAGE)
    with harness_env_prepare(harness_dir=directory) as env:
        result = run_rollout(directory, env)
    assert result.outcome == RolloutOutcome.PASSED, result.detail


def stored_candidate(project, tmp_path: Path, requirements: str, *, name: str):
    directory = harness(tmp_path, requirements, name=name, agent=ANSWER_FROM_THE_PACKAGE)
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message=name, author_name="T"
    )
    return candidate


@pytest.mark.django_db(transaction=True)
def test_a_build_that_fails_ends_the_rollout_as_a_harness_error_of_kind_dependencies(
    empty_queue, tmp_path, project, humaneval_suite, policy_version
):
    candidate = stored_candidate(project, tmp_path, "nosuchpackage==1.0\n", name="missing")
    evaluation = evaluation_create(
        candidate=candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    rollout = Rollout.objects.get(evaluation=evaluation)

    done = rollout_execute(rollout_id=rollout.id, worker="test")

    assert done.outcome == RolloutOutcome.HARNESS_ERROR and done.score == 0.0
    assert done.error_kind == ErrorKind.DEPENDENCIES
    assert done.detail.startswith("declared dependencies (requirements.txt) did not build: error:")
    assert "nosuchpackage was not found in the provided package locations" in done.detail
    steps = list(TraceStep.objects.filter(rollout=done).values_list("kind", "payload"))
    assert steps == [("error", {"outcome": "harness_error", "message": done.detail})]


@pytest.mark.django_db(transaction=True)
def test_a_rollout_of_a_stored_candidate_imports_its_declared_packages(
    empty_queue, tmp_path, project, humaneval_suite, policy_version, settings
):
    candidate = stored_candidate(project, tmp_path, PINNED, name="pinned")
    evaluation = evaluation_create(
        candidate=candidate,
        suite=humaneval_suite,
        split=Split.SEARCH,
        policy_version=policy_version,
        task_limit=1,
    )
    rollout = Rollout.objects.get(evaluation=evaluation)

    done = rollout_execute(rollout_id=rollout.id, worker="test")

    # HumanEval fails the answer, but the harness ran and answered with the package's value.
    assert done.outcome == RolloutOutcome.TASK_FAILURE, done.detail
    assert done.answer == "alpha+beta"
    assert len(envs(settings)) == 1


@pytest.mark.django_db
def test_the_import_stage_builds_the_dependencies_and_imports_with_them(
    tmp_path, project, settings
):
    check = candidate_import_check(candidate=stored_candidate(project, tmp_path, PINNED, name="a"))
    assert check.ok, check
    assert len(envs(settings)) == 1  # built here: the first rollout finds it cached

    missing = stored_candidate(project, tmp_path, "tinyalpha==9.9\ntinybeta==2.0\n", name="b")
    check = candidate_import_check(candidate=missing)
    assert not check.ok
    assert check.reason.startswith("declared dependencies (requirements.txt) did not build")
    assert "tinyalpha==9.9" in check.reason

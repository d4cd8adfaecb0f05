"""The shipped example agents' declared dependencies, built as a worker builds them from what
scripts/test prepares (no index or registry is asked): Python requirements from the wheel
directory var/wheelhouse (scripts/lib.sh, ensure_test_wheelhouse), npm locks from
var/npm-cache (ensure_test_npm_cache)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO_ROOT
from workers.harness_env import HarnessEnv, harness_env_prepare

NPM_CACHE = REPO_ROOT / "var" / "npm-cache"
WHEELHOUSE = Path(os.environ.get("COEVO_TEST_WHEELHOUSE") or Path.cwd() / "var" / "wheelhouse")


def wheelhouse_use(settings) -> None:
    """Build harness environments from the wheel directory alone, as scripts/test fills it."""
    assert (WHEELHOUSE / ".requirements-sha256").exists(), (
        f"no wheel directory at {WHEELHOUSE}: scripts/test downloads the example agents' wheels"
    )
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)


@contextlib.contextmanager
def wheel_example_env(settings, env_dir: Path, example: Path) -> Iterator[Path]:
    """``example``'s requirements built from the wheel directory into ``env_dir``, held while
    the caller mounts the environment (its path)."""
    wheelhouse_use(settings)
    settings.COEVO_HARNESS_ENV_DIR = env_dir
    with harness_env_prepare(harness_dir=example) as env:
        assert env.path is not None
        yield env.path


@contextlib.contextmanager
def npm_example_env(settings, env_dir: Path, example: Path) -> Iterator[HarnessEnv]:
    """``example``'s npm lock installed from the prefilled cache into ``env_dir`` (npm is never
    online: the registry setting points nowhere), held while the caller uses it."""
    assert (NPM_CACHE / ".locks-sha256").exists(), (
        f"no npm cache at {NPM_CACHE}: scripts/test adds the example agents' packages to it "
        "(scripts/lib.sh, ensure_test_npm_cache)"
    )
    settings.COEVO_HARNESS_NPM_CACHE = str(NPM_CACHE)
    settings.COEVO_HARNESS_NPM_REGISTRY = "http://127.0.0.1:9/"
    settings.COEVO_HARNESS_ENV_DIR = env_dir
    settings.COEVO_HARNESS_ENV_MAX_BYTES = 4 * 1024**3  # the agents' native binaries, ~400 MB
    with harness_env_prepare(harness_dir=example) as env:
        assert env.path is not None
        yield env

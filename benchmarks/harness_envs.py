"""Harness dependency builds: a small environment built cold, then found warm.

Cold: a fresh COEVO_HARNESS_ENV_DIR for each run, so workers/harness_env.py builds the
environment as a worker does before a candidate's first rollout (uv installs the pinned wheels
with its own cache off, bytecode is compiled, the directory is renamed into place). Warm: the
same requirements asked for again, as every later rollout of any candidate with the same file
does (a lock, a stat and a touch). Reported: the median and the slowest of ``--runs`` cold
builds, and the median and p95 of ``--warm`` warm ones.

    .venv/bin/python benchmarks/harness_envs.py                       # from PyPI
    .venv/bin/python benchmarks/harness_envs.py --find-links WHEELS   # a local wheel directory

Without ``--requirements`` the environment is the openai SDK's pins (DEFAULT_PINS: what an
agent on the unmodified SDK declares). ``--download WHEELS`` first fetches those wheels into
WHEELS with pip (for the --find-links measurement) and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# `uv pip compile` of `openai` for Python 3.11, wheels only (2026-12-01).
DEFAULT_PINS = """\
annotated-types==0.8.0
anyio==4.16.0
h11==0.16.0
httpcore2==2.16.2
httpx2==2.16.2
idna==3.20
jiter==0.19.0
openai==3.57.0
pydantic==2.14.4
pydantic-core==2.50.5
sniffio==1.3.1
truststore==0.10.5
typing-extensions==4.16.0
typing-inspection==0.4.5
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", type=Path, help="a pinned requirements file")
    parser.add_argument("--index-url", default="https://pypi.org/simple")
    parser.add_argument("--find-links", type=Path, help="a local wheel directory (--no-index)")
    parser.add_argument("--download", type=Path, help="fetch the wheels into this directory")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", type=int, default=50)
    args = parser.parse_args()
    pins = args.requirements.read_text() if args.requirements else DEFAULT_PINS
    if args.download:
        download(pins, args.download)
        return

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    import django

    django.setup()
    from django.conf import settings

    from workers.harness_env import harness_env_prepare

    settings.COEVO_HARNESS_INDEX_URL = args.index_url
    settings.COEVO_HARNESS_FIND_LINKS = str(args.find_links.resolve()) if args.find_links else ""
    with tempfile.TemporaryDirectory(prefix="coevo-bench-envs-") as tmp:
        harness = Path(tmp) / "harness"
        harness.mkdir()
        (harness / "harness.toml").write_text(
            '[harness]\nname = "bench"\nentrypoint = "agent:run"\n'
            'requirements = "requirements.txt"\n'
        )
        (harness / "agent.py").write_text("def run(task, ctx):\n    return None\n")
        (harness / "requirements.txt").write_text(pins)
        cold, installs = [], []
        for run in range(args.runs):
            settings.COEVO_HARNESS_ENV_DIR = Path(tmp) / f"envs-{run}"
            with harness_env_prepare(harness_dir=harness) as env:
                assert env.built
                cold.append(env.seconds)
                meta = json.loads((env.path.parent / "env.json").read_text())
                installs.append(meta["install_seconds"])
                size = sum(p.lstat().st_blocks * 512 for p in env.path.rglob("*"))
        warm = []
        for _ in range(args.warm):
            with harness_env_prepare(harness_dir=harness) as env:
                assert not env.built
                warm.append(env.seconds)
    warm.sort()
    source = f"--find-links {args.find_links}" if args.find_links else args.index_url
    print(
        f"machine: {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}"
    )
    print(
        f"environment: {len(pins.split())} pinned packages, {size / 1024**2:.1f} MiB, from {source}"
    )
    print(
        f"cold build: median {statistics.median(cold):.2f} s, slowest {max(cold):.2f} s "
        f"({args.runs} runs); of which uv's install: median {statistics.median(installs):.2f} s "
        "(the rest: bytecode, permissions, size)"
    )
    p95 = warm[min(len(warm) - 1, int(len(warm) * 0.95))]
    print(
        f"warm (cached): median {statistics.median(warm) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms ({args.warm} runs)"
    )


def download(pins: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
        requirements.write(pins)
        requirements.flush()
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--only-binary", ":all:", "--no-deps"]
            + ["-r", requirements.name, "-d", str(directory)],
            check=True,
        )
    print(f"wheels in {directory}")


if __name__ == "__main__":
    main()

"""TextWorld: text adventure games generated offline by ``tw-make`` with fixed seeds.

The games ship pre-generated in ``coevo/suites/data/textworld/`` (``games.tar.xz`` and its
``manifest.json``): ``tw-make`` takes 8-15 s a game and is not byte-reproducible (set ordering
leaks into the files), so generating at import time would make imports take ten minutes and
change the suite's content hash from one machine to the next. ``python -m
coevo.suites.textworld build`` regenerates them with the commands and seeds in ``LEVELS``.

Workers never share a disk with the web process, so each game's files travel in the task's
``verifier`` (xz-compressed, base64), which never enters the sandbox; ``inputs`` holds only what
a harness may know before playing.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coevo.errors import CoevoError, InvalidInput
from workers.environments.textworld import DEFAULT_MAX_STEPS, encode_blob

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from coevo.projects.models import Project
    from coevo.suites.models import Suite

DATA_DIR = Path(__file__).resolve().parent / "data" / "textworld"
ARCHIVE_NAME = "games.tar.xz"
MANIFEST_NAME = "manifest.json"
TEXTWORLD_VERSION = "1.7.0"
VERSION = f"textworld-{TEXTWORLD_VERSION}-games-1"
GAMES_PER_LEVEL = 10
MAX_STEPS_RANGE = (1, 500)


@dataclass(frozen=True)
class Level:
    name: str
    challenge: str
    options: tuple[str, ...]
    first_seed: int
    description: str


# Easy to hard; the seeds of a level are first_seed, first_seed + 1, ...
LEVELS: tuple[Level, ...] = (
    Level(
        "cooking-easy",
        "tw-cooking",
        ("--recipe", "1", "--take", "1", "--go", "1"),
        1000,
        "one room, one ingredient to take",
    ),
    Level(
        "cooking-medium",
        "tw-cooking",
        ("--recipe", "2", "--take", "2", "--go", "6", "--open"),
        2000,
        "six rooms, two ingredients, closed doors and containers",
    ),
    Level(
        "cooking-hard",
        "tw-cooking",
        ("--recipe", "3", "--take", "3", "--go", "9", "--open", "--cook", "--cut"),
        3000,
        "nine rooms, three ingredients to find, cut and cook",
    ),
    Level(
        "simple-dense",
        "tw-simple",
        ("--rewards", "dense", "--goal", "detailed"),
        4000,
        "a point for every useful step, detailed goal",
    ),
    Level(
        "simple-balanced",
        "tw-simple",
        ("--rewards", "balanced", "--goal", "brief"),
        5000,
        "points for milestones, brief goal",
    ),
    Level(
        "simple-sparse",
        "tw-simple",
        ("--rewards", "sparse", "--goal", "none"),
        6000,
        "a point only for winning, no goal given",
    ),
)


@dataclass(frozen=True)
class TextWorldGame:
    key: str
    level: str
    challenge: str
    seed: int
    max_score: int
    z8: bytes
    game_json: bytes

    @property
    def walkthrough(self) -> list[str]:
        return list(json.loads(self.game_json)["metadata"].get("walkthrough") or [])


def tw_make_command(
    level: Level, *, seed: int, output: Path, tw_make: str = "tw-make"
) -> list[str]:
    return [tw_make, level.challenge, *level.options, "--seed", str(seed), "--output", str(output)]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# Small caches: reading the archive takes about a second, and the games are 30 MB unpacked.
@lru_cache(maxsize=2)
def textworld_games(data_dir: Path = DATA_DIR) -> tuple[tuple[TextWorldGame, ...], str]:
    """The shipped games and a hash of their files (checked against the manifest)."""
    try:
        manifest = json.loads((data_dir / MANIFEST_NAME).read_text())
        with tarfile.open(data_dir / ARCHIVE_NAME, "r:xz") as archive:
            files = {
                m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()
            }
    except (FileNotFoundError, ValueError, tarfile.TarError, lzma.LZMAError) as exc:
        raise CoevoError(
            f"The TextWorld games are missing or unreadable in {data_dir} ({exc}); "
            "regenerate them with `python -m coevo.suites.textworld build`."
        ) from exc
    games = []
    digest = hashlib.sha256(VERSION.encode())
    for entry in manifest["games"]:
        z8, game_json = files.get(f"{entry['key']}.z8"), files.get(f"{entry['key']}.json")
        expected = (entry["z8_sha256"], entry["json_sha256"])
        if z8 is None or game_json is None or (_sha256(z8), _sha256(game_json)) != expected:
            raise CoevoError(
                f"TextWorld game {entry['key']!r} in {data_dir / ARCHIVE_NAME} does not match "
                f"{MANIFEST_NAME}; regenerate with `python -m coevo.suites.textworld build`."
            )
        games.append(
            TextWorldGame(
                key=entry["key"],
                level=entry["level"],
                challenge=entry["challenge"],
                seed=entry["seed"],
                max_score=entry["max_score"],
                z8=z8,
                game_json=game_json,
            )
        )
        digest.update(
            f"{entry['key']}\x00{entry['z8_sha256']}\x00{entry['json_sha256']}\n".encode()
        )
    return tuple(games), digest.hexdigest()


def suite_name_for(*, admissible_commands: bool, max_steps: int) -> str:
    name = "textworld"
    if not admissible_commands:
        name += "-no-commands"
    if max_steps != DEFAULT_MAX_STEPS:
        name += f"-{max_steps}-steps"
    return name


def suite_import_textworld(
    *,
    project: Project,
    split_seed: str = "0",
    admissible_commands: bool = True,
    max_steps: int = DEFAULT_MAX_STEPS,
    actor: AbstractBaseUser | None = None,
) -> tuple[Suite, bool]:
    """Import the shipped TextWorld games; the same games, seed and config return the same suite.

    ``admissible_commands`` (whether a harness is shown the valid commands at every step) and
    ``max_steps`` (the per-game step limit) are part of the suite's identity: they change what
    a score means.
    """
    # Imported here so that `python -m coevo.suites.textworld build` runs without Django.
    from django.db import transaction

    from coevo.suites.models import Suite, SuiteKind, Task
    from coevo.suites.services import suite_audit
    from coevo.suites.splits import split_for

    low, high = MAX_STEPS_RANGE
    if (
        isinstance(max_steps, bool)
        or not isinstance(max_steps, int)
        or not low <= max_steps <= high
    ):
        raise InvalidInput(
            f"The TextWorld step limit must be an integer from {low} to {high}, got {max_steps!r}."
        )
    games, games_hash = textworld_games()
    config = {"admissible_commands": bool(admissible_commands), "max_steps": max_steps}
    content_hash = _sha256(f"{games_hash}\x00{json.dumps(config, sort_keys=True)}".encode())
    name = suite_name_for(admissible_commands=admissible_commands, max_steps=max_steps)
    existing = Suite.objects.filter(
        project=project, name=name, content_hash=content_hash, split_seed=split_seed
    ).first()
    if existing:
        return existing, False
    levels = ", ".join(f"{lv.name} ({lv.description})" for lv in LEVELS)
    shown = "shown" if admissible_commands else "not shown"
    with transaction.atomic():
        suite = Suite.objects.create(
            project=project,
            name=name,
            kind=SuiteKind.TEXTWORLD,
            version=VERSION,
            content_hash=content_hash,
            split_seed=split_seed,
            description=f"TextWorld {TEXTWORLD_VERSION}: {len(games)} text games generated "
            f"offline by tw-make with fixed seeds, {GAMES_PER_LEVEL} per level: {levels}. "
            f"At most {max_steps} steps a game; admissible commands {shown}. "
            "Score = points / max points; passed = won.",
        )
        Task.objects.bulk_create(
            Task(
                suite=suite,
                key=game.key,
                split=split_for(game.key, seed=split_seed),
                position=position,
                **task_payload(game, admissible_commands=admissible_commands, max_steps=max_steps),
            )
            for position, game in enumerate(games)
        )
    suite_audit(actor=actor, suite=suite, action="suite.imported")
    return suite, True


def task_payload(
    game: TextWorldGame, *, admissible_commands: bool, max_steps: int
) -> dict[str, dict[str, Any]]:
    """A game's ``inputs`` (what a harness may know before playing) and ``verifier`` data."""
    return {
        "inputs": {
            "level": game.level,
            "challenge": game.challenge,
            "admissible_commands": bool(admissible_commands),
            "max_steps": max_steps,
        },
        "verifier": {
            "encoding": "xz+base64",
            "z8": encode_blob(game.z8),
            "json": encode_blob(game.game_json),
            "max_score": game.max_score,
        },
    }


# --- building the shipped games -----------------------------------------------------------


def textworld_build(
    *,
    out_dir: Path = DATA_DIR,
    levels: tuple[Level, ...] = LEVELS,
    games_per_level: int = GAMES_PER_LEVEL,
    tw_make: str | None = None,
    jobs: int = 1,
    work_dir: Path | None = None,
    progress: Callable[[str], Any] = print,
) -> Path:
    """Generate every level's games with tw-make and write the archive and its manifest.

    With ``work_dir`` the generated files are kept there and games already in it are reused,
    so an interrupted build resumes where it stopped.
    """
    tw_make = tw_make or shutil.which("tw-make") or str(Path(sys.executable).parent / "tw-make")
    if not Path(tw_make).exists() and not shutil.which(tw_make):
        raise CoevoError(f"tw-make was not found; install textworld=={TEXTWORLD_VERSION}.")
    plan = [(level, i) for level in levels for i in range(games_per_level)]
    with tempfile.TemporaryDirectory(prefix="coevo-tw-build-") as tmp:
        files_dir = Path(work_dir or tmp)
        files_dir.mkdir(parents=True, exist_ok=True)
        done = iter(range(1, len(plan) + 1))

        def generate(item: tuple[Level, int]) -> dict[str, Any]:
            level, i = item
            key, seed = f"{level.name}-{i:02d}", level.first_seed + i
            z8_path, json_path = files_dir / f"{key}.z8", files_dir / f"{key}.json"
            command = tw_make_command(level, seed=seed, output=z8_path, tw_make=tw_make)
            if not (z8_path.is_file() and json_path.is_file()):
                subprocess.run([*command, "--silent", "-f"], check=True)
            progress(f"[{next(done)}/{len(plan)}] {key}: {' '.join(command[1:-2])}")
            return {
                "key": key,
                "level": level.name,
                "challenge": level.challenge,
                "options": list(level.options),
                "seed": seed,
                "max_score": game_max_score(json_path),
                "z8_sha256": _sha256(z8_path.read_bytes()),
                "json_sha256": _sha256(json_path.read_bytes()),
            }

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            entries = list(pool.map(generate, plan))
        out_dir.mkdir(parents=True, exist_ok=True)
        archive_path = out_dir / ARCHIVE_NAME
        # One solid archive: the games share most of their bytes (the Inform runtime), so it
        # is several times smaller than the games compressed one by one.
        with tarfile.open(archive_path, "w:xz", preset=9) as archive:
            for entry in entries:
                for suffix in (".z8", ".json"):
                    data = (files_dir / f"{entry['key']}{suffix}").read_bytes()
                    info = tarfile.TarInfo(f"{entry['key']}{suffix}")
                    info.size = len(data)
                    info.mode = 0o644
                    archive.addfile(info, io.BytesIO(data))
    manifest = {
        "textworld": TEXTWORLD_VERSION,
        "generated_by": "python -m coevo.suites.textworld build",
        "command": "tw-make CHALLENGE OPTIONS --seed SEED --output KEY.z8 --silent -f",
        "games": entries,
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    progress(f"wrote {len(entries)} games to {archive_path} ({archive_path.stat().st_size} bytes)")
    return archive_path


_TEXTWORLD_PARSER = threading.Lock()


def game_max_score(game_json: Path) -> int:
    """The points a game gives in all (tw-simple games do not record it in their metadata)."""
    import textworld

    # TextWorld's logic parser keeps global state: two threads loading games at once fail.
    with _TEXTWORLD_PARSER:
        return int(textworld.Game.load(str(game_json)).max_score)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coevo.suites.textworld")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="regenerate the shipped games with tw-make")
    build.add_argument("--out", type=Path, default=DATA_DIR)
    build.add_argument("--games-per-level", type=int, default=GAMES_PER_LEVEL)
    build.add_argument("--tw-make", default=None, help="path of tw-make (default: on PATH)")
    build.add_argument("--jobs", type=int, default=1, help="tw-make processes at once")
    build.add_argument(
        "--work-dir", type=Path, default=None, help="keep generated files here; resume from them"
    )
    args = parser.parse_args(argv)
    textworld_build(
        out_dir=args.out,
        games_per_level=args.games_per_level,
        tw_make=args.tw_make,
        jobs=args.jobs,
        work_dir=args.work_dir,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""TextWorld: a text game played step by step; score = points / max points, passed = won.

The game runs here, on the worker side, from files written to a private temporary folder;
the harness only ever sees the observations (the game text, the objective and, when the suite
says so, the admissible commands). The game files travel in the task's verifier data.
"""

from __future__ import annotations

import base64
import lzma
import re
import shutil
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from coevo.errors import InvalidState
from workers.environments.base import Environment, StepResult, Verdict, register_environment

DEFAULT_MAX_STEPS = 50
# Longer commands are never meaningful to the game's parser; cut rather than fail.
MAX_COMMAND_CHARS = 200

# The "TEXT WORLD" banner at the start of every game: lines of box-drawing ASCII art.
_BANNER_LINE = re.compile(r"^\s*[$_|\\/<>][\s$_|\\/<>]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


# A game's files travel in the task's verifier data (coevo/suites/textworld.py writes them at
# import; workers share no disk with the web process), xz-compressed and base64-encoded.


@lru_cache(maxsize=2 * 64)
def encode_blob(data: bytes) -> str:
    # Preset 1: a game compresses within 7% of preset 9 in a quarter of the time (0.14 s),
    # which keeps an import of 60 games under ten seconds. Cached for repeated imports.
    return base64.b64encode(lzma.compress(data, preset=1)).decode("ascii")


def decode_blob(text: str) -> bytes:
    return lzma.decompress(base64.b64decode(text))


def harness_view(inputs: dict[str, Any]) -> dict[str, Any]:
    return {
        "level": inputs.get("level", ""),
        "max_steps": int(inputs.get("max_steps", DEFAULT_MAX_STEPS)),
        "admissible_commands": bool(inputs.get("admissible_commands", True)),
    }


def open_episode(
    *, inputs: dict[str, Any], verifier: dict[str, Any], seed: int
) -> TextWorldEpisode:
    # TextWorld games are deterministic once generated: the seed has nothing to vary.
    del seed
    return TextWorldEpisode(
        z8=decode_blob(verifier["z8"]),
        game_json=decode_blob(verifier["json"]),
        show_commands=bool(inputs.get("admissible_commands", True)),
        max_steps=int(inputs.get("max_steps", DEFAULT_MAX_STEPS)),
        max_score=int(verifier.get("max_score") or 0),
    )


def clean_feedback(text: str) -> str:
    """The game's text without the banner, the input prompt and its status line."""
    # The interpreter echoes a ">" prompt followed by a status line ("-= Kitchen =-0/3").
    text = re.split(r"\n>", text, maxsplit=1)[0]
    # After the end, the game asks to RESTART/RESTORE/QUIT: not something a harness can do.
    text = text.split("Would you like to RESTART", 1)[0]
    lines = [line.rstrip() for line in text.splitlines() if not _BANNER_LINE.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def clean_command(action: str) -> str:
    # A newline would make the interpreter run several commands in one step (and leave the
    # environment out of step with its replies), so control characters become spaces.
    return " ".join(_CONTROL.sub(" ", action).split())[:MAX_COMMAND_CHARS]


class TextWorldEpisode:
    """One play of one game through TextWorld's Python API."""

    def __init__(
        self,
        *,
        z8: bytes,
        game_json: bytes,
        show_commands: bool,
        max_steps: int,
        max_score: int = 0,
    ) -> None:
        # Imported here: TextWorld is only needed by workers that play games.
        import textworld

        self.show_commands = show_commands
        self.max_steps = max_steps
        self.known_max_score = max_score
        self.steps = 0
        self._dir = Path(tempfile.mkdtemp(prefix="coevo-textworld-"))
        game_path = self._dir / "game.z8"
        game_path.write_bytes(z8)
        # TextWorld finds the game's logic (for admissible commands, won and lost) in the
        # .json next to the .z8.
        (self._dir / "game.json").write_bytes(game_json)
        infos = textworld.EnvInfos(
            feedback=True,
            objective=True,
            admissible_commands=show_commands,
            score=True,
            max_score=True,
            moves=True,
            won=True,
            lost=True,
        )
        try:
            with warnings.catch_warnings():
                # Jericho does not know generated games; TextWorld tracks score and state itself.
                warnings.filterwarnings("ignore", message=".*is not fully supported")
                self._env = textworld.start(str(game_path), request_infos=infos)
        except Exception:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._state: Any = None
        self._done = False

    # --- the Episode protocol -----------------------------------------------------------

    def reset(self) -> dict[str, Any]:
        # Steps are counted across restarts: the limit is per rollout, not per attempt.
        self._state = self._env.reset()
        self._done = self.steps >= self.max_steps
        return self._observation(clean_feedback(self._state.feedback or ""))

    def step(self, action: str) -> StepResult:
        if self._state is None:
            raise InvalidState("step() before reset(): start the episode with reset() first.")
        if self._done:
            raise InvalidState("step() after the episode ended (done); start again with reset().")
        before = self._score()
        self._state, _, game_over = self._env.step(clean_command(action))
        self.steps += 1
        self._done = bool(game_over or self._state["won"] or self._state["lost"])
        self._done = self._done or self.steps >= self.max_steps
        observation = self._observation(clean_feedback(self._state.feedback or ""))
        return StepResult(
            observation=observation, reward=float(self._score() - before), done=self._done
        )

    def verdict(self) -> Verdict:
        max_score = self._max_score()
        points = self._score()
        won = bool(self._state is not None and self._state["won"])
        lost = bool(self._state is not None and self._state["lost"])
        score = points / max_score if max_score else float(won)
        if won:
            how = f"won in {self.steps} steps"
        elif lost:
            how = f"lost after {self.steps} steps"
        elif self.steps >= self.max_steps:
            how = f"step limit of {self.max_steps} reached"
        elif self._state is None:
            how = "never started"
        else:
            how = f"stopped after {self.steps} of {self.max_steps} steps"
        return Verdict(
            passed=won, score=min(1.0, score), detail=f"{how}: {points}/{max_score} points"
        )

    def close(self) -> None:
        try:
            self._env.close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    # --- helpers ------------------------------------------------------------------------

    def _score(self) -> int:
        return int(self._state["score"] or 0) if self._state is not None else 0

    def _max_score(self) -> int:
        if self._state is not None and self._state["max_score"]:
            return int(self._state["max_score"])
        return self.known_max_score

    def _observation(self, text: str) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "observation": text,
            "objective": self._state["objective"] or "",
            "score": self._score(),
            "max_score": self._max_score(),
            "moves": self.steps,
            "max_steps": self.max_steps,
            "won": bool(self._state["won"]),
            "lost": bool(self._state["lost"]),
        }
        if self.show_commands:
            payload["admissible_commands"] = sorted(self._state["admissible_commands"] or [])
        return payload


@register_environment
class TextWorldEnvironment(Environment):
    """TextWorld games, played step by step (multi-step)."""

    kind = "textworld"
    multi_step = True
    harness_view = staticmethod(harness_view)
    open_episode = staticmethod(open_episode)

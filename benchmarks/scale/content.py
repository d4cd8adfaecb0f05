"""What a scale fill's rows hold: the harness files of its commits, its suite, and its trace
steps, shaped like the worker's (workers/rollout.py) and sized like benchmarks/traces.py's.

Trace payloads come from a seeded pool of a few hundred per kind, packed the way the worker's
TraceWriter packs them (payloads over 16 KB compressed, with an excerpt), so ten million steps
cost a table lookup each rather than a JSON encode.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from coevo.evaluations.traces import payload_pack
from workers.outcomes import RolloutOutcome
from workers.trace import (
    Answer,
    EnvReset,
    EnvStep,
    Error,
    HarnessException,
    Log,
    ModelCall,
    TypedStep,
    Verdict,
)

SEED_HARNESS = Path(__file__).resolve().parents[3] / "examples" / "humaneval-basic"

WORDS = [
    "kitchen",
    "fridge",
    "counter",
    "door",
    "north",
    "south",
    "key",
    "lamp",
    "table",
    "chest",
    "coin",
    "bread",
    "milk",
    "apple",
    "knife",
    "cook",
    "slice",
    "fry",
    "roast",
    "open",
    "close",
    "take",
    "drop",
    "examine",
    "inventory",
    "look",
    "go",
    "west",
    "east",
    "recipe",
    "yellow",
    "red",
    "blue",
    "potato",
    "carrot",
    "onion",
    "pepper",
    "stove",
    "oven",
    "basket",
    "shelf",
    "garden",
]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


# --- harness files -------------------------------------------------------------------------


def seed_files() -> dict[str, bytes]:
    """The shipped seed harness's files: the first commit of every filled project."""
    return {
        path.relative_to(SEED_HARNESS).as_posix(): path.read_bytes()
        for path in sorted(SEED_HARNESS.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def variant_files(rng: random.Random, number: int, kind: str) -> dict[str, bytes]:
    """The files a commit changes on top of its first parent: a config proposal retunes the
    prompt's settings, a patch rewrites the system prompt's rules or the agent's hints."""
    if kind in ("config", "random"):
        text = (
            "# Tuned by a config proposal.\n"
            f"temperature = {rng.uniform(0, 1):.3f}\n"
            f"max_tokens = {rng.choice((64, 128, 192, 256, 384, 512))}\n"
            f"samples = {rng.randint(1, 8)}\n"
        )
        return {"settings.toml": text.encode()}
    rules = "\n".join(f"- {sentence(rng, rng.randint(6, 14))}." for _ in range(rng.randint(3, 9)))
    prompt = f"You solve the task step by step (revision {number}).\nRules:\n{rules}\n"
    files = {"prompts/system.txt": prompt.encode()}
    if rng.random() < 0.4:
        hints = ", ".join(repr(sentence(rng, 3)) for _ in range(rng.randint(2, 6)))
        files["hints.py"] = (
            f'"""Hints the agent adds to its prompt."""\n\nHINTS = [{hints}]\n'.encode()
        )
    return files


def patch_text(files: dict[str, bytes]) -> str:
    """A unified-diff-looking patch of ``files`` (what an llm-patch proposal stores)."""
    parts = []
    for path, data in files.items():
        lines = data.decode().splitlines()
        body = "\n".join(f"+{line}" for line in lines)
        parts.append(f"--- a/{path}\n+++ b/{path}\n@@ -1,{len(lines)} +1,{len(lines)} @@\n{body}")
    return "\n".join(parts) + "\n"


# --- the suite -----------------------------------------------------------------------------


def suite_rows(rng: random.Random, *, search: int, validation: int, heldout: int) -> list[dict]:
    rows = []
    for split, count in (("search", search), ("validation", validation), ("heldout", heldout)):
        for i in range(count):
            a, b = rng.randint(2, 999), rng.randint(2, 999)
            rows.append(
                {
                    "id": f"{split}-{i:05d}",
                    "input": f"{sentence(rng, rng.randint(8, 30))}. What is {a} + {b}?",
                    "expected": str(a + b),
                    "split": split,
                }
            )
    return rows


# --- trace steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PooledStep:
    kind: str
    text: str  # the stored payload's JSON
    payload_zlib: bytes | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int


def _pooled(step: TypedStep, tokens: tuple[int, int] = (0, 0), ms: int = 0) -> PooledStep:
    """A step as the worker writes it (the trace's types, workers/trace.py), packed."""
    stored, payload_zlib = payload_pack(step.to_payload())
    text = json.dumps(stored, ensure_ascii=False, separators=(",", ":"))
    return PooledStep(step.kind, text, payload_zlib, tokens[0], tokens[1], ms)


@dataclass(frozen=True)
class StepPool:
    model_calls: list[PooledStep]
    env_steps: list[PooledStep]
    env_resets: list[PooledStep]
    logs: list[PooledStep]
    answers: list[PooledStep]
    verdicts_passed: list[PooledStep]
    verdicts_failed: list[PooledStep]
    exceptions: list[PooledStep]
    errors: list[PooledStep]


def step_pool(rng: random.Random, *, policy_name: str, size: int = 400) -> StepPool:
    def model_call(i: int) -> PooledStep:
        # Prompts of ~1.5 KB, a few long ones (whole game histories) past the 16 KB threshold.
        chars = int(rng.lognormvariate(7.2, 0.6)) if rng.random() > 0.01 else 20_000
        prompt = (f"[move {i}] " + sentence(rng, chars // 6 + 1))[:chars]
        completion = sentence(rng, rng.randint(3, 60))
        call = ModelCall(
            api="completions",
            model="gemma-3-270m",
            policy_version=policy_name,
            endpoint="policy-main",
            prompt=prompt,
            sampling={"max_tokens": 192, "temperature": 0.0, "stop": ["\n"], "seed": i},
            sample=0,
            n=1,
            completion=completion,
            finish_reason=rng.choice(("stop", "stop", "stop", "length")),
        )
        return _pooled(
            call,
            (len(prompt) // 4, len(completion) // 4 + 1),
            rng.randint(80, 900),
        )

    def env_step(i: int) -> PooledStep:
        step = EnvStep(
            index=i,
            action=f"{rng.choice(WORDS)} {rng.choice(WORDS)}",
            observation=sentence(rng, rng.randint(30, 120)),
            reward=rng.choice((0.0, 0.0, 0.0, 1.0)),
            done=False,
            truncated=False,
        )
        return _pooled(step, ms=rng.randint(1, 20))

    def verdict(passed: bool) -> PooledStep:
        output = "" if passed else f"expected {rng.randint(4, 1998)}, got {rng.randint(0, 999)}"
        detail = "exact match" if passed else "answer differs from the expected one"
        return _pooled(Verdict(passed=passed, score=float(passed), detail=detail, output=output))

    def exception() -> PooledStep:
        line = rng.randint(10, 120)
        raised = HarnessException(
            error=f"KeyError: '{rng.choice(WORDS)}'",
            traceback=f'Traceback (most recent call last):\n  File "agent.py", line {line}, '
            f"in run\n    return HINTS[key]\nKeyError: '{rng.choice(WORDS)}'\n",
            frames=[{"file": "agent.py", "line": line, "function": "run"}],
        )
        return _pooled(raised)

    return StepPool(
        model_calls=[model_call(i) for i in range(size)],
        env_steps=[env_step(i) for i in range(size)],
        env_resets=[
            _pooled(EnvReset(observation=sentence(rng, rng.randint(40, 150))))
            for _ in range(size // 8)
        ],
        logs=[
            _pooled(Log(message=f"plan: {sentence(rng, rng.randint(4, 20))}"))
            for _ in range(size // 4)
        ],
        answers=[_pooled(Answer(answer=str(rng.randint(4, 1998)))) for _ in range(size // 4)],
        verdicts_passed=[verdict(True) for _ in range(8)],
        verdicts_failed=[verdict(False) for _ in range(size // 4)],
        exceptions=[exception() for _ in range(16)],
        errors=[
            _pooled(
                Error(
                    outcome=RolloutOutcome.HARNESS_ERROR,
                    message="the harness ran past wall_time_s",
                )
            ),
            _pooled(Error(outcome=RolloutOutcome.HARNESS_ERROR, message="the harness raised")),
        ],
    )


def trace_of(rng: random.Random, pool: StepPool, *, outcome: str, mean_steps: float) -> list:
    """A rollout's steps: a reset, model calls alternating with env steps, a log line now and
    then, and the ending the outcome calls for (answer and verdict, or the exception)."""
    calls = 1 + min(int(rng.expovariate(1 / max(mean_steps / 2 - 1.75, 0.1))), 40)
    steps = [rng.choice(pool.env_resets)]
    for _ in range(calls):
        steps.append(rng.choice(pool.model_calls))
        steps.append(rng.choice(pool.env_steps))
    if rng.random() < 0.5:
        steps.append(rng.choice(pool.logs))
    if outcome == "harness_error":
        steps += [rng.choice(pool.exceptions), rng.choice(pool.errors)]
    elif outcome == "infra_error":
        steps.append(pool.errors[0])
    else:
        steps.append(rng.choice(pool.answers))
        passed = outcome == "passed"
        steps.append(rng.choice(pool.verdicts_passed if passed else pool.verdicts_failed))
    return steps

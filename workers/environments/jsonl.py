"""Custom (JSONL) suites: the harness sees ``input`` and ``metadata``; the declared scorer decides.

A task's ``verifier`` payload is ``{"scorer": {"kind", …}, "expected": …}``; for the ``python``
scorer it also carries the verifier module's source (workers share no disk with the web).
"""

from __future__ import annotations

from typing import Any

from workers.environments import scorers
from workers.environments.base import Environment, Verdict, register_environment


def harness_view(inputs: dict[str, Any]) -> dict[str, Any]:
    return {"input": inputs["input"], "metadata": inputs.get("metadata") or {}}


def verify(*, inputs: dict[str, Any], verifier: dict[str, Any], answer: Any) -> Verdict:
    scorer = verifier.get("scorer") or {}
    kind = scorer.get("kind")
    expected = verifier.get("expected")
    if answer is None:
        return Verdict(False, 0.0, "the harness returned no answer (None)")
    if kind == "exact":
        return scorers.score_exact(answer, expected)
    if kind == "normalized":
        return scorers.score_normalized(answer, expected)
    if kind == "numeric":
        return scorers.score_numeric(
            answer,
            expected,
            abs_tol=float(scorer.get("abs_tol") or 0.0),
            rel_tol=float(scorer.get("rel_tol") or 0.0),
        )
    if kind == "regex":
        return scorers.score_regex(answer, expected)
    if kind == "python":
        return scorers.score_python(
            answer,
            expected,
            inputs.get("metadata") or {},
            source=scorer.get("source", ""),
            name=scorer.get("verifier") or "verify.py",
        )
    return Verdict(False, 0.0, f"the suite declares an unknown scorer {kind!r}")


@register_environment
class JsonlEnvironment(Environment):
    """Custom JSONL suites: an answer compared with the expected one by the row's rule."""

    kind = "jsonl"
    harness_view = staticmethod(harness_view)
    verify = staticmethod(verify)

"""What every proposer hands the runner, and how the runner tells it the outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from harness_store.models import Candidate


@dataclass
class Draft:
    """A proposed change, before it becomes a candidate. ``stages`` holds the validation stages
    the proposer already decided (e.g. ``applies``); ``failed`` says one of them rejected it."""

    kind: str
    parents: list[Candidate]
    changes: dict[str, bytes | None]
    message: str
    patch: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    trial_number: int | None = None
    shown: dict[str, Any] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str = ""
    response: str = ""
    proposer_tokens: int = 0
    # Set by a proposer that waits on a model (its calls); else the runner times propose().
    proposer_wall_ms: int | None = None
    # US dollars of its model calls at the prices that applied; None: no price (or no call).
    proposer_cost_usd: Decimal | None = None

    @property
    def failed(self) -> bool:
        return any(not stage["ok"] for stage in self.stages)


class ProposalOutcome:
    """How a proposal ended, as a proposer learns it."""

    COMPLETE = "complete"  # evaluated on validation: ``value`` is its validation score
    PRUNED = "pruned"  # stopped on the search split as clearly worse than its parent
    FAIL = "fail"  # invalid, or its evaluation could not run


class Proposer(Protocol):
    # True for a proposer whose propose() waits on a model (minutes): the runner calls it
    # outside the campaign's row lock and transaction, so pause, stop and the page never wait.
    drafts_slowly: bool

    def propose(self, *, history: list[dict[str, Any]]) -> Draft: ...

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None: ...


def stage(name: str, ok: bool, reason: str) -> dict[str, Any]:
    return {"stage": name, "ok": ok, "reason": reason}

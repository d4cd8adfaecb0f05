"""The budget ledger: reserve before enqueueing, settle (or refund) when the work ends.

Reservations are conditional updates (``limit >= reserved + spent + amount``), so two
evaluations racing for the last of a budget cannot both get it. Each movement is also written as
a LedgerEntry, which is what the pages show.

Dollars are units like tokens: a rollout reserves the manifest's token limit at the highest
per-token price of the endpoints serving its policy version (``unit_usd``: 0 where none has a
price) and settles its calls' actual cost (coevo/policies/prices.py). Amounts of dollars are
exact decimals.

Proposer spend (the proposer model's tokens and dollars, the wall time of each draft) is in the
same ledger as units of its own, never mixed with the policy's: a campaign's runner charges each draft once
it is written (``budget_settle`` with nothing reserved: its cost is known only then), and the
campaign's stop rule checks them before the next draft.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Q

from coevo.errors import BudgetExceeded
from coevo.evaluations.models import Budget, LedgerEntry, LedgerKind, Rollout
from coevo.projects.models import Project

_FIELDS = (
    "rollouts",
    "tokens",
    "wall_s",
    "usd",
    "proposer_tokens",
    "proposer_wall_ms",
    "proposer_usd",
)
# Charged after each draft, so a draft may pass their limit: a rollout (which needs none of
# them) is not refused for it; the stop rule ends the campaign before the next draft instead.
_PROPOSER_FIELDS = ("proposer_tokens", "proposer_wall_ms", "proposer_usd")
_DOLLAR_FIELDS = ("usd", "proposer_usd")
_UNITS = {
    "rollouts": "rollouts",
    "tokens": "tokens",
    "wall_s": "seconds of rollout wall time",
    "usd": "in policy calls",
    "proposer_usd": "in proposer calls",
    "proposer_tokens": "proposer tokens",
    "proposer_wall_ms": "milliseconds of proposer wall time",
}


@dataclass(frozen=True)
class Amount:
    rollouts: int = 0
    tokens: int = 0
    wall_s: int = 0
    proposer_tokens: int = 0
    # Milliseconds: a config draft takes a few, and rounding each up to a second would
    # overcharge a campaign of many drafts.
    proposer_wall_ms: int = 0
    usd: Decimal = Decimal(0)
    proposer_usd: Decimal = Decimal(0)

    def __mul__(self, n: int) -> Amount:
        return Amount(**{f.name: getattr(self, f.name) * n for f in fields(self)})

    @property
    def is_zero(self) -> bool:
        return not any(getattr(self, f) for f in _FIELDS)


@dataclass(frozen=True)
class BudgetLimits:
    rollouts: int | None = None
    tokens: int | None = None
    wall_s: int | None = None
    proposer_tokens: int | None = None
    # Given in seconds like wall_s; the ledger keeps proposer wall time in milliseconds.
    proposer_wall_s: int | None = None
    usd: Decimal | None = None
    proposer_usd: Decimal | None = None


def budget_create(
    *,
    project: Project,
    name: str,
    limits: BudgetLimits | None = None,
    unit: Amount | None = None,
    evaluation_id: object | None = None,
    parent: Budget | None = None,
) -> Budget:
    limits = limits or BudgetLimits()
    unit = unit or Amount()
    for field in (
        "rollouts",
        "tokens",
        "wall_s",
        "usd",
        "proposer_tokens",
        "proposer_wall_s",
        "proposer_usd",
    ):
        value = getattr(limits, field)
        if value is not None and value < 0:
            unit = _UNITS.get(field, "seconds of proposer wall time")
            raise BudgetExceeded(f"A budget limit of {value} {unit} is not valid.")
    return Budget.objects.create(
        project=project,
        name=name,
        evaluation_id=evaluation_id,
        parent=parent,
        limit_rollouts=limits.rollouts,
        limit_tokens=limits.tokens,
        limit_wall_s=limits.wall_s,
        limit_proposer_tokens=limits.proposer_tokens,
        limit_proposer_wall_ms=(
            None if limits.proposer_wall_s is None else 1000 * limits.proposer_wall_s
        ),
        limit_usd=limits.usd,
        limit_proposer_usd=limits.proposer_usd,
        unit_tokens=unit.tokens,
        unit_wall_s=unit.wall_s,
        unit_usd=unit.usd,
    )


def budget_reserve(
    *, budget: Budget, amount: Amount, note: str = "", rollout: Rollout | None = None
) -> None:
    """Reserve ``amount`` on the budget and every ancestor, or raise BudgetExceeded (nothing
    reserved) naming the limit and the figures."""
    if amount.is_zero:
        return
    with transaction.atomic():
        for account in _chain(budget):
            fits = Q(id=account.id)
            for field in _FIELDS:
                need = getattr(amount, field)
                if not need and field in _PROPOSER_FIELDS:
                    continue
                fits &= Q(**{f"limit_{field}__isnull": True}) | Q(
                    **{f"limit_{field}__gte": F(f"reserved_{field}") + F(f"spent_{field}") + need}
                )
            moved = Budget.objects.filter(fits).update(
                **{f"reserved_{f}": F(f"reserved_{f}") + getattr(amount, f) for f in _FIELDS}
            )
            if moved != 1:
                raise BudgetExceeded(_refusal(account, amount))
            LedgerEntry.objects.create(
                budget=account,
                kind=LedgerKind.RESERVE,
                rollout=rollout,
                note=note[:300],
                **_signed(amount, 1),
            )


def budget_settle(
    *, budget: Budget, reserved: Amount, actual: Amount, rollout: Rollout | None, note: str = ""
) -> None:
    """Release a reservation and record what was actually spent (may differ either way).

    Inside a caller's transaction it takes no savepoint of its own (it raises nothing a caller
    could want to go on after): a worker settles every rollout it finishes."""
    # Only the columns that move (a rollout's settlement moves six of ten).
    moves = {
        **{f"reserved_{f}": F(f"reserved_{f}") - getattr(reserved, f) for f in _moved(reserved)},
        **{f"spent_{f}": F(f"spent_{f}") + getattr(actual, f) for f in _moved(actual)},
    }
    with transaction.atomic(savepoint=False):
        for account in _chain(budget):
            if moves:
                Budget.objects.filter(id=account.id).update(**moves)
            LedgerEntry.objects.create(
                budget=account,
                kind=LedgerKind.SETTLE,
                rollout=rollout,
                note=note[:300],
                **_signed(actual, 1),
            )


def budget_refund(*, budget: Budget, amount: Amount, note: str = "") -> None:
    """Release a reservation for work that will not run (cancelled, stopped early)."""
    if amount.is_zero:
        return
    with transaction.atomic():
        for account in _chain(budget):
            Budget.objects.filter(id=account.id).update(
                **{f"reserved_{f}": F(f"reserved_{f}") - getattr(amount, f) for f in _FIELDS}
            )
            LedgerEntry.objects.create(
                budget=account, kind=LedgerKind.REFUND, note=note[:300], **_signed(amount, 1)
            )


def budget_unit(budget: Budget) -> Amount:
    """What one rollout reserves on this budget."""
    return Amount(1, budget.unit_tokens, budget.unit_wall_s, usd=Decimal(budget.unit_usd))


def wall_seconds(latency_ms: int) -> int:
    return math.ceil(latency_ms / 1000)


def _chain(budget: Budget) -> Iterator[Budget]:
    seen = set()
    account: Budget | None = budget
    while account is not None and account.id not in seen:
        seen.add(account.id)
        yield account
        account = account.parent


def _moved(amount: Amount) -> list[str]:
    return [f for f in _FIELDS if getattr(amount, f)]


def _signed(amount: Amount, sign: int) -> dict[str, int | Decimal]:
    return {f: sign * getattr(amount, f) for f in _FIELDS}


def _refusal(account: Budget, amount: Amount) -> str:
    account.refresh_from_db()
    for field in _FIELDS:
        limit = getattr(account, f"limit_{field}")
        if limit is None:
            continue
        used = getattr(account, f"reserved_{field}") + getattr(account, f"spent_{field}")
        need = getattr(amount, field)
        if not need and field in _PROPOSER_FIELDS:
            continue
        if used + need > limit:
            return (
                f"Budget {account.name!r} would be exceeded: this needs {_shown(field, need)} "
                f"{_UNITS[field]} (the worst case the harness's limits allow), but only "
                f"{_shown(field, max(0, limit - used))} of its {_shown(field, limit)} are left. "
                "Raise the budget, lower the harness's limits in harness.toml, or evaluate "
                "fewer tasks or epochs."
            )
    return f"Budget {account.name!r} would be exceeded."


def _shown(field: str, value: int | Decimal) -> str:
    if field in _DOLLAR_FIELDS:
        return f"${Decimal(value):,.4f}"
    return f"{value:,}"

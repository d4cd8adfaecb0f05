"""What model calls cost in money: the price table (ModelPrice rows) and a call's cost.

A price is per endpoint and model, in US dollars per million input, cached-input (prompt-cache
reads), cache-write (prompt-cache writes; the input price where a row leaves it empty) and
output tokens, and applies from its row's ``effective_from`` until a newer row's. A price change is a
new row: calls already made keep the cost they were given, with the row that applied (its id
and values are on the call's model-call step). A client reads its endpoint's rows once, when
it is built (``price_schedule_for``), and prices each call at the moment it was answered; a
row added later applies to the clients built after it (the next rollout, the next draft).

Costs are exact decimals (per-million prices with six places, over a million tokens: twelve
places), stored as such and summed without rounding; only the pages round them. An endpoint
with no row has no price: its calls' cost is None (shown as "—"), not zero.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.errors import InvalidInput
from coevo.policies.models import ModelPrice, PolicyEndpoint, PolicyVersion
from coevo.policies.pricing import Price, PriceSchedule

# An endpoint's rows read for one client: a price table holds a few rows per model.
MAX_PRICE_ROWS = 500
# The highest price per million tokens accepted (a mistyped price should be refused, not charged).
MAX_PRICE_PER_M = Decimal(10_000)
# How far before now a new price may start: a clock's drift between the admin and the database.
# Earlier would re-price calls already made (never edit the past).
PAST_SLACK = timedelta(seconds=60)


def price_schedule_for(*, endpoint: PolicyEndpoint) -> PriceSchedule:
    rows = ModelPrice.objects.filter(endpoint=endpoint).order_by("-effective_from", "-id")
    return PriceSchedule(tuple(_price(row) for row in rows[:MAX_PRICE_ROWS]))


def price_worst_per_token(*, version: PolicyVersion, at: datetime | None = None) -> Decimal:
    """The most a token of ``version`` may cost now on any endpoint serving it (primary and
    replicas: a rollout may be routed to either); 0 where none has a price."""
    at = at or timezone.now()
    worst = Decimal(0)
    for endpoint in [version.endpoint, *version.replicas.all()]:
        price = price_schedule_for(endpoint=endpoint).at(model=version.served_name, when=at)
        if price is not None:
            worst = max(worst, price.worst_per_token)
    return worst


def model_price_create(
    *,
    endpoint: PolicyEndpoint,
    model: str,
    input_per_m: Decimal,
    cached_input_per_m: Decimal,
    output_per_m: Decimal,
    cache_write_per_m: Decimal | None = None,
    effective_from: datetime | None = None,
    note: str = "",
    actor: AbstractBaseUser | None = None,
) -> ModelPrice:
    """A new price from ``effective_from`` (default now) on, audited. Refused when it would
    start in the past (the calls made since were priced by the row that applied then).
    ``cache_write_per_m`` None: prompt-cache writes at the input price."""
    if len(model) > 200:
        raise InvalidInput("A price's model name is at most 200 characters.")
    model_price_check(
        effective_from=effective_from,
        prices=[input_per_m, cached_input_per_m, cache_write_per_m, output_per_m],
    )
    effective_from = effective_from or timezone.now()
    with transaction.atomic():
        row = ModelPrice.objects.create(
            endpoint=endpoint,
            model=model,
            effective_from=effective_from,
            input_per_m=input_per_m,
            cached_input_per_m=cached_input_per_m,
            cache_write_per_m=cache_write_per_m,
            output_per_m=output_per_m,
            note=note[:200],
        )
        audit_record(
            actor=actor,
            project=None,
            action="modelprice.created",
            target=row,
            after=_price(row).record(),
        )
    return row


def model_price_check(*, effective_from: datetime | None, prices: list[Decimal | None]) -> None:
    """Refuse a price that would start in the past, or a price per million tokens below 0 or
    above MAX_PRICE_PER_M (a mistyped one). ``prices``: input, cached input, cache write and
    output, each None where not given."""
    if effective_from is not None and effective_from < timezone.now() - PAST_SLACK:
        raise InvalidInput(
            f"A price cannot start in the past ({effective_from.isoformat()}): calls made since "
            "then were charged the price that applied. Add a row from now or a later time."
        )
    names = ("input", "cached input", "cache write", "output")
    for name, value in zip(names, prices, strict=True):
        if value is not None and not Decimal(0) <= value <= MAX_PRICE_PER_M:
            raise InvalidInput(
                f"The {name} price must be between 0 and {MAX_PRICE_PER_M} dollars per "
                f"million tokens, not {value}."
            )


def _price(row: ModelPrice) -> Price:
    return Price(
        id=row.id,
        model=row.model,
        effective_from=row.effective_from,
        input_per_m=Decimal(row.input_per_m),
        cached_input_per_m=Decimal(row.cached_input_per_m),
        output_per_m=Decimal(row.output_per_m),
        cache_write_per_m=None if row.cache_write_per_m is None else Decimal(row.cache_write_per_m),
    )

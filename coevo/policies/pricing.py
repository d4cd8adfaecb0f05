"""A call's price and cost, without the database: what the policy client (which the worker's
runtime side imports) needs to price each call it makes. The price table and its rows are
coevo/policies/prices.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Price:
    """One price row as it applied. ``cache_write_per_m`` None: cache writes at the input
    price (a provider that does not charge them apart, or a row that does not say)."""

    id: int
    model: str
    effective_from: datetime
    input_per_m: Decimal
    cached_input_per_m: Decimal
    output_per_m: Decimal
    cache_write_per_m: Decimal | None = None

    @property
    def cache_write_price(self) -> Decimal:
        """Per million tokens written to the provider's prompt cache, as charged."""
        return self.input_per_m if self.cache_write_per_m is None else self.cache_write_per_m

    def cost(
        self,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        cache_write_tokens: int = 0,
    ) -> Decimal:
        """US dollars: prompt tokens read from the provider's prompt cache at the cached-input
        price, those written to it (Anthropic's cache writes) at the cache-write price, the
        rest of the prompt at the input price (cache reads and writes each at most what the
        prompt leaves), completion tokens at the output price."""
        cached = max(0, min(cached_tokens, prompt_tokens))
        written = max(0, min(cache_write_tokens, prompt_tokens - cached))
        per_m = (
            (prompt_tokens - cached - written) * self.input_per_m
            + cached * self.cached_input_per_m
            + written * self.cache_write_price
            + completion_tokens * self.output_per_m
        )
        return per_m / MILLION

    @property
    def worst_per_token(self) -> Decimal:
        """The most one token of any kind costs: what a worst-case reservation charges."""
        dearest = max(
            self.input_per_m, self.cached_input_per_m, self.cache_write_price, self.output_per_m
        )
        return dearest / MILLION

    def record(self) -> dict[str, Any]:
        """The row's id and values, as the model-call step records them (strings: exact;
        ``cache_write_per_m`` null where the row leaves cache writes at the input price)."""
        return {
            "id": self.id,
            "model": self.model,
            "effective_from": self.effective_from.isoformat(),
            "input_per_m": str(self.input_per_m),
            "cached_input_per_m": str(self.cached_input_per_m),
            "cache_write_per_m": (
                None if self.cache_write_per_m is None else str(self.cache_write_per_m)
            ),
            "output_per_m": str(self.output_per_m),
        }


@dataclass(frozen=True)
class PriceSchedule:
    """One endpoint's price rows, newest first."""

    prices: tuple[Price, ...] = ()

    def at(self, *, model: str, when: datetime) -> Price | None:
        """The price that applies to ``model`` at ``when``: the model's own newest row from
        before then, else the endpoint's any-model row; None when neither has begun."""
        for wanted in (model, ""):
            for price in self.prices:
                if price.model == wanted and price.effective_from <= when:
                    return price
        return None

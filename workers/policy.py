"""What a rollout asks of a policy server and what it gets back.

The runtime speaks to models only through ``Policy``: the caller passes in a client
(``coevo.policies.client``, the one module that speaks HTTP to policy servers), so nothing
here knows where a model is served or how its endpoints are chosen.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def as_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            # What a kind of server has beyond these (top_k, min_p, a repetition penalty) the
            # policy client adds with its neutral value (coevo/policies/request_tables.py).
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
        }
        if self.stop:
            params["stop"] = list(self.stop)
        if self.seed is not None:
            params["seed"] = self.seed
        return params


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: int
    model: str
    raw: dict[str, Any] = field(repr=False, default_factory=dict)
    # The endpoint that answered (its /v1 base URL), recorded on the model-call step.
    endpoint: str = ""
    # The sampling parameters sent, under the names the server read (its kind's, with the
    # neutral values of its own knobs), and the request's keys its kind does not take (left
    # out): what the model-call step records as applied. Empty: not known.
    sampling: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    # Prompt tokens the server says it served from its prompt cache (0 where it does not say),
    # and those it says it wrote to that cache (Anthropic's cache writes; 0 likewise).
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    # US dollars, at ``price`` (the price row that applied when it was answered: its id and
    # values); None where the endpoint has no price (coevo/policies/prices.py).
    cost_usd: Decimal | None = None
    price: dict[str, Any] | None = None

    def cost_record(self) -> dict[str, Any] | None:
        """The call's cost as its model-call step records it; None: the endpoint has no price."""
        if self.cost_usd is None:
            return None
        return {
            "usd": str(self.cost_usd),
            "cached_tokens": self.cached_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "price": self.price,
        }


def cost_total(costs: Iterable[Decimal | None]) -> Decimal | None:
    """The sum of the calls' costs that have one; None when none has (no price at all)."""
    priced = [cost for cost in costs if cost is not None]
    return sum(priced, Decimal(0)) if priced else None


class Policy(Protocol):
    """A policy server as a rollout sees it. Raises PolicyUnavailable when it cannot answer
    (an infra_error) and PolicyRequestRejected when it refuses the request, or fails on that
    request alone (PolicyRequestFailed): the harness's fault."""

    def complete(self, prompt: str, sampling: Sampling) -> Completion: ...

    def chat(self, messages: list[dict[str, Any]], sampling: Sampling) -> Completion: ...

    def forward(self, api: str, body: dict[str, Any]) -> Completion:
        """An OpenAI request body sent as it is (``api``: ``completions`` or ``chat``) with the
        policy's own model; the whole reply is in ``Completion.raw``."""
        ...


# --- waits for the platform ------------------------------------------------------------------


class PlatformWaitObserver(Protocol):
    """Told when a request of its thread starts and stops waiting for the platform (a
    concurrency slot of the policy endpoint): the rollout stops its harness's wall clock
    meanwhile. Calls may nest and come from several threads (a program's parallel calls)."""

    def platform_wait_started(self) -> None: ...

    def platform_wait_ended(self) -> None: ...


_observers = threading.local()


@contextmanager
def platform_waits_observed(observer: PlatformWaitObserver) -> Iterator[None]:
    """Within this block, on this thread, waits for the platform are reported to ``observer``."""
    previous = getattr(_observers, "observer", None)
    _observers.observer = observer
    try:
        yield
    finally:
        _observers.observer = previous


@contextmanager
def platform_wait() -> Iterator[None]:
    """Wrap a wait for the platform (the policy client's wait for a slot) in this: the rollout
    whose call it is, if any, does not count it against its harness."""
    observer: PlatformWaitObserver | None = getattr(_observers, "observer", None)
    if observer is None:
        yield
        return
    observer.platform_wait_started()
    try:
        yield
    finally:
        observer.platform_wait_ended()

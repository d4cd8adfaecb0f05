"""Login throttling: failed password attempts are counted per account and per client address in
the shared cache (Redis in production, so every web process counts together).

After COEVO_LOGIN_MAX_FAILURES failures within COEVO_LOGIN_WINDOW_S seconds, for one username
or from one address, every further attempt for that username or from that address is refused
for COEVO_LOGIN_WINDOW_S seconds, even with the right password: a guesser learns nothing from
an attempt it makes while blocked, so at most COEVO_LOGIN_MAX_FAILURES guesses a window reach
the password check.

Nothing here tells whether an account exists: a username is counted whether or not there is
such a user, and the refusal reads the same for both. Usernames are keyed by a hash of their
case-folded form, so the cache never holds them in clear and "Owner" counts with "owner".
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
import unicodedata
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

logger = logging.getLogger(__name__)

_FAILURES = "coevo-login-failures"
_BLOCKED = "coevo-login-blocked"
# IPv6 clients are counted per /64: one subscriber (one home, one cloud VM) usually holds a
# whole /64 and could otherwise rotate through 2**64 addresses.
_IPV6_PREFIX = 64


@dataclass(frozen=True)
class LoginBlocked:
    """Attempts are refused for another ``retry_after_s`` seconds."""

    retry_after_s: int

    @property
    def message(self) -> str:
        return (
            "Too many failed logins for this username or from this address: try again in "
            f"{_duration(self.retry_after_s)}."
        )


def _duration(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def client_address(request: HttpRequest | None) -> str | None:
    """The address the request came from: REMOTE_ADDR, unless that is one of
    COEVO_TRUSTED_PROXIES; then the right-most X-Forwarded-For entry that is not a trusted
    proxy (each proxy appends the address it received from, so entries to the left of the
    last untrusted one were written by the client and prove nothing). None when unknown."""
    if request is None:
        return None
    remote = _parse(request.META.get("REMOTE_ADDR", ""))
    if remote is None:
        return None
    proxies = _trusted_proxies()
    if not proxies or not _is_trusted(remote, proxies):
        return str(remote)
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [_parse(part) for part in forwarded.split(",")][::-1]
    for hop in hops:
        if hop is None:
            # A malformed entry: what lies to its left cannot be trusted either.
            break
        if not _is_trusted(hop, proxies):
            return str(hop)
    # Only proxies (or nothing usable) forwarded: the nearest one is all we know.
    return str(remote)


def _parse(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:443" as some proxies write it
        text = text[1 : text.index("]")]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted_proxies() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(entry, strict=False) for entry in settings.COEVO_TRUSTED_PROXIES]


def _is_trusted(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address,
    proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> bool:
    return any(address.version == net.version and address in net for net in proxies)


def _subjects(*, username: str | None, address: str | None) -> list[str]:
    """The cache key suffixes an attempt is counted under: its account and its address."""
    subjects = []
    if username:
        folded = unicodedata.normalize("NFKC", username).strip().casefold()
        subjects.append("user:" + hashlib.sha256(folded.encode()).hexdigest()[:32])
    parsed = _parse(address) if address else None
    if parsed is not None:
        if parsed.version == 6:
            net = ipaddress.ip_network(f"{parsed}/{_IPV6_PREFIX}", strict=False)
            subjects.append(f"addr:{net.network_address}/{_IPV6_PREFIX}")
        else:
            subjects.append(f"addr:{parsed}")
    return subjects


def login_block_get(*, username: str | None, address: str | None) -> LoginBlocked | None:
    """The block that refuses an attempt for ``username`` from ``address``, if any."""
    subjects = _subjects(username=username, address=address)
    if not subjects:
        return None
    until = cache.get_many([f"{_BLOCKED}:{s}" for s in subjects]).values()
    remaining = max((float(u) for u in until), default=0.0) - time.time()
    if remaining <= 0:
        return None
    return LoginBlocked(retry_after_s=max(1, math.ceil(remaining)))


def login_failure_record(*, username: str | None, address: str | None) -> LoginBlocked | None:
    """Count a failed attempt; returns the block it starts, if it reached the limit."""
    limit = settings.COEVO_LOGIN_MAX_FAILURES
    window = settings.COEVO_LOGIN_WINDOW_S
    for subject in _subjects(username=username, address=address):
        key = f"{_FAILURES}:{subject}"
        # The count lives for one window from its first failure (INCR keeps the expiry).
        cache.add(key, 0, timeout=window)
        try:
            failures = cache.incr(key)
        except ValueError:  # it expired between add and incr
            cache.set(key, 1, timeout=window)
            failures = 1
        if failures >= limit:
            # The block stores its end, so the refusal can say when to come back.
            cache.set(f"{_BLOCKED}:{subject}", time.time() + window, timeout=window)
            cache.delete(key)
            # The subject names the address, or the account by its hash (never the username).
            logger.warning(
                "login blocked for %s s after %s failed attempts: %s", window, failures, subject
            )
    return login_block_get(username=username, address=address)


def login_success_record(*, username: str) -> None:
    """The account's owner proved the password: its failure count starts again. The address's
    count stays (a guesser with an account of its own must not reset it by logging in)."""
    for subject in _subjects(username=username, address=None):
        cache.delete(f"{_FAILURES}:{subject}")


def login_throttle_reset(*, username: str | None = None, address: str | None = None) -> None:
    """Lift a block and forget the failures (an operator unlocking an account or address)."""
    for subject in _subjects(username=username, address=address):
        cache.delete_many([f"{_FAILURES}:{subject}", f"{_BLOCKED}:{subject}"])

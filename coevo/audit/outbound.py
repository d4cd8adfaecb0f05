"""Outbound requests to addresses a user chose (webhooks): never to this machine or its network.

A webhook URL is a user's choice, and the worker sends from inside the deployment, next to
PostgreSQL, Redis, the policy servers and the cloud's metadata service. So every request is
checked where it is sent, not only where the URL was saved:

- the host is resolved once; *every* address it resolves to must be publicly routable (not
  loopback, private, link-local, CGNAT, multicast, reserved or unspecified, also when an IPv4
  address hides inside an IPv6 one), or the request is refused;
- the connection goes to the address that was checked (the URL's host replaced by it), with the
  original ``Host`` header and TLS server name, so a DNS answer that changes between the check
  and the connect (rebinding) cannot redirect it;
- redirects are not followed and proxies from the environment are not used (either would
  connect to an address nobody checked);
- nothing of the reply but its status code is read.

``COEVO_WEBHOOK_ALLOWED_HOSTS`` names the internal hosts (or address ranges) an operator does
want reachable, e.g. a chat bridge on the private network.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

import httpx

from coevo.errors import InvalidInput

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 6761: these names are loopback whatever a resolver says (and some resolvers say nothing).
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
# NAT64 (RFC 6052) carries an IPv4 address in its last 32 bits; a NAT64 gateway connects to it.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ALLOW_HINT = "an operator can allow an internal host with COEVO_WEBHOOK_ALLOWED_HOSTS"


@dataclass(frozen=True)
class PinnedTarget:
    """Where a checked request goes: ``url`` with its host replaced by ``address``."""

    url: str
    address: str
    pinned_url: str
    host_header: str
    sni_hostname: str | None


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (numeric forms like ``2130706433`` or ``0177.1``
    resolve too: that is the point of checking what the resolver answers, not the text).

    The one place outbound code asks DNS: tests replace it to play a rebinding resolver."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _numeric(host: str) -> list[str] | None:
    """The address of a host written as a number (any form the C library accepts), else None."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        return None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_ipv4(address: Address) -> list[ipaddress.IPv4Address]:
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found = [address.ipv4_mapped, address.sixtofour]
    if address.teredo:
        found.extend(address.teredo)
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [a for a in found if a is not None]


def address_is_public(address: Address) -> bool:
    """Publicly routable: not loopback, private, link-local, CGNAT (``is_global`` leaves out
    100.64/10), multicast, reserved or unspecified, and neither is an IPv4 address inside it."""
    for a in (address, *_embedded_ipv4(address)):
        if (
            not a.is_global
            or a.is_multicast
            or a.is_reserved
            or a.is_unspecified
            or a.is_loopback
            or a.is_link_local
            or (isinstance(a, ipaddress.IPv6Address) and a.is_site_local)
        ):
            return False
    return True


class _AllowList:
    def __init__(self, entries: Iterable[str]) -> None:
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            entry = entry.strip().strip("[]").rstrip(".").lower()
            if not entry:
                continue
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.names.add(entry)

    def allows_name(self, host: str) -> bool:
        return host.strip("[]").rstrip(".").lower() in self.names

    def allows_address(self, address: Address) -> bool:
        return any(address in network for network in self.networks)


def _parse(url: str) -> httpx.URL:
    text = (url or "").strip()
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidInput(f"Webhook URL {text!r} must be an http:// or https:// URL with a host.")
    return parsed


def _refuse(url: httpx.URL, address: str) -> InvalidInput:
    return InvalidInput(
        f"Webhook URL host {url.host!r} is (or resolves to) {address}, an address on this "
        "machine or a private network; webhooks go to public addresses only "
        f"({_ALLOW_HINT})."
    )


def _checked_addresses(parsed: httpx.URL, allowed: Iterable[str]) -> list[str] | None:
    """The host's addresses, each checked (InvalidInput for a refused one); None when a name
    does not resolve."""
    allow = _AllowList(allowed)
    host = _host(parsed)
    trusted = allow.allows_name(host)
    if not trusted and (host.rstrip(".") in _LOOPBACK_NAMES or host.endswith(".localhost")):
        raise _refuse(parsed, "loopback")
    addresses = _numeric(host)
    if addresses is None:
        try:
            addresses = resolve_host(host, parsed.port or _default_port(parsed))
        except (socket.gaierror, UnicodeError):
            return None
    if not trusted:
        for text in addresses:
            address = ipaddress.ip_address(text.split("%", 1)[0])  # no IPv6 zone id
            if not address_is_public(address) and not allow.allows_address(address):
                raise _refuse(parsed, text)
    return addresses or None


def _host(url: httpx.URL) -> str:
    """The host as sent on the wire: IDNA-encoded, lower case, without IPv6 brackets."""
    return url.raw_host.decode("ascii").lower()


def _default_port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


def outbound_url_check(url: str, *, allowed: Iterable[str]) -> str:
    """The check when a URL is saved: http(s) with a host that is not, and does not resolve
    to, an internal address. A name that does not resolve yet is accepted: every send checks
    again, against what it resolves to then."""
    _checked_addresses(_parse(url), allowed)
    return url.strip()


def outbound_target(url: str, *, allowed: Iterable[str]) -> PinnedTarget:
    """Resolve ``url``'s host once, check every address, and pin the first.

    Raises InvalidInput for a URL or address that is refused (retrying cannot help), and
    httpx.ConnectError when the host does not resolve (it may, later)."""
    parsed = _parse(url)
    addresses = _checked_addresses(parsed, allowed)
    if addresses is None:
        raise httpx.ConnectError(f"{parsed.host} does not resolve")
    address = addresses[0].split("%", 1)[0]
    host = _host(parsed)
    is_name = _numeric(host) is None
    return PinnedTarget(
        url=str(parsed),
        address=address,
        pinned_url=str(parsed.copy_with(host=address)),
        host_header=parsed.netloc.decode("ascii"),
        # The certificate is checked against the name the user wrote, not the address.
        sni_hostname=host.rstrip(".") if is_name and parsed.scheme == "https" else None,
    )


def outbound_post(
    url: str,
    *,
    content: bytes,
    headers: dict[str, str],
    timeout_s: float,
    allowed: Iterable[str],
    verify: ssl.SSLContext | bool = True,
) -> tuple[int, str]:
    """POST to a checked, pinned address; returns (status code, its standard phrase).
    ``verify``: how to check an https server's certificate (default: the public CAs).

    The reply body is never read: what a server answers is not shown to whoever chose the
    URL (an allowed internal host's reply would be a way to read it), and a large or endless
    body costs nothing."""
    target = outbound_target(url, allowed=allowed)
    extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
    with (
        # trust_env=False: an HTTP(S)_PROXY from the environment would connect to the name
        # itself, past the pinned address.
        httpx.Client(
            trust_env=False, follow_redirects=False, timeout=timeout_s, verify=verify
        ) as client,
        client.stream(
            "POST",
            target.pinned_url,
            content=content,
            headers={**headers, "Host": target.host_header},
            extensions=extensions,
        ) as response,
    ):
        status = response.status_code
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return status, phrase

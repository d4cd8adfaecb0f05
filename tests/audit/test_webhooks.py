"""Webhooks against a real local HTTP receiver that checks the signature and can fail.

The receiver listens on loopback, which webhooks refuse unless an operator allows it: the
``receiver`` fixture allows 127.0.0.1 through COEVO_WEBHOOK_ALLOWED_HOSTS, as an operator
would for an internal host. DNS is played by replacing ``coevo.audit.outbound.resolve_host``
(the one place outbound code resolves names), so a test can make a name rebind."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import ssl
import subprocess
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.db import transaction
from django.utils import timezone

from coevo.audit.models import AuditEvent, DeliveryState, Webhook, WebhookDelivery
from coevo.audit.outbound import outbound_post
from coevo.audit.webhooks import (
    webhook_backoff_s,
    webhook_create,
    webhook_delivery_attempt,
    webhook_redeliver,
    webhooks_notify,
)
from coevo.errors import InvalidInput


class Receiver:
    """Answers 500 to the first ``fail_first`` POSTs (with ``reply_body``), then 204; records
    every request and whether its X-Coevo-Signature matched ``secret``."""

    def __init__(self) -> None:
        self.secret = ""
        self.fail_first = 0
        self.reply_body = b""
        self.requests: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                expected = (
                    "sha256=" + hmac.new(receiver.secret.encode(), body, hashlib.sha256).hexdigest()
                )
                receiver.requests.append(
                    {
                        "headers": dict(self.headers),
                        "body": json.loads(body),
                        "signed": hmac.compare_digest(
                            self.headers.get("X-Coevo-Signature", ""), expected
                        ),
                    }
                )
                failing = len(receiver.requests) <= receiver.fail_first
                self.send_response(500 if failing else 204)
                if failing and receiver.reply_body:
                    self.send_header("Content-Length", str(len(receiver.reply_body)))
                    self.end_headers()
                    self.wfile.write(receiver.reply_body)
                else:
                    self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(settings):
    settings.COEVO_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def dns(monkeypatch):
    """A resolver the test controls: {name: [addresses]}; records every lookup."""

    class Dns:
        def __init__(self) -> None:
            self.answers: dict[str, list[str]] = {}
            self.lookups: list[str] = []

        def resolve(self, host: str, port: int) -> list[str]:
            self.lookups.append(host)
            if host not in self.answers:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return list(self.answers[host])

    fake = Dns()
    monkeypatch.setattr("coevo.audit.outbound.resolve_host", fake.resolve)
    return fake


@pytest.fixture
def enqueued(monkeypatch):
    """Unit tests drive attempts by hand: record what would be enqueued (and its countdown)."""
    calls: list[tuple[str, float]] = []
    monkeypatch.setattr(
        "coevo.audit.webhooks._delivery_enqueue",
        lambda pk, countdown=0: calls.append((str(pk), countdown)),
    )
    return calls


def _hook(project, owner, receiver, events=("channel.moved",)) -> Webhook:
    webhook, secret = webhook_create(
        project=project, url=receiver.url, events=list(events), created_by=owner
    )
    receiver.secret = secret
    return webhook


def test_it_refuses_urls_that_are_not_http(project, owner):
    for url in ("file:///etc/passwd", "gopher://x/", "ftp://h/", "/relative", "http://"):
        with pytest.raises(InvalidInput, match="http"):
            webhook_create(project=project, url=url, events=["channel.moved"], created_by=owner)
    assert not Webhook.objects.exists()


def test_it_creates_a_delivery_per_subscribed_active_webhook_and_enqueues_on_commit(
    project, owner, receiver, enqueued, django_capture_on_commit_callbacks
):
    subscribed = _hook(project, owner, receiver)
    Webhook.objects.create(project=project, url=receiver.url, secret="s", events=["other.event"])
    inactive = _hook(project, owner, receiver)
    Webhook.objects.filter(pk=inactive.pk).update(active=False)
    everything = _hook(project, owner, receiver, events=["*"])
    with django_capture_on_commit_callbacks(execute=True):
        webhooks_notify(project=project, event="channel.moved", payload={"channel": "prod"})
        assert enqueued == []  # nothing leaves before the transaction commits
    deliveries = WebhookDelivery.objects.all()
    assert {d.webhook_id for d in deliveries} == {subscribed.pk, everything.pk}
    assert sorted(pk for pk, _ in enqueued) == sorted(str(d.pk) for d in deliveries)
    assert AuditEvent.objects.filter(action="webhook.created").count() == 3


def test_it_posts_a_signed_json_body_with_event_and_delivery_headers(
    project, owner, receiver, enqueued
):
    _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={"to": "abc123"})
    delivery = WebhookDelivery.objects.get()
    delivery = webhook_delivery_attempt(delivery_id=delivery.pk)
    assert delivery.state == DeliveryState.DELIVERED
    assert delivery.attempts == 1 and delivery.last_status_code == 204
    assert delivery.delivered_at is not None
    [request] = receiver.requests
    assert request["signed"]
    assert request["headers"]["X-Coevo-Event"] == "channel.moved"
    assert request["headers"]["X-Coevo-Delivery"] == str(delivery.pk)
    assert request["body"]["data"] == {"to": "abc123"}
    assert request["body"]["project"] == "demo"


def test_it_retries_with_exponential_backoff_until_delivered(
    project, owner, receiver, enqueued, settings
):
    settings.COEVO_WEBHOOK_BACKOFF_S = 30
    settings.COEVO_WEBHOOK_MAX_ATTEMPTS = 6
    receiver.fail_first = 2
    _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = WebhookDelivery.objects.get()
    enqueued.clear()

    expected_delays = [30.0, 60.0]
    for attempt, delay in enumerate(expected_delays, start=1):
        before = timezone.now()
        delivery = webhook_delivery_attempt(delivery_id=delivery.pk)
        assert delivery.state == DeliveryState.PENDING
        assert delivery.attempts == attempt
        assert delivery.last_status_code == 500
        assert "HTTP 500" in delivery.last_error
        wait = (delivery.next_attempt_at - before).total_seconds()
        assert delay - 1 < wait < delay + 5
        assert enqueued[-1] == (str(delivery.pk), delay)
        # Not due yet: a duplicate message does nothing.
        assert webhook_delivery_attempt(delivery_id=delivery.pk).attempts == attempt
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())

    delivery = webhook_delivery_attempt(delivery_id=delivery.pk)
    assert delivery.state == DeliveryState.DELIVERED
    assert delivery.attempts == 3
    assert len(receiver.requests) == 3
    assert all(r["signed"] for r in receiver.requests)
    assert webhook_backoff_s(attempts=5) == 30 * 16


def test_it_ends_failed_after_the_last_attempt(project, owner, receiver, enqueued, settings):
    settings.COEVO_WEBHOOK_MAX_ATTEMPTS = 3
    receiver.fail_first = 100
    _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = WebhookDelivery.objects.get()
    for _ in range(3):
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
        delivery = webhook_delivery_attempt(delivery_id=delivery.pk)
    assert delivery.state == DeliveryState.FAILED
    assert delivery.attempts == 3
    assert delivery.next_attempt_at is None
    assert webhook_delivery_attempt(delivery_id=delivery.pk).attempts == 3  # final: left alone
    assert len(receiver.requests) == 3


def test_it_never_sends_to_a_url_that_became_non_http(project, owner, receiver, enqueued):
    webhook = _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={})
    Webhook.objects.filter(pk=webhook.pk).update(url="file:///etc/passwd")
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.state == DeliveryState.FAILED
    assert "http" in delivery.last_error
    assert receiver.requests == []


def test_it_redelivers_as_a_new_delivery(project, owner, receiver, enqueued):
    _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={"n": 1})
    first = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    webhook_redeliver(delivery=first, actor=owner)
    second = WebhookDelivery.objects.exclude(pk=first.pk).get()
    assert (second.event, second.payload, second.state) == ("channel.moved", {"n": 1}, "pending")
    assert AuditEvent.objects.filter(action="webhook.redelivered", actor=owner).exists()


def test_it_retries_through_a_real_worker(celery_worker_thread, project, owner, receiver, settings):
    settings.COEVO_WEBHOOK_BACKOFF_S = 0.2
    receiver.fail_first = 2
    _hook(project, owner, receiver)
    with transaction.atomic():
        webhooks_notify(project=project, event="channel.moved", payload={"to": "sha"})
    delivery = WebhookDelivery.objects.get()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        delivery.refresh_from_db()
        if delivery.state != DeliveryState.PENDING:
            break
        time.sleep(0.1)
    assert delivery.state == DeliveryState.DELIVERED
    assert delivery.attempts == 3
    assert [r["signed"] for r in receiver.requests] == [True, True, True]
    # Backoff 0.2 s then 0.4 s: the delivery cannot have landed sooner.
    assert delivery.created_at + timedelta(seconds=0.5) < delivery.delivered_at


# --- outbound requests go to public addresses only (SSRF) --------------------------------------

INTERNAL_URLS = [
    "http://127.0.0.1/hook",
    "http://127.0.0.1:6379/",
    "http://169.254.169.254/latest/meta-data/",
    "http://localhost:6379/",
    "http://LOCALHOST./",
    "http://anything.localhost/",
    "http://[::1]:5432/",
    "http://10.0.0.5/",
    "http://172.16.3.4/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",  # CGNAT, which ipaddress's is_global alone lets through
    "http://0.0.0.0:8000/",
    "http://0/",
    "http://2130706433/",  # 127.0.0.1 as one decimal number
    "http://0x7f.1/",  # hex, short form
    "http://[::ffff:127.0.0.1]/",  # IPv4-mapped IPv6
    "http://[::ffff:a9fe:a9fe]/",  # 169.254.169.254, mapped
    "http://[64:ff9b::a9fe:a9fe]/",  # 169.254.169.254 through NAT64
    "http://[2002:7f00:1::]/",  # 6to4 around 127.0.0.1
    "http://[::]/",
    "http://[fe80::1]/",
    "http://[fd00::1]/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://255.255.255.255/",
    "https://192.0.2.1/",  # documentation range (reserved)
]


# Forms the C library reads as 127.0.0.1 but the HTTP client refuses to parse: refused too.
UNPARSEABLE_URLS = ["http://0177.0.0.1/", "http://127.000.000.001/"]


@pytest.mark.parametrize("url", UNPARSEABLE_URLS)
def test_it_refuses_a_webhook_url_the_http_client_cannot_parse(project, owner, url):
    with pytest.raises(InvalidInput, match="must be an http:// or https:// URL with a host"):
        webhook_create(project=project, url=url, events=["channel.moved"], created_by=owner)
    assert not Webhook.objects.exists()


@pytest.mark.parametrize("url", INTERNAL_URLS)
def test_it_refuses_a_webhook_to_an_internal_address_when_it_is_created(project, owner, url):
    with pytest.raises(InvalidInput, match="public addresses only") as refused:
        webhook_create(project=project, url=url, events=["channel.moved"], created_by=owner)
    assert "COEVO_WEBHOOK_ALLOWED_HOSTS" in str(refused.value)  # says what an operator can do
    assert not Webhook.objects.exists()


def test_it_refuses_a_name_when_any_address_it_resolves_to_is_internal(project, owner, dns):
    dns.answers["hooks.example.test"] = ["10.1.2.3"]
    dns.answers["mixed.example.test"] = ["93.184.216.34", "127.0.0.1"]
    for host in ("hooks.example.test", "mixed.example.test"):
        with pytest.raises(InvalidInput, match="public addresses only"):
            webhook_create(
                project=project, url=f"https://{host}/hook", events=["*"], created_by=owner
            )
    assert not Webhook.objects.exists()
    # A public answer, or none yet (every send checks again), is accepted.
    dns.answers["hooks.example.test"] = ["93.184.216.34"]
    webhook_create(
        project=project, url="https://hooks.example.test/", events=["*"], created_by=owner
    )
    webhook_create(
        project=project, url="https://later.example.test/", events=["*"], created_by=owner
    )
    assert Webhook.objects.count() == 2


def test_it_refuses_at_send_time_a_stored_url_to_an_internal_address(
    project, owner, receiver, enqueued, settings
):
    # Created while allowed (or before this check existed), then the operator's allowance ends.
    _hook(project, owner, receiver)
    settings.COEVO_WEBHOOK_ALLOWED_HOSTS = []
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.state == DeliveryState.FAILED  # retrying cannot help
    assert "public addresses only" in delivery.last_error
    assert receiver.requests == []


def test_it_refuses_a_name_that_rebinds_to_loopback_after_creation(
    project, owner, receiver, enqueued, dns, settings
):
    settings.COEVO_WEBHOOK_ALLOWED_HOSTS = []
    dns.answers["hooks.example.test"] = ["93.184.216.34"]
    webhook, receiver.secret = webhook_create(
        project=project,
        url=f"http://hooks.example.test:{receiver.port}/hook",
        events=["*"],
        created_by=owner,
    )
    dns.answers["hooks.example.test"] = ["127.0.0.1"]  # the attacker's DNS changes its answer
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.state == DeliveryState.FAILED
    assert "127.0.0.1" in delivery.last_error and "public addresses only" in delivery.last_error
    assert receiver.requests == []


def test_it_connects_to_the_address_it_checked_with_the_original_host_header(
    project, owner, receiver, enqueued, dns, settings
):
    # An allowed internal name: resolved once per attempt, by coevo, and the connection goes
    # to that answer (the name exists in no real DNS, so a second lookup by the HTTP client
    # would fail); the receiver still sees the name the user wrote.
    settings.COEVO_WEBHOOK_ALLOWED_HOSTS = ["hooks.internal.test"]
    dns.answers["hooks.internal.test"] = ["127.0.0.1"]
    webhook, receiver.secret = webhook_create(
        project=project,
        url=f"http://hooks.internal.test:{receiver.port}/hook",
        events=["*"],
        created_by=owner,
    )
    webhooks_notify(project=project, event="channel.moved", payload={"to": "abc"})
    dns.lookups.clear()
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.state == DeliveryState.DELIVERED, delivery.last_error
    assert dns.lookups == ["hooks.internal.test"]
    [request] = receiver.requests
    assert request["headers"]["Host"] == f"hooks.internal.test:{receiver.port}"
    assert request["signed"] and request["body"]["data"] == {"to": "abc"}


def test_it_allows_an_internal_address_an_operator_listed(
    project, owner, receiver, enqueued, settings
):
    settings.COEVO_WEBHOOK_ALLOWED_HOSTS = ["10.0.0.0/8", "127.0.0.0/30"]
    _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.state == DeliveryState.DELIVERED
    assert len(receiver.requests) == 1


def test_it_retries_a_name_that_does_not_resolve(project, owner, receiver, enqueued, dns):
    webhook_create(
        project=project, url="https://gone.example.test/hook", events=["*"], created_by=owner
    )
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.state == DeliveryState.PENDING  # DNS may come back: retried
    assert "does not resolve" in delivery.last_error
    assert delivery.next_attempt_at is not None


def test_it_keeps_no_reply_body_in_the_delivery_log(project, owner, receiver, enqueued):
    receiver.fail_first = 1
    receiver.reply_body = b"redis_version:7.2.4 SECRET-FROM-THE-REPLY " * 1000
    _hook(project, owner, receiver)
    webhooks_notify(project=project, event="channel.moved", payload={})
    delivery = webhook_delivery_attempt(delivery_id=WebhookDelivery.objects.get().pk)
    assert delivery.last_status_code == 500
    assert delivery.last_error == "HTTP 500 Internal Server Error"


def test_it_checks_the_tls_certificate_against_the_name_not_the_pinned_address(tmp_path, dns):
    # A certificate for the name only: connecting to the pinned address must still send the
    # name as TLS server name (SNI) and verify the certificate against it.
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", key, "-out", cert, "-subj", "/CN=hooks.internal.test",
         "-addext", "subjectAltName=DNS:hooks.internal.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    seen: dict[str, str] = {}
    names: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen["host"] = self.headers["Host"]
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    server_context.sni_callback = lambda sock, name, ctx: names.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_port
    dns.answers["hooks.internal.test"] = ["127.0.0.1"]
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        status = outbound_post(
            f"https://hooks.internal.test:{port}/hook",
            content=b"{}",
            headers={"Content-Type": "application/json"},
            timeout_s=10,
            allowed=["hooks.internal.test"],
            verify=trust,
        )
        # The same server by its address: the certificate does not name it, so it is refused.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|match"):
            outbound_post(
                f"https://127.0.0.1:{port}/hook",
                content=b"{}",
                headers={},
                timeout_s=10,
                allowed=["127.0.0.1"],
                verify=trust,
            )
    finally:
        server.shutdown()
        server.server_close()
    assert status == (204, "No Content")
    assert names[0] == "hooks.internal.test"  # the second handshake, by address, sent none
    assert seen["host"] == f"hooks.internal.test:{port}"

"""Webhooks against a real local HTTP receiver that checks the signature and can fail."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.utils import timezone

from coevo.audit.models import AuditEvent, DeliveryState, Webhook, WebhookDelivery
from coevo.audit.webhooks import (
    webhook_backoff_s,
    webhook_create,
    webhook_delivery_attempt,
    webhook_redeliver,
    webhooks_notify,
)
from coevo.errors import InvalidInput


class Receiver:
    """Answers 500 to the first ``fail_first`` POSTs, then 204; records every request and
    whether its X-Coevo-Signature matched ``secret``."""

    def __init__(self) -> None:
        self.secret = ""
        self.fail_first = 0
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
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    with Receiver() as receiver:
        yield receiver


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

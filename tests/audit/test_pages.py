"""The audit log page and the webhooks page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from coevo.audit.models import Webhook, WebhookDelivery
from coevo.audit.services import audit_record
from coevo.audit.webhooks import webhooks_notify
from coevo.projects.models import Role
from coevo.projects.services import membership_set

AUDIT = reverse("web:audit", args=["demo"])
WEBHOOKS = reverse("web:webhooks", args=["demo"])


@pytest.fixture
def no_enqueue(monkeypatch):
    monkeypatch.setattr("coevo.audit.webhooks._delivery_enqueue", lambda pk, countdown=0: None)


def test_it_shows_events_with_a_compact_diff(client, project, owner, reviewer):
    membership_set(project=project, user=reviewer, role=Role.VIEWER, actor=owner)
    client.force_login(reviewer)  # still a member: any change keeps them at least a viewer
    membership_set(project=project, user=reviewer, role=Role.REVIEWER, actor=owner)
    page = client.get(AUDIT).content.decode()
    assert "member.role_changed" in page
    assert "<del>reviewer</del> → <ins>viewer</ins>" in page


def test_it_filters_by_get_params(client, project, owner, reviewer):
    audit_record(actor=owner, project=project, action="channel.moved", target=project)
    audit_record(actor=reviewer, project=project, action="suite.imported", target=project)
    client.force_login(owner)
    page = client.get(AUDIT, {"actor": "reviewer"}).content.decode()
    assert "suite.imported" in page and "channel.moved" not in page
    page = client.get(AUDIT, {"action": "channel", "since": "2000-01-01"}).content.decode()
    assert "channel.moved" in page and "suite.imported" not in page
    assert client.get(AUDIT, {"since": "yesterday"}).status_code == 400


def test_it_paginates(client, project, owner, settings):
    for n in range(55):
        audit_record(actor=owner, project=project, action=f"bulk.e{n:02d}", target=project)
    client.force_login(owner)
    first = client.get(AUDIT, {"action": "bulk"}).content.decode()
    assert first.count("bulk.e") == 50
    assert 'rel="next"' in first
    older = first.split('href="?', 2)[-1].split('" rel="next"')[0].replace("&amp;", "&")
    second = client.get(AUDIT + "?" + older).content.decode()
    assert second.count("bulk.e") == 5


def test_it_keeps_other_projects_events_off_the_page(client, project, owner):
    from coevo.projects.services import project_get_or_create

    other = project_get_or_create(slug="other", name="Other")
    audit_record(actor=None, project=other, action="secret.other", target=other)
    client.force_login(owner)
    assert "secret.other" not in client.get(AUDIT).content.decode()


def test_it_shows_the_global_log_to_staff_only(client, project, owner):
    audit_record(actor=None, project=None, action="policyversion.created", target=project)
    client.force_login(owner)
    assert client.get(reverse("web:global_audit")).status_code == 403
    staff = get_user_model().objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    client.force_login(staff)
    assert "policyversion.created" in client.get(reverse("web:global_audit")).content.decode()


def test_it_creates_a_webhook_and_shows_the_secret_once(client, project, owner):
    client.force_login(owner)
    response = client.post(
        WEBHOOKS, {"url": "https://ci.example.com/hook", "events": ["channel.moved"]}
    )
    assert response.status_code == 302
    secret = Webhook.objects.get().secret
    assert secret in client.get(WEBHOOKS).content.decode()
    assert secret not in client.get(WEBHOOKS).content.decode()


def test_it_refuses_a_non_http_webhook_url(client, project, owner):
    client.force_login(owner)
    response = client.post(
        WEBHOOKS, {"url": "file:///etc/passwd", "events": ["channel.moved"]}, follow=True
    )
    assert "must be an http" in response.content.decode()
    assert not Webhook.objects.exists()


def test_it_refuses_a_webhook_to_the_metadata_service_and_says_why(client, project, owner):
    client.force_login(owner)
    response = client.post(
        WEBHOOKS,
        {"url": "http://169.254.169.254/latest/meta-data/", "events": ["channel.moved"]},
        follow=True,
    )
    content = response.content.decode()
    assert "public addresses only" in content and "COEVO_WEBHOOK_ALLOWED_HOSTS" in content
    assert not Webhook.objects.exists()


def test_it_lists_deliveries_and_redelivers(client, project, owner, no_enqueue):
    client.force_login(owner)
    client.post(WEBHOOKS, {"url": "https://ci.example.com/hook", "events": ["*"]})
    webhooks_notify(project=project, event="channel.moved", payload={"to": "abc"})
    delivery = WebhookDelivery.objects.get()
    assert "channel.moved" in client.get(WEBHOOKS).content.decode()
    url = reverse("web:webhook_redeliver", args=["demo", delivery.pk])
    assert client.post(url).status_code == 302
    assert WebhookDelivery.objects.count() == 2


def test_it_forbids_reviewers_from_the_webhooks_page(client, project, reviewer):
    client.force_login(reviewer)
    assert client.get(WEBHOOKS).status_code == 403
    assert client.post(WEBHOOKS, {"url": "https://x.example/", "events": ["*"]}).status_code == 403

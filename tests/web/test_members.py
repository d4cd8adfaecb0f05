"""The members page: admins add, change and remove members; every change is audited."""

from __future__ import annotations

import pytest
from django.urls import reverse

from coevo.audit.models import AuditEvent
from coevo.projects.models import Membership, Role
from tests.support.factories import make_member

MEMBERS = reverse("web:members", args=["demo"])


def _action(name: str) -> str:
    return reverse("web:member_action", args=["demo", name])


@pytest.fixture
def admin_client(client, owner, project):
    client.force_login(owner)
    return client


def test_it_lists_members_with_their_roles(admin_client):
    page = admin_client.get(MEMBERS).content.decode()
    assert 'data-username="owner"' in page and 'data-username="reviewer"' in page


def test_it_adds_a_user_by_email_with_a_role_and_audits_it(admin_client, project, outsider):
    response = admin_client.post(
        _action("add"), {"user": "OUTSIDER@example.com", "role": "researcher"}
    )
    assert response.status_code == 302
    assert Membership.objects.get(project=project, user=outsider).role == Role.RESEARCHER
    event = AuditEvent.objects.get(action="member.added", target_id="outsider")
    assert event.actor_label == "owner" and event.after == {"role": "researcher"}


def test_it_changes_a_role_and_records_before_and_after(admin_client, project):
    admin_client.post(_action("role"), {"username": "reviewer", "role": "viewer"})
    event = AuditEvent.objects.get(action="member.role_changed")
    assert (event.before, event.after) == ({"role": "reviewer"}, {"role": "viewer"})


def test_it_removes_a_member(admin_client, project, reviewer):
    admin_client.post(_action("remove"), {"username": "reviewer"})
    assert not Membership.objects.filter(project=project, user=reviewer).exists()
    assert AuditEvent.objects.filter(action="member.removed", actor_label="owner").exists()


def test_it_refuses_to_remove_the_last_admin(admin_client, project, owner):
    response = admin_client.post(_action("remove"), {"username": "owner"}, follow=True)
    assert "last admin" in response.content.decode()
    assert Membership.objects.get(project=project, user=owner).role == Role.ADMIN


def test_it_says_when_no_user_matches(admin_client):
    response = admin_client.post(_action("add"), {"user": "nobody", "role": "viewer"}, follow=True)
    assert "No single active user" in response.content.decode()


def test_it_refuses_an_unknown_role(admin_client, outsider, project):
    response = admin_client.post(_action("add"), {"user": "outsider", "role": "god"}, follow=True)
    assert "is not a role" in response.content.decode()
    assert not Membership.objects.filter(user=outsider).exists()


@pytest.mark.parametrize("role", [Role.VIEWER, Role.RESEARCHER, Role.REVIEWER])
def test_it_forbids_non_admins_from_changing_members(client, project, role):
    user = make_member(project, "member", role)
    client.force_login(user)
    response = client.post(_action("role"), {"username": "member", "role": "admin"})
    assert response.status_code == 403
    assert Membership.objects.get(user=user).role == role


def test_it_hides_the_page_from_outsiders(client, project, outsider):
    client.force_login(outsider)
    assert client.get(MEMBERS).status_code == 404
    assert client.post(_action("add"), {"user": "outsider", "role": "admin"}).status_code == 404
    assert not Membership.objects.filter(user=outsider).exists()


def test_it_refuses_to_add_an_existing_member_and_keeps_their_role(admin_client, project, reviewer):
    response = admin_client.post(
        _action("add"), {"user": "reviewer", "role": "viewer"}, follow=True
    )
    assert "reviewer is already a member: change the role." in response.content.decode()
    assert Membership.objects.get(project=project, user=reviewer).role == Role.REVIEWER

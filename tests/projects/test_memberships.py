"""Memberships through their selectors and services: finding the user to add, adding them once,
listing members by role."""

from __future__ import annotations

import pytest

from coevo.audit.models import AuditEvent
from coevo.errors import InvalidInput, NotFound
from coevo.projects.models import Membership, Role
from coevo.projects.selectors import membership_list, project_member_get, user_find_active
from coevo.projects.services import membership_add
from tests.support.factories import make_member, make_user

pytestmark = pytest.mark.django_db


def test_it_finds_an_active_user_by_username_or_email_in_either_case(outsider):
    assert user_find_active(identifier="  OUTSIDER ") == outsider
    assert user_find_active(identifier="Outsider@Example.com") == outsider


def test_it_finds_no_one_for_an_inactive_user_a_shared_email_or_nothing(outsider):
    outsider.is_active = False
    outsider.save()
    with pytest.raises(NotFound, match="No single active user"):
        user_find_active(identifier="outsider")
    make_user("twin-a", email="twins@example.com")
    make_user("twin-b", email="twins@example.com")
    with pytest.raises(NotFound, match="No single active user"):
        user_find_active(identifier="twins@example.com")
    with pytest.raises(InvalidInput, match="Give a username"):
        user_find_active(identifier="   ")


def test_it_gets_a_member_by_username_and_refuses_a_non_member(project, reviewer, outsider):
    assert project_member_get(project=project, username="reviewer") == reviewer
    with pytest.raises(NotFound, match="'outsider' is not a member of demo"):
        project_member_get(project=project, username="outsider")


def test_it_lists_members_highest_role_first_then_by_username(project):
    make_member(project, "zed", Role.VIEWER)
    make_member(project, "amy", Role.VIEWER)
    listed = [(m.user.username, m.role) for m in membership_list(project=project)]
    assert listed == [
        ("owner", Role.ADMIN),
        ("reviewer", Role.REVIEWER),
        ("amy", Role.VIEWER),
        ("zed", Role.VIEWER),
    ]


def test_it_adds_a_user_once_and_audits_it(project, owner, outsider):
    membership_add(project=project, user=outsider, role=Role.VIEWER, actor=owner)
    assert Membership.objects.get(project=project, user=outsider).role == Role.VIEWER
    assert AuditEvent.objects.filter(action="member.added", target_id="outsider").count() == 1


def test_it_refuses_to_add_a_member_again_and_keeps_their_role(project, owner, reviewer):
    with pytest.raises(InvalidInput, match="reviewer is already a member: change the role"):
        membership_add(project=project, user=reviewer, role=Role.VIEWER, actor=owner)
    assert Membership.objects.get(project=project, user=reviewer).role == Role.REVIEWER
    assert not AuditEvent.objects.filter(action="member.role_changed").exists()

"""The audit log: append-only (model and database), what the services record, the filters."""

from __future__ import annotations

import datetime

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from coevo.audit.models import AuditEvent
from coevo.audit.selectors import audit_event_list, audit_event_page
from coevo.audit.services import audit_record
from coevo.errors import InvalidState, NotFound
from coevo.projects.models import Project, Role
from coevo.projects.services import membership_remove, membership_set
from coevo.suites.services import suite_delete, suite_import_humaneval


def test_it_records_actor_target_and_json_safe_before_after(project, owner):
    when = timezone.now()
    audit_record(
        actor=owner,
        project=project,
        action="project.renamed",
        target=project,
        before={"name": "Old", "at": when},
        after={"name": "New", "role": Role.ADMIN},
    )
    event = AuditEvent.objects.get(action="project.renamed")
    assert event.actor == owner
    assert event.actor_label == "owner"
    assert event.target_type == "projects.Project"
    assert event.target_id == "demo"
    assert event.before == {"name": "Old", "at": when.isoformat()}
    assert event.after == {"name": "New", "role": "admin"}


def test_it_refuses_to_change_or_delete_an_event_through_the_model(project):
    audit_record(actor=None, project=project, action="x.y", target=project)
    event = AuditEvent.objects.get(action="x.y")
    assert event.actor_label == "system"
    event.action = "rewritten"
    with pytest.raises(InvalidState):
        event.save()
    with pytest.raises(InvalidState):
        event.delete()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE audit_auditevent SET action = 'rewritten'",
        "DELETE FROM audit_auditevent",
    ],
)
def test_it_rejects_update_and_delete_in_raw_sql(project, sql):
    audit_record(actor=None, project=project, action="x.y", target=project)
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert AuditEvent.objects.filter(action="x.y").count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the trigger is PostgreSQL's")
def test_it_rejects_a_queryset_update(project):
    audit_record(actor=None, project=project, action="x.y", target=project)
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(action="x.y").update(action="z")


def test_it_audits_role_changes_with_before_and_after(project, owner, outsider):
    membership_set(project=project, user=outsider, role=Role.VIEWER, actor=owner)
    membership_set(project=project, user=outsider, role=Role.RESEARCHER, actor=owner)
    membership_set(project=project, user=outsider, role=Role.RESEARCHER, actor=owner)  # no-op
    membership_remove(project=project, user=outsider, actor=owner)
    events = list(AuditEvent.objects.filter(target_id="outsider").order_by("created_at", "action"))
    assert [(e.action, e.before, e.after) for e in events] == [
        ("member.added", None, {"role": "viewer"}),
        ("member.role_changed", {"role": "viewer"}, {"role": "researcher"}),
        ("member.removed", {"role": "researcher"}, None),
    ]
    assert {e.actor_label for e in events} == {"owner"}


def test_it_refuses_to_remove_or_demote_the_last_admin(project, owner):
    with pytest.raises(InvalidState, match="last admin"):
        membership_remove(project=project, user=owner, actor=owner)
    with pytest.raises(InvalidState, match="last admin"):
        membership_set(project=project, user=owner, role=Role.REVIEWER, actor=owner)


def test_it_says_not_found_when_removing_a_non_member(project, owner, outsider):
    with pytest.raises(NotFound):
        membership_remove(project=project, user=outsider, actor=owner)


def test_it_audits_suite_import_and_deletion(project, owner):
    suite, _ = suite_import_humaneval(project=project, actor=owner)
    suite_delete(suite=suite, actor=owner)
    actions = list(
        AuditEvent.objects.filter(target_type="suites.Suite").values_list("action", "target_id")
    )
    assert sorted(actions) == [("suite.deleted", str(suite.pk)), ("suite.imported", str(suite.pk))]


def test_it_filters_by_actor_action_prefix_target_type_and_dates(project, owner, reviewer):
    AuditEvent.objects.all()  # the fixture's two member.added events (actor: system)
    audit_record(actor=owner, project=project, action="channel.moved", target=project)
    audit_record(actor=reviewer, project=project, action="channelx.odd", target=project)
    audit_record(actor=reviewer, project=project, action="suite.imported", target=project)
    audit_record(actor=None, project=None, action="policyversion.created", target=project)

    def actions(**filters):
        return sorted(audit_event_list(project=project, **filters).values_list("action", flat=True))

    assert actions(actor="reviewer") == ["channelx.odd", "suite.imported"]
    assert actions(action_prefix="channel") == ["channel.moved"]
    assert actions(action_prefix="member.") == ["member.added", "member.added"]
    assert actions(target_type="auth.user") == ["member.added", "member.added"]
    assert "policyversion.created" not in actions()
    assert list(audit_event_list(global_only=True).values_list("action", flat=True)) == [
        "policyversion.created"
    ]
    tomorrow = timezone.now() + datetime.timedelta(days=1)
    assert actions(since=tomorrow) == []
    assert len(actions(until=tomorrow)) == 5


def test_it_pages_with_a_cursor_without_repeating_rows(project):
    for n in range(7):
        audit_record(actor=None, project=project, action=f"test.e{n}", target=project)
    events = audit_event_list(project=project, action_prefix="test")
    seen, cursor = [], None
    while True:
        page = audit_event_page(events=events, cursor=cursor, limit=3)
        seen += [e.action for e in page.events]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == [f"test.e{n}" for n in range(7)]
    assert len(seen) == 7


def test_the_target_types_are_every_type_once_sorted(project, owner, reviewer):
    from coevo.audit.selectors import audit_target_types

    other = Project.objects.create(slug="other-types", name="other")
    audit_record(actor=None, project=other, action="x.y", target=other)
    everywhere = sorted(set(AuditEvent.objects.values_list("target_type", flat=True)))
    mine = sorted(
        set(AuditEvent.objects.filter(project=project).values_list("target_type", flat=True))
    )
    # The global list hops along the index (a recursive query): the same answer as reading all.
    assert audit_target_types(project=None) == everywhere and len(everywhere) >= 2
    assert audit_target_types(project=project) == mine

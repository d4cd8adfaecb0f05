"""Channel writes. ``channel_move`` is the only way a channel changes (the management command,
the admin and, with issue 5, approved promotion requests all call it).

Git tags (in the project's harness repository):
- ``channels/<name>/<NNNN>``: one per move, numbered from 0001 and never moved, so the
  repository itself keeps the channel's history (``git tag -l 'channels/production/*'``);
- ``<name>`` (e.g. ``production``): moves with the channel, for ``git checkout production``.
A channel may therefore not be called ``channels`` (its moving tag would clash with the
``channels/`` namespace).
"""

from __future__ import annotations

import logging
import re

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from coevo.audit.services import audit_record
from coevo.audit.webhooks import webhooks_notify
from coevo.errors import InvalidInput, InvalidState, PermissionDenied
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.reviews.models import Channel, ChannelMove
from harness_store.models import Candidate
from harness_store.services import project_repo

logger = logging.getLogger(__name__)

CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
RESERVED_CHANNEL_NAMES = frozenset({"channels"})
TAG_PREFIX = "channels"


def channel_tag_names(*, channel: Channel, number: int) -> tuple[str, str]:
    """(numbered history tag, moving tag) of the ``number``-th move of ``channel``."""
    return f"{TAG_PREFIX}/{channel.name}/{number:04d}", channel.name


def channel_get_or_create(*, project: Project, name: str) -> Channel:
    """The project's channel ``name``, created empty (no holder) on first use."""
    if not CHANNEL_NAME.match(name) or name in RESERVED_CHANNEL_NAMES:
        raise InvalidInput(
            f"{name!r} is not a valid channel name: use 1 to 64 lowercase letters, digits, "
            "'-' or '_', starting with a letter or digit (and not 'channels')."
        )
    channel = Channel.objects.filter(project=project, name=name).first()
    if channel is not None:
        return channel
    try:
        with transaction.atomic():
            return Channel.objects.create(project=project, name=name)
    except IntegrityError:
        # Created by a concurrent request between the lookup and the insert.
        return Channel.objects.get(project=project, name=name)


# Every project has these; any other channel is created by a project admin (channel_create).
STANDARD_CHANNELS = ("production", "staging")


def channel_for_request(*, project: Project, name: str) -> Channel:
    """The channel a promotion request or gate names: a standard one (created empty on first
    use) or one a project admin created; anything else is refused, so a typo never makes a new
    channel."""
    if name in STANDARD_CHANNELS or not CHANNEL_NAME.match(name):
        return channel_get_or_create(project=project, name=name)  # or its name's error
    channel = Channel.objects.filter(project=project, name=name).first()
    if channel is None:
        raise InvalidInput(
            f"Project {project.slug} has no channel {name!r}: use production or staging, or ask "
            "a project admin to create it on the channels page."
        )
    return channel


def channel_create(*, project: Project, name: str, by: AbstractBaseUser) -> Channel:
    """A new, empty channel (project admins; the caller checks the role). Audited."""
    if Channel.objects.filter(project=project, name=name).exists():
        raise InvalidInput(f"Project {project.slug} already has a channel {name!r}.")
    channel = channel_get_or_create(project=project, name=name)
    audit_record(
        actor=by, project=project, action="channel.created", target=channel, after={"name": name}
    )
    return channel


def channel_move(
    *,
    channel: Channel,
    candidate: Candidate,
    policy_version: PolicyVersion | None,
    moved_by: AbstractBaseUser | None,
    reason: str = "",
    reverts: ChannelMove | None = None,
) -> ChannelMove:
    """Point ``channel`` at ``candidate`` (and ``policy_version``), record the move and tag it.

    Compare-and-swap on the channel as the caller loaded it: if it moved in the meantime the
    move is refused (InvalidState), so a reviewer never overwrites a move they did not see.
    The git tags are written inside the transaction, after the swap: a failing tag rolls the
    move back, and a losing concurrent move never reaches git. The audit event is written in
    the same transaction; webhooks (``channel.moved``) are notified once it commits.
    ``reverts`` marks a rollback (see channel_rollback).
    """
    if candidate.project_id != channel.project_id:
        raise InvalidInput(
            f"Candidate {candidate.short_sha} belongs to another project than channel "
            f"{channel.name}."
        )
    number = channel.generation + 1
    history_tag, moving_tag = channel_tag_names(channel=channel, number=number)
    now = timezone.now()
    with transaction.atomic():
        swapped = Channel.objects.filter(
            id=channel.id,
            generation=channel.generation,
            candidate_id=channel.candidate_id,
        ).update(
            candidate=candidate,
            policy_version=policy_version,
            moved_at=now,
            generation=F("generation") + 1,
            updated_at=now,
        )
        if swapped != 1:
            current = Channel.objects.filter(id=channel.id).select_related("candidate").first()
            holder = current.candidate.short_sha if current and current.candidate else "nothing"
            raise InvalidState(
                f"Channel {channel.name} moved while this move was prepared (it now holds "
                f"{holder}); look at its history and try again."
            )
        move = ChannelMove.objects.create(
            channel=channel,
            number=number,
            from_candidate_id=channel.candidate_id,
            to_candidate=candidate,
            from_policy_version_id=channel.policy_version_id,
            to_policy_version=policy_version,
            moved_by=moved_by,
            reason=reason.strip(),
            tag=history_tag,
            reverts=reverts,
        )
        repo = project_repo(project=channel.project)
        # force on the numbered tag too: a move whose transaction rolled back after tagging
        # leaves its number free, and the next move reuses it.
        repo.tag(history_tag, candidate.sha, force=True)
        repo.tag(moving_tag, candidate.sha, force=True)
        _record_move(channel=channel, move=move, moved_by=moved_by)
    channel.refresh_from_db()
    logger.info(
        "channel %s moved to %s (move %d, by %s)",
        channel,
        candidate.short_sha,
        number,
        moved_by.get_username() if moved_by else "system",
    )
    return move


def _holder_dict(candidate_id: object, policy_version_id: object, generation: int) -> dict:
    sha = (
        Candidate.objects.filter(id=candidate_id).values_list("sha", flat=True).first()
        if candidate_id
        else None
    )
    name = (
        PolicyVersion.objects.filter(id=policy_version_id).values_list("name", flat=True).first()
        if policy_version_id
        else None
    )
    return {"candidate": sha, "policy_version": name, "generation": generation}


def _record_move(*, channel: Channel, move: ChannelMove, moved_by: AbstractBaseUser | None) -> None:
    """Audit the move (inside its transaction) and notify webhooks once it commits."""
    before = _holder_dict(move.from_candidate_id, move.from_policy_version_id, move.number - 1)
    after = _holder_dict(move.to_candidate_id, move.to_policy_version_id, move.number)
    rollback = move.reverts_id is not None
    audit_record(
        actor=moved_by,
        project=channel.project,
        action="channel.rolled_back" if rollback else "channel.moved",
        target=channel,
        before=before,
        after={**after, "reason": move.reason, "tag": move.tag},
    )
    payload = {
        "project": channel.project.slug,
        "channel": channel.name,
        "move": move.number,
        "kind": "rollback" if rollback else "move",
        "from": before,
        "to": after,
        "tag": move.tag,
        "reason": move.reason,
        "moved_by": moved_by.get_username() if moved_by else None,
        "moved_at": move.created_at.isoformat(),
    }
    project = channel.project
    transaction.on_commit(lambda: _notify_webhooks(project=project, payload=payload))


def _notify_webhooks(*, project: Project, payload: dict) -> None:
    try:
        webhooks_notify(project=project, event="channel.moved", payload=payload)
    except Exception:  # the move is committed: a notification failure must not undo or hide it
        logger.exception("channel %s: could not notify webhooks of move", payload["channel"])


def channel_rollback_target(*, channel: Channel) -> ChannelMove | None:
    """The move a rollback would undo: the newest move not already undone by a rollback
    (rollbacks themselves are skipped), so repeated rollbacks walk back through the holders
    instead of flipping between the last two. None when there is nothing to go back to."""
    undone: set[object] = set()
    for move in ChannelMove.objects.filter(channel=channel).order_by("-number"):
        if move.reverts_id is not None:
            undone.add(move.reverts_id)
            continue
        if move.id in undone:
            continue
        return move if move.from_candidate_id is not None else None
    return None


def channel_rollback(*, channel: Channel, by: AbstractBaseUser, reason: str = "") -> ChannelMove:
    """Move ``channel`` back to its previous holder (candidate and policy version) in one
    action, recorded as a move (``reverts`` = the move undone) and audited as a rollback.

    Reviewers and admins of the project only. Refused on a channel with no previous holder.
    """
    if not project_user_has_role(project=channel.project, user=by, role=Role.REVIEWER):
        raise PermissionDenied(
            f"Only reviewers and admins of project {channel.project.slug} can roll back a "
            "channel: ask one of them."
        )
    channel = Channel.objects.select_related("project").get(id=channel.id)
    undo = channel_rollback_target(channel=channel)
    if undo is None:
        raise InvalidState(f"Channel {channel.name} has no previous holder to roll back to.")
    # from_candidate is RESTRICT-protected: the previous holder still exists.
    previous = Candidate.objects.get(id=undo.from_candidate_id)
    previous_policy = (
        PolicyVersion.objects.get(id=undo.from_policy_version_id)
        if undo.from_policy_version_id
        else None
    )
    note = reason.strip()
    return channel_move(
        channel=channel,
        candidate=previous,
        policy_version=previous_policy,
        moved_by=by,
        reason=f"rollback of move {undo.number}" + (f": {note}" if note else ""),
        reverts=undo,
    )

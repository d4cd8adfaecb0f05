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

from coevo.errors import InvalidInput, InvalidState
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.reviews.models import Channel, ChannelMove
from harness_store.models import Candidate

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


def channel_move(
    *,
    channel: Channel,
    candidate: Candidate,
    policy_version: PolicyVersion | None,
    moved_by: AbstractBaseUser | None,
    reason: str = "",
) -> ChannelMove:
    """Point ``channel`` at ``candidate`` (and ``policy_version``), record the move and tag it.

    Compare-and-swap on the channel as the caller loaded it: if it moved in the meantime the
    move is refused (InvalidState), so a reviewer never overwrites a move they did not see.
    The git tags are written inside the transaction, after the swap: a failing tag rolls the
    move back, and a losing concurrent move never reaches git.
    """
    from harness_store.services import project_repo

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
        )
        repo = project_repo(project=channel.project)
        # force on the numbered tag too: a move whose transaction rolled back after tagging
        # leaves its number free, and the next move reuses it.
        repo.tag(history_tag, candidate.sha, force=True)
        repo.tag(moving_tag, candidate.sha, force=True)
    channel.refresh_from_db()
    logger.info(
        "channel %s moved to %s (move %d, by %s)",
        channel,
        candidate.short_sha,
        number,
        moved_by.get_username() if moved_by else "system",
    )
    return move

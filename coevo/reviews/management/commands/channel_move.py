"""Move a channel from the command line (operators, tests, and scripts before promotion
requests exist): ``manage.py channel_move --project demo --channel production --candidate SHA``."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from coevo.policies.models import PolicyVersion
from coevo.projects.models import Project
from coevo.reviews.services import channel_get_or_create, channel_move
from harness_store.selectors import candidate_get


class Command(BaseCommand):
    help = "Point a channel (production, staging, …) at a candidate; records history and tags."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="project slug")
        parser.add_argument("--channel", required=True, help="channel name, e.g. production")
        parser.add_argument("--candidate", required=True, help="candidate SHA (or a prefix)")
        parser.add_argument(
            "--policy-version",
            default="",
            help="policy version name (default: keep the channel's current one)",
        )
        parser.add_argument("--reason", default="", help="why (kept in the channel's history)")
        parser.add_argument("--user", default="", help="username recorded as the mover")

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(slug=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']!r}.")
        user = None
        if options["user"]:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"No user {options['user']!r}.")
        try:
            candidate = candidate_get(project=project, sha=options["candidate"])
            channel = channel_get_or_create(project=project, name=options["channel"])
            policy_version = channel.policy_version
            if options["policy_version"]:
                policy_version = PolicyVersion.objects.filter(
                    name=options["policy_version"]
                ).first()
                if policy_version is None:
                    raise CommandError(f"No policy version {options['policy_version']!r}.")
            move = channel_move(
                channel=channel,
                candidate=candidate,
                policy_version=policy_version,
                moved_by=user,
                reason=options["reason"] or "moved with manage.py channel_move",
            )
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"{project.slug}:{channel.name} -> {candidate.sha} (move {move.number}, tag {move.tag})"
        )

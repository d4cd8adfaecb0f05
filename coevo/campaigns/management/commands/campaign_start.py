"""``manage.py campaign_start --project SLUG --seed SHA --suite NAME [--proposals N] [--epochs K]
[--batch-size N]``"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.campaigns.services import campaign_create, campaign_start
from coevo.errors import CoevoError
from coevo.evaluations.ledger import BudgetLimits
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project
from coevo.suites.models import Suite
from harness_store.selectors import candidate_get


class Command(BaseCommand):
    help = "Create and start a config campaign (Optuna over the seed's knobs)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True)
        parser.add_argument("--seed", required=True, help="the seed candidate's SHA (or prefix)")
        parser.add_argument("--suite", required=True, help="suite name (latest version)")
        parser.add_argument("--name", default="")
        parser.add_argument("--proposals", type=int, default=10)
        parser.add_argument(
            "--batch-size",
            type=int,
            default=1,
            help="proposals drafted per round and raced on the search split (1 to 16)",
        )
        parser.add_argument("--epochs", type=int, default=1)
        parser.add_argument("--patience", type=int, default=None)
        parser.add_argument("--target", type=float, default=None)
        parser.add_argument("--max-rollouts", type=int, default=None)
        # Config drafts ask no model, so of the proposer budget only wall time applies here.
        parser.add_argument(
            "--max-proposer-wall-s",
            type=int,
            default=None,
            help="stop once the proposer has spent this many seconds drafting",
        )
        parser.add_argument("--random-seed", type=int, default=0)

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(slug=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']!r}.")
        suite = (
            Suite.objects.filter(project=project, name=options["suite"])
            .order_by("-created_at")
            .first()
        )
        if suite is None:
            raise CommandError(f"Project {project.slug} has no suite {options['suite']!r}.")
        try:
            seed = candidate_get(project=project, sha=options["seed"])
            campaign = campaign_create(
                project=project,
                name=options["name"] or f"config {seed.short_sha}",
                seed_candidate=seed,
                policy_version=policy_version_get_default(),
                suite=suite,
                max_proposals=options["proposals"],
                batch_size=options["batch_size"],
                epochs=options["epochs"],
                patience=options["patience"],
                target_score=options["target"],
                budget_limits=BudgetLimits(
                    rollouts=options["max_rollouts"],
                    proposer_wall_s=options["max_proposer_wall_s"],
                ),
                seed=options["random_seed"],
            )
            campaign_start(campaign=campaign)
        except CoevoError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"campaign {campaign.id} started ({campaign.name})")

"""Register a trainer command (operators only: it runs on the training worker unsandboxed).

    manage.py trainer_register tiny-lora --time-limit 1800 -- \
        python /opt/trainers/sft_lora.py --data {export} --base {base_model} --out {output_dir}
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from coevo.training.trainers import PLACEHOLDERS, trainer_register


class Command(BaseCommand):
    help = "Register (or --replace) a trainer: the argv after -- with {placeholders}."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "argv",
            nargs="+",
            help="the command; placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS),
        )
        parser.add_argument("--time-limit", type=int, default=3600, help="seconds (default 3600)")
        parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
        parser.add_argument("--description", default="")
        parser.add_argument("--replace", action="store_true", help="update an existing trainer")

    def handle(self, *args: Any, **options: Any) -> None:
        env = {}
        for item in options["env"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--env {item!r}: expected NAME=VALUE.")
            env[name] = value
        try:
            trainer = trainer_register(
                name=options["name"],
                command=list(options["argv"]),
                time_limit_s=options["time_limit"],
                env=env,
                description=options["description"],
                replace=options["replace"],
            )
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"trainer {trainer.name}: {' '.join(trainer.command)}")

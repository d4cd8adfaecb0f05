"""Helpers the training tests share: the tiny trainer's command, a trainer and a run made
from it, running a run in a thread (as a training worker would), and waiting on the database."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from django.db import connection

from coevo.training.models import TrainingRun
from coevo.training.services import training_run_create, training_run_execute
from coevo.training.trainers import trainer_register

TRAINER = str(Path(__file__).resolve().parents[1] / "support" / "tiny_trainer.py")


def tiny_command(*extra: str) -> list[str]:
    return [sys.executable, TRAINER, "--data", "{export}", "--base", "{base_model}",
            "--out", "{output_dir}", *extra]  # fmt: skip


def make_trainer(*extra: str, name: str = "tiny-lora", time_limit_s: int = 120, **kwargs):
    return trainer_register(
        name=name, command=tiny_command(*extra), time_limit_s=time_limit_s, **kwargs
    )


def make_run(project, owner, export, base_policy, trainer=None, **kwargs) -> TrainingRun:
    return training_run_create(
        project=project,
        trainer=trainer or make_trainer(),
        export=export,
        parent_policy=base_policy,
        created_by=owner,
        **kwargs,
    )


def execute_in_thread(run_id) -> tuple[threading.Thread, list]:
    result: list = []

    def target() -> None:
        try:
            result.append(training_run_execute(run_id=run_id))
        except BaseException as exc:  # surfaced by the test
            result.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def wait_for(predicate, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)

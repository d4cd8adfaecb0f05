"""Celery tasks are found by autodiscovery and sent by name: every name that is sent, routed
or scheduled must be one a worker registers, and no service imports a task module."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
from django.conf import settings

import coevo
from coevo.celery import app


@pytest.fixture(scope="module")
def registered() -> set[str]:
    app.loader.import_default_modules()  # what a worker does when it starts
    return {name for name in app.tasks if name.startswith("coevo.")}


def _task_name_constants() -> dict[str, str]:
    """Every ``*_TASK`` string constant in coevo's modules (the names services send)."""
    found = {}
    for module in pkgutil.walk_packages(coevo.__path__, "coevo."):
        if ".migrations" in module.name or module.name.startswith(("coevo.cli", "coevo.wsgi")):
            continue
        loaded = importlib.import_module(module.name)
        for attr, value in vars(loaded).items():
            if attr.endswith("_TASK") and isinstance(value, str):
                found[f"{module.name}.{attr}"] = value
    return found


def test_every_name_a_service_sends_is_registered(registered):
    constants = _task_name_constants()
    assert len(set(constants.values())) >= 7  # rollouts, exports, training, webhooks, ...
    assert {where: name for where, name in constants.items() if name not in registered} == {}


def test_every_scheduled_and_routed_task_is_registered(registered):
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled - registered == set()
    assert set(settings.CELERY_TASK_ROUTES) - registered == set()


def test_each_task_lives_in_the_tasks_module_its_name_says(registered):
    for name in registered:
        module, _, function = name.rpartition(".")
        assert re.fullmatch(r"coevo\.\w+\.tasks", module), name
        assert getattr(importlib.import_module(module), function).name == name


def test_beats_housekeeping_goes_to_the_ops_queue_and_campaign_work_to_default():
    # A worker of its own consumes `ops`: on `default`, the watchdog and the endpoint checks
    # waited behind rollouts whenever every rollout thread was busy.
    assert "ops" in {queue.name for queue in settings.CELERY_TASK_QUEUES}
    queues = {
        name: app.amqp.router.route({}, entry["task"])["queue"].name
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
    }
    assert queues.pop("campaigns-advance") == "default"  # it drafts proposals: campaign work
    assert set(queues.values()) == {"ops"}, queues
    assert {"rollouts-watchdog", "policy-endpoints-check", "training-watchdog"} <= set(queues)

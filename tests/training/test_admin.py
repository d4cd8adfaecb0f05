"""Operators define trainers in the Django admin with the same checks as the command, and
every change is audited."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from coevo.audit.models import AuditEvent
from coevo.training.models import Trainer


def _post(client, **overrides):
    data = {
        "name": "sft",
        "description": "",
        "command": json.dumps(["python", "train.py", "--data", "{export}"]),
        "env": json.dumps({"HF_HUB_OFFLINE": "1"}),
        "time_limit_s": 600,
        "enabled": "on",
    }
    data.update(overrides)
    return client.post(reverse("admin:training_trainer_add"), data)


def test_an_operator_adds_a_trainer_and_it_is_audited(client, operator):
    client.force_login(operator)
    response = _post(client)
    assert response.status_code == 302, response.content[:800]
    trainer = Trainer.objects.get(name="sft")
    assert trainer.command == ["python", "train.py", "--data", "{export}"]
    event = AuditEvent.objects.get(action="trainer.registered", target_type="training.Trainer")
    assert event.actor == operator
    # Names of the environment only: values may be credentials.
    assert event.after["env"] == ["HF_HUB_OFFLINE"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("command", json.dumps(["train.py", "{exprot}"]), "unknown placeholder"),
        ("command", json.dumps("train.py {export}"), "list of strings"),
        ("env", json.dumps({"COEVO_EXPORT_PATH": "/x"}), "COEVO_EXPORT_PATH"),
    ],
)
def test_the_admin_refuses_what_the_command_refuses(client, operator, field, value, message):
    client.force_login(operator)
    response = _post(client, **{field: value})
    assert response.status_code == 200  # the form again, with the error
    assert message in response.content.decode()
    assert not Trainer.objects.exists()


def test_a_non_staff_user_cannot_reach_the_trainer_admin(client, django_user_model):
    user = django_user_model.objects.create_user("researcher", password="x")
    client.force_login(user)
    response = client.get(reverse("admin:training_trainer_changelist"))
    assert response.status_code == 302 and "/login" in response["Location"]

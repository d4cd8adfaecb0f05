"""Reading trainers for the campaign start form."""

from __future__ import annotations

import pytest

from coevo.training.models import Trainer
from coevo.training.selectors import trainer_list_enabled
from coevo.training.trainers import trainer_register

pytestmark = pytest.mark.django_db


def test_it_lists_only_enabled_trainers_by_name():
    for name in ("zeta", "alpha", "off"):
        trainer_register(name=name, command=["true"])
    Trainer.objects.filter(name="off").update(enabled=False)
    assert [t.name for t in trainer_list_enabled()] == ["alpha", "zeta"]

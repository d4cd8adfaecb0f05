"""Listens to the evaluation engine: when an evaluation ends, advance the gates waiting on it."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from coevo.evaluations.signals import evaluation_finished
from coevo.gates.services import gate_advance_enqueue, gates_for_evaluation


@receiver(evaluation_finished, dispatch_uid="coevo.gates.advance_on_evaluation_finished")
def advance_gates_on_evaluation_finished(sender: Any, evaluation_id: Any, **kwargs: Any) -> None:
    for gate_id in gates_for_evaluation(evaluation_id=evaluation_id):
        gate_advance_enqueue(gate_id=gate_id)

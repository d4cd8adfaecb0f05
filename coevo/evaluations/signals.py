"""Signals other apps listen to, so the evaluation engine never imports them.

``evaluation_finished`` is sent once per transition into a final state (finished, failed,
cancelled), after the transaction that made the transition commits: a receiver that reads the
evaluation sees the final state. A resumed evaluation that ends again sends it again. Receivers
must be cheap (enqueue work, do not do it) and must not rely on receiving every send: a crash
between the commit and the send loses it, so each listener also has a periodic catch-up job.
"""

from django.dispatch import Signal

# Sent with sender=Evaluation, evaluation_id=<UUID>, state=<EvaluationState value>.
evaluation_finished = Signal()

# Sent with sender=Evaluation, evaluation_id=<UUID> after each step of a paced evaluation (a
# rollout of it ended, a stage moved on), once the step commits: its pacer sends what comes next.
evaluation_progressed = Signal()

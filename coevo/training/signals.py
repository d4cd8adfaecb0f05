"""Signals other apps listen to (campaigns advance when a policy step's training ends).

``training_finished`` is sent once per transition into a final state, after the commit; as
with ``evaluation_finished``, listeners also have a periodic catch-up job.
"""

from django.dispatch import Signal

# Sent with sender=TrainingRun, run_id=<UUID>, state=<TrainingState value>.
training_finished = Signal()

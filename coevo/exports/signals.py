"""Signals other apps listen to (a campaign's policy step waits for its export).

``export_finished`` is sent once per transition into ready or failed, after the commit;
listeners also have a periodic catch-up job (a crash between the two loses the send).
"""

from django.dispatch import Signal

# Sent with sender=TrajectoryExport, export_id=<UUID>, state=<ExportState value>.
export_finished = Signal()

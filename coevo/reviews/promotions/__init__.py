"""Promotion requests: the held-out evaluations, the evidence, comments, two-person approval and
the channel move an approval makes (docs/architecture.md, "The held-out seal"). Import each service from its module:

- ``create``: ``promotion_request_create`` (and the held-out evaluations it starts: the
  candidate's and its reference's, the holder or, for an empty channel, a baseline);
- ``refresh``: ``promotion_evidence_refresh``, beat's ``promotions_refresh_open``;
- ``evidence``: ``evidence_build``, what reviewers decide on;
- ``decide``: ``promotion_comment``, ``promotion_decide``, ``promotion_cancel``;
- ``transitions``: what they share (the audit event, the refresh after commit, the
  compare-and-swap to a final state).

Life of a request:
    evaluating ──(the candidate's and the reference's held-out evaluations final)──> ready ──(approvals reach the project's
    required count)──> approved (the channel moved) ; ready ──(a reject)──> rejected ;
    evaluating|ready ──> cancelled (withdrawn) ; evaluating ──(an evaluation failed)──> failed.
A request whose channel moved meanwhile is *stale*: ``promotion_evidence_refresh`` re-targets
it at the new holder (back to evaluating; approvals already given are withdrawn, they were
given on other evidence; a baseline is dropped, the holder is the reference now), and approval
is refused until then. A baseline is evidence only: approval moves the channel from what it
held (nothing) to the candidate, as without one.

Refresh is triggered by the ``evaluation_finished`` signal (coevo.reviews.receivers) and by
beat (``promotions_refresh_open``), and is idempotent: every transition is a compare-and-swap
from the state it read, so a redelivered task or beat racing the signal does the work once.
Every state change writes an audit event in its own transaction.
"""

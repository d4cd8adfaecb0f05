"""The one domain error type. Views and tasks translate it in one place each."""


class CoevoError(Exception):
    """A failure a user can act on; the message says what was wrong and what to do."""

    code = "error"


class NotFound(CoevoError):
    code = "not_found"


class InvalidInput(CoevoError):
    code = "invalid_input"


class HarnessStoreError(CoevoError):
    code = "harness_store"


class InvalidManifest(InvalidInput):
    code = "invalid_manifest"


class PolicyUnavailable(CoevoError):
    """The policy server could not answer (after retries): an infra_error, never a score."""

    code = "policy_unavailable"


class PolicyRequestRejected(CoevoError):
    """The policy server answered 4xx: the request itself was wrong."""

    code = "policy_request_rejected"


class SandboxUnavailable(CoevoError):
    code = "sandbox_unavailable"


class BudgetExceeded(CoevoError):
    """Reserving the work would overrun a budget: refused before anything is enqueued."""

    code = "budget_exceeded"


class InvalidState(CoevoError):
    """The action does not apply to the object's current state (e.g. resuming a finished run)."""

    code = "invalid_state"

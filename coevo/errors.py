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
    """The policy server could not answer (after retries): an infra_error, never a score.

    ``endpoint_down``: the server itself is failing (no connection, or its health probe failed
    too), so its endpoint is marked unhealthy and gets no requests until a probe answers. False
    when the server is up but could not serve this request now (it stayed busy, or a gateway in
    front of it failed): still an infra_error, but one request's failure must not take the
    endpoint from every other rollout.
    """

    code = "policy_unavailable"
    endpoint_down = True

    def __init__(self, message: str, *, endpoint_down: bool | None = None) -> None:
        super().__init__(message)
        if endpoint_down is not None:
            self.endpoint_down = endpoint_down


class PolicySlotTimeout(PolicyUnavailable):
    """No concurrency slot of the endpoint came free within COEVO_POLICY_SLOT_WAIT_S: its
    capacity, not its server, is what failed (an infra_error; the endpoint stays healthy)."""

    code = "policy_slot_timeout"
    endpoint_down = False


class PolicyRequestRejected(CoevoError):
    """The policy server answered 4xx, or failed on this request alone (PolicyRequestFailed):
    the request itself was wrong."""

    code = "policy_request_rejected"

    def __init__(self, message: str, *, status: int | None = None, reply: str = "") -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, when there was one
        # The server's own answer (its body), without its address: what a program harness
        # that sent the request may be shown.
        self.reply = reply


class PolicyRequestFailed(PolicyRequestRejected):
    """The policy server answered HTTP 500 to this request on every try while its health probe
    says it is up: what fails is the request (its content: a tool_choice the server cannot
    serve, say), not the server. Handled as a refusal (the harness's fault, the endpoint stays
    healthy); ``status`` is the 500."""

    code = "policy_request_failed"


class SandboxUnavailable(CoevoError):
    code = "sandbox_unavailable"


class BudgetExceeded(CoevoError):
    """Reserving the work would overrun a budget: refused before anything is enqueued."""

    code = "budget_exceeded"


class InvalidState(CoevoError):
    """The action does not apply to the object's current state (e.g. resuming a finished run)."""

    code = "invalid_state"


class PermissionDenied(CoevoError):
    """The user is known and may see the object, but their role does not allow the action."""

    code = "permission_denied"


class InvalidBundle(InvalidInput):
    """A git bundle that is not one, is corrupt, or lacks the named commit."""

    code = "invalid_bundle"


class MissingPrerequisites(InvalidBundle):
    """A thin bundle that needs commits the project's repository does not have."""

    code = "missing_prerequisites"

    def __init__(self, message: str, *, missing: list[str]) -> None:
        super().__init__(message)
        self.missing = missing


class UnsafeArchive(InvalidInput):
    """An uploaded archive with entries that would land outside its directory."""

    code = "unsafe_archive"


class PayloadTooLarge(InvalidInput):
    code = "payload_too_large"


class NotAuthenticated(CoevoError):
    """No credentials, or a token that is unknown, revoked or expired."""

    code = "not_authenticated"


class ScopeMissing(PermissionDenied):
    """The token's user may do this, but the token was not given the scope for it."""

    code = "scope_missing"


class AdapterLoadFailed(PolicyUnavailable):
    """A policy version's LoRA adapter could not be loaded on a vLLM endpoint (infra_error)."""

    code = "adapter_load_failed"
    # An adapter that will not load is not a dead server: the endpoint stays healthy.
    endpoint_down = False

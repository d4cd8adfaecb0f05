"""How a rollout ends: its outcome and, when it fails, the kind of failure, as data.

The runtime decides both where the failure happens (each fault below carries its kind), so no
one downstream has to read them back out of the English detail message. The values are what
``Rollout.outcome`` and ``Rollout.error_kind`` store and what breakdowns and metrics are
labelled with: renaming one is a data migration, not a refactor. ``coevo.evaluations.models``
builds its ``Rollout.outcome`` choices from ``RolloutOutcome`` here.
"""

from __future__ import annotations

from enum import StrEnum


class RolloutOutcome(StrEnum):
    PASSED = "passed"
    TASK_FAILURE = "task_failure"
    # The candidate's fault (crashed, timed out, broke the protocol or a limit): scores 0.
    HARNESS_ERROR = "harness_error"
    # The worker's, the sandbox's or the policy server's fault: retried, never a score.
    INFRA_ERROR = "infra_error"


SCORED_OUTCOMES = (RolloutOutcome.PASSED, RolloutOutcome.TASK_FAILURE)


class ErrorKind(StrEnum):
    """A short, stable class of what went wrong, for breakdowns and metrics."""

    NONE = ""  # a scored rollout (passed or task_failure)
    LIMIT = "limit"  # a manifest limit or one of the worker's own bounds
    PROTOCOL = "protocol"  # the harness broke the channel's protocol
    MANIFEST = "manifest"  # harness.toml did not load
    DEPENDENCIES = "dependencies"  # the harness's declared dependencies did not build
    EXCEPTION = "exception"  # the harness raised
    EXITED = "exited"  # the harness process ended before answering
    WORKER_LOST = "worker_lost"  # the worker stopped heartbeating (the watchdog ends it)
    WORKER = "worker"  # the worker itself failed while running the rollout
    SANDBOX = "sandbox"  # the sandbox could not run
    POLICY = "policy"  # the policy server failed or refused the harness's request
    OTHER = "other"  # anything else, e.g. a call with invalid arguments


class HarnessFault(Exception):
    """The candidate's fault: ends the rollout as a harness_error of ``error_kind``."""

    error_kind = ErrorKind.OTHER


class LimitExceeded(HarnessFault):
    error_kind = ErrorKind.LIMIT


class ProtocolViolation(HarnessFault):
    error_kind = ErrorKind.PROTOCOL


class InvalidCall(HarnessFault):
    """A well-formed call with an invalid argument (the message names the call and field)."""

    error_kind = ErrorKind.OTHER


class HarnessRaised(HarnessFault):
    error_kind = ErrorKind.EXCEPTION


class HarnessExited(HarnessFault):
    error_kind = ErrorKind.EXITED


class DependencyBuildFailed(HarnessFault):
    """The harness's declared dependencies did not build (workers/harness_env.py): the message
    carries the resolver's own words (a missing version, a package with no wheel)."""

    error_kind = ErrorKind.DEPENDENCIES

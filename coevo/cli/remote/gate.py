"""``coevo gate``: compare a candidate with a baseline (a channel or a SHA) and decide: exit 0
pass, 1 fail, 2 inconclusive, 3 error (API errors, timeouts and usage errors too: a mistyped
flag in a CI script must not read as "inconclusive")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from coevo.cli.client import ApiError, Client, add_connection_arguments
from coevo.cli.remote.common import (
    EVALUATION_FINAL_STATES,
    EXIT_ERROR,
    EXIT_OK,
    GATE_ERROR_STATES,
    GATE_EXIT_CODES,
    WaitTimeout,
    add_wait_arguments,
    check_wait_arguments,
    exit_usage_errors_with,
    note,
    poll,
    print_created,
    print_error,
    print_json,
    status_url_of,
    without_none,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "gate",
        help="gate a candidate against a channel or another candidate (exit 0/1/2/3)",
        description=(
            "Compare a candidate with a baseline on a suite split and decide: exit 0 pass,"
            " 1 fail, 2 inconclusive, 3 error (API errors, timeouts and usage errors included)."
        ),
    )
    parser.add_argument("--candidate", required=True, metavar="SHA")
    parser.add_argument(
        "--against", required=True, metavar="CHANNEL|SHA", help="e.g. production, or a SHA"
    )
    parser.add_argument("--suite", required=True, metavar="NAME")
    parser.add_argument("--split", choices=["search", "validation"], help="default validation")
    parser.add_argument("--policy-version", metavar="NAME")
    parser.add_argument("--epochs", type=int, metavar="K")
    parser.add_argument("--min-score", type=float, metavar="X", help="the candidate's mean ≥ X")
    parser.add_argument(
        "--max-regression", type=float, metavar="D", help="mean may drop by at most D"
    )
    parser.add_argument("--confidence", type=float, metavar="C", help="default 0.95")
    parser.add_argument(
        "--critical-task",
        action="append",
        dest="critical_tasks",
        metavar="TASK",
        help="a task that must not break (repeat the flag)",
    )
    parser.add_argument(
        "--max-error-rate", type=float, metavar="R", help="harness + infra errors per rollout"
    )
    parser.add_argument("--seed", type=int, help="the rollouts' seed (default 0)")
    parser.add_argument(
        "--budget-usd",
        metavar="USD",
        help="US dollars both evaluations may spend together; refused when their worst case "
        "exceeds them",
    )
    add_wait_arguments(parser)
    add_connection_arguments(parser)
    parser.set_defaults(handler=gate)
    exit_usage_errors_with(parser, EXIT_ERROR)


def gate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    body = without_none(
        candidate=args.candidate,
        against=args.against,
        suite=args.suite,
        split=args.split,
        policy_version=args.policy_version,
        epochs=args.epochs,
        min_score=args.min_score,
        max_regression=args.max_regression,
        confidence=args.confidence,
        critical_tasks=args.critical_tasks,
        max_error_rate=args.max_error_rate,
        seed=args.seed,
        budget_usd=args.budget_usd,
    )
    try:
        check_wait_arguments(args)
        with Client.from_args(args) as client:
            created = client.post(client.project_url("gates/"), json=body)
            status_url = status_url_of(client, created, "gates")
            if not args.wait:
                print_created("gate", created, status_url, as_json=args.json)
                return EXIT_OK
            note(f"gate {created['id']}: {created.get('dashboard_url') or status_url}")
            final = poll(
                client,
                status_url,
                is_final=lambda obj: (
                    bool(obj.get("verdict")) or obj.get("state") in GATE_ERROR_STATES
                ),
                describe=_gate_progress(client),
                args=args,
            )
    except (ApiError, ValueError, WaitTimeout) as exc:
        print_error(exc)
        return EXIT_ERROR
    code = gate_exit_code(final)
    if args.json:
        print_json(final)
    else:
        print(f"verdict: {final.get('verdict') or 'error'}")
        for reason in final.get("reasons") or []:
            print(f"  {_reason_line(reason)}")
        if final.get("dashboard_url"):
            print(final["dashboard_url"])
    return code


def gate_exit_code(gate_object: dict[str, Any]) -> int:
    """0 pass, 1 fail, 2 inconclusive, 3 anything else (an error verdict, or none)."""
    return GATE_EXIT_CODES.get(gate_object.get("verdict") or "", EXIT_ERROR)


def _gate_progress(client: Client) -> Callable[[dict[str, Any]], str]:
    """A describer of a gate's progress: its state, and its evaluations' rollouts while open.

    The gate object carries only its evaluations' ids and states, so an open evaluation's
    progress is read from its own status URL (one GET per open evaluation per poll).
    """

    def describe(gate_object: dict[str, Any]) -> str:
        line = f"gate {gate_object.get('state', '?')}"
        if gate_object.get("verdict"):
            return f"{line}: {gate_object['verdict']}"
        evaluations = gate_object.get("evaluations")
        if not isinstance(evaluations, dict):
            return line
        parts = []
        for side in ("candidate", "baseline"):
            evaluation = evaluations.get(side)
            if not isinstance(evaluation, dict) or not evaluation.get("id"):
                continue
            state = evaluation.get("state", "?")
            if state in EVALUATION_FINAL_STATES:
                parts.append(f"{side} {state}")
                continue
            url = client.project_url(f"evaluations/{quote(str(evaluation['id']), safe='')}/")
            try:
                progress = client.get(url).get("progress") or {}
            except ApiError:
                # Progress is a courtesy: the gate's own status decides, so never fail on it.
                parts.append(f"{side} {state}")
                continue
            parts.append(f"{side} {progress.get('done', 0)}/{progress.get('total', '?')} rollouts")
        return f"{line}: {', '.join(parts)}" if parts else line

    return describe


def _reason_line(reason: Any) -> str:
    if isinstance(reason, dict):
        return (
            f"{reason.get('outcome', '?')}: {reason.get('rule', '?')}: {reason.get('message', '')}"
        )
    return str(reason)

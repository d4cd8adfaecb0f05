"""``coevo evaluate``: start an evaluation of a candidate on a suite split; ``--wait`` follows it
to the end (exit 0 finished, 1 otherwise)."""

from __future__ import annotations

import argparse
from typing import Any

from coevo.cli import gitlocal
from coevo.cli.client import ApiError, Client, add_connection_arguments
from coevo.cli.remote.common import (
    EVALUATION_FINAL_STATES,
    EXIT_FAIL,
    EXIT_OK,
    WaitTimeout,
    add_wait_arguments,
    check_wait_arguments,
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
        "evaluate",
        help="evaluate a candidate on a suite split",
        description="Start an evaluation; with --wait, follow it to the end.",
    )
    parser.add_argument("--candidate", required=True, metavar="SHA")
    parser.add_argument("--suite", required=True, metavar="NAME")
    parser.add_argument(
        "--split", default="validation", choices=["search", "validation"], help="default validation"
    )
    parser.add_argument("--epochs", type=int, metavar="K", help="samples per task")
    parser.add_argument("--task-limit", type=int, metavar="N", help="evaluate the first N tasks")
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--policy-version", metavar="NAME", help="policy version name (default: the configured one)"
    )
    parser.add_argument(
        "--budget-usd",
        metavar="USD",
        help="US dollars it may spend; refused when its worst case (every token the harness's "
        "limits allow, at the endpoints' prices) exceeds them",
    )
    add_wait_arguments(parser)
    add_connection_arguments(parser)
    parser.set_defaults(handler=evaluate)


def evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    body = without_none(
        candidate=args.candidate,
        suite=args.suite,
        split=args.split,
        epochs=args.epochs,
        task_limit=args.task_limit,
        seed=args.seed,
        policy_version=args.policy_version,
        budget_usd=args.budget_usd,
    )
    try:
        check_wait_arguments(args)
        with Client.from_args(args) as client:
            created = client.post(client.project_url("evaluations/"), json=body)
            status_url = status_url_of(client, created, "evaluations")
            if not args.wait:
                print_created("evaluation", created, status_url, as_json=args.json)
                return EXIT_OK
            note(f"evaluation {created['id']}: {created.get('dashboard_url') or status_url}")
            final = poll(
                client,
                status_url,
                is_final=lambda obj: obj.get("state") in EVALUATION_FINAL_STATES,
                describe=_evaluation_progress,
                args=args,
            )
    except (ApiError, gitlocal.GitError, ValueError) as exc:
        print_error(exc)
        return EXIT_FAIL
    except WaitTimeout as exc:
        print_error(exc)
        return EXIT_FAIL
    if args.json:
        print_json(final)
    else:
        print(_evaluation_summary(final))
        if final.get("dashboard_url"):
            print(final["dashboard_url"])
    return EXIT_OK if final.get("state") == "finished" else EXIT_FAIL


def _evaluation_progress(evaluation: dict[str, Any]) -> str:
    progress = evaluation.get("progress") or {}
    line = f"{evaluation.get('state', '?')}: {progress.get('done', 0)}/{progress.get('total', '?')} rollouts"
    mean = (evaluation.get("summary") or {}).get("mean")
    if mean is not None:
        line += f", mean {mean:.2f}"
    failed = progress.get("failed")
    if failed:
        line += f", {failed} failed"
    return line


def _evaluation_summary(evaluation: dict[str, Any]) -> str:
    state = evaluation.get("state", "?")
    parts = [f"evaluation {evaluation.get('id', '?')} {state}"]
    if evaluation.get("stop_reason"):
        parts[0] += f" ({evaluation['stop_reason']})"
    summary = evaluation.get("summary") or {}
    if summary.get("mean") is not None:
        text = f"mean {summary['mean']:.3f}"
        if summary.get("ci_low") is not None and summary.get("ci_high") is not None:
            text += f" [{summary['ci_low']:.3f}, {summary['ci_high']:.3f}]"
        if summary.get("n_tasks") is not None:
            text += f" over {summary['n_tasks']} tasks"
        parts.append(text)
    if evaluation.get("cost_usd") is not None:
        parts.append(f"cost ${evaluation['cost_usd']}")
    errors = {kind: n for kind, n in (evaluation.get("errors") or {}).items() if n}
    if errors:
        parts.append(", ".join(f"{n} {kind.replace('_', ' ')}s" for kind, n in errors.items()))
    return "; ".join(parts)

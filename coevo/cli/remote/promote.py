"""``coevo promote``: request that a candidate replace a channel's holder; prints the request's
dashboard URL, where reviewers read the evidence and decide."""

from __future__ import annotations

import argparse
from typing import Any

from coevo.cli.client import ApiError, Client, add_connection_arguments
from coevo.cli.remote.common import (
    EXIT_FAIL,
    EXIT_OK,
    print_error,
    print_json,
    status_url_of,
    without_none,
)


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "promote",
        help="request that a candidate replace a channel's holder",
        description=(
            "Create a promotion request: coevo evaluates the candidate and the channel's holder"
            " on the suite's held-out split and assembles the evidence; a reviewer other than"
            " you approves or rejects it on the dashboard. Prints the request's URL."
        ),
    )
    parser.add_argument("--candidate", required=True, metavar="SHA")
    parser.add_argument("--channel", default="production", help="default production")
    parser.add_argument(
        "--suite",
        metavar="NAME",
        help="the suite whose held-out split decides (default: the project's only one with held-out tasks)",
    )
    parser.add_argument("--policy-version", metavar="NAME")
    parser.add_argument("--epochs", type=int, metavar="K", help="samples per held-out task")
    parser.add_argument(
        "--baseline",
        metavar="SHA",
        help="for an empty channel: the candidate to compare against (default: the seed of the"
        " candidate's campaign)",
    )
    parser.add_argument("--json", action="store_true", help="print the API object as JSON")
    add_connection_arguments(parser)
    parser.set_defaults(handler=promote)


def promote(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    body = without_none(
        candidate=args.candidate,
        channel=args.channel,
        suite=args.suite,
        policy_version=args.policy_version,
        epochs=args.epochs,
        baseline=args.baseline,
    )
    try:
        with Client.from_args(args) as client:
            created = client.post(client.project_url("promotions/"), json=body)
            status_url = status_url_of(client, created, "promotions")
    except (ApiError, ValueError) as exc:
        print_error(exc)
        return EXIT_FAIL
    if args.json:
        print_json(created)
        return EXIT_OK
    print(f"promotion {created.get('id')} {created.get('state', '')}".rstrip())
    # The dashboard page is where reviewers read the evidence and decide: it goes first.
    print(created.get("dashboard_url") or status_url)
    print(f"status: {status_url}")
    return EXIT_OK

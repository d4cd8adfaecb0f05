"""What the remote commands share: exit codes, polling, and printing.

Output convention: results on stdout (``--json`` prints the API object and nothing else there),
progress, warnings and errors on stderr as ``coevo: <message> (<code>)``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn
from urllib.parse import quote

from coevo.cli import gitlocal
from coevo.cli.client import ApiError, Client

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_INCONCLUSIVE = 2
EXIT_ERROR = 3  # gate only; the other commands use 1 for errors

GATE_EXIT_CODES = {"pass": EXIT_OK, "fail": EXIT_FAIL, "inconclusive": EXIT_INCONCLUSIVE}
EVALUATION_FINAL_STATES = frozenset({"finished", "failed", "cancelled"})
# A gate is final once it has a verdict; these states end it without one (counted as error).
GATE_ERROR_STATES = frozenset({"error", "failed", "cancelled"})

# Indirections so that tests can run the polling loops without waiting.
sleep: Callable[[float], None] = time.sleep
monotonic: Callable[[], float] = time.monotonic


class WaitTimeout(Exception):
    pass


def exit_usage_errors_with(parser: argparse.ArgumentParser, code: int) -> None:
    """Make this subcommand's usage errors exit with ``code`` instead of argparse's 2."""

    def error(message: str) -> NoReturn:
        parser.print_usage(sys.stderr)
        parser.exit(code, f"{parser.prog}: error: {message}\n")

    parse_known_args = parser.parse_known_args

    def parse_known_args_strict(args: Any = None, namespace: Any = None) -> Any:
        # Unknown flags would otherwise be reported by the top-level parser, exiting 2.
        namespace, extras = parse_known_args(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = parse_known_args_strict  # type: ignore[method-assign]


def add_wait_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true", help="follow it until it is final")
    parser.add_argument(
        "--interval", type=float, default=5.0, metavar="SECONDS", help="poll every (default 5)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="give up waiting after (default 3600; the work keeps running on the server)",
    )
    parser.add_argument("--json", action="store_true", help="print the API object as JSON")


def check_wait_arguments(args: argparse.Namespace) -> None:
    if args.interval <= 0 or args.timeout <= 0:
        raise ValueError("--interval and --timeout must be positive")


def poll(
    client: Client,
    url: str,
    *,
    is_final: Callable[[dict[str, Any]], bool],
    describe: Callable[[dict[str, Any]], str],
    args: argparse.Namespace,
) -> dict[str, Any]:
    deadline = monotonic() + args.timeout
    last_line = None
    while True:
        current = client.get(url)
        line = describe(current)
        if line != last_line:
            note(line)
            last_line = line
        if is_final(current):
            return current
        if monotonic() >= deadline:
            raise WaitTimeout(
                f"still {current.get('state', 'running')} after {args.timeout:g}s: {url}"
            )
        sleep(min(args.interval, max(deadline - monotonic(), 0.0)))


def status_url_of(client: Client, created: dict[str, Any], collection: str) -> str:
    if created.get("status_url"):
        return client.absolute(created["status_url"])
    return client.project_url(f"{collection}/{quote(str(created['id']), safe='')}/")


def print_created(kind: str, created: dict[str, Any], status_url: str, *, as_json: bool) -> None:
    if as_json:
        print_json(created)
        return
    print(f"{kind} {created.get('id')} {created.get('state', '')}".rstrip())
    print(f"status: {status_url}")
    if created.get("dashboard_url"):
        print(f"dashboard: {created['dashboard_url']}")


def print_error(exc: Exception) -> None:
    if isinstance(exc, ApiError):
        print(exc.render(), file=sys.stderr)
        missing = exc.details.get("missing")
        if missing:
            print(f"coevo: missing: {', '.join(map(str, missing))}", file=sys.stderr)
    elif isinstance(exc, gitlocal.GitError):
        print(f"coevo: {exc} (git)", file=sys.stderr)
    elif isinstance(exc, WaitTimeout):
        print(f"coevo: {exc} (timeout)", file=sys.stderr)
    else:
        print(f"coevo: {exc} (invalid_input)", file=sys.stderr)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def note(message: str) -> None:
    print(f"coevo: {message}", file=sys.stderr, flush=True)


def without_none(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"

"""``coevo submit``, ``coevo evaluate`` and ``coevo gate``: the CI side of coevo.

They talk to a coevo server's REST API (docs/api.md) through :mod:`coevo.cli.client` and run
the user's ``git`` through :mod:`coevo.cli.gitlocal`; nothing here imports Django, so a CI
runner needs only the HTTP client.

Output: results on stdout (``--json`` prints the API object and nothing else there), progress,
warnings and errors on stderr as ``coevo: <message> (<code>)``.

Exit codes (docs/ci.md):

- ``submit``, ``evaluate``: 0 done, 1 error (or, for ``evaluate --wait``, a failed or
  cancelled evaluation, or ``--timeout``); argparse's usage errors stay 2.
- ``gate``: 0 pass, 1 fail, 2 inconclusive, 3 error (an API or connection error, a gate that
  ended in error, ``--timeout``, and usage errors too: a mistyped flag in a CI script must not
  read as "inconclusive"). Without ``--wait``: 0 once the gate is created, 3 on error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

from coevo.cli import gitlocal
from coevo.cli.client import ApiError, Client, add_connection_arguments

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


def register(commands: Any) -> None:
    _register_submit(commands)
    _register_evaluate(commands)
    _register_gate(commands)


# -- submit ---------------------------------------------------------------------------------


def _register_submit(commands: Any) -> None:
    parser = commands.add_parser(
        "submit",
        help="import a commit of a local harness repository as a candidate",
        description=(
            "Bundle a commit of the git repository at PATH (only the commits the server lacks)"
            " and import it as a candidate. Prints the SHA and the candidate's dashboard URL."
        ),
    )
    parser.add_argument("path", nargs="?", default=".", help="repository (default: .)")
    parser.add_argument("--ref", default="HEAD", help="the commit to submit (default: HEAD)")
    parser.add_argument("--json", action="store_true", help="print the candidate as JSON")
    add_connection_arguments(parser)
    parser.set_defaults(handler=submit)


def submit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        with Client.from_args(args) as client:
            candidate = candidate_submit(client=client, path=Path(args.path), ref=args.ref)
    except (ApiError, gitlocal.GitError) as exc:
        _print_error(exc)
        return EXIT_FAIL
    if args.json:
        _print_json(candidate)
    else:
        print(candidate["sha"])
        if candidate.get("dashboard_url"):
            print(candidate["dashboard_url"])
    return EXIT_OK


def candidate_submit(*, client: Client, path: Path, ref: str) -> dict[str, Any]:
    """Import ``ref`` of the repository at ``path``; return the API's candidate object."""
    repo = gitlocal.repo_toplevel(path=path)
    sha = gitlocal.commit_resolve(repo=repo, ref=ref)
    if gitlocal.worktree_is_dirty(repo=repo):
        _note(
            "warning: the work tree has uncommitted changes; they are not submitted"
            f" (the bundle holds commit {sha[:12]}, not the work tree)"
        )
    ancestors = gitlocal.commit_ancestors(repo=repo, sha=sha)
    known_reply = client.post(client.project_url("candidates/known/"), json={"shas": ancestors})
    # Only what we asked about: anything else could not be excluded from a bundle anyway.
    asked = set(ancestors)
    known = [s for s in known_reply.get("known") or [] if s in asked]
    if sha in known:
        _note(f"{sha[:12]} is already a candidate; nothing to upload")
        return client.get(client.project_url(f"candidates/{sha}/"))
    if gitlocal.repo_is_shallow(repo=repo):
        # A shallow clone's bundle would name parents it does not contain.
        raise gitlocal.GitError(
            f"{repo} is a shallow clone, so its commits' history cannot be bundled; fetch it"
            " first (`git fetch --unshallow`, or `fetch-depth: 0` in actions/checkout)"
        )
    try:
        return _upload(client=client, repo=repo, sha=sha, exclude=known)
    except ApiError as exc:
        if exc.code != "missing_prerequisites" or not known:
            raise
        # The server forgot (or never had) a commit it reported known: send everything once.
        _note("the server lacks commits it reported known; retrying with the full history")
        return _upload(client=client, repo=repo, sha=sha, exclude=[])


def _upload(*, client: Client, repo: Path, sha: str, exclude: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="coevo-submit-") as tmp:
        bundle = gitlocal.bundle_create(
            repo=repo, sha=sha, exclude=exclude, output=Path(tmp) / f"{sha}.bundle"
        )
        size = bundle.stat().st_size
        _note(
            f"uploading {sha[:12]} ({_human_size(size)}"
            + (f", excluding {len(exclude)} commits the server has)" if exclude else ")")
        )

        def files() -> dict[str, Any]:
            return {"bundle": (bundle.name, bundle.open("rb"), "application/octet-stream")}

        return client.post(
            client.project_url("candidates/import-bundle/"), data={"ref": sha}, files=files
        )


# -- evaluate -------------------------------------------------------------------------------


def _register_evaluate(commands: Any) -> None:
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
    _add_wait_arguments(parser)
    add_connection_arguments(parser)
    parser.set_defaults(handler=evaluate)


def evaluate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    body = _without_none(
        candidate=args.candidate,
        suite=args.suite,
        split=args.split,
        epochs=args.epochs,
        task_limit=args.task_limit,
        seed=args.seed,
        policy_version=args.policy_version,
    )
    try:
        _check_wait_arguments(args)
        with Client.from_args(args) as client:
            created = client.post(client.project_url("evaluations/"), json=body)
            status_url = _status_url(client, created, "evaluations")
            if not args.wait:
                _print_created("evaluation", created, status_url, as_json=args.json)
                return EXIT_OK
            _note(f"evaluation {created['id']}: {created.get('dashboard_url') or status_url}")
            final = _poll(
                client,
                status_url,
                is_final=lambda obj: obj.get("state") in EVALUATION_FINAL_STATES,
                describe=_evaluation_progress,
                args=args,
            )
    except (ApiError, gitlocal.GitError, ValueError) as exc:
        _print_error(exc)
        return EXIT_FAIL
    except WaitTimeout as exc:
        _print_error(exc)
        return EXIT_FAIL
    if args.json:
        _print_json(final)
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
    errors = {kind: n for kind, n in (evaluation.get("errors") or {}).items() if n}
    if errors:
        parts.append(", ".join(f"{n} {kind.replace('_', ' ')}s" for kind, n in errors.items()))
    return "; ".join(parts)


# -- gate -----------------------------------------------------------------------------------


def _register_gate(commands: Any) -> None:
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
    _add_wait_arguments(parser)
    add_connection_arguments(parser)
    parser.set_defaults(handler=gate)
    _exit_usage_errors_with(parser, EXIT_ERROR)


def gate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    body = _without_none(
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
    )
    try:
        _check_wait_arguments(args)
        with Client.from_args(args) as client:
            created = client.post(client.project_url("gates/"), json=body)
            status_url = _status_url(client, created, "gates")
            if not args.wait:
                _print_created("gate", created, status_url, as_json=args.json)
                return EXIT_OK
            _note(f"gate {created['id']}: {created.get('dashboard_url') or status_url}")
            final = _poll(
                client,
                status_url,
                is_final=lambda obj: (
                    bool(obj.get("verdict")) or obj.get("state") in GATE_ERROR_STATES
                ),
                describe=_gate_progress(client),
                args=args,
            )
    except (ApiError, ValueError, WaitTimeout) as exc:
        _print_error(exc)
        return EXIT_ERROR
    code = gate_exit_code(final)
    if args.json:
        _print_json(final)
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


def _exit_usage_errors_with(parser: argparse.ArgumentParser, code: int) -> None:
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


# -- shared ---------------------------------------------------------------------------------


def _add_wait_arguments(parser: argparse.ArgumentParser) -> None:
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


def _check_wait_arguments(args: argparse.Namespace) -> None:
    if args.interval <= 0 or args.timeout <= 0:
        raise ValueError("--interval and --timeout must be positive")


def _poll(
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
            _note(line)
            last_line = line
        if is_final(current):
            return current
        if monotonic() >= deadline:
            raise WaitTimeout(
                f"still {current.get('state', 'running')} after {args.timeout:g}s: {url}"
            )
        sleep(min(args.interval, max(deadline - monotonic(), 0.0)))


def _status_url(client: Client, created: dict[str, Any], collection: str) -> str:
    if created.get("status_url"):
        return client.absolute(created["status_url"])
    return client.project_url(f"{collection}/{quote(str(created['id']), safe='')}/")


def _print_created(kind: str, created: dict[str, Any], status_url: str, *, as_json: bool) -> None:
    if as_json:
        _print_json(created)
        return
    print(f"{kind} {created.get('id')} {created.get('state', '')}".rstrip())
    print(f"status: {status_url}")
    if created.get("dashboard_url"):
        print(f"dashboard: {created['dashboard_url']}")


def _print_error(exc: Exception) -> None:
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


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _note(message: str) -> None:
    print(f"coevo: {message}", file=sys.stderr, flush=True)


def _without_none(**fields: Any) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"

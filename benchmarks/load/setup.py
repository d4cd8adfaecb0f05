"""Targets for the load benchmark (issue 21, item 2), as JSON for benchmarks/load/locustfile.py.

Finds in one project (a database of the scale fill, ``python -m benchmarks.scale``, or any other) what each measured
page and API list reads: the campaign with the most proposals, the largest finished evaluation
and a second one of the same suite and split (the comparison), the matrix with the most cells,
the rollout with the most trace steps (among the 20 with the most model calls: counting every
rollout's steps would read the whole trace table), a candidate SHA prefix to search for, audit
filters that match. Then a logged-in session for a project member (admin, else reviewer)
through Django's own login, a read-only API token for them
(coevo.accounts.services.token_create), and a session for a staff user ``<slug>-load-staff``
(made here, without a password) for the global audit log.

Where the project lacks a measured size it is added, and said so: a rollout's trace is extended
to ``--steps`` steps through the worker's TraceWriter (game-like steps of about 1 KB), and when
no two non-held-out evaluations of one suite split both hold ``--rollouts`` rollouts, the largest
is copied (rollouts only, about one task in seven flipped) onto another candidate, finished.
Run it against a copy of a scale database, never one another benchmark reads.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/coevo_load_medium \\
      COEVO_HARNESS_STORE_DIR=/work/main/var/harness-store \\
      .venv/bin/python benchmarks/load/setup.py --project medium --out var/load/targets.json

The session is signed with the server's secret key (COEVO_SECRET_KEY, or the one kept under
COEVO_HOME): run this with the environment the server gets (benchmarks/load/run.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from workers.trace import Step, StepKind  # noqa: E402  (the worker's own step, as TraceWriter takes it)

TOKEN_NAME = "load benchmark"


def say(message: str) -> None:
    print(f"[load setup] {message}", flush=True)


def game_step(i: int) -> Step:
    """A game's step: a model call (~1 KB prompt) or the environment's answer (~1 KB)."""
    words = ("north", "lamp", "door", "key", "take", "open", "west", "chest", "look", "map")
    text = " ".join(words[(i * 7 + j) % len(words)] for j in range(180))[:1000]
    if i % 2 == 0:
        payload = {
            "api": "completions",
            "model": "gemma-3-270m",
            "prompt": f"[move {i // 2}] {text}",
            "sampling": {"max_tokens": 64, "temperature": 0.0},
            "completion": f"{words[i % 10]} {words[(i + 3) % 10]}",
            "finish_reason": "stop",
        }
        return Step(StepKind.MODEL_CALL, payload, 250, 4, 80 + i % 400)
    payload = {"index": i // 2, "action": words[i % 10], "observation": text, "reward": 0.0}
    return Step(StepKind.ENV_STEP, payload, latency_ms=1 + i % 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", required=True, help="the project's slug")
    parser.add_argument("--out", type=Path, default=REPO / "var" / "load" / "targets.json")
    parser.add_argument("--steps", type=int, default=5_000, help="trace steps wanted (5,000)")
    parser.add_argument("--rollouts", type=int, default=5_000, help="comparison size (5,000)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to the PostgreSQL database to measure.")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    import django

    django.setup()
    targets = find_targets(args.project, steps=args.steps, rollouts=args.rollouts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(targets, indent=2) + "\n")
    args.out.chmod(0o600)  # it holds a session and a token
    say(f"{len(targets['requests'])} targets written to {args.out}")


def find_targets(slug: str, *, steps: int, rollouts: int) -> dict[str, Any]:
    from django.conf import settings
    from django.db.models import Count

    from coevo.audit.models import AuditEvent
    from coevo.campaigns.models import Campaign
    from coevo.evaluations.models import Evaluation, EvaluationState, Rollout, TraceStep
    from coevo.matrices.models import CompatibilityMatrix
    from coevo.projects.models import Membership, Project, Role
    from coevo.suites.models import Split
    from harness_store.selectors import candidate_page

    project = Project.objects.get(slug=slug)
    p = f"/p/{slug}"
    api = f"/api/v1/projects/{slug}"
    requests: dict[str, dict[str, str]] = {}
    notes: list[str] = []

    def add(key: str, name: str, path: str, auth: str = "member") -> None:
        requests[key] = {"name": name, "path": path, "auth": auth}

    repo = Path(settings.COEVO_HARNESS_STORE_DIR) / f"{project.id}.git"
    if not repo.is_dir():
        sys.exit(
            f"No repository {repo}: point COEVO_HARNESS_STORE_DIR at the harness store the "
            "database was filled with (candidate pages read their files from it)."
        )

    # --- the project page, an older page of candidates, a candidate by SHA prefix ----------
    candidates = project.candidates.count()
    add("project", f"page: project ({candidates:,} candidates)", f"{p}/")
    older = candidate_page(project=project, limit=50).next_cursor
    if older:
        add("candidates_older", "page: project, older candidates", f"{p}/?cursor={quote(older)}")

    # --- evaluations: the largest, and a second of its suite split for the comparison ------
    finished = (
        Evaluation.objects.filter(project=project, state=EvaluationState.FINISHED)
        .exclude(split=Split.HELDOUT)  # sealed: neither page shows held-out evaluations
        .annotate(size=Count("rollouts"))
        .order_by("-size", "id")
    )
    largest = finished.first()
    if largest is None:
        sys.exit(f"Project {slug} has no finished evaluation.")
    pair = finished.filter(suite=largest.suite, split=largest.split).exclude(pk=largest.pk).first()
    if pair is None or pair.size < min(rollouts, largest.size):
        second = copy_evaluation(largest)
        second_size = second.rollouts.count()
        notes.append(
            f"added evaluation {second.id}: a copy of {largest.id}'s {second_size:,} rollouts on "
            f"candidate {second.candidate.sha[:12]} (the next largest of its suite split held "
            f"{pair.size if pair else 0:,})"
        )
    else:
        second, second_size = pair, pair.size
    add("evaluation", f"page: evaluation ({largest.size:,} rollouts)", f"{p}/e/{largest.id}/")
    query = urlencode({"reference": second.id, "candidate": largest.id})
    add(
        "comparison",
        f"page: comparison ({second_size:,} vs {largest.size:,} rollouts)",
        f"{p}/compare/?{query}",
    )

    # --- the candidate search: the largest evaluation's candidate by an 8-digit prefix -----
    sha = largest.candidate.sha
    check = subprocess.run(
        ["git", f"--git-dir={repo}", "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True
    )
    if check.returncode:
        sys.exit(f"Commit {sha} is not in {repo}: is it this database's harness store?")
    add("candidate_search", "page: candidate by SHA prefix (search)", f"{p}/c/{sha[:8]}/")

    # --- the campaign with the most proposals ----------------------------------------------
    campaign = (
        Campaign.objects.filter(project=project)
        .annotate(size=Count("proposals"))
        .order_by("-size", "id")
        .first()
    )
    if campaign is not None:
        add(
            "campaign",
            f"page: campaign ({campaign.size:,} proposals)",
            f"{p}/campaigns/{campaign.id}/",
        )
    else:
        notes.append("no campaign: its page and proposal list are not measured")

    # --- the matrix with the most cells ------------------------------------------------------
    matrix = (
        CompatibilityMatrix.objects.filter(project=project)
        .annotate(size=Count("cells"))
        .order_by("-size", "id")
        .first()
    )
    if matrix is not None:
        add("matrix", f"page: matrix ({matrix.size} cells)", f"{p}/matrices/{matrix.id}/")
    else:
        notes.append("no matrix: its page is not measured")

    # --- the trace: the rollout with the most steps, extended to ``steps`` if shorter ------
    # Counting every rollout's steps is a scan of the whole trace table (10 million rows at
    # full scale): the steps of the 20 rollouts with the most model calls are counted instead.
    busiest = (
        Rollout.objects.filter(evaluation__project=project)
        .exclude(evaluation__split=Split.HELDOUT)
        .order_by("-model_calls", "id")
        .values_list("id", flat=True)[:20]
    )
    longest = (
        TraceStep.objects.filter(rollout_id__in=list(busiest))
        .values("rollout_id")
        .annotate(n=Count("id"))
        .order_by("-n", "rollout_id")
        .first()
    )
    if longest is None:
        sys.exit(f"Project {slug} has no trace steps.")
    rollout = Rollout.objects.get(id=longest["rollout_id"])
    trace_steps = longest["n"]
    if trace_steps < steps:
        added = extend_trace(rollout, steps - trace_steps)
        notes.append(
            f"added {added:,} game-like steps (~1 KB each) to rollout {rollout.id}'s trace "
            f"(it had {trace_steps:,}, the most in the project)"
        )
        trace_steps += added
    add("trace", f"page: trace ({trace_steps:,} steps)", f"{p}/r/{rollout.id}/")

    # --- audit logs: the project's and the global one, each with a filter that matches -----
    common = (
        AuditEvent.objects.filter(project=project)
        .values("actor_label", "action")
        .annotate(n=Count("id"))
        .order_by("-n", "action")
        .first()
    )
    if common is not None:
        query = urlencode(
            {"actor": common["actor_label"], "action": common["action"].split(".")[0]}
        )
        add("audit", "page: audit log, project (actor + action)", f"{p}/audit/?{query}")
    events = AuditEvent.objects.count()
    # A rare actor: the filter matches a few events among all of them (the index is no help).
    rare = (
        AuditEvent.objects.values("actor_label")
        .annotate(n=Count("id"))
        .order_by("n", "actor_label")
        .first()
    )
    if rare is not None:
        query = urlencode({"actor": rare["actor_label"], "since": "2000-01-01"})
        add(
            "global_audit",
            f"page: audit log, global ({events:,} events; rare actor)",
            f"/audit/?{query}",
            auth="staff",
        )
        # The most common action: its filter matches many events (the kind people look for).
        action = AuditEvent.objects.values("action").annotate(n=Count("id")).order_by("-n").first()
        assert action is not None
        add(
            "global_audit_action",
            "page: audit log, global (common action)",
            f"/audit/?{urlencode({'action': action['action'].split('.')[0]})}",
            auth="staff",
        )

    # --- every list endpoint of the API -------------------------------------------------------
    add("api_projects", "api: projects", "/api/v1/projects/", "token")
    add("api_candidates", "api: candidates", f"{api}/candidates/", "token")
    add("api_suites", "api: suites", f"{api}/suites/", "token")
    add("api_evaluations", "api: evaluations", f"{api}/evaluations/", "token")
    add(
        "api_evaluations_search",
        "api: evaluations?candidate=<prefix> (search)",
        f"{api}/evaluations/?candidate={sha[:8]}",
        "token",
    )
    add(
        "api_evaluation_tasks",
        f"api: evaluation tasks ({largest.size:,} rollouts)",
        f"{api}/evaluations/{largest.id}/tasks/",
        "token",
    )
    add("api_campaigns", "api: campaigns", f"{api}/campaigns/", "token")
    if campaign is not None:
        add(
            "api_proposals",
            f"api: campaign proposals ({campaign.size:,})",
            f"{api}/campaigns/{campaign.id}/proposals/",
            "token",
        )
    add("api_channels", "api: channels", f"{api}/channels/", "token")
    add("api_matrices", "api: matrices", f"{api}/matrices/", "token")
    add("api_gates", "api: gates", f"{api}/gates/", "token")
    add("api_exports", "api: exports", f"{api}/exports/", "token")
    add("api_training_runs", "api: training runs", f"{api}/training-runs/", "token")
    add("api_trainers", "api: trainers", "/api/v1/trainers/", "token")
    add("api_promotions", "api: promotions", f"{api}/promotions/", "token")

    # --- who: a member's session and token, a staff session ------------------------------
    member = (
        Membership.objects.filter(project=project, role__in=[Role.ADMIN, Role.REVIEWER])
        .select_related("user")
        .order_by("role", "user__username")  # "admin" sorts before "reviewer"
        .first()
    )
    if member is None:
        sys.exit(f"Project {slug} has no admin or reviewer member.")
    user = member.user
    staff = staff_user(f"{slug}-load-staff")
    for note in notes:
        say(note)
    say(f"requests as {user.username} ({member.role}); global audit log as {staff.username}")
    return {
        "project": slug,
        "member": user.username,
        "staff": staff.username,
        "cookie_name": settings.SESSION_COOKIE_NAME,
        "sessions": {"member": session_for(user), "staff": session_for(staff)},
        "token": api_token_for(user),
        "notes": notes,
        "requests": requests,
    }


def copy_evaluation(source: Any) -> Any:
    """A finished copy of ``source`` (its rollouts, no traces) on another candidate, about one
    task in seven flipped between passed and failed, so that the comparison has changes."""
    from django.db import transaction

    from coevo.evaluations.models import Evaluation, Rollout, RolloutOutcome
    from harness_store.models import Candidate

    other = (
        Candidate.objects.filter(project_id=source.project_id)
        .exclude(pk=source.candidate_id)
        .order_by("-authored_at", "id")
        .first()
    )
    if other is None:
        sys.exit("The project has a single candidate: nothing to compare.")
    flip = {
        RolloutOutcome.PASSED: RolloutOutcome.TASK_FAILURE,
        RolloutOutcome.TASK_FAILURE: RolloutOutcome.PASSED,
    }
    with transaction.atomic():
        copy = Evaluation.objects.get(pk=source.pk)
        copy.pk = uuid.uuid4()
        copy._state.adding = True
        copy.candidate = other
        copy.reference = None
        copy.save(force_insert=True)
        rows = []
        for rollout in Rollout.objects.filter(evaluation=source).iterator(chunk_size=2000):
            rollout.pk = uuid.uuid4()
            rollout._state.adding = True
            rollout.evaluation = copy
            rollout.reused_from = None
            if rollout.task_id % 7 == 0 and rollout.outcome in flip:
                rollout.outcome = flip[rollout.outcome]
                rollout.score = 1.0 if rollout.outcome == RolloutOutcome.PASSED else 0.0
            rows.append(rollout)
        Rollout.objects.bulk_create(rows, batch_size=1000)
    return copy


def extend_trace(rollout: Any, count: int) -> int:
    """Append ``count`` steps to the rollout's last attempt, as the worker writes them."""
    from django.db import transaction
    from django.db.models import Max

    from coevo.evaluations.models import TraceStep
    from coevo.evaluations.traces import TraceWriter

    last = TraceStep.objects.filter(rollout=rollout).aggregate(a=Max("attempt"))["a"] or 0
    start = TraceStep.objects.filter(rollout=rollout, attempt=last).aggregate(i=Max("index"))["i"]
    with (
        transaction.atomic(),
        # A fill, not a live attempt: batched, model calls included.
        TraceWriter(
            rollout_id=rollout.id,
            attempt=last,
            start_index=(start or 0) + 1,
            write_at_once=frozenset(),
        ) as writer,
    ):
        for i in range(count):
            writer.add(game_step(i))
    return writer.written


def staff_user(username: str) -> Any:
    from django.contrib.auth import get_user_model

    user, created = get_user_model().objects.get_or_create(
        username=username, defaults={"is_staff": True}
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
        say(f"created staff user {username} (no password) for the global audit log")
    elif not user.is_staff:
        sys.exit(f"User {username} exists and is not staff: not touching it.")
    return user


def session_for(user: Any) -> str:
    """A session key, logged in through django.contrib.auth.login as a login form does."""
    from django.conf import settings
    from django.contrib.auth import login
    from django.http import HttpRequest
    from django.utils.module_loading import import_string

    request = HttpRequest()
    request.session = import_string(f"{settings.SESSION_ENGINE}.SessionStore")()
    login(request, user, backend=settings.AUTHENTICATION_BACKENDS[0])
    request.session.save()
    return str(request.session.session_key)


def api_token_for(user: Any) -> str:
    """A read-only personal token for ``user``, valid two days; earlier ones revoked."""
    from django.utils import timezone

    from coevo.accounts.models import ApiToken, TokenKind
    from coevo.accounts.services import token_create, token_revoke

    for old in ApiToken.objects.filter(user=user, name=TOKEN_NAME, revoked_at__isnull=True):
        token_revoke(token=old, actor=user)
    _token, raw = token_create(
        user=user,
        name=TOKEN_NAME,
        kind=TokenKind.PERSONAL,
        scopes=["read"],
        created_by=user,
        expires_at=timezone.now() + timedelta(days=2),
    )
    return raw


if __name__ == "__main__":
    main()

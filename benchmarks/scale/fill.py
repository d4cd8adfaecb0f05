"""``scale_fill``: a busy team's year in one project, written through bulk paths.

Order (each step its own transaction, the bulk ones one per chunk): the project with its
members, suite, policies and channels (through the app's own services, so their audit events
are the app's); every candidate commit through one ``git fast-import`` and their rows; each
campaign's proposals with their search and validation evaluations, rollouts and traces; the
main line's full evaluations; the harness × policy matrix; the promotion requests with their
sealed held-out evaluations, approvals, channel moves and evidence (the app's evidence_build);
the audit events. An interrupted run leaves consistent rows (every chunk is whole: a proposal
never lacks its evaluations, a rollout never lacks its steps), with the campaign it stopped in
still ``running``; it does not resume: run again with ``--replace``.
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TextIO

from django.contrib.auth import get_user_model
from django.db import connection, transaction

from benchmarks.scale.content import (
    patch_text,
    seed_files,
    sentence,
    step_pool,
    suite_rows,
    variant_files,
)
from benchmarks.scale.copy import Progress, TableCopy
from benchmarks.scale.plan import SCALES, YEAR, YEAR_START, ScalePlan
from benchmarks.scale.rows import RowWriter, TaskRef
from coevo.accounts.models import ApiToken
from coevo.audit.models import AuditEvent
from coevo.campaigns.models import Campaign, Proposal
from coevo.errors import InvalidInput, InvalidState
from coevo.evaluations import trace_partitions
from coevo.evaluations.models import (
    Budget,
    Evaluation,
    EvaluationStage,
    LedgerEntry,
    Rollout,
    TraceStep,
)
from coevo.matrices.models import CompatibilityMatrix, MatrixCell
from coevo.policies.models import EndpointKind, PolicyEndpoint, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.projects.models import Membership, Project, Role
from coevo.projects.services import membership_set
from coevo.reviews.models import Approval, Channel, ChannelMove, PromotionRequest
from coevo.reviews.promotions.evidence import evidence_build
from coevo.reviews.services import channel_get_or_create, channel_tag_names
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.models import Suite, Task
from coevo.suites.services import suite_import_jsonl
from harness_store.models import Candidate
from harness_store.repo_fast_import import BulkCommit
from harness_store.services import project_repo

MEMBERS = (
    ("owner", Role.ADMIN), ("reviewer-1", Role.REVIEWER), ("reviewer-2", Role.REVIEWER),
    ("researcher-1", Role.RESEARCHER), ("researcher-2", Role.RESEARCHER),
    ("researcher-3", Role.RESEARCHER), ("viewer-1", Role.VIEWER), ("ci", Role.RESEARCHER),
)  # fmt: skip
# What marks a project as scale data: --replace deletes only such a project. It still names
# the fill's old entry point (a manage.py command until it moved out of coevo): projects filled
# before the move carry this text, and --replace must go on recognising them.
SCALE_DESCRIPTION = "Scale data written by manage.py scale_fill."
PROPOSER_KINDS = (("llm-patch", 0.5), ("config", 0.3), ("random", 0.1), ("merge", 0.1))


@dataclass
class Node:
    """One candidate commit as planned, before git gives it a SHA."""

    position: int
    parents: tuple[int, ...]
    files: dict[str, bytes]
    message: str
    author: str
    at: datetime
    origin: str
    skill: float
    sha: str = ""
    tree_sha: str = ""
    id: uuid.UUID = field(default_factory=uuid.uuid4)


@dataclass
class FillReport:
    counts: dict[str, int]
    seconds: dict[str, float]
    database_bytes: int

    def describe(self) -> str:
        lines = [f"  {name}: {count:,}" for name, count in self.counts.items()]
        lines += [f"  {name}: {secs:.1f} s" for name, secs in self.seconds.items()]
        lines.append(f"  database size: {self.database_bytes / 2**20:,.0f} MiB")
        return "\n".join(lines)


def scale_fill(
    *, slug: str, scale: str, seed: int = 0, replace: bool = False, out: TextIO
) -> FillReport:
    """Fill project ``slug`` at ``scale`` (a name in plan.SCALES) from ``seed``."""
    if connection.vendor != "postgresql":
        raise InvalidState(
            f"scale_fill writes with PostgreSQL's COPY; this database is {connection.vendor}. "
            "Point DATABASE_URL at a PostgreSQL database (e.g. "
            "postgres://postgres@127.0.0.1:5432/coevo_scale) and run it again."
        )
    if scale not in SCALES:
        raise InvalidInput(f"No scale {scale!r}: choose one of {', '.join(SCALES)}.")
    existing = Project.objects.filter(slug=slug).first()
    if existing is not None and not replace:
        raise InvalidState(
            f"Project {slug!r} already exists. Pass --replace to delete it (and all its rows) "
            "and fill it again, or choose another --project."
        )
    plan = SCALES[scale]
    seconds: dict[str, float] = {}
    started = time.monotonic()
    if existing is not None:
        out.write(f"deleting project {slug!r} …\n")
        project_delete_bulk(project=existing)
        seconds["delete"] = time.monotonic() - started
    # The year's steps go into their months' partitions of the trace table, not its default.
    trace_partitions.partitions_ensure(since=YEAR_START)
    fill = _Fill(plan=plan, rng=random.Random(seed), slug=slug, out=out)
    for name, step in (
        ("setup", fill.setup),
        ("commits", fill.commits),
        ("campaigns", fill.campaigns),
        ("mainline evaluations", fill.mainline),
        ("matrix", fill.matrix),
        ("promotions", fill.promotions),
        ("audit events", fill.audit),
    ):
        began = time.monotonic()
        step()
        seconds[name] = time.monotonic() - began
        out.write(f"{name}: done in {seconds[name]:.1f} s\n")
        out.flush()
    seconds["total"] = time.monotonic() - started
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        size = cursor.fetchone()[0]
    return FillReport(counts=fill.counts(), seconds=seconds, database_bytes=size)


def project_delete_bulk(*, project: Project) -> None:
    """Delete a filled project with one set-based DELETE per table (the ORM's cascade would
    load every rollout into memory, and stops at the PROTECT chains between evaluations,
    proposals and promotions), children first, in one transaction; then its users, policies
    and repository. Its audit events stay, as every project's do."""
    if project.description != SCALE_DESCRIPTION:
        raise InvalidState(
            f"Project {project.slug!r} was not written by scale_fill, so --replace will not "
            "delete it. Choose another --project."
        )
    prefix = f"{project.slug}-"
    repo_path = project_repo(project=project).path
    users = get_user_model().objects.filter(username__startswith=prefix)
    scoped = (
        TraceStep.objects.filter(rollout__evaluation__project=project),
        LedgerEntry.objects.filter(budget__project=project),
        Rollout.objects.filter(evaluation__project=project),
        EvaluationStage.objects.filter(evaluation__project=project),
        MatrixCell.objects.filter(matrix__project=project),
        CompatibilityMatrix.objects.filter(project=project),
        Approval.objects.filter(request__project=project),
        PromotionRequest.objects.filter(project=project),
        ChannelMove.objects.filter(channel__project=project),
        Channel.objects.filter(project=project),
        Proposal.objects.filter(campaign__project=project),
        Campaign.objects.filter(project=project),
        Evaluation.objects.filter(project=project),
        Budget.objects.filter(project=project),
        Task.objects.filter(suite__project=project),
        Suite.objects.filter(project=project),
        Candidate.objects.filter(project=project),
        Membership.objects.filter(project=project),
        ApiToken.objects.filter(user__in=users),
        Project.objects.filter(id=project.id),
    )
    with transaction.atomic():
        # QuerySet._raw_delete: one DELETE … WHERE each, no rows loaded; these tables have no
        # delete signals, and a row another project still refers to fails the commit.
        for queryset in scoped:
            queryset._raw_delete(queryset.db)
        users.delete()
        PolicyVersion.objects.filter(name__startswith=prefix, parent__isnull=False).delete()
        PolicyVersion.objects.filter(name__startswith=prefix).delete()
        PolicyEndpoint.objects.filter(name__startswith=prefix).delete()
    shutil.rmtree(repo_path, ignore_errors=True)


class _Fill:
    def __init__(self, *, plan: ScalePlan, rng: random.Random, slug: str, out: TextIO) -> None:
        self.plan, self.rng, self.slug, self.out = plan, rng, slug, out
        self.nodes: list[Node] = []
        self.heldout_evaluations = 0
        self.extra = {"campaigns": 0, "promotions": 0, "audit events": 0, "tokens": 0}

    def at(self, share: float) -> datetime:
        return YEAR_START + YEAR * min(max(share, 0.0), 1.0)

    # --- setup -----------------------------------------------------------------------------

    def setup(self) -> None:
        plan, rng, slug = self.plan, self.rng, self.slug
        with transaction.atomic():
            self.project = Project.objects.create(
                slug=slug, name=f"Scale data ({plan.name})", description=SCALE_DESCRIPTION
            )
            self.users = {}
            for name, role in MEMBERS:
                user = get_user_model().objects.create_user(
                    f"{slug}-{name}", f"{slug}-{name}@example.com"
                )
                membership_set(project=self.project, user=user, role=role)
                self.users[name] = user
            rows = suite_rows(
                rng, search=plan.search_tasks, validation=plan.validation_tasks,
                heldout=plan.heldout_tasks,
            )  # fmt: skip
            data = "\n".join(json.dumps(row) for row in rows).encode()
            self.suite, _ = suite_import_jsonl(
                project=self.project, name="arith-quest", data=data,
                scorer=scorer_spec_build(kind="exact"), actor=self.users["owner"],
            )  # fmt: skip
            self.tasks: dict[str, list[TaskRef]] = {"search": [], "validation": [], "heldout": []}
            for task_id, key, split in Task.objects.filter(suite=self.suite).values_list(
                "id", "key", "split"
            ):
                self.tasks[split].append(TaskRef(task_id, key, rng.gauss(0.0, 1.5)))
            endpoint = PolicyEndpoint.objects.create(
                name=f"{slug}-vllm", base_url="http://127.0.0.1:9/v1", kind=EndpointKind.VLLM,
                max_concurrency=16,
            )  # fmt: skip
            base = policy_version_create(
                name=f"{slug}-base", endpoint=endpoint, base_model="gemma-3-270m"
            )
            self.policies = [(base, 0.0)]
            for i in range(1, plan.policies):
                version = policy_version_create(
                    name=f"{slug}-lora-{i}", endpoint=endpoint, adapter_name=f"{slug}-lora-{i}",
                    adapter_path=f"/adapters/{slug}-lora-{i}", parent=base,
                    provenance={"trainer_command": ["train", "--epochs", "1"]},
                )  # fmt: skip
                self.policies.append((version, rng.gauss(0.15, 0.2)))
            self.production = channel_get_or_create(project=self.project, name="production")
            channel_get_or_create(project=self.project, name="staging")
        self.pool = step_pool(rng, policy_name=base.name)

    # --- commits ---------------------------------------------------------------------------

    def commits(self) -> None:
        plan, rng = self.plan, self.rng
        authors = ("Ada Reyes", "Sam Okafor", "CI")
        root = Node(0, (), seed_files(), "Seed harness: plain completion", "Ada Reyes",
                    self.at(0), "import", -0.6)  # fmt: skip
        self.nodes.append(root)
        for i in range(1, plan.mainline_candidates):
            parent = self.nodes[i - 1]
            files = variant_files(rng, i, "llm-patch")
            author = rng.choice(authors)
            self.nodes.append(
                Node(i, (i - 1,), files, f"{sentence(rng, 5).capitalize()} (main #{i})", author,
                     self.at(0.95 * i / plan.mainline_candidates),
                     "ci" if author == "CI" else "manual",
                     parent.skill + rng.gauss(0.02, 0.1))
            )  # fmt: skip
        self.plans = [self._campaign_plan(c) for c in range(plan.campaigns)]
        repo = project_repo(project=self.project)
        written = repo.fast_import(
            BulkCommit(
                parents=node.parents,
                files=node.files,
                message=node.message,
                author_name=node.author,
                author_email=f"{node.author.split()[0].lower()}@example.com",
                authored_at=node.at,
            )  # fmt: skip
            for node in self.nodes
        )
        for node, (sha, tree_sha) in zip(self.nodes, written, strict=True):
            node.sha, node.tree_sha = sha, tree_sha
        fields = ("id", "project", "sha", "tree_sha", "parent_shas", "message", "author_name",
                  "author_email", "authored_at", "origin", "created_by", "created_at", "updated_at")  # fmt: skip
        ci = self.users["ci"].id
        with transaction.atomic():
            TableCopy(Candidate, fields).write(
                (n.id, self.project.id, n.sha, n.tree_sha,
                 json.dumps([self.nodes[p].sha for p in n.parents]), n.message, n.author,
                 f"{n.author.split()[0].lower()}@example.com", n.at, n.origin,
                 ci if n.origin in ("ci", "proposer") else None, n.at, n.at)
                for n in self.nodes
            )  # fmt: skip
        self.out.write(f"commits: {len(self.nodes):,} through git fast-import\n")

    def _campaign_plan(self, c: int) -> list[dict]:
        """Campaign ``c``'s proposals, each appending its commit (when valid) to ``nodes``."""
        plan, rng = self.plan, self.rng
        begin, end = c / plan.campaigns, (c + 1) / plan.campaigns
        seed_position = max(
            n.position for n in self.nodes[: plan.mainline_candidates]
            if n.at <= self.at(begin)
        )  # fmt: skip
        best = seed_position
        valid_positions = [seed_position]
        proposals = [{"kind": "seed", "node": seed_position, "at": self.at(begin), "valid": True,
                      "validated": True}]  # fmt: skip
        kinds, weights = zip(*PROPOSER_KINDS, strict=True)
        for j in range(1, plan.proposals_per_campaign):
            at = self.at(begin + (end - begin) * j / plan.proposals_per_campaign)
            kind = rng.choices(kinds, weights)[0]
            if kind == "merge" and len(valid_positions) < 3:
                kind = "llm-patch"
            valid = rng.random() > 0.04
            entry = {"kind": kind, "at": at, "valid": valid, "node": None,
                     "validated": valid and rng.random() < plan.validated_share}  # fmt: skip
            if valid:
                parent = best if rng.random() < 0.7 else rng.choice(valid_positions)
                parents = (parent,)
                if kind == "merge":
                    other = rng.choice([p for p in valid_positions if p != parent])
                    parents = (parent, other)
                parent_node = self.nodes[parent]
                delta = rng.gauss(0.01, 0.25 if kind == "llm-patch" else 0.12)
                node = Node(len(self.nodes), parents, variant_files(rng, len(self.nodes), kind),
                            f"{kind} proposal {j}: {sentence(rng, 6)}", "proposer", at,
                            "proposer", parent_node.skill + delta)  # fmt: skip
                self.nodes.append(node)
                entry["node"] = node.position
                valid_positions.append(node.position)
                if entry["validated"] and node.skill > self.nodes[best].skill:
                    best = node.position
            proposals.append(entry)
        return proposals

    # --- campaigns -------------------------------------------------------------------------

    def writer(self) -> RowWriter:
        if not hasattr(self, "_writer"):
            plan = self.plan
            total = self._planned_rollouts()
            self._writer = RowWriter(
                rng=self.rng, pool=self.pool, mean_steps=plan.steps_per_rollout,
                chunk_rollouts=plan.chunk_rollouts,
                progress=Progress(what="rollouts", total=total, out=self.out), out=self.out,
            )  # fmt: skip
        return self._writer

    def _planned_rollouts(self) -> int:
        p = self.plan
        search = sum(p.search_eval_tasks for entries in self.plans for e in entries if e["valid"])
        validation = sum(
            p.validation_tasks for entries in self.plans for e in entries if e["validated"]
        )
        return (
            search + validation + p.full_evaluations * p.search_tasks * p.full_epochs
            + p.matrix_candidates * p.policies * p.validation_tasks
            + 2 * p.promotions * p.heldout_tasks
        )  # fmt: skip

    def _search_tasks(self) -> list[TaskRef]:
        return self.rng.sample(self.tasks["search"], self.plan.search_eval_tasks)

    def campaigns(self) -> None:
        writer = self.writer()
        base = self.policies[0][0]
        researcher = self.users["researcher-1"]
        self.campaign_bests: list[tuple[Node, Campaign]] = []
        for c, entries in enumerate(self.plans):
            last_campaign = c == len(self.plans) - 1
            seed_node = self.nodes[entries[0]["node"]]
            with transaction.atomic():
                budget = Budget.objects.create(
                    project=self.project, name=f"campaign {c + 1}",
                    limit_rollouts=len(entries) * (self.plan.search_eval_tasks + self.plan.validation_tasks),
                )  # fmt: skip
                campaign = Campaign.objects.create(
                    project=self.project, name=f"campaign {c + 1}: {sentence(self.rng, 3)}",
                    seed_candidate_id=seed_node.id, policy_version=base, suite=self.suite,
                    strategy=[{"kind": "llm-patch", "options": {}}, {"kind": "config", "options": {}}],
                    budget=budget, max_proposals=len(entries), state="running",
                    plan={"smoke_tasks": self.plan.smoke_tasks,
                          "minibatch_tasks": self.plan.search_eval_tasks - self.plan.smoke_tasks,
                          "early_stop": True, "alpha": 0.05},
                    created_by=researcher, started_at=entries[0]["at"],
                )  # fmt: skip
            search_evals: dict[int, Any] = {}
            best: tuple[float, Node | None] = (-1.0, None)
            since = 0
            spent = 0
            for j, entry in enumerate(entries):
                at = entry["at"]
                node = self.nodes[entry["node"]] if entry["node"] is not None else None
                open_last = last_campaign and j == len(entries) - 1 and node is not None
                search = validation = None
                if node is not None:
                    reference = search_evals.get(node.parents[0]) if node.parents else None
                    stop = (
                        None
                        if entry["validated"]
                        else self.rng.randint(
                            self.plan.smoke_tasks + 2, self.plan.search_eval_tasks - 1
                        )
                    )
                    search = writer.evaluation(
                        project_id=self.project.id, candidate_id=node.id, tree_sha=node.tree_sha,
                        skill=node.skill, policy_id=base.id, suite_id=self.suite.id,
                        split="search", tasks=self._search_tasks(), smoke=self.plan.smoke_tasks,
                        stop_after=None if open_last else stop,
                        pending_after=self.plan.search_eval_tasks // 2 if open_last else None,
                        reference_id=reference, created_by=researcher.id, at=at,
                    )  # fmt: skip
                    search_evals[node.position] = search.id
                    spent += search.rollouts
                    if entry["validated"] and not open_last:
                        validation = writer.evaluation(
                            project_id=self.project.id, candidate_id=node.id,
                            tree_sha=node.tree_sha, skill=node.skill, policy_id=base.id,
                            suite_id=self.suite.id, split="validation",
                            tasks=self.tasks["validation"], created_by=researcher.id,
                            at=at + timedelta(minutes=5),
                        )  # fmt: skip
                        spent += validation.rollouts
                improved = bool(
                    validation and validation.mean_score is not None
                    and validation.mean_score > best[0]
                )  # fmt: skip
                if improved:
                    best = (validation.mean_score, node)
                    since = 0
                elif entry["kind"] != "seed":
                    since += 1
                writer.proposal(
                    self._proposal_row(campaign, j, entry, node, search, validation, improved)
                )
                writer.maybe_flush()
            best_score, best_node = best
            self.campaign_bests.append((best_node, campaign))

            def finish(campaign=campaign, best_node=best_node, best_score=best_score,
                       since=since, spent=spent, open_=last_campaign, entries=entries):  # fmt: skip
                Campaign.objects.filter(id=campaign.id).update(
                    state="running" if open_ else "finished",
                    stop_reason="" if open_ else f"max_proposals ({len(entries)}) reached",
                    best_candidate_id=best_node.id if best_node else None,
                    best_validation_score=best_score if best_node else None,
                    best_policy_version_id=base.id if best_node else None,
                    proposals_since_improvement=since,
                    finished_at=None if open_ else entries[-1]["at"],
                    created_at=entries[0]["at"],
                    updated_at=entries[-1]["at"],
                )
                Budget.objects.filter(id=campaign.budget_id).update(spent_rollouts=spent)

            writer.flush(then=finish)
            self.extra["campaigns"] += 1

    def _proposal_row(self, campaign, j, entry, node, search, validation, improved) -> tuple:
        rng = self.rng
        kind = entry["kind"]
        at = entry["at"]
        parents = [self.nodes[p].sha for p in node.parents] if node else []
        shown = {
            "candidates": [
                {"sha": self.nodes[p].sha, "search_score": round(rng.random(), 3)}
                for p in (node.parents if node else ())
            ],
            "task_keys": [t.key for t in rng.sample(self.tasks["search"], 5)],
        }
        params, prompt, response, patch, tokens = {}, "", "", "", 0
        if kind in ("config", "random"):
            params = {"temperature": round(rng.random(), 3), "samples": rng.randint(1, 8)}
        elif kind in ("llm-patch", "merge") and node is not None:
            patch = patch_text(node.files)
            prompt = f"You improve a harness. Failing tasks: {sentence(rng, 200)}"
            response = f"I will tighten the rules.\n```diff\n{patch}```"
            tokens = len(prompt) // 4 + len(response) // 4
        if not entry["valid"]:
            stages = [{"stage": "applies", "ok": True, "reason": ""},
                      {"stage": "imports", "ok": False,
                       "reason": "SyntaxError: invalid syntax (agent.py, line 12)"}]  # fmt: skip
            state, detail = "invalid", "imports: SyntaxError: invalid syntax (agent.py, line 12)"
        else:
            stages = [{"stage": s, "ok": True, "reason": ""}
                      for s in ("applies", "manifest", "imports", "smoke")]  # fmt: skip
            state = (
                "evaluating"
                if search and validation is None and search.mean_score is None
                else "evaluated"
            )
            detail = ""
        finished = None if state == "evaluating" else at + timedelta(minutes=20)
        return (
            uuid.uuid4(), campaign.id, j, kind, json.dumps(parents), json.dumps(shown),
            json.dumps(params), j if kind in ("config", "random") else None, prompt, response,
            tokens, tokens * 12 if tokens else 0, patch, json.dumps(stages), state, detail,
            node.id if node else None, search.id if search else None,
            validation.id if validation else None, search.mean_score if search else None,
            validation.mean_score if validation else None,
            (validation or search).tokens_per_task if search else None,
            self.policies[0][0].id, improved, finished, at, finished or at,
        )  # fmt: skip

    # --- main line, matrix -----------------------------------------------------------------

    def mainline(self) -> None:
        writer = self.writer()
        step = max(self.plan.mainline_candidates // max(self.plan.full_evaluations, 1), 1)
        ci = self.users["ci"].id
        for k in range(self.plan.full_evaluations):
            node = self.nodes[min(self.plan.mainline_candidates - 1, (k + 1) * step - 1)]
            writer.evaluation(
                project_id=self.project.id, candidate_id=node.id, tree_sha=node.tree_sha,
                skill=node.skill, policy_id=self.policies[0][0].id, suite_id=self.suite.id,
                split="search", tasks=self.tasks["search"], epochs=self.plan.full_epochs,
                created_by=ci, at=node.at + timedelta(hours=1),
            )  # fmt: skip
            writer.maybe_flush()
        writer.flush()

    def matrix(self) -> None:
        writer = self.writer()
        picks = [n for n, _ in self.campaign_bests if n is not None]
        taken = {n.position for n in picks}
        picks += [
            n for n in self.nodes[: self.plan.mainline_candidates][::-1] if n.position not in taken
        ]
        picks = picks[: self.plan.matrix_candidates]
        at = self.at(0.97)
        with transaction.atomic():
            budget = Budget.objects.create(project=self.project, name="matrix")
            self.matrix_row = CompatibilityMatrix.objects.create(
                project=self.project, name="harness × policy", suite=self.suite,
                split="validation", budget=budget, created_by=self.users["researcher-2"],
            )  # fmt: skip
        cells = []
        for row, node in enumerate(picks):
            for column, (policy, bonus) in enumerate(self.policies):
                result = writer.evaluation(
                    project_id=self.project.id, candidate_id=node.id, tree_sha=node.tree_sha,
                    skill=node.skill + bonus + self.rng.gauss(0, 0.2), policy_id=policy.id,
                    suite_id=self.suite.id, split="validation", tasks=self.tasks["validation"],
                    created_by=self.users["researcher-2"].id, at=at,
                )  # fmt: skip
                cells.append((self.matrix_row.id, row, column, node.id, policy.id, result.id))
        fields = ("matrix", "row", "column", "candidate", "policy_version", "evaluation")
        writer.flush(then=lambda: TableCopy(MatrixCell, fields).write(cells))

    # --- promotions ------------------------------------------------------------------------

    def promotions(self) -> None:
        """Requests to move ``production``, oldest first: most approved (moving the channel and
        tagging the commit), some rejected or withdrawn, the newest still open for review.
        Their held-out evaluations exist only here (docs/architecture.md, "The held-out seal")."""
        plan, rng, writer = self.plan, self.rng, self.writer()
        base = self.policies[0][0]
        by_skill = sorted(self.nodes, key=lambda n: n.skill)
        candidates = sorted(by_skill[-plan.promotions :], key=lambda n: n.at)
        holder: Node | None = None
        generation = 0
        requesters = [self.users["researcher-1"], self.users["researcher-2"], self.users["owner"]]
        reviewers = [self.users["reviewer-1"], self.users["reviewer-2"]]
        repo = project_repo(project=self.project)
        self.request_events: list[tuple] = []
        campaign_of = {n.id: c for n, c in self.campaign_bests if n is not None}
        for r, node in enumerate(candidates):
            at = max(
                node.at + timedelta(hours=2), self.at(0.1 + 0.88 * r / max(plan.promotions, 1))
            )
            last = r == len(candidates) - 1
            state = "ready" if last else rng.choices(
                ("approved", "rejected", "cancelled"), (0.7, 0.2, 0.1)
            )[0]  # fmt: skip
            heldout = self.tasks["heldout"]
            reference = holder or self.nodes[0]
            sides = [
                writer.evaluation(
                    project_id=self.project.id,
                    candidate_id=side.id,
                    tree_sha=side.tree_sha,
                    skill=side.skill,
                    policy_id=base.id,
                    suite_id=self.suite.id,
                    split="heldout",
                    tasks=heldout,
                    at=at,
                )  # fmt: skip
                for side in (node, reference)
            ]
            self.heldout_evaluations += 2
            requester = requesters[r % len(requesters)]
            request_id = uuid.uuid4()
            decided = at + timedelta(hours=rng.randint(2, 48))
            move_id = uuid.uuid4() if state == "approved" else None

            def write(request_id=request_id, node=node, holder=holder, reference=reference,
                      sides=sides, state=state, requester=requester, at=at, decided=decided,
                      move_id=move_id, generation=generation, r=r):  # fmt: skip
                if move_id:
                    TableCopy(ChannelMove, ("id", "channel", "number", "from_candidate",
                              "to_candidate", "from_policy_version", "to_policy_version",
                              "moved_by", "reason", "tag", "created_at")).write([
                        (move_id, self.production.id, generation + 1,
                         holder.id if holder else None, node.id, base.id if holder else None,
                         base.id, reviewers[0].id, f"promotion {request_id}",
                         channel_tag_names(channel=self.production, number=generation + 1)[0],
                         decided)
                    ])  # fmt: skip
                TableCopy(PromotionRequest, (
                    "id", "project", "channel", "candidate", "policy_version", "suite",
                    "requester", "state", "state_detail", "holder_candidate",
                    "holder_policy_version", "holder_generation", "baseline_candidate",
                    "baseline_kind", "campaign", "candidate_evaluation", "holder_evaluation",
                    "baseline_evaluation", "heldout_looks_project", "heldout_looks_campaign",
                    "channel_move", "decided_at", "created_at", "updated_at",
                )).write([(
                    request_id, self.project.id, self.production.id, node.id, base.id,
                    self.suite.id, requester.id, state, "", holder.id if holder else None,
                    base.id if holder else None, generation,
                    None if holder else reference.id, "" if holder else "picked",
                    campaign_of[node.id].id if node.id in campaign_of else None,
                    sides[0].id, sides[1].id if holder else None,
                    None if holder else sides[1].id, 2 * (r + 1),
                    2 if node.id in campaign_of else None, move_id,
                    None if state == "ready" else decided, at, decided,
                )])  # fmt: skip
                approvals = []
                if state in ("approved", "rejected"):
                    approvals.append((uuid.uuid4(), request_id, reviewers[r % 2].id, requester.id,
                                      "approve" if state == "approved" else "reject",
                                      sentence(self.rng, 12), decided))  # fmt: skip
                TableCopy(Approval, ("id", "request", "reviewer", "requester", "decision",
                                     "comment", "created_at")).write(approvals)  # fmt: skip
                request = PromotionRequest.objects.select_related(
                    "candidate",
                    "candidate_evaluation",
                    "holder_candidate",
                    "holder_evaluation",
                    "baseline_candidate",
                    "baseline_evaluation",
                    "suite",
                    "policy_version",
                ).get(id=request_id)
                evidence = evidence_build(request=request)
                PromotionRequest.objects.filter(id=request_id).update(
                    evidence=evidence, evidence_at=at + timedelta(hours=1)
                )

            writer.flush(then=write)
            self.request_events += self._request_events(request_id, state, requester, at, decided)
            self.extra["promotions"] += 1
            if state == "approved":
                generation += 1
                holder = node
                repo.tag(channel_tag_names(channel=self.production, number=generation)[0],
                         node.sha, force=True)  # fmt: skip
        if holder is not None:
            repo.tag("production", holder.sha, force=True)
            Channel.objects.filter(id=self.production.id).update(
                candidate_id=holder.id, policy_version_id=base.id, generation=generation,
                moved_at=self.at(0.98),
            )  # fmt: skip

    def _request_events(self, request_id, state, requester, at, decided) -> list[tuple]:
        label = f"promotion {request_id}"
        events = [("promotion.requested", requester, None, {"state": "evaluating"}, at),
                  ("promotion.ready", None, {"state": "evaluating"}, {"state": "ready"},
                   at + timedelta(hours=1))]  # fmt: skip
        if state != "ready":
            action = {"approved": "promotion.approved", "rejected": "promotion.rejected",
                      "cancelled": "promotion.cancelled"}[state]  # fmt: skip
            events.append(
                (action, self.users["reviewer-1"], {"state": "ready"}, {"state": state}, decided)
            )
        return [("reviews.PromotionRequest", str(request_id), label, *event) for event in events]

    # --- audit -----------------------------------------------------------------------------

    def audit(self) -> None:
        """The promotions' events, then CI's short-lived job tokens (created, then revoked at
        the end of the job: ``token.created``/``token.revoked``, global events as the app
        writes them) up to the plan's count."""
        rng = self.rng
        fields = ("id", "project", "actor", "actor_label", "action", "target_type", "target_id",
                  "target_label", "before", "after", "created_at")  # fmt: skip
        events = TableCopy(AuditEvent, fields)
        structural = [
            (uuid.uuid4(), self.project.id, actor.id if actor else None,
             actor.get_username() if actor else "system", action, target_type, target_id,
             label, json.dumps(before) if before is not None else None, json.dumps(after), when)
            for target_type, target_id, label, action, actor, before, after, when in self.request_events
        ]  # fmt: skip
        existing = AuditEvent.objects.filter(project_id=self.project.id).count()
        with transaction.atomic():
            events.write(structural)
        self.extra["audit events"] += len(structural) + existing
        remaining = max(self.plan.audit_events - len(structural) - existing, 0)
        ci = self.users["ci"]
        prefixes = set(ApiToken.objects.values_list("prefix", flat=True))
        tokens = TableCopy(ApiToken, ("id", "user", "name", "kind", "prefix", "secret_hash",
                                      "scopes", "created_by", "last_used_at", "expires_at",
                                      "revoked_at", "created_at", "updated_at"))  # fmt: skip
        progress = Progress(what="audit events", total=remaining, out=self.out)
        scopes = json.dumps(["read", "candidates:write", "evaluations:run"])
        pairs = remaining // 2
        for start in range(0, pairs, self.plan.chunk_events // 2):
            token_rows, event_rows = [], []
            for k in range(start, min(start + self.plan.chunk_events // 2, pairs)):
                while (prefix := secrets.token_hex(4)) in prefixes:
                    pass
                prefixes.add(prefix)
                made = self.at(k / max(pairs, 1))
                revoked = made + timedelta(minutes=rng.randint(3, 90))
                token_id = uuid.uuid4()
                name = f"ci job {k + 1}"
                token_rows.append((token_id, ci.id, name, "ci", prefix, secrets.token_hex(32),
                                   scopes, ci.id, revoked, made + timedelta(days=1), revoked,
                                   made, revoked))  # fmt: skip
                label = f"{name} ({prefix}…)"
                event_rows.append((uuid.uuid4(), None, ci.id, ci.get_username(), "token.created",
                                   "accounts.ApiToken", str(token_id), label, None,
                                   json.dumps({"user": ci.get_username(), "kind": "ci",
                                               "scopes": json.loads(scopes)}), made))  # fmt: skip
                event_rows.append((uuid.uuid4(), None, ci.id, ci.get_username(), "token.revoked",
                                   "accounts.ApiToken", str(token_id), label,
                                   json.dumps({"revoked_at": None}),
                                   json.dumps({"revoked_at": revoked.isoformat()}), revoked))  # fmt: skip
            with transaction.atomic():
                tokens.write(token_rows)
                events.write(event_rows)
            self.extra["audit events"] += len(event_rows)
            self.extra["tokens"] += len(token_rows)
            progress.advance(len(event_rows))

    def counts(self) -> dict[str, int]:
        w = self.writer()
        return {
            "candidates": len(self.nodes),
            "campaigns": self.extra["campaigns"],
            "proposals": w.counts.proposals,
            "evaluations": w.counts.evaluations,
            "held-out evaluations": self.heldout_evaluations,
            "rollouts": w.counts.rollouts,
            "trace steps": w.counts.steps,
            "promotion requests": self.extra["promotions"],
            "audit events": self.extra["audit events"],
            "api tokens": self.extra["tokens"],
        }

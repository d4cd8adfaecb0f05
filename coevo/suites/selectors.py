from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import (
    Case,
    Count,
    F,
    IntegerField,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from coevo.errors import NotFound
from coevo.projects.audience import Audience
from coevo.projects.models import Project
from coevo.suites.kinds import platform_kind
from coevo.suites.models import Split, Suite, SuiteKind, Task, TaskImageBuild
from workers.environments.regexes import regex_problem


def suite_list(*, project: Project) -> QuerySet[Suite]:
    return Suite.objects.filter(project=project).annotate(task_count=Count("tasks"))


def suite_summaries(*, project: Project) -> QuerySet[Suite]:
    """The project's suites with task counts per split and how many evaluations used each."""
    # Evaluations are counted in a subquery (through Evaluation.suite's reverse relation: the
    # evaluations app sits above this one): joining them next to the tasks would multiply the
    # rows (tasks × evaluations) before counting.
    evaluations = (
        Suite.objects.filter(pk=OuterRef("pk"))
        .order_by()
        .annotate(n=Count("evaluations"))
        .values("n")
    )

    # The task counts are subqueries too: next to a GROUP BY of the joined tasks, the evaluation
    # count would be grouped by and run once per task (measured: 1,300 runs for 13 suites).
    def tasks(split: Q) -> Coalesce:
        counted = (
            Task.objects.filter(split, suite=OuterRef("pk"))
            .order_by()
            .values("suite")
            .annotate(n=Count("id"))
            .values("n")
        )
        return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))

    return Suite.objects.filter(project=project).annotate(
        task_count=tasks(Q()),
        search_count=tasks(Q(split=Split.SEARCH)),
        validation_count=tasks(Q(split=Split.VALIDATION)),
        heldout_count=tasks(Q(split=Split.HELDOUT)),
        evaluation_count=Coalesce(Subquery(evaluations, output_field=IntegerField()), Value(0)),
    )


def suite_get(*, project: Project, name: str, version: str | None = None) -> Suite:
    """The suite of this name: this version, or (``version`` None or blank) the latest one."""
    suites = Suite.objects.filter(project=project, name=name)
    if version:
        suites = suites.filter(version=version)
    suite = suites.order_by("-created_at").first()
    if suite is None:
        which = f" version {version}" if version else ""
        raise NotFound(f"No suite {name!r}{which} in project {project.slug}.")
    return suite


# How far suite_family follows slices of slices: a bound on the queries, far above any use.
FAMILY_MAX_DEPTH = 8


def suite_family_root(*, suite: Suite) -> Suite:
    """The suite ``suite`` is (a slice of a slice of …) a slice of; itself when it is none."""
    root = suite
    for _ in range(FAMILY_MAX_DEPTH):
        if root.source_id is None:
            break
        root = root.source
    return root


def suite_family(*, suite: Suite) -> QuerySet[Suite]:
    """The suites that measure the same thing as ``suite``: every version of its root's name
    (the root: what it is a slice of, or itself) and the slices of any of them, in the same
    project. Scores from one member say something about another (a campaign on the demo's
    slice of textworld, a promotion judged on the full textworld); scores from another
    family do not."""
    root = suite_family_root(suite=suite)
    ids = set(
        Suite.objects.filter(project_id=suite.project_id, name=root.name).values_list(
            "id", flat=True
        )
    )
    ids.add(suite.id)
    frontier = set(ids)
    for _ in range(FAMILY_MAX_DEPTH):
        frontier = set(
            Suite.objects.filter(source_id__in=frontier)
            .exclude(id__in=ids)
            .values_list("id", flat=True)
        )
        if not frontier:
            break
        ids |= frontier
    return Suite.objects.filter(id__in=ids)


def suite_get_by_id(*, project: Project, suite_id: UUID) -> Suite:
    suite = suite_summaries(project=project).filter(id=suite_id).first()
    if suite is None:
        raise NotFound(f"No such suite in project {project.slug}.")
    return suite


def suite_split_counts(*, suite: Suite) -> dict[str, int]:
    """Tasks per split, every split present (zero when empty), in search → held-out order."""
    rows = dict(
        Task.objects.filter(suite=suite).values_list("split").annotate(n=Count("id")).order_by()
    )
    return {split.value: rows.get(split.value, 0) for split in Split}


def task_list(*, suite: Suite, split: Split) -> QuerySet[Task]:
    # The verifier payload (hidden tests) is never needed to list tasks.
    return Task.objects.filter(suite=suite, split=split).defer("verifier").order_by("position")


def task_catalogue(
    *, suite: Suite, audience: Audience, split: Split | None = None
) -> QuerySet[Task]:
    """A suite's tasks for listing: key, split, position and what the harness sees
    (``listed_inputs``), never the verifier. A held-out task's ``listed_inputs`` is None unless
    ``audience`` is ``Audience.REVIEWER``: sealed (docs/architecture.md, "The held-out seal").

    A kind whose inputs may be large (a workspace task's hold its starting files) names the one
    input a listing takes (``PlatformKind.listed_input``), read out by the database."""
    key = platform_kind(suite.kind).listed_input
    listed: Any = KT(f"inputs__{key}") if key else F("inputs")
    if not audience.sees_heldout:
        listed = Case(
            When(split=Split.HELDOUT, then=Value(None)),
            default=listed,
            output_field=TextField() if key else JSONField(),
        )
    tasks = (
        Task.objects.filter(suite=suite)
        .only("id", "key", "split", "position")
        .annotate(listed_inputs=listed)
    )
    if split is not None:
        tasks = tasks.filter(split=split)
    return tasks.order_by("position")


def task_is_sealed(*, task: Task) -> bool:
    """Held-out tasks are sealed (docs/architecture.md, "The held-out seal"): no page or proposer may see their inputs."""
    return task.split == Split.HELDOUT


def suite_unrunnable_patterns(*, suite: Suite, task_ids: list[Any]) -> int:
    """How many of these tasks hold a regex pattern the worker's engine (RE2) refuses. Only a
    suite imported before coevo matched with RE2 holds any: the import checks every pattern."""
    if suite.kind != SuiteKind.JSONL or (suite.scorer or {}).get("kind") != "regex":
        return 0
    patterns = Task.objects.filter(suite=suite, id__in=task_ids).values_list(
        "verifier__expected", flat=True
    )
    return sum(
        1
        for pattern in patterns.iterator()
        if isinstance(pattern, str) and regex_problem(pattern) is not None
    )


# --- image builds --------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageBuildView:
    """A task's latest image build as a page may show it. A held-out task's has its outcome
    and time only: its step, error and log are never read from the database."""

    outcome: str
    created_at: datetime
    seconds: float | None = None
    machine: str = ""
    source: str = ""
    failed_step: str = ""
    failed_line: int | None = None
    timed_out: bool = False
    error: str = ""
    log: str = ""


@dataclass(frozen=True)
class TaskImageRow:
    key: str
    split: str
    sealed: bool
    build: ImageBuildView | None  # None: no build recorded yet


# What a held-out task's build shows (docs/architecture.md, "The held-out seal"): that it was built or failed, and when. A
# log or a failed step quotes the task's Dockerfile and what its RUN steps print.
_SEALED_BUILD_FIELDS = ("id", "outcome", "created_at")
_BUILD_FIELDS = (
    *_SEALED_BUILD_FIELDS,
    "seconds",
    "machine",
    "source",
    "failed_step",
    "failed_line",
    "timed_out",
    "error",
    "log",
)


def suite_image_rows(*, suite: Suite, task_ids: Iterable[Any]) -> list[TaskImageRow]:
    """For the tasks among ``task_ids`` that run in their container (``inputs.environment``),
    in suite order: each one's latest recorded image build, sealed for held-out tasks."""
    if not platform_kind(suite.kind).task_images:
        return []
    latest = (
        TaskImageBuild.objects.filter(task=OuterRef("pk")).order_by("-created_at").values("id")[:1]
    )
    tasks = list(
        Task.objects.filter(suite=suite, id__in=list(task_ids), inputs__has_key="environment")
        .order_by("position")
        .annotate(latest_build=Subquery(latest))
        .values("key", "split", "latest_build")
    )
    sealed = {t["latest_build"] for t in tasks if t["split"] == Split.HELDOUT} - {None}
    shown = {t["latest_build"] for t in tasks if t["split"] != Split.HELDOUT} - {None}
    builds: dict[Any, ImageBuildView] = {}
    for ids, fields in ((sealed, _SEALED_BUILD_FIELDS), (shown, _BUILD_FIELDS)):
        if ids:
            for row in TaskImageBuild.objects.filter(id__in=ids).values(*fields):
                build_id = row.pop("id")
                builds[build_id] = ImageBuildView(**row)
    return [
        TaskImageRow(
            key=t["key"],
            split=t["split"],
            sealed=t["split"] == Split.HELDOUT,
            build=builds.get(t["latest_build"]),
        )
        for t in tasks
    ]

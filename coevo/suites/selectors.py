from django.db.models import Count, QuerySet

from coevo.errors import NotFound
from coevo.projects.models import Project
from coevo.suites.models import Split, Suite, Task


def suite_list(*, project: Project) -> QuerySet[Suite]:
    return Suite.objects.filter(project=project).annotate(task_count=Count("tasks"))


def suite_get(*, project: Project, name: str) -> Suite:
    suite = Suite.objects.filter(project=project, name=name).order_by("-created_at").first()
    if suite is None:
        raise NotFound(f"No suite {name!r} in project {project.slug}.")
    return suite


def task_list(*, suite: Suite, split: Split) -> QuerySet[Task]:
    # The verifier payload (hidden tests) is never needed to list tasks.
    return Task.objects.filter(suite=suite, split=split).defer("verifier").order_by("position")

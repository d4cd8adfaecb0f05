"""Suite kinds on the platform's side: one registered class a kind (coevo/suites/kinds/), found
by the command line and the import page from its registration alone, and every kind the model
stores has both its platform registration and its worker environment."""

from __future__ import annotations

import html
import pkgutil
from io import StringIO
from typing import Any

import pytest
from django import forms
from django.core.management import call_command
from django.urls import reverse

from coevo.errors import InvalidInput
from coevo.suites import kinds
from coevo.suites.kinds import (
    CommandImport,
    Imported,
    PlatformKind,
    ShippedImport,
    UploadImport,
    command_imports,
    platform_kind,
    register_suite_kind,
    registered_suite_kinds,
    shipped_imports,
    upload_imports,
)
from coevo.suites.kinds import base as kinds_base
from coevo.suites.kinds.workspace import WorkspaceKind
from coevo.suites.models import Split, Suite, SuiteKind, Task
from coevo.suites.services import suite_version_create
from workers.environments import registered_kinds as environment_kinds

TINY = "tiny"


def test_every_suite_kind_has_its_platform_registration_and_its_worker_environment():
    assert registered_suite_kinds() == sorted(SuiteKind.values) == environment_kinds()
    for kind in SuiteKind.values:
        assert platform_kind(kind).kind == kind


def test_each_module_of_the_package_registers_the_kind_it_is_named_after():
    modules = {m.name for m in pkgutil.iter_modules(kinds.__path__)} - {"base"}

    assert modules == set(registered_suite_kinds())
    for name in modules:
        assert type(platform_kind(name)).__module__ == f"coevo.suites.kinds.{name}"


def test_the_imports_users_see_come_from_the_registrations_in_the_order_of_their_kinds():
    assert list(command_imports()) == ["humaneval", "jsonl", "textworld", "harbor", "workspace"]
    assert list(shipped_imports()) == ["humaneval", "textworld", "workspace"]
    assert list(upload_imports()) == ["jsonl", "harbor"]
    assert platform_kind("workspace").listed_input == "instruction"
    assert [k for k in registered_suite_kinds() if platform_kind(k).task_images] == ["workspace"]


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(InvalidInput, match="'nope'"):
        platform_kind("nope")


def test_a_kind_is_registered_once_and_its_import_names_are_its_own(registry):
    with pytest.raises(TypeError, match="already has WorkspaceKind"):

        @register_suite_kind
        class Another(PlatformKind):
            kind = SuiteKind.WORKSPACE

    with pytest.raises(TypeError, match="names no suite kind"):

        @register_suite_kind
        class Nameless(PlatformKind):
            pass

    with pytest.raises(TypeError, match="'harbor'"):

        @register_suite_kind
        class Borrower(PlatformKind):
            kind = TINY
            commands = (CommandImport("harbor", "another harbor", lambda parser: None, _run),)

    assert type(platform_kind("workspace")) is WorkspaceKind
    assert TINY not in registered_suite_kinds()


# --- a kind found from its registration alone ----------------------------------------------


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, given back as it was after the test."""
    monkeypatch.setattr(kinds_base, "_REGISTRY", dict(kinds_base._REGISTRY))


class TinyForm(forms.Form):
    size = forms.IntegerField(min_value=1, max_value=9)


def _tiny_suite(*, project: Any, size: int) -> Imported:
    return Imported(
        *suite_version_create(
            project=project,
            name=f"tiny-{size}",
            kind=TINY,
            noun="this tiny suite",
            content_hash=f"tiny-{size}",
            split_seed="0",
            description="",
            scorer={},
            actor=None,
            tasks=lambda suite: (
                Task(
                    suite=suite,
                    key=f"t{i}",
                    split=Split.SEARCH,
                    position=i,
                    inputs={"n": i},
                    verifier={},
                )
                for i in range(size)
            ),
        )
    )


def _run(*, project: Any, **_: Any) -> Imported:
    return _tiny_suite(project=project, size=1)


@pytest.fixture
def tiny_kind(registry):
    @register_suite_kind
    class TinyKind(PlatformKind):
        kind = TINY
        commands = (
            CommandImport(
                "tiny",
                "a tiny suite of SIZE tasks",
                lambda parser: parser.add_argument("--size", type=int, default=1),
                lambda *, project, options, progress: _tiny_suite(
                    project=project, size=options["size"]
                ),
            ),
        )
        shipped = (ShippedImport("tiny", "Import the tiny suite", _run),)
        uploads = (
            UploadImport(
                "tiny-upload",
                "Tiny suites by size",
                TinyForm,
                "Up to 9 tasks (uploads: at most {max_megabytes} MB).",
                lambda *, project, data, actor: _tiny_suite(project=project, size=data["size"]),
            ),
        )

    return TinyKind


@pytest.mark.django_db
def test_a_registered_kind_is_a_subcommand_of_suite_import(tiny_kind, project):
    out = StringIO()
    call_command("suite_import", "--project", project.slug, "tiny", "--size", "3", stdout=out)

    suite = Suite.objects.get(project=project, name="tiny-3")
    assert suite.kind == TINY and suite.tasks.count() == 3
    assert "tiny-3 v1 (tiny): imported as a new suite" in out.getvalue()


@pytest.mark.django_db
def test_a_registered_kind_has_its_button_and_its_form_on_the_import_page(
    tiny_kind, client, researcher, project
):
    client.force_login(researcher)
    url = reverse("web:suite_import", args=[project.slug])

    page = html.unescape(client.get(url).content.decode())
    assert 'value="tiny"><button type="submit">Import the tiny suite</button>' in page
    assert "<h2>Tiny suites by size</h2>" in page and 'value="tiny-upload"' in page
    assert 'name="size"' in page and "Up to 9 tasks (uploads: at most" in page

    shipped = client.post(url, {"kind": "tiny"})
    suite = Suite.objects.get(project=project, name="tiny-1")
    assert shipped.status_code == 302
    assert shipped["Location"] == reverse("web:suite", args=[project.slug, suite.id])

    refused = client.post(url, {"kind": "tiny-upload", "size": "12"})
    assert refused.status_code == 400
    assert "size: Ensure this value is less than or equal to 9." in html.unescape(
        refused.content.decode()
    )
    uploaded = client.post(url, {"kind": "tiny-upload", "size": "4"})
    assert uploaded.status_code == 302
    assert Suite.objects.get(project=project, name="tiny-4").tasks.count() == 4


@pytest.mark.django_db
def test_an_unregistered_kind_is_neither_offered_nor_imported(client, researcher, project):
    client.force_login(researcher)
    url = reverse("web:suite_import", args=[project.slug])

    assert 'value="tiny"' not in client.get(url).content.decode()
    refused = client.post(url, {"kind": "tiny"})
    assert refused.status_code == 400
    assert "unknown suite kind" in html.unescape(refused.content.decode())
    assert not Suite.objects.filter(project=project).exists()

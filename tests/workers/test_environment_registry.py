"""Suite kinds and their environments: one registered class a kind (workers/environments/base.py),
and every kind the platform offers has one."""

from __future__ import annotations

import pytest

from coevo.errors import InvalidInput
from coevo.suites.models import SuiteKind
from workers.environments import Environment, environment_for, register_environment
from workers.environments.base import registered_kinds
from workers.environments.workspace import WorkspaceEnvironment


def test_every_suite_kind_has_its_environment_and_no_environment_is_without_a_kind():
    assert registered_kinds() == sorted(SuiteKind.values)
    for kind in SuiteKind.values:
        assert environment_for(kind).kind == kind


def test_what_an_environment_declares_is_what_the_runner_reads():
    workspace = environment_for("workspace")
    assert isinstance(workspace, WorkspaceEnvironment)
    assert workspace.workspace and not workspace.multi_step and set(workspace.helpers) == {"exec"}
    assert environment_for("textworld").multi_step
    assert set(environment_for("humaneval").helpers) == {"check"}
    with pytest.raises(NotImplementedError, match="multi-step"):
        environment_for("textworld").verify(inputs={}, verifier={}, answer=None)


def test_an_unknown_kind_is_refused_by_name():
    with pytest.raises(InvalidInput, match="'nope'"):
        environment_for("nope")


def test_a_kind_is_registered_once_and_an_environment_must_name_one():
    with pytest.raises(TypeError, match="already has WorkspaceEnvironment"):

        @register_environment
        class Another(Environment):
            kind = "workspace"

    with pytest.raises(TypeError, match="names no suite kind"):

        @register_environment
        class Nameless(Environment):
            pass

    assert type(environment_for("workspace")) is WorkspaceEnvironment

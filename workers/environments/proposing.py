"""The environment of an agentic proposer (coevo/campaigns/proposers/agentic.py): a program
harness that edits a working copy of the parent harness instead of solving a task.

Its workspace (``/app``) is the parent candidate's tree, writable; the campaign's history is
read-only at ``/history`` (``record.md``, ``shown.json``, ``candidates/<sha>/``: search-split
material only); its model boundary answers with the proposer's endpoint. Nothing is verified
here: what it leaves in ``/app`` is the proposal, which the campaign's own stages (applies,
manifest, imports, smoke, search, validation) then judge.
"""

from __future__ import annotations

from typing import Any

from workers.environments.base import Environment, Verdict
from workers.environments.workspace import MOUNT, exec_command

HISTORY_MOUNT = "/history"


def harness_view(inputs: dict[str, Any]) -> dict[str, Any]:
    return {
        "instruction": inputs["instruction"],
        "files": sorted(inputs.get("files") or {}),
        "components": list(inputs.get("components") or []),
        "workspace": MOUNT,
        "history": HISTORY_MOUNT,
    }


def verify(
    *, inputs: dict[str, Any], verifier: dict[str, Any], answer: Any, workspace: Any
) -> Verdict:
    return Verdict(True, 1.0, "the proposer finished: its edits are the proposal")


class ProposingEnvironment(Environment):
    """An agentic proposer's environment (see the module doc): not a suite kind, so not
    registered; coevo/campaigns/proposers/agentic.py uses it directly."""

    workspace = True
    helpers = {"exec": exec_command}
    harness_view = staticmethod(harness_view)
    verify = staticmethod(verify)


ENVIRONMENT = ProposingEnvironment()

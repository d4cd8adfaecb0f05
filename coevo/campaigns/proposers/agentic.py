"""The ``agentic`` proposer (Meta-Harness): a coding agent edits a working copy of the parent
after reading the campaign's whole history as files it can grep.

The agent is itself a program harness, a candidate of the project (``program``: its SHA), so a
team versions its proposers in the harness store like its harnesses; `examples/proposers/`
ships one. It runs in the sandbox as any program harness does (workers/environments/
proposing.py): the parent's tree is its workspace at ``/app``, writable; the history is
read-only at ``/history``; its model boundary answers with the proposer's endpoint (a
registered endpoint by name, as for llm-patch, never a URL a campaign's author types). What it
leaves in ``/app`` is the proposal, held to the same rules as llm-patch's edits (declared
components only; the manifest keeps its components, entrypoint and command), then judged by
the campaign's stages like any proposal.

The history (``agentic_history_write``) is the record llm-patch is shown (the parent's
editable files, earlier proposals with their patches, search scores and rejection reasons,
per-task search results, failed search traces, failure patterns), written to ``record.md``
and ``shown.json``, plus the trees of the candidates it lists under ``candidates/<sha>/``:
search-split material only (coevo/campaigns/workspace.py filters it at the query), and code.
The agent's model calls and wall time are proposer spend.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from coevo.campaigns.edits import EditRejected, changes_check
from coevo.campaigns.models import Campaign, ProposerKind
from coevo.campaigns.proposers.base import Draft, stage
from coevo.campaigns.proposers.llm_patch import (
    _unified,
    llm_patch_options_validate,
    proposer_client,
    proposer_parent,
)
from coevo.campaigns.workspace import DEFAULT_BUDGET_CHARS, workspace_build
from coevo.errors import InvalidInput, InvalidManifest, PolicyUnavailable
from coevo.projects.models import Project
from harness_store.manifest import MANIFEST_NAME, Manifest, load_manifest, parse_manifest
from harness_store.models import Candidate
from harness_store.selectors import candidate_export, candidate_read_file
from workers.environments import proposing
from workers.environments.workspace import Workspace
from workers.environments.workspace_files import (
    TreeError,
    WorkspaceRefused,
    spec_bytes,
    tree_from_dir,
)
from workers.harness_env import harness_env_prepare
from workers.outcomes import DependencyBuildFailed, RolloutOutcome
from workers.rollout import RolloutInputs, TaskEnvironment, execute_rollout
from workers.trace import Error, HelperCall, Log, ModelCall, ProgramOutput, Step

logger = logging.getLogger(__name__)

OPTION_KEYS = (
    "program",
    "endpoint",
    "base_url",
    "model",
    "parent",
    "workspace_chars",
    "timeout_s",
    "history_candidates",
    "knobs",
)
# Below the campaign_advance task's soft time limit (300 s), which the draft runs inside.
MAX_TIMEOUT_S = 270
SHA = re.compile(r"^[0-9a-f]{7,40}$")
MAX_RESPONSE_CHARS = 20_000
MAX_PROPOSAL_FILES = 500
MAX_PROPOSAL_BYTES = 16 * 1024**2

INSTRUCTION = """Improve this LLM-agent harness: the code and prompts that drive a language model
(the policy) to solve the tasks of a suite. /app is a working copy of the parent candidate
{parent}: edit it in place. Read /history/record.md first (the earlier proposals with their
patches and search scores, the per-task search results, the traces of failed search tasks,
the failure patterns); earlier candidates' full trees are under /history/candidates/<sha>/.
Form ONE hypothesis about what makes tasks fail and make a targeted change for it. Edit only
the declared components: {components}. Do not change [harness] components, entrypoint or
command in harness.toml. When done, exit; you may write your hypothesis, one line, as a JSON
string to $COEVO_ANSWER_FILE."""


def agentic_options_validate(
    *, manifest: Manifest, options: dict[str, Any], project: Project
) -> dict[str, Any]:
    """``program`` (required: the SHA, or a unique prefix of 7+ hex digits, of the project's
    candidate holding the proposer program; kept as the full SHA), ``knobs`` (overrides of the
    program's knobs), ``history_candidates`` (0..50, default 12: candidate trees under
    /history/candidates), ``timeout_s`` (1..270, default 240: the program's wall time), and
    llm-patch's ``endpoint``, ``model``, ``parent`` and ``workspace_chars`` (the record's
    size)."""
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise InvalidInput(
            f"agentic proposer: unknown options {unknown} (known: {', '.join(OPTION_KEYS)})."
        )
    program = options.get("program")
    if not isinstance(program, str) or not SHA.match(program.strip().lower()):
        raise InvalidInput(
            "agentic proposer: program must be the SHA (7 to 40 hex digits) of the project's "
            "candidate that holds the proposer program (e.g. examples/proposers/agentic, "
            "imported as a candidate)."
        )
    shared = {k: v for k, v in options.items() if k in llm_patch_keys()}
    cleaned = llm_patch_options_validate(
        manifest=manifest, options=shared, label="agentic", keys=llm_patch_keys()
    )
    if cleaned["timeout_s"] > MAX_TIMEOUT_S:
        raise InvalidInput(
            f"agentic proposer: timeout_s must be at most {MAX_TIMEOUT_S} (the draft runs "
            "inside a task with a 300 s limit)."
        )
    cleaned["program"] = program.strip().lower()
    knobs = options.get("knobs", {})
    if not isinstance(knobs, dict) or len(json.dumps(knobs, default=str)) > 4000:
        raise InvalidInput("agentic proposer: knobs must be an object (at most 4000 characters).")
    cleaned["knobs"] = knobs
    count = options.get("history_candidates", 12)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 50:
        raise InvalidInput("agentic proposer: history_candidates must be an integer in 0..50.")
    cleaned["history_candidates"] = count
    # Refused now, not at every draft: a program of another project is never this campaign's.
    # The full SHA: a prefix unique today may match a candidate imported later.
    matches = _program_matches(project_id=project.id, program=cleaned["program"])
    if not matches:
        raise InvalidInput(
            f"agentic proposer: program {cleaned['program']}: no candidate of this project has "
            "that commit (import the proposer program into this project first, e.g. "
            "examples/proposers/agentic)."
        )
    if len(matches) > 1:
        raise InvalidInput(
            f"agentic proposer: program {cleaned['program']} is the start of several candidates' "
            "SHAs in this project: give more of its SHA."
        )
    cleaned["program"] = matches[0].sha
    return cleaned


def _program_matches(*, project_id: Any, program: str) -> list[Candidate]:
    """At most two of the project's candidates whose SHA starts with ``program``."""
    return list(Candidate.objects.filter(project=project_id, sha__startswith=program)[:2])


def llm_patch_keys() -> tuple[str, ...]:
    return ("endpoint", "base_url", "model", "parent", "workspace_chars", "timeout_s")


def agentic_history_write(
    *,
    campaign: Campaign,
    parent: Candidate,
    manifest: Manifest,
    directory: Path,
    budget_chars: int = DEFAULT_BUDGET_CHARS,
    candidates: int = 12,
) -> dict[str, Any]:
    """Write the history the agent reads at /history into ``directory`` (which exists, empty)
    and return what it was shown (the proposal's ``shown``)."""
    record = workspace_build(
        campaign=campaign, parent=parent, manifest=manifest, budget_chars=budget_chars
    )
    (directory / "record.md").write_text(record.text)
    shown = dict(record.shown)
    shown["proposer"] = ProposerKind.AGENTIC.value
    (directory / "shown.json").write_text(json.dumps(shown, indent=2, default=str))
    trees = directory / "candidates"
    trees.mkdir()
    listed = [c.get("sha") for c in shown.get("candidates", []) if isinstance(c, dict)]
    exported = []
    for sha in [parent.sha, *listed]:
        if len(exported) >= candidates or not sha or sha in exported:
            continue
        candidate = Candidate.objects.filter(project=campaign.project_id, sha=sha).first()
        if candidate is None:
            continue
        (trees / sha).mkdir()
        candidate_export(candidate=candidate, destination=trees / sha)
        exported.append(sha)
    shown["history_candidates"] = exported
    _readable(directory)
    return shown


class AgenticProposer:
    drafts_slowly = True

    def __init__(self, campaign: Campaign, options: dict[str, Any]) -> None:
        self.campaign = campaign
        self.options = options

    def propose(self, *, history: list[dict[str, Any]]) -> Draft:
        campaign = self.campaign
        parent = proposer_parent(campaign=campaign, options=self.options, kind=ProposerKind.AGENTIC)
        manifest_text = candidate_read_file(candidate=parent, path=MANIFEST_NAME).decode()
        manifest = parse_manifest(tomllib.loads(manifest_text))
        instruction = INSTRUCTION.format(
            parent=parent.sha[:12], components=", ".join(manifest.components)
        )
        draft = Draft(
            kind=ProposerKind.AGENTIC,
            parents=[parent],
            changes={},
            message="agentic: (no hypothesis)",
            prompt=instruction,
            proposer_wall_ms=0,  # until the agent runs: no request, no proposer time
        )
        program = self._program()
        if program is None:
            draft.stages.append(
                stage(
                    "applies",
                    False,
                    f"the proposer program {self.options['program'][:12]} is not a candidate of "
                    "this project (import it first, e.g. examples/proposers/agentic)",
                )
            )
            return draft
        try:
            client, endpoint = proposer_client(campaign=campaign, options=self.options)
        except InvalidInput as exc:
            draft.stages.append(stage("applies", False, f"{exc} No request was sent."))
            return draft
        draft.params = {"program": program.sha, "endpoint": endpoint, "parent": parent.sha}
        with tempfile.TemporaryDirectory(prefix="coevo-agentic-") as tmp:
            base = Path(tmp)
            for name in ("program", "parent", "history"):
                (base / name).mkdir()
            candidate_export(candidate=program, destination=base / "program")
            try:
                if not load_manifest(base / "program").is_program:
                    raise InvalidManifest("it has an entrypoint, not a command")
                harness_env = harness_env_prepare(harness_dir=base / "program")
            except (InvalidManifest, DependencyBuildFailed) as exc:
                draft.stages.append(
                    stage("applies", False, f"the proposer program cannot run: {exc}")
                )
                return draft
            candidate_export(candidate=parent, destination=base / "parent")
            start = tree_from_dir(base / "parent", label="the parent's tree")
            draft.shown = agentic_history_write(
                campaign=campaign,
                parent=parent,
                manifest=manifest,
                directory=base / "history",
                budget_chars=self.options.get("workspace_chars", DEFAULT_BUDGET_CHARS),
                candidates=self.options.get("history_candidates", 12),
            )
            workspace = Workspace.create(
                start, ro_binds={base / "history": proposing.HISTORY_MOUNT}
            )
            try:
                with harness_env:
                    self._run(draft, workspace, base / "program", harness_env.path, client, start)
                if draft.failed:
                    return draft
                self._take(draft, workspace, start, manifest, manifest_text)
            finally:
                workspace.close()
        return draft

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None:
        return None  # stateless: the next history reads every outcome from the records

    def _program(self) -> Candidate | None:
        matches = _program_matches(
            project_id=self.campaign.project_id, program=self.options["program"]
        )
        return matches[0] if len(matches) == 1 else None

    def _run(
        self,
        draft: Draft,
        workspace: Workspace,
        program_dir: Path,
        harness_env: Path | None,
        client: Any,
        start: dict[str, Any],
    ) -> None:
        inputs = {
            "instruction": draft.prompt,
            "files": start,
            "components": list(parse_components(start)),
        }
        made = self.campaign.proposals.filter(kind=ProposerKind.AGENTIC).count()
        started = time.monotonic()
        with client:
            result = execute_rollout(
                RolloutInputs(
                    harness_dir=program_dir,
                    task_key="propose",
                    task_view=proposing.harness_view(inputs),
                    knob_overrides=self.options.get("knobs", {}),
                    seed=self.campaign.seed + made,
                    wall_time_s=self.options.get("timeout_s", 240),
                    policy_version=f"proposer {draft.params['endpoint']}",
                    harness_env=harness_env,
                ),
                policy=client,
                environment=TaskEnvironment(
                    adapter=proposing.ENVIRONMENT, inputs=inputs, verifier={}, workspace=workspace
                ),
            )
        draft.proposer_wall_ms = round(1000 * (time.monotonic() - started))
        draft.proposer_tokens = result.prompt_tokens + result.completion_tokens
        draft.proposer_cost_usd = result.cost_usd
        draft.response = _transcript(result.steps)
        draft.params.update(
            {
                "outcome": str(result.outcome),
                "detail": result.detail[:500],
                "model_calls": result.model_calls,
                "usage": {
                    "prompt_tokens": result.prompt_tokens,
                    "completion_tokens": result.completion_tokens,
                },
            }
        )
        if result.outcome == RolloutOutcome.INFRA_ERROR:
            # The proposer's server is down (or the sandbox): not a proposal; the next advance
            # retries, as for llm-patch.
            raise PolicyUnavailable(f"the agentic proposer could not run: {result.detail}")
        if result.outcome == RolloutOutcome.HARNESS_ERROR:
            draft.stages.append(
                stage("applies", False, f"the proposer program failed: {result.detail[:500]}")
            )
            return
        if isinstance(result.answer, str) and result.answer.strip():
            hypothesis = result.answer.strip().splitlines()[0][:300]
            draft.params["hypothesis"] = hypothesis
            draft.message = f"agentic: {hypothesis}"

    def _take(
        self,
        draft: Draft,
        workspace: Workspace,
        start: dict[str, Any],
        manifest: Manifest,
        manifest_text: str,
    ) -> None:
        """The edited working copy as the draft's changes, held to the edits' rules."""
        try:
            changes = workspace.changes(max_files=MAX_PROPOSAL_FILES, max_bytes=MAX_PROPOSAL_BYTES)
            changes_check(
                changes=changes, manifest_text=manifest_text, components=manifest.components
            )
        except (TreeError, WorkspaceRefused, EditRejected) as exc:
            draft.stages.append(stage("applies", False, str(exc)))
            return
        if not changes:
            draft.stages.append(stage("applies", False, "the proposer changed nothing"))
            return
        draft.changes = changes
        texts = {}
        for path, spec in start.items():
            try:
                texts[path] = spec_bytes(spec).decode()
            except UnicodeDecodeError:
                continue
        draft.patch = _unified(texts, changes)
        draft.stages.append(
            stage(
                "applies",
                True,
                f"{len(changes)} file(s) changed: {', '.join(sorted(changes))}",
            )
        )


def parse_components(start: dict[str, Any]) -> tuple[str, ...]:
    """The parent's declared components, from its manifest in ``start``."""
    try:
        manifest = parse_manifest(tomllib.loads(spec_bytes(start[MANIFEST_NAME]).decode()))
    except (KeyError, InvalidManifest, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return ()
    return tuple(manifest.components)


def _transcript(steps: list[Step]) -> str:
    """The agent's run for the proposal page: its model calls (the last message it sent and
    what came back), logs and errors, cut to a size."""
    lines: list[str] = []
    for step in steps:
        typed = step.typed()
        if isinstance(typed, ModelCall):
            messages = typed.messages or []
            last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
            asked = str(last.get("content") or typed.prompt or "")[-600:]
            calls = typed.tool_calls or []
            said = str(typed.completion or "")[:800]
            lines.append(
                f"[asked] {asked}\n[model] {said}" + (f"\n[tools] {calls}" if calls else "")
            )
        elif isinstance(typed, Log | HelperCall | Error | ProgramOutput):
            lines.append(f"[{typed.kind}] {json.dumps(typed.to_payload(), default=str)[:600]}")
    text = "\n".join(lines)
    return text if len(text) <= MAX_RESPONSE_CHARS else text[-MAX_RESPONSE_CHARS:]


def _readable(directory: Path) -> None:
    """The sandbox's uid reads the history: directories 0755, files 0644 (whatever the
    worker's umask made them)."""
    for root, _dirs, files in os.walk(directory):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.chmod(path, 0o644)

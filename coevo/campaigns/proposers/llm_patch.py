"""The ``llm-patch`` proposer (Meta-Harness): a proposer model reads the campaign's workspace
(code, search scores, failing search traces) and answers with a hypothesis and edits.

The proposer model is configured per campaign, separately from the policy (a stronger model
is typical), and reached through ``coevo.policies.client.PolicyClient`` like every model.
What it was shown, the prompt, the raw answer and its token usage are recorded on the
proposal; its tokens are proposer spend, kept on the proposal and never charged to the
campaign's policy budget (the ledger has no proposer unit yet).

Validation: ``applies`` is decided here (coevo.campaigns.edits); the runner then records the
manifest, imports, duplicate and smoke stages.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import tomllib
from typing import Any

from django.conf import settings

from coevo.campaigns.edits import EditRejected, answer_parse, edits_apply, path_check
from coevo.campaigns.models import Campaign, ProposerKind
from coevo.campaigns.proposers.base import Draft, stage
from coevo.campaigns.workspace import DEFAULT_BUDGET_CHARS, workspace_build
from coevo.errors import HarnessStoreError, InvalidInput, NotFound, PolicyRequestRejected
from coevo.policies.client import PolicyClient, Sampling
from coevo.policies.services import policy_client_for
from harness_store.models import Candidate
from harness_store.selectors import candidate_read_file
from workers.manifest import MANIFEST_NAME, Manifest, parse_manifest

logger = logging.getLogger(__name__)

API_KINDS = ("chat", "completions")
PARENT_RULES = ("best", "front")
OPTION_KEYS = (
    "base_url",
    "model",
    "api",
    "max_tokens",
    "temperature",
    "workspace_chars",
    "parent",
    "timeout_s",
)


def llm_patch_options_validate(*, manifest: Manifest, options: dict[str, Any]) -> dict[str, Any]:
    """The ``llm-patch`` strategy entry's options, with defaults filled in.

    ``base_url`` (an OpenAI-compatible endpoint; default: the campaign's policy endpoint),
    ``model`` (default: the policy version's served name), ``api`` (chat|completions, default
    completions),
    ``max_tokens`` (1..32768, default 1024), ``temperature`` (0..2, default 0.7),
    ``workspace_chars`` (2000..1000000, default 24000), ``parent`` (best: the best candidate on
    validation; front: a candidate of the per-task search front, rotating), ``timeout_s``
    (default 240: the proposal is written inside the campaign_advance task, whose soft time
    limit is 300 s; outside the campaign's row lock, so nothing else waits on it).
    """
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise InvalidInput(
            f"llm-patch proposer: unknown options {unknown} (known: {', '.join(OPTION_KEYS)})."
        )
    if not manifest.components:
        raise InvalidInput(
            f"llm-patch proposer: the seed's {MANIFEST_NAME} declares no components, so there "
            'is nothing it may edit (add e.g. components = ["agent.py"] under [harness]).'
        )
    cleaned: dict[str, Any] = {}
    for key in ("base_url", "model"):
        if key not in options:
            continue  # resolved when proposing: the campaign's policy endpoint / served name
        value = options[key]
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(f"llm-patch proposer: {key} must be a non-empty string.")
        cleaned[key] = value.strip()
    if not cleaned.get("base_url", "http://").startswith(("http://", "https://")):
        raise InvalidInput("llm-patch proposer: base_url must be an http(s) URL.")
    api = options.get("api", "completions")
    if api not in API_KINDS:
        raise InvalidInput(f"llm-patch proposer: api must be one of {', '.join(API_KINDS)}.")
    cleaned["api"] = api
    parent = options.get("parent", "best")
    if parent not in PARENT_RULES:
        raise InvalidInput(f"llm-patch proposer: parent must be one of {', '.join(PARENT_RULES)}.")
    cleaned["parent"] = parent
    cleaned["max_tokens"] = _number(options, "max_tokens", 1024, 1, 32768, integer=True)
    cleaned["temperature"] = _number(options, "temperature", 0.7, 0.0, 2.0, integer=False)
    cleaned["workspace_chars"] = _number(
        options, "workspace_chars", DEFAULT_BUDGET_CHARS, 2000, 1_000_000, integer=True
    )
    cleaned["timeout_s"] = _number(options, "timeout_s", 240, 1, 3600, integer=True)
    return cleaned


def _number(
    options: dict[str, Any], key: str, default: float, low: float, high: float, *, integer: bool
) -> Any:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"llm-patch proposer: {key} must be a number.")
    if integer and not float(value).is_integer():
        raise InvalidInput(f"llm-patch proposer: {key} must be an integer.")
    if not low <= value <= high:
        raise InvalidInput(f"llm-patch proposer: {key} must be between {low:g} and {high:g}.")
    return int(value) if integer else float(value)


class LlmPatchProposer:
    drafts_slowly = True

    def __init__(self, campaign: Campaign, options: dict[str, Any]) -> None:
        self.campaign = campaign
        self.options = options

    def propose(self, *, history: list[dict[str, Any]]) -> Draft:
        parent = self._parent()
        manifest_text = candidate_read_file(candidate=parent, path=MANIFEST_NAME).decode()
        manifest = parse_manifest(tomllib.loads(manifest_text))
        workspace = workspace_build(
            campaign=self.campaign,
            parent=parent,
            manifest=manifest,
            budget_chars=self.options.get("workspace_chars", DEFAULT_BUDGET_CHARS),
        )
        draft = Draft(
            kind=ProposerKind.LLM_PATCH,
            parents=[parent],
            changes={},
            message="llm-patch: (no hypothesis)",
            shown=workspace.shown,
            prompt=workspace.text,
        )
        sampling = Sampling(
            max_tokens=self.options.get("max_tokens", 1024),
            temperature=self.options.get("temperature", 0.7),
            seed=self.campaign.seed + len(workspace.shown["proposals"]),
        )
        draft.params = {
            "model": self.options.get("model", self.campaign.policy_version.served_name),
            "base_url": self.options.get("base_url", "(the policy endpoint)"),
            "api": self.options.get("api", "completions"),
            "sampling": sampling.as_params(),
            "parent_rule": self.options.get("parent", "best"),
        }
        try:
            completion = self._ask(workspace.text, sampling)
        except PolicyRequestRejected as exc:
            # A 4xx is a persistent answer (say, the workspace exceeds the proposer's context):
            # recorded as a rejected proposal. PolicyUnavailable (the server is down) propagates:
            # an infrastructure failure must not count as a proposal; the next advance retries.
            draft.stages.append(stage("applies", False, f"the proposer model refused: {exc}"))
            return draft
        draft.response = completion.text
        draft.proposer_tokens = completion.prompt_tokens + completion.completion_tokens
        draft.params["usage"] = {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "finish_reason": completion.finish_reason,
        }
        try:
            answer = answer_parse(completion.text)
            draft.params["hypothesis"] = answer.hypothesis
            draft.params["format"] = answer.format
            draft.message = f"llm-patch: {answer.hypothesis}"
            files = dict(workspace.files)
            files[MANIFEST_NAME] = manifest_text
            for path in answer.paths:
                path = path_check(path, manifest.components)  # refused paths are never read
                if path not in files:
                    # Absent (a new file) or binary: edits_apply says which.
                    with contextlib.suppress(HarnessStoreError, NotFound, UnicodeDecodeError):
                        files[path] = candidate_read_file(candidate=parent, path=path).decode()
            changes = edits_apply(answer=answer, files=files, components=manifest.components)
        except EditRejected as exc:
            draft.stages.append(stage("applies", False, str(exc)))
            return draft
        draft.changes = changes
        draft.patch = _unified(files, changes)
        draft.stages.append(
            stage(
                "applies",
                True,
                f"{len(changes)} file(s) changed: {', '.join(sorted(changes)) or 'none'}",
            )
        )
        return draft

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None:
        # Stateless: the next workspace reads every outcome from the campaign's records.
        return None

    def _client(self) -> PolicyClient:
        version = self.campaign.policy_version
        if "base_url" not in self.options:
            # The policy's own endpoint, holding one of its concurrency slots per request.
            client = policy_client_for(version=version)
            client.model = self.options.get("model", version.served_name)
            return client
        return PolicyClient(
            self.options["base_url"],
            model=self.options.get("model", version.served_name),
            timeout_s=self.options.get("timeout_s", 240),
            retries=settings.COEVO_POLICY_RETRIES,
        )

    def _ask(self, text: str, sampling: Sampling) -> Any:
        with self._client() as client:
            if self.options.get("api", "completions") == "chat":
                return client.chat([{"role": "user", "content": text}], sampling)
            return client.complete(text, sampling)

    def _parent(self) -> Candidate:
        """The best candidate on validation, or (``parent = front``) the candidates of the
        per-task search front in turn: each solves some search task best."""
        campaign = self.campaign
        best = campaign.best_candidate or campaign.seed_candidate
        if self.options.get("parent") != "front":
            return best
        from coevo.campaigns.selectors import campaign_task_front

        front = sorted(
            {sha for shas in campaign_task_front(campaign=campaign).values() for sha in shas}
        )
        if not front:
            return best
        made = campaign.proposals.filter(kind=ProposerKind.LLM_PATCH).count()
        sha = front[made % len(front)]
        return Candidate.objects.filter(project=campaign.project_id, sha=sha).first() or best


def _unified(files: dict[str, str], changes: dict[str, bytes | None]) -> str:
    parts = []
    for path in sorted(changes):
        before = files.get(path)
        after = changes[path]
        parts.extend(
            difflib.unified_diff(
                (before or "").splitlines(keepends=True),
                (after or b"").decode().splitlines(keepends=True),
                fromfile=f"a/{path}" if before is not None else "/dev/null",
                tofile=f"b/{path}" if after is not None else "/dev/null",
            )
        )
    return "".join(parts)

"""The ``llm-patch`` proposer (Meta-Harness): a proposer model reads the campaign's workspace
(code, search scores, failing search traces) and answers with a hypothesis and edits.

The proposer model is configured per campaign, separately from the policy (a stronger model
is typical), and reached through ``coevo.policies.client.PolicyClient`` like every model. It is
served by a *registered* policy endpoint (``endpoint``: its name), never by a URL a campaign's
author types: the worker posts a whole workspace there and reads the answer, so an arbitrary
URL would let any researcher make the worker send requests into its own network (the cloud's
metadata service, Redis, PostgreSQL) and read what comes back. Only operators register
endpoints (the admin), and the worker checks the name again before each request.
What it was shown, the prompt, the raw answer and its token usage are recorded on the
proposal; its tokens and the model call's wall time are proposer spend, charged to the
campaign's budget as proposer units (never as policy tokens) by the runner.

The workspace is fitted to the proposer model's context window (fitting.py), and the answer
is asked for as JSON the server enforces where it can (coevo.campaigns.answers:
``answer_format`` auto picks it by what the server is), else in the free-text format.

Validation: ``applies`` is decided here (coevo.campaigns.edits); the runner then records the
manifest, imports, duplicate and smoke stages.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import time
import tomllib
from typing import Any

from django.conf import settings

from coevo.campaigns.answers import (
    ANSWER_FORMATS,
    JSON_FORMATS,
    answer_format_choose,
    answer_parse_json,
)
from coevo.campaigns.edits import EditRejected, answer_parse, edits_apply, path_check
from coevo.campaigns.models import Campaign, ProposerKind
from coevo.campaigns.proposers.base import Draft, stage
from coevo.campaigns.proposers.fitting import (
    PromptTooLarge,
    context_window_resolve,
    workspace_fit,
)
from coevo.campaigns.selectors import campaign_task_front
from coevo.campaigns.workspace import DEFAULT_BUDGET_CHARS, ProposerPrompt, workspace_build
from coevo.errors import HarnessStoreError, InvalidInput, NotFound, PolicyRequestRejected
from coevo.policies.client import (
    PolicyClient,
    RoutedPolicyClient,
    Sampling,
    ServerFlavor,
    ServerInfo,
    normalize_base_url,
)
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.services import policy_client_for, policy_client_for_endpoint
from harness_store.manifest import MANIFEST_NAME, Manifest, parse_manifest
from harness_store.models import Candidate
from harness_store.selectors import candidate_files, candidate_read_file

logger = logging.getLogger(__name__)

API_KINDS = ("chat", "completions")
PARENT_RULES = ("best", "front")
OPTION_KEYS = (
    "endpoint",
    "base_url",
    "model",
    "api",
    "max_tokens",
    "temperature",
    "workspace_chars",
    "parent",
    "timeout_s",
    "context_tokens",
    "answer_format",
)
# What an endpoint's registered kind says its server is, where its replies do not tell.
_KIND_FLAVORS = {
    EndpointKind.VLLM: ServerFlavor.VLLM,
    EndpointKind.LLAMACPP: ServerFlavor.LLAMA_CPP,
}


def llm_patch_options_validate(
    *,
    manifest: Manifest,
    options: dict[str, Any],
    label: str = "llm-patch",
    keys: tuple[str, ...] = OPTION_KEYS,
) -> dict[str, Any]:
    """The ``llm-patch`` strategy entry's options, with defaults filled in.

    ``endpoint`` (the name of a registered policy endpoint serving the proposer model;
    default: the campaign's policy endpoint; ``base_url`` is still accepted when it is a
    registered endpoint's URL, and is stored as that endpoint's name),
    ``model`` (default: the policy version's served name), ``api`` (chat|completions, default
    completions),
    ``max_tokens`` (1..32768, default 1024), ``temperature`` (0..2, default 0.7),
    ``workspace_chars`` (2000..1000000, default 24000), ``parent`` (best: the best candidate on
    validation; front: a candidate of the per-task search front, rotating), ``timeout_s``
    (default 240: the proposal is written inside the campaign_advance task, whose soft time
    limit is 300 s; outside the campaign's row lock, so nothing else waits on it),
    ``context_tokens`` (256..10000000; the proposer model's context window where its server
    does not report one; the smaller counts where both are known; default: the
    COEVO_PROPOSER_CONTEXT_TOKENS setting), ``answer_format`` (auto|json|json-lines|text,
    default auto: json-lines on llama.cpp and llama-cpp-python, json on vLLM, by the server's
    replies or its endpoint's kind, enforced by a grammar or a JSON schema; else the free-text
    format).
    """
    unknown = sorted(set(options) - set(keys))
    if unknown:
        raise InvalidInput(
            f"{label} proposer: unknown options {unknown} (known: {', '.join(keys)})."
        )
    if not manifest.components:
        raise InvalidInput(
            f"{label} proposer: the seed's {MANIFEST_NAME} declares no components, so there "
            'is nothing it may edit (add e.g. components = ["agent.py"] under [harness]).'
        )
    cleaned: dict[str, Any] = {}
    for key in ("endpoint", "base_url", "model"):
        if key not in options:
            continue  # resolved when proposing: the campaign's policy endpoint / served name
        value = options[key]
        if not isinstance(value, str) or not value.strip():
            raise InvalidInput(f"{label} proposer: {key} must be a non-empty string.")
        cleaned[key] = value.strip()
    if "endpoint" in cleaned and "base_url" in cleaned:
        raise InvalidInput(
            f"{label} proposer: give endpoint (a registered endpoint's name), not both "
            "endpoint and base_url."
        )
    if "endpoint" in cleaned or "base_url" in cleaned:
        endpoint = llm_patch_endpoint(options=cleaned, label=label)
        cleaned.pop("base_url", None)
        cleaned["endpoint"] = endpoint.name
    api = options.get("api", "completions")
    if api not in API_KINDS:
        raise InvalidInput(f"{label} proposer: api must be one of {', '.join(API_KINDS)}.")
    cleaned["api"] = api
    parent = options.get("parent", "best")
    if parent not in PARENT_RULES:
        raise InvalidInput(f"{label} proposer: parent must be one of {', '.join(PARENT_RULES)}.")
    cleaned["parent"] = parent
    number = functools.partial(_number, label=label)
    cleaned["max_tokens"] = number(options, "max_tokens", 1024, 1, 32768, integer=True)
    cleaned["temperature"] = number(options, "temperature", 0.7, 0.0, 2.0, integer=False)
    cleaned["workspace_chars"] = number(
        options, "workspace_chars", DEFAULT_BUDGET_CHARS, 2000, 1_000_000, integer=True
    )
    cleaned["timeout_s"] = number(options, "timeout_s", 240, 1, 3600, integer=True)
    if "context_tokens" in options:
        cleaned["context_tokens"] = number(
            options, "context_tokens", 0, 256, 10_000_000, integer=True
        )
    answer_format = options.get("answer_format", "auto")
    if answer_format not in ANSWER_FORMATS:
        raise InvalidInput(
            f"{label} proposer: answer_format must be one of {', '.join(ANSWER_FORMATS)}."
        )
    cleaned["answer_format"] = answer_format
    return {key: value for key, value in cleaned.items() if key in keys}


def llm_patch_endpoint(*, options: dict[str, Any], label: str = "llm-patch") -> PolicyEndpoint:
    """The registered policy endpoint the options name (``endpoint``, or a stored ``base_url``
    equal to a registered endpoint's URL, as campaigns created before endpoints were named
    have); InvalidInput for anything else. Checked when a campaign starts and again by the
    worker before each request (an endpoint may have been removed since)."""
    if "endpoint" in options:
        endpoint = PolicyEndpoint.objects.filter(name=options["endpoint"]).first()
        wanted = f"endpoint {str(options['endpoint'])[:64]!r} is not a registered policy endpoint"
    else:
        url = str(options.get("base_url", ""))
        wanted = "base_url is not the URL of a registered policy endpoint"
        endpoint = None
        if url.startswith(("http://", "https://")):
            url = normalize_base_url(url)
            endpoint = next(
                (e for e in PolicyEndpoint.objects.all() if normalize_base_url(e.base_url) == url),
                None,
            )
    if endpoint is not None:
        return endpoint
    names = list(PolicyEndpoint.objects.order_by("name").values_list("name", flat=True)[:20])
    raise InvalidInput(
        f"{label} proposer: {wanted}. Choose one by name with endpoint "
        f"({', '.join(names) or 'none registered'}); an operator registers endpoints in the admin."
    )


def _number(
    options: dict[str, Any],
    key: str,
    default: float,
    low: float,
    high: float,
    *,
    integer: bool,
    label: str = "llm-patch",
) -> Any:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{label} proposer: {key} must be a number.")
    if integer and not float(value).is_integer():
        raise InvalidInput(f"{label} proposer: {key} must be an integer.")
    if not low <= value <= high:
        raise InvalidInput(f"{label} proposer: {key} must be between {low:g} and {high:g}.")
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
        budget_chars = self.options.get("workspace_chars", DEFAULT_BUDGET_CHARS)
        max_tokens = self.options.get("max_tokens", 1024)
        api = self.options.get("api", "completions")

        def build(chars: int, answer_format: str = "text") -> ProposerPrompt:
            return workspace_build(
                campaign=self.campaign,
                parent=parent,
                manifest=manifest,
                budget_chars=chars,
                answer_format=answer_format,
            )

        params: dict[str, Any] = {
            "model": self.options.get("model", self.campaign.policy_version.served_name),
            "endpoint": "(the policy endpoint)",
            "api": api,
            "parent_rule": self.options.get("parent", "best"),
        }
        try:
            client, params["endpoint"] = self._client()
        except InvalidInput as exc:
            # Checked before any request: a campaign whose endpoint was removed, or one stored
            # with a base_url that no registered endpoint has, sends nothing.
            draft, _ = self._draft(parent, build(budget_chars), params, max_tokens)
            draft.stages.append(stage("applies", False, f"{exc} No request was sent."))
            return draft
        with client:
            info = client.server_info()
            # What the server showed it is decides what it is sent (a grammar, a schema).
            client.kind_learn(info.flavor)
            answer_format, fields, enforced_by = self._answer_format(info, manifest, parent)
            window = context_window_resolve(
                server_tokens=info.context_tokens,
                option_tokens=self.options.get("context_tokens"),
                setting_tokens=settings.COEVO_PROPOSER_CONTEXT_TOKENS,
            )
            flavor = info.flavor or self._kind_flavor()
            params.update(
                server=info.flavor,
                answer_format=answer_format,
                enforced_by=enforced_by,
            )
            try:
                workspace, params["context"] = workspace_fit(
                    build=lambda chars: build(chars, answer_format),
                    budget_chars=budget_chars,
                    window=window,
                    max_tokens=max_tokens,
                    count=lambda text: client.token_count(text, flavor=flavor),
                )
            except PromptTooLarge as exc:
                params["context"] = exc.record
                draft, _ = self._draft(parent, exc.workspace, params, max_tokens)
                draft.stages.append(stage("applies", False, str(exc)))
                return draft
            draft, sampling = self._draft(parent, workspace, params, max_tokens)
            started = time.monotonic()
            try:
                completion = self._ask(client, workspace.text, sampling, fields)
            except PolicyRequestRejected as exc:
                # A 4xx is a persistent answer (say, the workspace exceeds the proposer's
                # context): recorded as a rejected proposal. PolicyUnavailable (the server is
                # down) propagates: an infrastructure failure must not count as a proposal; the
                # next advance retries. Every member reads the stage, so it says what the
                # status means, never what the server wrote back; the reply goes to the
                # worker's log.
                logger.warning(
                    "campaign %s: the proposer model refused the request: %s",
                    self.campaign.id,
                    exc,
                )
                draft.stages.append(stage("applies", False, _refusal_summary(exc.status)))
                return draft
            finally:
                # The model call alone: building the workspace is the runner's cost.
                draft.proposer_wall_ms = round(1000 * (time.monotonic() - started))
        draft.response = completion.text
        draft.proposer_tokens = completion.prompt_tokens + completion.completion_tokens
        draft.proposer_cost_usd = completion.cost_usd
        draft.params["usage"] = {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "finish_reason": completion.finish_reason,
            # Its cost and the price row that applied; None: the endpoint has no price.
            "cost": completion.cost_record(),
        }
        try:
            if answer_format in JSON_FORMATS:
                answer = answer_parse_json(completion.text)
            else:
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
            reason = str(exc)
            if completion.finish_reason == "length":
                reason += (
                    f" The answer stopped at max_tokens ({max_tokens}) before it ended: raise "
                    "max_tokens."
                )
            draft.stages.append(stage("applies", False, reason))
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

    def _draft(
        self, parent: Candidate, workspace: ProposerPrompt, params: dict[str, Any], max_tokens: int
    ) -> tuple[Draft, Sampling]:
        shown = workspace.shown
        sampling = Sampling(
            max_tokens=max_tokens,
            temperature=self.options.get("temperature", 0.7),
            # Counted over every proposal the workspace considered, shown or trimmed, so
            # successive proposals of one campaign draw different samples.
            seed=self.campaign.seed
            + len(shown["proposals"])
            + len(shown.get("trimmed", {}).get("proposals", [])),
        )
        draft = Draft(
            kind=ProposerKind.LLM_PATCH,
            parents=[parent],
            changes={},
            message="llm-patch: (no hypothesis)",
            shown=shown,
            prompt=workspace.text,
            proposer_wall_ms=0,  # until the model is asked: no request, no proposer time
            params={**params, "sampling": sampling.as_params()},
        )
        return draft, sampling

    def tell(self, *, trial_number: int | None, outcome: str, value: float | None) -> None:
        # Stateless: the next workspace reads every outcome from the campaign's records.
        return None

    def _client(self) -> tuple[PolicyClient | RoutedPolicyClient, str]:
        return proposer_client(campaign=self.campaign, options=self.options)

    def _ask(
        self,
        client: PolicyClient | RoutedPolicyClient,
        text: str,
        sampling: Sampling,
        fields: dict[str, Any],
    ) -> Any:
        if self.options.get("api", "completions") == "chat":
            body = {"messages": [{"role": "user", "content": text}]}
            return client.forward("chat", {**body, **sampling.as_params(), **fields})
        return client.forward("completions", {"prompt": text, **sampling.as_params(), **fields})

    def _answer_format(
        self, info: ServerInfo, manifest: Manifest, parent: Candidate
    ) -> tuple[str, dict[str, Any], str | None]:
        flavor = info.flavor or self._kind_flavor()
        wanted = self.options.get("answer_format", "auto")
        texts = {}
        if wanted != "text" and (wanted != "auto" or flavor is not None):
            for entry in candidate_files(candidate=parent):
                if not _editable(entry.path, manifest):
                    continue
                with contextlib.suppress(HarnessStoreError, NotFound, UnicodeDecodeError):
                    texts[entry.path] = candidate_read_file(
                        candidate=parent, path=entry.path
                    ).decode()
        return answer_format_choose(
            wanted=wanted, flavor=flavor, texts=texts, components=list(manifest.components)
        )

    def _kind_flavor(self) -> str | None:
        if "endpoint" in self.options or "base_url" in self.options:
            try:
                kind = llm_patch_endpoint(options=self.options).kind
            except InvalidInput:
                return None
        else:
            kind = self.campaign.policy_version.endpoint.kind
        return _KIND_FLAVORS.get(kind)

    def _parent(self) -> Candidate:
        return proposer_parent(
            campaign=self.campaign, options=self.options, kind=ProposerKind.LLM_PATCH
        )


def proposer_client(
    *, campaign: Campaign, options: dict[str, Any]
) -> tuple[PolicyClient | RoutedPolicyClient, str]:
    """The proposer model's client (llm-patch's and the agentic proposer's), and the
    endpoint's name as the proposal records it."""
    version = campaign.policy_version
    if "endpoint" not in options and "base_url" not in options:
        # The policy's own endpoint, holding one of its concurrency slots per request.
        client = policy_client_for(version=version)
        client.model = options.get("model", version.served_name)
        return client, "(the policy endpoint)"
    endpoint = llm_patch_endpoint(options=options)  # again: it may be gone since
    client = policy_client_for_endpoint(
        endpoint=endpoint,
        model=options.get("model", version.served_name),
        timeout_s=options.get("timeout_s", 240),
    )
    return client, endpoint.name


def proposer_parent(*, campaign: Campaign, options: dict[str, Any], kind: str) -> Candidate:
    """The best candidate on validation, or (``parent = front``) the candidates of the
    per-task search front in turn (rotating with the proposals of ``kind``): each solves some
    search task best."""
    best = campaign.best_candidate or campaign.seed_candidate
    if options.get("parent") != "front":
        return best

    front = sorted(
        {sha for shas in campaign_task_front(campaign=campaign).values() for sha in shas}
    )
    if not front:
        return best
    made = campaign.proposals.filter(kind=kind).count()
    sha = front[made % len(front)]
    return Candidate.objects.filter(project=campaign.project_id, sha=sha).first() or best


# What a proposer model's refusal usually means, by status: said to members instead of the reply.
_REFUSALS = {
    400: (
        "often a prompt longer than the model's context (set context_tokens to the model's "
        "context, or lower workspace_chars or max_tokens) or a grammar or response_format the "
        "server does not take (set answer_format to text)"
    ),
    401: "the endpoint wants credentials coevo does not send",
    403: "the endpoint wants credentials coevo does not send",
    404: "often a model name the endpoint does not serve: check the model option",
    413: "the prompt is too large for the endpoint: lower workspace_chars",
    422: "often a prompt longer than the model's context: lower workspace_chars or max_tokens",
}


def _editable(path: str, manifest: Manifest) -> bool:
    try:
        path_check(path, manifest.components)
    except EditRejected:
        return False
    return True


def _refusal_summary(status: int | None) -> str:
    code = f"HTTP {status}" if status else "an error"
    hint = _REFUSALS.get(status or 0, "")
    return (
        f"the proposer model refused the request ({code}{'; ' + hint if hint else ''}); "
        "its reply is in the worker's log"
    )


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

"""API: campaigns (see docs/api.md, Campaigns). Included under ``projects/<slug:slug>/``.

Starting, pausing, resuming, stopping and feeding a campaign a manual candidate need the
``campaigns:run`` scope and the researcher role; every answer to those is ``202`` with the
campaign's status URL (the work itself happens on the workers).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.api.fields import FiniteFloatField, MethodField, OutSerializer, finite
from coevo.campaigns.alternation import SWITCH_RULES
from coevo.campaigns.models import (
    Campaign,
    CampaignState,
    Proposal,
    ProposalState,
    ProposerKind,
)
from coevo.campaigns.policy_steps import next_phase
from coevo.campaigns.selectors import (
    campaign_best_proposal,
    campaign_get,
    campaign_list,
    campaign_progress,
)
from coevo.campaigns.services import (
    MAX_BATCH_SIZE,
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_start,
    campaign_stop,
    campaign_submit_candidate,
)
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.models import Budget
from coevo.evaluations.selectors import search_validation_gap
from coevo.exports.models import ExportFormat
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Role
from coevo.suites.selectors import suite_get
from coevo.training.trainers import MAX_TIME_LIMIT_S
from harness_store.selectors import candidate_get

MAX_SEED = 2**31 - 1
MAX_BUDGET = 2**62
SHA = r"^[0-9a-fA-F]{7,40}$"


# --- serializers ------------------------------------------------------------------------------


class StrategyEntryIn(serializers.Serializer):
    # Checked by the strategy validation (400 naming the proposers available), not by an enum
    # here: which proposers exist is the campaign engine's to say.
    kind = serializers.CharField(
        max_length=32, help_text="config, random, llm-patch, agentic or merge."
    )
    options = serializers.DictField(
        required=False,
        help_text=(
            "Per proposer: e.g. config or random {knobs: [names]}; llm-patch {endpoint (a "
            "registered policy endpoint's name), model, api, max_tokens, ...}; agentic "
            "{program (the SHA of the candidate holding the proposer program), endpoint, "
            "model, knobs, timeout_s, history_candidates}."
        ),
    )


class StrictSerializer(serializers.Serializer):
    """Refuses keys it does not know, as the domain's own validation does: a misspelt option
    must not be dropped in silence."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    f"Unknown key(s) {unknown}; known: {sorted(self.fields)}."
                )
        return super().to_internal_value(data)


class BudgetIn(StrictSerializer):
    rollouts = serializers.IntegerField(min_value=1, max_value=MAX_BUDGET, required=False)
    tokens = serializers.IntegerField(min_value=1, max_value=MAX_BUDGET, required=False)
    wall_s = serializers.IntegerField(min_value=1, max_value=MAX_BUDGET, required=False)
    proposer_tokens = serializers.IntegerField(
        min_value=1,
        max_value=MAX_BUDGET,
        required=False,
        help_text="The proposer models' tokens (prompt and completion), apart from the policy's.",
    )
    proposer_wall_s = serializers.IntegerField(
        min_value=1,
        max_value=MAX_BUDGET // 1000,
        required=False,
        help_text="Seconds the proposers spend writing proposals (llm-patch: its model calls).",
    )
    usd = serializers.DecimalField(
        max_digits=18,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        help_text="US dollars of the policy's calls (endpoints' prices; a rollout reserves its "
        "worst case).",
    )
    proposer_usd = serializers.DecimalField(
        max_digits=18,
        decimal_places=6,
        min_value=Decimal("0.000001"),
        required=False,
        help_text="US dollars of the proposer models' calls; the campaign stops when spent.",
    )


class AlternationExportIn(StrictSerializer):
    format = serializers.ChoiceField(choices=ExportFormat.choices, required=False)
    successful_only = serializers.BooleanField(required=False)
    min_score = serializers.FloatField(min_value=0.0, max_value=1.0, required=False)
    last_turns = serializers.IntegerField(min_value=1, max_value=10_000, required=False)


class AlternationIn(StrictSerializer):
    # Numbers left out take coevo.campaigns.alternation's defaults (docs/api.md, Campaigns).
    trainer = serializers.SlugField(max_length=64, help_text="A registered trainer's name.")
    switch = serializers.ChoiceField(choices=list(SWITCH_RULES), required=False)
    harness_steps = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    policy_steps = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    patience = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    max_policy_steps = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    time_limit_s = serializers.IntegerField(
        min_value=1, max_value=MAX_TIME_LIMIT_S, required=False, help_text="Per training run."
    )
    export = AlternationExportIn(required=False)


class CampaignStartIn(serializers.Serializer):
    seed_candidate = serializers.RegexField(SHA, help_text="The seed candidate's SHA.")
    suite = serializers.SlugField(max_length=64, help_text="Suite name (latest version).")
    suite_version = serializers.CharField(max_length=32, required=False)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    policy_version = serializers.CharField(
        max_length=100, required=False, help_text="Policy version name (default policy)."
    )
    strategy = StrategyEntryIn(
        many=True, required=False, help_text='Default [{"kind": "config"}]; proposers take turns.'
    )
    max_proposals = serializers.IntegerField(min_value=1, max_value=10_000, default=10)
    batch_size = serializers.IntegerField(
        min_value=1,
        max_value=MAX_BATCH_SIZE,
        default=1,
        help_text=(
            "Proposals drafted per round; with more than 1 they are raced on the search split "
            "and those clearly worse than the best are eliminated early."
        ),
    )
    max_candidates = serializers.IntegerField(min_value=1, max_value=10_000, required=False)
    patience = serializers.IntegerField(min_value=1, max_value=10_000, required=False)
    target_score = serializers.FloatField(required=False)
    epochs = serializers.IntegerField(min_value=1, max_value=100, default=1)
    seed = serializers.IntegerField(min_value=0, max_value=MAX_SEED, default=0)
    budget = BudgetIn(required=False)
    alternation = AlternationIn(
        required=False,
        help_text="Alternate harness steps with policy steps that train an adapter.",
    )

    def validate_target_score(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("target_score must be a finite number.")
        return value


class CampaignAcceptedOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=CampaignState.choices)
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, campaign: Campaign) -> str:
        return self.view.absolute("api:campaign", self.view.project.slug, campaign.id)

    def get_dashboard_url(self, campaign: Campaign) -> str:
        return self.view.absolute("web:campaign", self.view.project.slug, campaign.id)


class CampaignOut(OutSerializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=CampaignState.choices)
    stop_reason = serializers.CharField()
    seed_candidate = serializers.CharField(source="seed_candidate.sha", help_text="SHA.")
    suite = serializers.CharField(source="suite.name")
    suite_version = serializers.CharField(source="suite.version")
    policy_version = serializers.CharField(source="policy_version.name")
    best_candidate = serializers.CharField(
        source="best_candidate.sha", allow_null=True, help_text="SHA; chosen on validation."
    )
    best_validation_score = FiniteFloatField(allow_null=True)
    created_at = serializers.DateTimeField()
    url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_url(self, campaign: Campaign) -> str:
        return self.view.absolute("api:campaign", self.view.project.slug, campaign.id)

    def get_dashboard_url(self, campaign: Campaign) -> str:
        return self.view.absolute("web:campaign", self.view.project.slug, campaign.id)


# Of the best proposal (campaign_best_proposal).
class BestOut(OutSerializer):
    candidate = serializers.CharField(source="candidate.sha", help_text="SHA.")
    proposal = serializers.IntegerField(
        source="sequence", help_text="Its proposal's sequence number."
    )
    search_score = FiniteFloatField(allow_null=True)
    validation_score = FiniteFloatField(allow_null=True)
    gap = MethodField(
        serializers.FloatField(allow_null=True, help_text="search_score − validation_score.")
    )
    dashboard_url = MethodField(serializers.URLField())

    def get_gap(self, best: Proposal) -> float | None:
        return search_validation_gap(
            search_score=finite(best.search_score), validation_score=finite(best.validation_score)
        )

    def get_dashboard_url(self, best: Proposal) -> str:
        return self.view.absolute("web:candidate", self.view.project.slug, best.candidate.sha)


# Of a ledger budget, for one unit (rollouts, tokens or wall_s).
class SpendOut(serializers.Serializer):
    spent = MethodField(serializers.IntegerField())
    reserved = MethodField(serializers.IntegerField())
    limit = MethodField(serializers.IntegerField(allow_null=True))

    def __init__(self, *args: Any, unit: str = "rollouts", **kwargs: Any) -> None:
        self.unit = unit
        super().__init__(*args, **kwargs)

    def get_spent(self, budget: Budget) -> int:
        return getattr(budget, f"spent_{self.unit}")

    def get_reserved(self, budget: Budget) -> int:
        return getattr(budget, f"reserved_{self.unit}")

    def get_limit(self, budget: Budget) -> int | None:
        return getattr(budget, f"limit_{self.unit}")


# Of a ledger budget, for a unit of US dollars (usd or proposer_usd): exact decimal strings.
class DollarSpendOut(SpendOut):
    spent = MethodField(serializers.DecimalField(max_digits=24, decimal_places=12))
    reserved = MethodField(serializers.DecimalField(max_digits=24, decimal_places=12))
    limit = MethodField(serializers.DecimalField(max_digits=24, decimal_places=12, allow_null=True))

    def get_spent(self, budget: Budget) -> str:
        return _dollars(super().get_spent(budget))

    def get_reserved(self, budget: Budget) -> str:
        return _dollars(super().get_reserved(budget))

    def get_limit(self, budget: Budget) -> str | None:
        limit = super().get_limit(budget)
        return None if limit is None else _dollars(limit)


def _dollars(value: Any) -> str:
    return format(Decimal(value).normalize(), "f") if Decimal(value) else "0"


class SpendAllOut(serializers.Serializer):
    rollouts = SpendOut(source="*", unit="rollouts")
    tokens = SpendOut(source="*", unit="tokens")
    wall_s = SpendOut(source="*", unit="wall_s")
    usd = DollarSpendOut(
        source="*", unit="usd", help_text="US dollars of the policy's calls (decimal strings)."
    )
    proposer_tokens = SpendOut(source="*", unit="proposer_tokens")
    proposer_wall_ms = SpendOut(
        source="*", unit="proposer_wall_ms", help_text="Milliseconds (the limit too)."
    )
    proposer_usd = DollarSpendOut(
        source="*", unit="proposer_usd", help_text="US dollars of the proposers' calls."
    )


# Of campaign_progress's figures.
class ProposalCountsOut(serializers.Serializer):
    total = serializers.IntegerField(
        source="proposals", help_text="Proposals, the seed's evaluation excluded."
    )
    by_state = serializers.DictField(child=serializers.IntegerField())


class StopRulesOut(serializers.Serializer):
    max_proposals = serializers.IntegerField()
    max_candidates = serializers.IntegerField(allow_null=True)
    patience = serializers.IntegerField(allow_null=True)
    target_score = FiniteFloatField(allow_null=True)


# Of coevo.campaigns.policy_steps.next_phase's Phase.
class PhaseOut(serializers.Serializer):
    name = serializers.CharField(help_text="What the next step is: harness or policy.")
    steps = serializers.IntegerField(help_text="Steps taken in this phase so far.")
    stale = serializers.IntegerField(help_text="Of those, in a row without an improvement.")
    policy_steps = serializers.IntegerField(help_text="Policy steps in the whole campaign.")
    reason = serializers.CharField()


# Context: progress (campaign_progress) and best (campaign_best_proposal, or None).
class CampaignDetailOut(CampaignOut):
    state_detail = serializers.CharField()
    alternation = serializers.DictField(
        help_text="The alternation configuration, defaults filled in ({}: harness steps only)."
    )
    phase = MethodField(
        PhaseOut(allow_null=True, help_text="An alternating campaign's phase; else null.")
    )
    current_policy_version = serializers.CharField(
        source="active_policy_version.name",
        help_text="The policy harness proposals are evaluated under now.",
    )
    best_policy_version = serializers.CharField(
        source="best_policy_version.name",
        allow_null=True,
        help_text="The policy the best candidate scored its best under.",
    )
    search_split = serializers.CharField()
    validation_split = serializers.CharField()
    strategy = serializers.ListField(child=serializers.DictField())
    stop_rules = StopRulesOut(source="*")
    batch_size = serializers.IntegerField(help_text="Proposals drafted (and raced) per round.")
    rollouts_saved_by_racing = MethodField(
        serializers.IntegerField(
            help_text="Search rollouts not run (nor charged) because a race eliminated them."
        )
    )
    epochs = serializers.IntegerField()
    seed = serializers.IntegerField()
    proposals = MethodField(ProposalCountsOut())
    best = MethodField(BestOut(allow_null=True))
    spend = MethodField(
        SpendAllOut(
            help_text=(
                "The campaign's ledger: spent, reserved and limit per unit, the proposers' "
                "(proposer_tokens, proposer_wall_ms) apart from the policy's."
            )
        )
    )
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    proposals_url = MethodField(serializers.URLField())

    def get_phase(self, campaign: Campaign) -> dict[str, Any] | None:
        return PhaseOut(next_phase(campaign)).data if campaign.alternates else None

    def get_proposals(self, campaign: Campaign) -> dict[str, Any]:
        return ProposalCountsOut(self.context["progress"]).data

    def get_rollouts_saved_by_racing(self, campaign: Campaign) -> int:
        return self.context["progress"].rollouts_saved

    def get_best(self, campaign: Campaign) -> dict[str, Any] | None:
        best = self.context["best"]
        return None if best is None else BestOut(best, context=self.context).data

    def get_spend(self, campaign: Campaign) -> dict[str, Any]:
        return SpendAllOut(self.context["progress"].budget).data

    def get_proposals_url(self, campaign: Campaign) -> str:
        return self.view.absolute("api:campaign_proposals", self.view.project.slug, campaign.id)


# Of a stage record as a proposal stores it (a dict; missing keys read as empty).
class StageOut(serializers.Serializer):
    stage = MethodField(serializers.CharField())
    ok = MethodField(serializers.BooleanField())
    reason = MethodField(serializers.CharField(allow_blank=True))

    def get_stage(self, stage: dict[str, Any]) -> str:
        return str(stage.get("stage", ""))

    def get_ok(self, stage: dict[str, Any]) -> bool:
        return bool(stage.get("ok"))

    def get_reason(self, stage: dict[str, Any]) -> str:
        return str(stage.get("reason", ""))


# Of Proposal.elimination (coevo.campaigns.racing).
class EliminationOut(serializers.Serializer):
    kind = serializers.CharField(
        help_text="evidence: clearly worse (anytime-valid); out_of_reach: cannot catch up."
    )
    p_value = FiniteFloatField(help_text="Anytime-valid, corrected for the rivals.")
    reason = serializers.CharField()


# Context: detail, whether the large fields (DETAIL_FIELDS) go out.
class ProposalOut(OutSerializer):
    id = serializers.UUIDField()
    sequence = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=ProposerKind.choices)
    state = serializers.ChoiceField(choices=ProposalState.choices)
    state_detail = serializers.CharField(allow_blank=True)
    parents = MethodField(
        serializers.ListField(child=serializers.CharField(), help_text="Parent SHAs.")
    )
    params = serializers.DictField()
    stages = MethodField(StageOut(many=True))
    candidate = serializers.CharField(
        source="candidate.sha", allow_null=True, help_text="SHA of the resulting commit."
    )
    search_evaluation = serializers.UUIDField(source="search_evaluation_id", allow_null=True)
    validation_evaluation = serializers.UUIDField(
        source="validation_evaluation_id", allow_null=True
    )
    search_score = FiniteFloatField(allow_null=True)
    validation_score = FiniteFloatField(allow_null=True)
    tokens_per_task = FiniteFloatField(allow_null=True)
    proposer_tokens = serializers.IntegerField()
    proposer_wall_ms = serializers.IntegerField(help_text="How long the proposer took to write it.")
    proposer_cost_usd = serializers.DecimalField(
        max_digits=24,
        decimal_places=12,
        allow_null=True,
        help_text="US dollars of its proposer model calls at the prices that applied; null: "
        "no price.",
    )
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    diff_url = MethodField(serializers.URLField(allow_null=True))
    policy_version = serializers.CharField(
        source="policy_version.name",
        allow_null=True,
        help_text="The policy its evaluations ran under (a policy step: trained).",
    )
    export = serializers.UUIDField(
        source="export_id", allow_null=True, help_text="A policy step's training data."
    )
    training_run = serializers.UUIDField(
        source="training_run_id", allow_null=True, help_text="A policy step's run."
    )
    improved = serializers.BooleanField(help_text="It raised the best validation score.")
    batch = serializers.IntegerField(
        allow_null=True,
        help_text="The round it was drafted in (its first sequence); null outside rounds.",
    )
    eliminated_by = serializers.IntegerField(
        source="eliminated_by.sequence",
        allow_null=True,
        help_text="The sequence of the proposal whose race eliminated it; null if none did.",
    )
    eliminated_after_tasks = serializers.IntegerField(
        allow_null=True, help_text="Search tasks every racer had finished when it was eliminated."
    )
    eliminated_at = serializers.DateTimeField(allow_null=True)
    elimination = MethodField(EliminationOut(allow_null=True))
    rollouts_saved = serializers.IntegerField(
        help_text="Its search rollouts not run because it was eliminated."
    )
    prompt = serializers.CharField(required=False, help_text="Only with ?detail=1.")
    response = serializers.CharField(required=False, help_text="Only with ?detail=1.")
    patch = serializers.CharField(required=False, help_text="Only with ?detail=1.")
    shown = serializers.DictField(
        required=False, help_text="What the proposer saw (search split only); ?detail=1."
    )

    DETAIL_FIELDS = ("prompt", "response", "patch", "shown")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # The schema (no context) declares them; a list without ?detail=1 never loads them.
        if self.context.get("detail") is False:
            for name in self.DETAIL_FIELDS:
                del fields[name]
        return fields

    def get_parents(self, proposal: Proposal) -> list[str]:
        return [str(sha) for sha in (proposal.parent_shas or [])]

    def get_elimination(self, proposal: Proposal) -> dict[str, Any] | None:
        return EliminationOut(proposal.elimination).data if proposal.elimination else None

    def get_stages(self, proposal: Proposal) -> list[dict[str, Any]]:
        stages = [stage for stage in (proposal.stages or []) if isinstance(stage, dict)]
        return StageOut(stages, many=True).data

    def get_diff_url(self, proposal: Proposal) -> str | None:
        if proposal.candidate is None:
            return None
        return self.view.absolute(
            "web:candidate_diff", self.view.project.slug, proposal.candidate.sha
        )


class ProposalFilterIn(serializers.Serializer):
    detail = serializers.BooleanField(
        default=False, help_text="Include prompt, response, patch and shown."
    )


class SubmitCandidateIn(serializers.Serializer):
    sha = serializers.RegexField(SHA, help_text="A candidate of the project (import it first).")


class ProposalAcceptedOut(OutSerializer):
    id = serializers.UUIDField()
    sequence = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=ProposerKind.choices)
    state = serializers.ChoiceField(choices=ProposalState.choices)
    candidate = serializers.CharField(source="candidate.sha")
    status_url = MethodField(serializers.URLField(help_text="The campaign's status."))
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, proposal: Proposal) -> str:
        return self.view.absolute("api:campaign", self.view.project.slug, proposal.campaign_id)

    def get_dashboard_url(self, proposal: Proposal) -> str:
        return self.view.absolute("web:campaign", self.view.project.slug, proposal.campaign_id)


# --- helpers ----------------------------------------------------------------------------------


def _alternation(values: dict[str, Any] | None) -> dict[str, Any]:
    if not values:
        return {}
    config = dict(values)
    if "export" in config:
        config["export"] = dict(config["export"])
    return config


class CampaignViewMixin(ApiView):
    def campaign(self, campaign_id: Any) -> Campaign:
        return campaign_get(project=self.project, campaign_id=campaign_id)

    def accepted(self, campaign: Campaign) -> Response:
        body = self.out(CampaignAcceptedOut, campaign)
        return Response(body, status=202, headers={"Location": body["status_url"]})


def _campaigns(view: ApiView) -> QuerySet[Campaign]:
    return campaign_list(project=view.project).select_related("policy_version")


# --- views ------------------------------------------------------------------------------------


class CampaignListView(CampaignViewMixin):
    required_scopes = {"POST": "campaigns:run"}
    enqueues = frozenset({"POST"})
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="campaigns_list", parameters=PAGE_PARAMETERS, responses=paginated(CampaignOut)
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(self, _campaigns(self), CampaignOut)

    @extend_schema(
        operation_id="campaigns_start",
        request=CampaignStartIn,
        responses={202: CampaignAcceptedOut},
    )
    def post(self, request: Request, slug: str) -> Response:
        data = CampaignStartIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        seed = candidate_get(project=self.project, sha=values["seed_candidate"])
        suite = suite_get(
            project=self.project, name=values["suite"], version=values.get("suite_version")
        )
        budget = values.get("budget") or {}
        strategy = (
            [{"kind": e["kind"], "options": e.get("options") or {}} for e in values["strategy"]]
            if values.get("strategy")
            else None
        )
        campaign = campaign_create(
            project=self.project,
            name=values.get("name", ""),
            seed_candidate=seed,
            policy_version=(
                policy_version_named(values.get("policy_version")) or policy_version_get_default()
            ),
            suite=suite,
            strategy=strategy,
            budget_limits=BudgetLimits(
                rollouts=budget.get("rollouts"),
                tokens=budget.get("tokens"),
                wall_s=budget.get("wall_s"),
                proposer_tokens=budget.get("proposer_tokens"),
                proposer_wall_s=budget.get("proposer_wall_s"),
                usd=budget.get("usd"),
                proposer_usd=budget.get("proposer_usd"),
            ),
            max_proposals=values["max_proposals"],
            batch_size=values["batch_size"],
            max_candidates=values.get("max_candidates"),
            patience=values.get("patience"),
            target_score=values.get("target_score"),
            epochs=values["epochs"],
            seed=values["seed"],
            alternation=_alternation(values.get("alternation")),
            created_by=request.user,
        )
        return self.accepted(campaign_start(campaign=campaign))


class CampaignDetailView(CampaignViewMixin):
    @extend_schema(operation_id="campaigns_retrieve", responses=CampaignDetailOut)
    def get(self, request: Request, slug: str, campaign_id: UUID) -> Response:
        campaign = self.campaign(campaign_id)
        body = self.out(
            CampaignDetailOut,
            campaign,
            progress=campaign_progress(campaign=campaign),
            best=campaign_best_proposal(campaign=campaign),
        )
        return Response(body)


class CampaignProposalsView(CampaignViewMixin):
    @extend_schema(
        operation_id="campaigns_proposals",
        parameters=[ProposalFilterIn, *PAGE_PARAMETERS],
        responses=paginated(ProposalOut),
    )
    def get(self, request: Request, slug: str, campaign_id: UUID) -> Response:
        detail = self.query(ProposalFilterIn)["detail"]
        campaign = self.campaign(campaign_id)
        # eliminated_by: its sequence goes out; read with each row, without its large fields.
        proposals = (
            Proposal.objects.filter(campaign=campaign)
            .select_related("candidate", "policy_version", "eliminated_by")
            .defer(*(f"eliminated_by__{name}" for name in ProposalOut.DETAIL_FIELDS))
        )
        if not detail:
            # The prompt and response of an LLM proposer can be large: a list never loads them.
            proposals = proposals.defer("shown", "prompt", "response", "patch")
        return paginate(self, proposals, ProposalOut, detail=detail)


class CampaignActionView(CampaignViewMixin):
    required_scopes = {"POST": "campaigns:run"}
    required_roles = {"POST": Role.RESEARCHER}


class CampaignPauseView(CampaignActionView):
    @extend_schema(
        operation_id="campaigns_pause", request=None, responses={202: CampaignAcceptedOut}
    )
    def post(self, request: Request, slug: str, campaign_id: UUID) -> Response:
        return self.accepted(campaign_pause(campaign=self.campaign(campaign_id)))


class CampaignResumeView(CampaignActionView):
    enqueues = frozenset({"POST"})

    @extend_schema(
        operation_id="campaigns_resume", request=None, responses={202: CampaignAcceptedOut}
    )
    def post(self, request: Request, slug: str, campaign_id: UUID) -> Response:
        return self.accepted(campaign_resume(campaign=self.campaign(campaign_id)))


class CampaignStopView(CampaignActionView):
    @extend_schema(
        operation_id="campaigns_stop", request=None, responses={202: CampaignAcceptedOut}
    )
    def post(self, request: Request, slug: str, campaign_id: UUID) -> Response:
        campaign = self.campaign(campaign_id)
        reason = f"stopped through the API by {request.user.get_username()}"
        return self.accepted(campaign_stop(campaign=campaign, reason=reason))


class CampaignCandidatesView(CampaignViewMixin):
    required_scopes = {"POST": "campaigns:run"}
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="campaigns_submit_candidate",
        request=SubmitCandidateIn,
        responses={202: ProposalAcceptedOut},
    )
    def post(self, request: Request, slug: str, campaign_id: UUID) -> Response:
        data = SubmitCandidateIn(data=request.data)
        data.is_valid(raise_exception=True)
        campaign = self.campaign(campaign_id)
        candidate = candidate_get(project=self.project, sha=data.validated_data["sha"])
        proposal = campaign_submit_candidate(
            campaign=campaign, candidate=candidate, submitted_by=request.user
        )
        body = self.out(ProposalAcceptedOut, proposal)
        return Response(body, status=202, headers={"Location": body["status_url"]})


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
_C = "campaigns/<uuid:campaign_id>/"
urlpatterns = [
    path("campaigns/", CampaignListView.as_view(), name="campaigns"),
    path(_C, CampaignDetailView.as_view(), name="campaign"),
    path(f"{_C}proposals/", CampaignProposalsView.as_view(), name="campaign_proposals"),
    path(f"{_C}candidates/", CampaignCandidatesView.as_view(), name="campaign_candidates"),
    path(f"{_C}pause/", CampaignPauseView.as_view(), name="campaign_pause"),
    path(f"{_C}resume/", CampaignResumeView.as_view(), name="campaign_resume"),
    path(f"{_C}stop/", CampaignStopView.as_view(), name="campaign_stop"),
]

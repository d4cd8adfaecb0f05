"""API: promotion requests (see docs/api.md, Promotions). Included under
``projects/<slug:slug>/``.

Held-out per-task details (flips and their rollouts) are sealed (docs/architecture.md, "The
held-out seal"): the evidence goes out whole only to reviewers' personal tokens
(``ApiView.audience``); everyone else gets the aggregates (``sealed_evidence``, the promotion
page's rule too). Approve/reject need the ``promotions:approve`` scope, which
``coevo.accounts`` never grants to CI tokens, and the reviewer role; the service refuses the
requester (and the database refuses it again).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from coevo.api.base import PAGE_PARAMETERS, ApiView, paginate, paginated, policy_version_named
from coevo.api.fields import MethodField, OutSerializer
from coevo.errors import InvalidInput
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project, Role
from coevo.reviews import selectors as review_selectors
from coevo.reviews import services as review_services
from coevo.reviews.models import PromotionRequest
from coevo.reviews.promotions.create import promotion_baseline_get, promotion_request_create
from coevo.reviews.promotions.decide import promotion_decide
from coevo.reviews.promotions.evidence_types import Evidence
from coevo.suites.models import Split, Suite
from coevo.suites.selectors import suite_get
from harness_store.selectors import candidate_get


class PromotionIn(serializers.Serializer):
    candidate = serializers.RegexField(r"^[0-9a-fA-F]{7,40}$", help_text="The candidate's SHA.")
    channel = serializers.SlugField(max_length=64, default="production")
    suite = serializers.CharField(
        max_length=64,
        required=False,
        help_text="Suite name (its latest version); its held-out split decides. Default: the "
        "project's only suite with held-out tasks.",
    )
    policy_version = serializers.CharField(
        max_length=100,
        required=False,
        help_text="Policy version name (default: the channel's, else the configured one).",
    )
    epochs = serializers.IntegerField(min_value=1, max_value=20, default=1)
    baseline = serializers.RegexField(
        r"^[0-9a-fA-F]{7,40}$",
        required=False,
        help_text="For an empty channel: the candidate (SHA) the evidence compares against. "
        "Default: the seed of the campaign that proposed the candidate.",
    )


class DecisionIn(serializers.Serializer):
    comment = serializers.CharField(max_length=10_000, required=False, allow_blank=True)


class PromotionCreatedOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    status_url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_status_url(self, promotion: PromotionRequest) -> str:
        return self.view.absolute("api:promotion", self.view.project.slug, promotion.id)

    def get_dashboard_url(self, promotion: PromotionRequest) -> str:
        return self.view.absolute("web:promotion", self.view.project.slug, promotion.id)


class ApprovalOut(serializers.Serializer):
    reviewer = serializers.CharField(source="reviewer.get_username")
    decision = serializers.CharField()
    comment = serializers.CharField()
    created_at = serializers.DateTimeField()


# Context: evidence, the request's evidence sealed for the token's audience
# (review_selectors.promotion_review_get); summary, whether it is a list's row (the evidence's
# summary, for everyone).
class PromotionOut(OutSerializer):
    id = serializers.UUIDField()
    state = serializers.CharField()
    state_detail = serializers.CharField()
    stale = MethodField(
        serializers.BooleanField(help_text="The holder changed: refresh before approval.")
    )
    candidate = serializers.CharField(source="candidate.sha")
    channel = serializers.CharField(source="channel.name")
    policy_version = serializers.CharField(source="policy_version.name", allow_null=True)
    suite = MethodField(serializers.CharField())
    epochs = serializers.IntegerField()
    baseline = MethodField(
        serializers.CharField(
            allow_null=True,
            help_text="The candidate compared with when the channel held nothing (else null).",
        )
    )
    baseline_kind = serializers.CharField(
        help_text="campaign_seed, picked, or empty (no baseline: a holder, or none possible)."
    )
    requester = serializers.CharField(source="requester.get_username", allow_null=True)
    evidence = MethodField(
        serializers.DictField(
            help_text="Scores, the paired held-out comparison, gap, cost, errors, held-out "
            "looks; per-task held-out details only for reviewers' personal tokens. In lists, "
            "the summary: no per-task results, diff or lineage (GET the request's url)."
        )
    )
    approvals = MethodField(ApprovalOut(many=True))
    created_at = serializers.DateTimeField()
    url = MethodField(serializers.URLField())
    dashboard_url = MethodField(serializers.URLField())

    def get_stale(self, promotion: PromotionRequest) -> bool:
        return review_selectors.promotion_is_stale(request=promotion)

    def get_baseline(self, promotion: PromotionRequest) -> str | None:
        return promotion.baseline_candidate.sha if promotion.baseline_candidate_id else None

    def get_suite(self, promotion: PromotionRequest) -> str:
        return f"{promotion.suite.name}@{promotion.suite.version}"

    def get_evidence(self, promotion: PromotionRequest) -> dict[str, Any]:
        if self.context.get("summary"):
            # Read by the database without the sealed, diff and lineage parts (the list's
            # query: review_selectors.promotion_list_summaries).
            return dict(promotion.evidence_summary or {})
        evidence: Evidence | None = self.context["evidence"]
        return evidence.to_payload() if evidence else {}

    def get_approvals(self, promotion: PromotionRequest) -> list[dict[str, Any]]:
        approvals = review_selectors.promotion_approvals(request=promotion)
        return ApprovalOut(approvals, many=True).data

    def get_url(self, promotion: PromotionRequest) -> str:
        return self.view.absolute("api:promotion", self.view.project.slug, promotion.id)

    def get_dashboard_url(self, promotion: PromotionRequest) -> str:
        return self.view.absolute("web:promotion", self.view.project.slug, promotion.id)


def promotion_out(view: ApiView, request_id: Any) -> dict[str, Any]:
    """One request as PromotionOut renders it, its evidence sealed for the token's audience."""
    promotion, evidence = review_selectors.promotion_review_get(
        project=view.project, request_id=request_id, audience=view.audience()
    )
    return view.out(PromotionOut, promotion, evidence=evidence)


def _default_suite(project: Project) -> Suite:
    """The project's one suite (latest version of one name) with held-out tasks."""
    names = sorted(
        set(
            Suite.objects.filter(project=project, tasks__split=Split.HELDOUT).values_list(
                "name", flat=True
            )
        )
    )
    if len(names) != 1:
        found = ", ".join(names) if names else "none"
        raise InvalidInput(
            f"Name the suite whose held-out split decides the promotion (suites with held-out "
            f"tasks: {found})."
        )
    return suite_get(project=project, name=names[0])


class PromotionListView(ApiView):
    required_scopes = {"POST": "promotions:request"}
    enqueues = frozenset({"POST"})
    required_roles = {"POST": Role.RESEARCHER}

    @extend_schema(
        operation_id="promotions_list",
        parameters=PAGE_PARAMETERS,
        responses=paginated(PromotionOut),
    )
    def get(self, request: Request, slug: str) -> Response:
        return paginate(
            self,
            review_selectors.promotion_list_summaries(project=self.project),
            PromotionOut,
            summary=True,
        )

    @extend_schema(
        operation_id="promotions_create", request=PromotionIn, responses={202: PromotionCreatedOut}
    )
    def post(self, request: Request, slug: str) -> Response:
        data = PromotionIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        policy_version = policy_version_named(values.get("policy_version"))
        candidate = candidate_get(project=self.project, sha=values["candidate"])
        baseline = promotion_baseline_get(project=self.project, sha=values.get("baseline"))
        suite = (
            suite_get(project=self.project, name=values["suite"])
            if values.get("suite")
            else _default_suite(self.project)
        )
        channel = review_services.channel_for_request(project=self.project, name=values["channel"])
        if policy_version is None:
            # Like gates: the channel's policy version, else the configured default.
            policy_version = channel.policy_version or policy_version_get_default()
        promotion = promotion_request_create(
            channel=channel,
            candidate=candidate,
            policy_version=policy_version,
            requester=request.user,
            suite=suite,
            epochs=values["epochs"],
            baseline=baseline,
        )
        body = self.out(PromotionCreatedOut, promotion)
        return Response(body, status=202, headers={"Location": body["status_url"]})


class PromotionDetailView(ApiView):
    @extend_schema(operation_id="promotions_retrieve", responses=PromotionOut)
    def get(self, request: Request, slug: str, request_id: UUID) -> Response:
        return Response(promotion_out(self, request_id))


class PromotionDecisionView(ApiView):
    """POST .../approve/ or .../reject/ (the URL names the decision)."""

    required_scopes = {"POST": "promotions:approve"}
    required_roles = {"POST": Role.REVIEWER}
    decision = "approve"

    @extend_schema(request=DecisionIn, responses=PromotionOut)
    def post(self, request: Request, slug: str, request_id: UUID) -> Response:
        data = DecisionIn(data=request.data)
        data.is_valid(raise_exception=True)
        promotion = review_selectors.promotion_get(project=self.project, request_id=request_id)
        promotion_decide(
            request=promotion,
            reviewer=request.user,
            decision=self.decision,
            comment=data.validated_data.get("comment", ""),
        )
        return Response(promotion_out(self, request_id))


class PromotionApproveView(PromotionDecisionView):
    decision = "approve"

    @extend_schema(operation_id="promotions_approve", request=DecisionIn, responses=PromotionOut)
    def post(self, request: Request, slug: str, request_id: UUID) -> Response:
        return super().post(request, slug, request_id)


class PromotionRejectView(PromotionDecisionView):
    decision = "reject"

    @extend_schema(operation_id="promotions_reject", request=DecisionIn, responses=PromotionOut)
    def post(self, request: Request, slug: str, request_id: UUID) -> Response:
        return super().post(request, slug, request_id)


# Relative to projects/<slug:slug>/ (coevo/api/urls.py).
urlpatterns = [
    path("promotions/", PromotionListView.as_view(), name="promotions"),
    path("promotions/<uuid:request_id>/", PromotionDetailView.as_view(), name="promotion"),
    path(
        "promotions/<uuid:request_id>/approve/",
        PromotionApproveView.as_view(),
        name="promotion_approve",
    ),
    path(
        "promotions/<uuid:request_id>/reject/",
        PromotionRejectView.as_view(),
        name="promotion_reject",
    ),
]

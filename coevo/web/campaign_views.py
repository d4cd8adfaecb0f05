"""Campaign pages: the list, the start form, and one campaign's progress, plots (scores over
proposals, Pareto front, lineage), best candidate and proposals (htmx polling while it runs),
with pause / resume / stop for researchers; an alternating campaign also shows its
configuration, its current phase and the policy each proposal ran under."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.utils.cache import patch_vary_headers
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from coevo.campaigns.alternation import DEFAULTS as ALTERNATION_DEFAULTS
from coevo.campaigns.alternation import SWITCH_RULES
from coevo.campaigns.models import ProposerKind
from coevo.campaigns.plots import lineage_svg, pareto_plot_svg, scores_plot_svg
from coevo.campaigns.policy_steps import next_phase
from coevo.campaigns.selectors import (
    campaign_best_proposal,
    campaign_best_series,
    campaign_get,
    campaign_list,
    campaign_pareto_front,
    campaign_points,
    campaign_progress,
    campaign_round_count,
    campaign_rounds,
    proposal_window,
)
from coevo.campaigns.services import (
    MAX_BATCH_SIZE,
    campaign_create,
    campaign_pause,
    campaign_resume,
    campaign_start,
    campaign_stop,
)
from coevo.errors import CoevoError, NotFound
from coevo.evaluations.ledger import BudgetLimits
from coevo.evaluations.selectors import search_validation_gap
from coevo.policies.models import PolicyEndpoint, PolicyVersion
from coevo.policies.selectors import policy_endpoints_list, policy_versions_list
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project, Role
from coevo.projects.selectors import project_user_has_role
from coevo.suites.models import Suite
from coevo.suites.selectors import suite_list
from coevo.training.models import Trainer
from coevo.training.selectors import trainer_list_enabled
from coevo.web.access import project_view
from coevo.web.presenters import (
    PROPOSAL_TABLE_ROWS,
    bar_percent,
    campaign_lineage,
    campaign_spend_rows,
    pareto_points,
    pareto_table,
    proposal_rows,
)
from harness_store.models import Candidate
from harness_store.selectors import candidate_get, candidate_list

_DONE = {"pause": "paused", "resume": "resumed", "stop": "stopped"}
ACTIONS = {"pause": campaign_pause, "resume": campaign_resume}
PATTERNS_TEMPLATE = "campaigns/_patterns.html"
SEED_CHOICES = 200
# The newest rounds a raced campaign's page lists (hundreds in a long campaign).
ROUNDS_SHOWN = 20


def can_run_campaigns(*, project: Project, user: Any) -> bool:
    return project_user_has_role(project=project, user=user, role=Role.RESEARCHER)


@project_view
def campaign_list_page(request: HttpRequest, project: Project) -> HttpResponse:
    return render(
        request,
        "campaigns/list.html",
        {
            "project": project,
            "campaigns": campaign_list(project=project)[:100],
            "can_run": can_run_campaigns(project=project, user=request.user),
        },
    )


# --- the campaign page -----------------------------------------------------------------------


def _patterns_template() -> str | None:
    # The failure-patterns partial (coevo.campaigns.patterns' own, reading
    # campaign.failure_patterns) is another module's; the page renders without it. It sits in
    # the live part so new patterns appear while the campaign runs.
    try:
        get_template(PATTERNS_TEMPLATE)
    except TemplateDoesNotExist:
        return None
    return PATTERNS_TEMPLATE


@project_view
def campaign_detail(request: HttpRequest, project: Project, campaign_id: UUID) -> HttpResponse:
    campaign = campaign_get(project=project, campaign_id=campaign_id)
    best = campaign_best_proposal(campaign=campaign)
    # The plots, front and lineage read a dozen columns of every proposal; the table reads
    # whole rows of one window only (a campaign may hold 2,000 proposals).
    points = campaign_points(campaign=campaign)
    front = campaign_pareto_front(campaign=campaign, proposals=points)
    progress = campaign_progress(campaign=campaign, points=points)
    lineage = campaign_lineage(project=project, campaign=campaign, points=points)
    window = proposal_window(
        campaign=campaign, before=request.GET.get("before"), size=PROPOSAL_TABLE_ROWS
    )
    raced = campaign.batch_size > 1
    # Plots are built here from escaped data (coevo.campaigns.plots escapes every string).
    plots = {
        "scores": mark_safe(
            scores_plot_svg(series=campaign_best_series(campaign=campaign, points=points))
        ),
        "pareto": mark_safe(
            pareto_plot_svg(points=pareto_points(project=project, points=points, front=front))
        ),
        "lineage": mark_safe(lineage_svg(nodes=lineage.nodes)),
    }
    context = {
        "project": project,
        "campaign": campaign,
        "progress": progress,
        "proposal_percent": bar_percent(progress.proposals, campaign.max_proposals),
        "spend": campaign_spend_rows(progress=progress),
        "best": best,
        "gap": (
            search_validation_gap(
                search_score=best.search_score, validation_score=best.validation_score
            )
            if best
            else None
        ),
        "front": pareto_table(points=points, front=front, best=best),
        "plots": plots,
        "rows": proposal_rows(project=project, proposals=window.proposals),
        "window": window,
        "lineage_left_out": lineage.left_out,
        "rounds": campaign_rounds(campaign=campaign, limit=ROUNDS_SHOWN) if raced else [],
        "round_count": campaign_round_count(campaign=campaign) if raced else 0,
        "rounds_shown": ROUNDS_SHOWN,
        "patterns_template": _patterns_template(),
        "can_run": can_run_campaigns(project=project, user=request.user),
        # What the runner does next (derived from the ended proposals, as the runner does).
        "phase": next_phase(campaign) if campaign.alternates else None,
    }
    # The polling request (htmx) gets only the live part; its final render stops the polling.
    partial = request.htmx and not request.htmx.history_restore_request
    template = "campaigns/_live.html" if partial else "campaigns/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@require_POST
@project_view
def campaign_action(
    request: HttpRequest, project: Project, campaign_id: UUID, action: str
) -> HttpResponse:
    if not can_run_campaigns(project=project, user=request.user):
        raise PermissionDenied("Pausing, resuming or stopping campaigns needs the researcher role.")
    campaign = campaign_get(project=project, campaign_id=campaign_id)
    if action not in ("pause", "resume", "stop"):
        raise Http404(f"No action {action!r}.")
    try:
        if action == "stop":
            campaign_stop(campaign=campaign, reason=f"stopped by {request.user.get_username()}")
        else:
            ACTIONS[action](campaign=campaign)
        messages.success(request, f"Campaign {campaign.name} {_DONE[action]}.")
    except CoevoError as exc:
        messages.error(request, str(exc))
    return redirect("web:campaign", project.slug, campaign.id)


# --- the start form --------------------------------------------------------------------------

PROPOSER_CHOICES = [
    (ProposerKind.CONFIG.value, "config: Optuna search over the manifest's knobs"),
    (ProposerKind.RANDOM.value, "random: uniform draws over the manifest's knobs (a baseline)"),
    (ProposerKind.LLM_PATCH.value, "llm-patch: a proposer model edits the harness code"),
    (
        ProposerKind.AGENTIC.value,
        "agentic: a coding agent (a program candidate) edits a working copy, reading the history",
    ),
    (ProposerKind.MERGE.value, "merge: combine candidates that improved on different tasks"),
]


ALTERNATION_PREFIX = "alternation_"


def _alternation_number(name: str, help_text: str) -> forms.IntegerField:
    return forms.IntegerField(
        min_value=1,
        max_value=1000,
        required=False,
        label=name.replace("_", " "),
        help_text=f"{help_text}; blank: {ALTERNATION_DEFAULTS[name]}",
    )


class CampaignStartForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, help_text="default: from the seed")
    seed_candidate = forms.CharField(
        max_length=40,
        label="seed candidate",
        help_text="a SHA or a unique prefix (at least 4 hex digits)",
        widget=forms.TextInput(attrs={"list": "recent-candidates", "autocomplete": "off"}),
    )
    policy_version = forms.ModelChoiceField(queryset=PolicyVersion.objects.none())
    suite = forms.ModelChoiceField(queryset=Suite.objects.none())
    proposers = forms.MultipleChoiceField(
        choices=PROPOSER_CHOICES,
        widget=forms.CheckboxSelectMultiple,
        initial=[ProposerKind.CONFIG.value],
        help_text="they take turns, in this order",
    )
    # A registered endpoint, never a typed URL: the worker posts to it and reads the reply
    # (coevo.campaigns.proposers.llm_patch checks the name again).
    llm_endpoint = forms.ModelChoiceField(
        queryset=PolicyEndpoint.objects.none(),
        to_field_name="name",
        required=False,
        label="llm-patch endpoint",
        empty_label="the policy's endpoint",
        help_text="the registered policy endpoint serving the proposer model (operators "
        "register endpoints in the admin)",
    )
    llm_model = forms.CharField(
        max_length=200, required=False, label="llm-patch model", help_text="default: the policy's"
    )
    llm_api = forms.ChoiceField(
        choices=[("completions", "completions"), ("chat", "chat")],
        initial="completions",
        label="llm-patch API",
        help_text="chat for instruction-tuned proposer models, completions for base models",
    )
    agentic_program = forms.CharField(
        max_length=40,
        required=False,
        label="agentic proposer program",
        help_text="the candidate (SHA or prefix) holding the proposer program, e.g. "
        "examples/proposers/agentic imported into this project; it uses the llm-patch "
        "endpoint and model above",
    )
    max_proposals = forms.IntegerField(min_value=1, max_value=10_000, initial=10)
    batch_size = forms.IntegerField(
        min_value=1,
        max_value=MAX_BATCH_SIZE,
        initial=1,
        required=False,
        label="proposals per round",
        help_text="1 evaluates one proposal at a time; more are drafted together and raced on "
        f"the search split, the clearly worse eliminated early (at most {MAX_BATCH_SIZE})",
    )
    patience = forms.IntegerField(
        min_value=1, required=False, help_text="stop after this many proposals without a new best"
    )
    target_score = forms.FloatField(
        required=False, help_text="stop when the best validation score reaches it"
    )
    max_rollouts = forms.IntegerField(min_value=1, required=False, label="budget: rollouts")
    max_tokens = forms.IntegerField(min_value=1, required=False, label="budget: policy tokens")
    max_wall_s = forms.IntegerField(min_value=1, required=False, label="budget: wall time (s)")
    max_proposer_tokens = forms.IntegerField(
        min_value=1,
        required=False,
        label="budget: proposer tokens",
        help_text="the proposer model's tokens (llm-patch); the campaign stops when spent",
    )
    max_proposer_wall_s = forms.IntegerField(
        min_value=1,
        required=False,
        label="budget: proposer wall time (s)",
        help_text="time the proposers spend writing proposals",
    )
    max_usd = forms.DecimalField(
        min_value=Decimal("0.000001"),
        max_digits=18,
        decimal_places=6,
        required=False,
        label="budget: policy US$",
        help_text="at the endpoints' prices; each rollout reserves its worst case",
    )
    max_proposer_usd = forms.DecimalField(
        min_value=Decimal("0.000001"),
        max_digits=18,
        decimal_places=6,
        required=False,
        label="budget: proposer US$",
        help_text="the proposer model's calls at its endpoint's price; the campaign stops when spent",
    )
    epochs = forms.IntegerField(min_value=1, max_value=100, initial=1)
    random_seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0, label="seed")
    # Optional: alternate harness steps with policy steps (coevo.campaigns.alternation, which
    # checks the values; blank numbers take its defaults).
    alternation_trainer = forms.ModelChoiceField(
        queryset=Trainer.objects.none(),
        to_field_name="name",
        required=False,
        label="trainer",
        empty_label="none: harness steps only",
        help_text="policy steps train a LoRA adapter with it (a vLLM policy endpoint is needed)",
    )
    alternation_switch = forms.ChoiceField(
        choices=[(rule, rule) for rule in SWITCH_RULES],
        initial=ALTERNATION_DEFAULTS["switch"],
        required=False,
        label="switch",
        help_text="fixed: after so many steps; patience: after steps without improvement",
    )
    alternation_harness_steps = _alternation_number(
        "harness_steps", "per harness phase (fixed switch)"
    )
    alternation_policy_steps = _alternation_number(
        "policy_steps", "per policy phase (fixed switch)"
    )
    alternation_patience = _alternation_number(
        "patience",
        "steps in a row without a validation improvement that end a phase (patience switch)",
    )
    alternation_max_policy_steps = _alternation_number(
        "max_policy_steps", "policy steps in the whole campaign"
    )

    def __init__(self, *args: Any, project: Project, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["suite"].queryset = suite_list(project=project).order_by("name", "-created_at")
        self.fields["suite"].label_from_instance = lambda s: f"{s.name} {s.version}"
        self.fields["policy_version"].queryset = policy_versions_list()
        self.fields["llm_endpoint"].queryset = policy_endpoints_list()
        # Its name only: the endpoint's URL (an internal address) is the operators' business.
        self.fields["llm_endpoint"].label_from_instance = lambda e: e.name
        self.fields["alternation_trainer"].queryset = trainer_list_enabled()

    def campaign_fields(self) -> list[forms.BoundField]:
        return [f for f in self if not f.name.startswith(ALTERNATION_PREFIX)]

    def alternation_fields(self) -> list[forms.BoundField]:
        return [f for f in self if f.name.startswith(ALTERNATION_PREFIX)]

    def alternation(self) -> dict[str, Any]:
        """The alternation configuration for campaign_create ({} without a trainer)."""
        data = self.cleaned_data
        trainer = data.get("alternation_trainer")
        if trainer is None:
            return {}
        config: dict[str, Any] = {"trainer": trainer.name}
        for name in ("switch", "harness_steps", "policy_steps", "patience", "max_policy_steps"):
            value = data.get(f"{ALTERNATION_PREFIX}{name}")
            if value not in (None, ""):
                config[name] = value
        return config

    def clean_seed_candidate(self) -> Candidate:
        try:
            return candidate_get(project=self.project, sha=self.cleaned_data["seed_candidate"])
        except NotFound as exc:
            raise forms.ValidationError(str(exc)) from None

    def strategy(self) -> list[dict[str, Any]]:
        data = self.cleaned_data
        strategy = []
        for kind in data["proposers"]:
            options: dict[str, Any] = {}
            if kind == ProposerKind.LLM_PATCH:
                # Left out when blank: the proposer then defaults to the policy server's.
                options = {"api": data["llm_api"]}
                if data["llm_endpoint"]:
                    options["endpoint"] = data["llm_endpoint"].name
                if data["llm_model"]:
                    options["model"] = data["llm_model"]
            elif kind == ProposerKind.AGENTIC:
                options = {"program": data["agentic_program"]}
                if data["llm_endpoint"]:
                    options["endpoint"] = data["llm_endpoint"].name
                if data["llm_model"]:
                    options["model"] = data["llm_model"]
            strategy.append({"kind": kind, "options": options})
        return strategy


@project_view
def campaign_new(request: HttpRequest, project: Project) -> HttpResponse:
    if not can_run_campaigns(project=project, user=request.user):
        raise PermissionDenied("Starting a campaign needs the researcher role.")
    if request.method == "POST":
        form = CampaignStartForm(request.POST, project=project)
        if form.is_valid():
            data = form.cleaned_data
            seed = data["seed_candidate"]
            try:
                campaign = campaign_create(
                    project=project,
                    name=data["name"],
                    seed_candidate=seed,
                    policy_version=data["policy_version"],
                    suite=data["suite"],
                    strategy=form.strategy(),
                    budget_limits=BudgetLimits(
                        rollouts=data["max_rollouts"],
                        tokens=data["max_tokens"],
                        wall_s=data["max_wall_s"],
                        proposer_tokens=data["max_proposer_tokens"],
                        proposer_wall_s=data["max_proposer_wall_s"],
                        usd=data["max_usd"],
                        proposer_usd=data["max_proposer_usd"],
                    ),
                    max_proposals=data["max_proposals"],
                    batch_size=data["batch_size"] or 1,
                    patience=data["patience"],
                    target_score=data["target_score"],
                    epochs=data["epochs"],
                    seed=data["random_seed"],
                    alternation=form.alternation(),
                    created_by=request.user,
                )
                campaign_start(campaign=campaign)
            except CoevoError as exc:
                # Shown above the form: what the domain refused (a strategy the seed's manifest
                # does not allow, a suite without a validation split, …) and how to fix it.
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Campaign {campaign.name} started.")
                return redirect("web:campaign", project.slug, campaign.id)
    else:
        # The configured policy exists as a version before anyone picks it.
        default_policy = policy_version_get_default()
        initial = {"policy_version": default_policy.pk}
        if request.GET.get("seed"):
            initial["seed_candidate"] = request.GET["seed"][:40]
        form = CampaignStartForm(initial=initial, project=project)
    recent = candidate_list(project=project).order_by("-created_at")[:SEED_CHOICES]
    return render(
        request,
        "campaigns/new.html",
        {"project": project, "form": form, "recent_candidates": recent},
        status=400 if request.method == "POST" else 200,
    )

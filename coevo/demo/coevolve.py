"""The demo's co-evolution (``coevo demo --coevolve``): harness and policy steps in turn.

An alternating campaign (coevo.campaigns.alternation) on the demo's TextWorld slice, from the
naive seed (a later run: from the earlier demo campaign's best, coevo.demo.campaign_start): a
harness step (a config proposal), a policy step (the best candidate's search
trajectories exported, a LoRA adapter trained on them on the CPU by the built-in trainer,
converted to GGUF, registered as a policy version and served by the llama.cpp host), and a
harness step under the new policy. Then the harness x policy matrix (HRP): the harness the
first step found for the base policy and the campaign's final best, each under the base policy
and under the new one, on the validation split, so a mismatch (the harness tuned for the base
policy no longer best under the new one) is visible.

Imported once Django is set up (``coevo.demo.run``).
"""

from __future__ import annotations

import time
from typing import Any

from coevo.campaigns.models import Campaign, Proposal, ProposalState, ProposerKind
from coevo.campaigns.services import campaign_create, campaign_start
from coevo.demo.campaign import CAMPAIGN_KNOBS, demo_start_choose, demo_textworld_suite, pct
from coevo.demo.campaign_start import DEMO_NAME_PREFIX
from coevo.demo.processes import Services
from coevo.demo.progress import progress_step
from coevo.matrices.models import MATRIX_FINAL_STATES, CompatibilityMatrix
from coevo.matrices.selectors import matrix_grid, matrix_state
from coevo.matrices.services import matrix_create
from coevo.policies.models import PolicyVersion
from coevo.policies.services import policy_version_get_default
from coevo.projects.models import Project
from coevo.suites.models import Split
from coevo.training.builtin import trainer_register_cpu_lora
from coevo.training.models import Trainer

DEMO_TRAINER = "demo-cpu-lora"
# The demo's policy step: a rank-8 LoRA on the attention projections (the trainer's default),
# six steps of four of the best candidate's search turns at a learning rate high enough to
# move a few steps: minutes on 2 cores (a step of 4 TextWorld prompts takes 20-60 s).
TRAINER_OPTIONS = ("--steps", "6", "--learning-rate", "5e-4", "--max-length", "1024")
TRAINER_TIME_LIMIT_S = 1200
# What the policy step trains on: the model turns of the best candidate's search games that it
# won (the export gives the turns of lost games weight 0, and SFT has no use for them).
EXPORT = {"format": "prompt_completion", "successful_only": True}


def demo_trainer() -> Trainer:
    """The built-in CPU trainer, registered (again, so its options are the demo's) for the demo."""
    return trainer_register_cpu_lora(
        name=DEMO_TRAINER,
        replace=True,
        time_limit_s=TRAINER_TIME_LIMIT_S,
        options=TRAINER_OPTIONS,
        description="The demo's policy step: the built-in CPU LoRA trainer (coevo demo --coevolve)",
    )


def demo_coevolve_campaign(
    *, project: Project, user: Any, games: int, max_steps: int, seed: int | None
) -> Campaign:
    """Harness step, policy step, harness step: the middle one trains the policy. It starts
    where the demo's config campaign would (coevo.demo.campaign_start)."""
    trainer = demo_trainer()
    start = demo_start_choose(project=project, user=user, seed=seed)
    suite = demo_textworld_suite(project=project, games=games, max_steps=max_steps)
    number = project.campaigns.count() + 1
    campaign = campaign_create(
        project=project,
        name=f"{DEMO_NAME_PREFIX}{number}: TextWorld co-evolution (seed {start.seed})",
        seed_candidate=start.candidate,
        policy_version=policy_version_get_default(),
        suite=suite,
        strategy=[{"kind": "config", "options": {"knobs": CAMPAIGN_KNOBS}}],
        # Harness proposals: policy steps have their own quota (max_policy_steps), so two
        # harness steps with the policy step between them.
        max_proposals=2,
        seed=start.seed,
        created_by=user,
        alternation={
            "trainer": trainer.name,
            "switch": "fixed",
            "harness_steps": 1,
            "policy_steps": 1,
            "max_policy_steps": 1,
            "time_limit_s": TRAINER_TIME_LIMIT_S,
            "export": dict(EXPORT),
        },
    )
    return campaign_start(campaign=campaign)


def coevolve_summary(campaign: Campaign) -> list[str]:
    """A line per step: what it was, its validation score, and the policy it ran under."""
    lines = []
    for proposal in campaign.proposals.order_by("sequence"):
        lines.append("  " + _step_line(proposal))
    version = new_policy_version(campaign)
    if version is not None:
        provenance = version.provenance or {}
        lines.append(
            f"New policy version {version.name} (parent {version.parent.name}): trained by "
            f"{provenance.get('trainer', '?')} on export {provenance.get('export', '?')}, "
            f"adapter sha256 {str(provenance.get('adapter_sha256', ''))[:12]}"
            + (
                f", llama.cpp adapter {provenance['adapter_gguf']['tensors']} tensors"
                if isinstance(provenance.get("adapter_gguf"), dict)
                else ""
            )
        )
        adopted = campaign.active_policy_version.id == version.id
        lines.append(
            "The campaign adopted it (it raised the best validation score)."
            if adopted
            else "The campaign kept the base policy (the new one did not raise the best "
            "validation score)."
        )
    return lines


def _step_line(proposal: Proposal) -> str:
    policy = proposal.policy_version.name if proposal.policy_version_id else "the campaign's"
    if proposal.kind == ProposerKind.SEED:
        label = "seed"
    elif proposal.kind == ProposerKind.POLICY:
        label = f"step {proposal.sequence}: policy step"
    else:
        label = f"step {proposal.sequence}: harness step"
    if proposal.state != ProposalState.EVALUATED:
        return f"{label}: {proposal.state} ({proposal.state_detail[:200]})"
    changed = ""
    if proposal.kind == ProposerKind.CONFIG and proposal.params:
        changed = " · " + ", ".join(f"{k} = {v!r}" for k, v in sorted(proposal.params.items()))
    return (
        f"{label}: validation {pct(proposal.validation_score)}, search "
        f"{pct(proposal.search_score)} under {policy}{changed}"
    )


def new_policy_version(campaign: Campaign) -> PolicyVersion | None:
    step = (
        campaign.proposals.filter(kind=ProposerKind.POLICY, policy_version__isnull=False)
        .select_related("policy_version__parent")
        .first()
    )
    return step.policy_version if step is not None else None


def demo_matrix(*, campaign: Campaign, user: Any) -> CompatibilityMatrix | None:
    """The harness x policy matrix: the harness found for the base policy and the final best,
    under the base policy and the new one (validation split, the campaign's seed: cells the
    campaign already evaluated come from the rollout cache)."""
    version = new_policy_version(campaign)
    if version is None:
        return None
    policy_step = campaign.proposals.get(kind=ProposerKind.POLICY)
    before = (
        campaign.proposals.filter(sequence__lt=policy_step.sequence, state=ProposalState.EVALUATED)
        .exclude(validation_score=None)
        .order_by("-validation_score", "sequence")
        .first()
    )
    candidates = [before.candidate] if before is not None else []
    best = campaign.best_candidate
    if best is not None and best not in candidates:
        candidates.append(best)
    return matrix_create(
        project=campaign.project,
        candidates=candidates,
        policy_versions=[version.parent, version],
        suite=campaign.suite,
        split=Split.VALIDATION,
        seed=campaign.seed,
        name=f"{campaign.name}: harness x policy",
        created_by=user,
    )


def wait_for_matrix(matrix: CompatibilityMatrix, services: Services) -> None:
    with progress_step("harness x policy matrix", waiting_on="waiting for the worker") as step:
        while (state := matrix_state(matrix=matrix)) not in MATRIX_FINAL_STATES:
            step.update(f"matrix {state}")
            services.check_alive()
            time.sleep(2)


def matrix_summary(matrix: CompatibilityMatrix) -> list[str]:
    """The grid as text: a row per harness, a cell per policy; a mismatch (HRP) named."""
    grid = matrix_grid(matrix=matrix)
    lines = [
        "Harness x policy on validation: "
        + " | ".join(f"{column.policy_version.name}" for column in grid.columns)
    ]
    for row in grid.rows:
        cells = " | ".join(
            pct(cell.mean) + (" (best for this harness)" if cell.best_in_row else "")
            for cell in row.cells
        )
        lines.append(f"  {row.candidate.short_sha}: {cells}")
    for cell in grid.mismatches:
        lines.append(
            f"  mismatch: {cell.candidate.short_sha} under {cell.policy_version.name}: "
            f"{cell.mismatch.reason}"
        )
    return lines


__all__ = [
    "coevolve_summary",
    "demo_coevolve_campaign",
    "demo_matrix",
    "demo_trainer",
    "matrix_summary",
    "wait_for_matrix",
]

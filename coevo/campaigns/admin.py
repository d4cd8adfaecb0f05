from django.contrib import admin

from coevo.campaigns.models import Campaign, Proposal


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "state", "best_validation_score", "created_at")
    list_filter = ("state",)
    search_fields = ("name", "id")
    raw_id_fields = ("seed_candidate", "best_candidate", "budget", "suite", "policy_version")


@admin.register(Proposal)
class ProposalAdmin(admin.ModelAdmin):
    list_display = ("campaign", "sequence", "kind", "state", "search_score", "validation_score")
    list_filter = ("state", "kind")
    raw_id_fields = ("campaign", "candidate", "search_evaluation", "validation_evaluation")

    # Proposals are immutable records: the admin shows them, it does not edit them.
    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False

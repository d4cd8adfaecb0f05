from django.contrib import admin

from harness_store.models import Candidate


@admin.register(Candidate)
class CandidateAdmin(admin.ModelAdmin):
    list_display = ["short_sha", "project", "author_name", "authored_at", "origin"]
    list_filter = ["project", "origin"]
    search_fields = ["sha", "message"]

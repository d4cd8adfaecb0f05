from django.contrib import admin

from coevo.projects.models import Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    inlines = [MembershipInline]

from rest_framework.pagination import CursorPagination


class CreatedCursorPagination(CursorPagination):
    """Newest first; cursors stay valid while rows are added (no offsets that shift)."""

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200

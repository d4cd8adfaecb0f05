"""The download of a built export, as the pages and the API both serve it."""

from __future__ import annotations

from pathlib import Path

from django.http import FileResponse


def export_file_response(*, path: Path, filename: str) -> FileResponse:
    """Streams the file in blocks (FileResponse), never loading it into memory."""
    response = FileResponse(
        path.open("rb"), as_attachment=True, filename=filename, content_type="application/x-ndjson"
    )
    # Never stored by the browser or any proxy: the file is immutable, but access to it is not.
    # Each download asks again, so a member removed from the project (or an export whose
    # project is gone) gets a 404 rather than a copy cached on the way.
    response["Cache-Control"] = "private, no-store"
    return response

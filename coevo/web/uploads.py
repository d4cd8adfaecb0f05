"""Bounding dashboard uploads before and while their body is read.

Django's DATA_UPLOAD_MAX_MEMORY_SIZE bounds form fields only, and FILE_UPLOAD_MAX_MEMORY_SIZE
only decides when a file moves from memory to a temporary file: neither stops a large file,
which Django streams to disk whole before the view runs. So a form that takes files refuses a
declared length above the limit before reading anything, and installs ``UploadLimitHandler``,
which stops reading once the files pass the limit (the declared length is what WSGI servers
bound the body by, so this is the second line, for a body shaped to pass the first).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpRequest

# Room for the multipart envelope and the small form fields around the files.
MULTIPART_SLACK = 64 * 1024


def upload_limit_bytes() -> int:
    """The most bytes of files one dashboard upload may carry (COEVO_API_MAX_UPLOAD_MB, the
    API's limit too)."""
    return settings.COEVO_API_MAX_UPLOAD_MB * 1024**2


def declared_length(request: HttpRequest) -> int:
    try:
        return max(0, int(request.META.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


class UploadLimitHandler(FileUploadHandler):
    """Passes file data on to the next handler until the files of the request together pass
    ``limit`` bytes; then stops the upload without reading the rest (``exceeded`` says so)."""

    def __init__(self, request: HttpRequest, *, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.received = 0
        self.exceeded = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.exceeded = True
            # connection_reset: do not read (and discard) the remaining body either.
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size: int) -> Any:
        return None  # the next handler (memory or temporary file) makes the file


def upload_limit_install(request: HttpRequest) -> UploadLimitHandler:
    """Put the limit first among the request's upload handlers. Call it before anything reads
    ``request.POST`` or ``request.FILES`` (the CSRF check does: the view must be
    ``csrf_exempt`` and check CSRF itself afterwards)."""
    handler = UploadLimitHandler(request, limit=upload_limit_bytes())
    request.upload_handlers.insert(0, handler)
    return handler

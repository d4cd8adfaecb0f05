from django.http import HttpRequest, JsonResponse

from coevo.api.exceptions import error_body


def api_not_found(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        error_body("not_found", f"No API resource at {request.path}: see /api/v1/docs/."),
        status=404,
    )

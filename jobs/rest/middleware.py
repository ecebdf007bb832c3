"""Errors under /api/ are JSON, whichever layer answers.

DRF answers its own views' errors as JSON (jobs/rest/errors.py), but some answers come from
elsewhere: a path no route matches (/api/v1/runs/abc: the <int:...> converter refuses it,
so Django's HTML 404 page), a 500 page, a CSRF 403, require_GET's empty 405. A client of
the API must not have to parse HTML, so such an answer is replaced by the same shape the
route's own errors use: {"detail": ...} under /api/v1/, the engine's {"error": ...} under
the run-token door (/api/runs/...). Headers that tell the client what to do (Allow,
WWW-Authenticate, Retry-After) are kept.
"""

from http import HTTPStatus

from django.http import JsonResponse

KEPT_HEADERS = ("Allow", "WWW-Authenticate", "Retry-After")


def is_json(response) -> bool:
    return response.get("Content-Type", "").split(";")[0].strip() == "application/json"


class ApiErrorsAsJson:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (response.status_code < 400 or is_json(response)
                or not request.path.startswith("/api/")):
            return response
        try:
            phrase = HTTPStatus(response.status_code).phrase
        except ValueError:
            phrase = "error"
        message = f"{phrase}: {request.method} {request.path}"
        if response.status_code == 404:
            message += " (no such route; ids in paths are integers)"
        key = "detail" if request.path.startswith("/api/v1/") else "error"
        replaced = JsonResponse({key: message}, status=response.status_code)
        for name in KEPT_HEADERS:
            if name in response:
                replaced[name] = response[name]
        return replaced

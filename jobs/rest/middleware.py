"""Errors under /api/ are JSON, whichever layer answers.

DRF answers its own views' errors as JSON (jobs/rest/errors.py), but some answers come from
elsewhere: a path no route matches (/api/v1/runs/abc: the <int:...> converter refuses it,
so Django's HTML 404 page), a 500 page, a CSRF 403, require_GET's empty 405, the host
check's 400. A client of the API must not have to parse HTML, so such an answer is
replaced by {"detail": ...}, the REST API's shape. Under the run-token door (/api/runs/...)
too, and deliberately not with its {"error": ...}: the engine's sender reads "error" as
the ingest itself refusing the batch (set aside), while anything else there (a host check,
a proxy) means the server is away and the batch is retried. Headers that tell the client
what to do (Allow, WWW-Authenticate, Retry-After) are kept.
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
        replaced = JsonResponse({"detail": message}, status=response.status_code)
        for name in KEPT_HEADERS:
            if name in response:
                replaced[name] = response[name]
        return replaced

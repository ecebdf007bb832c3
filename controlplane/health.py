"""Liveness probe for load balancers and the embedded launcher."""

from django.http import JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request):
    return JsonResponse({"ok": True})

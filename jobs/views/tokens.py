"""The user's API tokens: create (shown once, stored hashed) and revoke.

    GET  /settings/tokens                 the user's tokens (name, first characters, last use)
    POST /settings/tokens                 {name} -> the page, with the new token shown once
    POST /settings/tokens/<id>/revoke     the token stops working at once

Any logged-in user may hold tokens: a token acts with its user's role, so a viewer's
token reads and nothing more.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from jobs.auth import is_operator
from jobs.models import ApiToken


@never_cache  # the page shows a new token once: no browser or proxy cache may keep it
@login_required
@require_http_methods(["GET", "POST"])
def tokens_page(request):
    created = None
    if request.method == "POST":
        name = request.POST.get("name", "").strip()[:100]
        if not name:
            messages.error(request, "Name the token (where it will be used, e.g. 'laptop CLI').")
        else:
            _, created = ApiToken.issue(request.user, name)
    tokens = ApiToken.objects.filter(user=request.user)
    return render(request, "jobs/settings/tokens.html", {
        "tokens": tokens, "created": created, "operator": is_operator(request.user),
        "site_url": request.build_absolute_uri("/")})


@login_required
@require_POST
def token_revoke(request, token_id: int):
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    token.revoke()
    messages.info(request, f"Token '{token.name}' revoked.")
    return redirect("tokens")

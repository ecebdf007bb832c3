"""Who calls the REST API, and what their role lets them do: the pages' rules (jobs.auth).

    Authorization: Bearer rlp_...   a user's API token (jobs.models.ApiToken) acts as the user
    a logged-in browser session     the docs page's "Try it out" (CSRF-checked)

Reading needs a login; anything that changes state (POST) needs an operator, exactly as
``operator_required`` guards every page that changes state.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from jobs.auth import bearer_token, is_operator
from jobs.models import ApiToken

OPERATORS_ONLY = "operators only: ask an admin to add you to 'operator'"


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        token = bearer_token(request)
        if token is None:
            return None  # no token: the session may still authenticate
        user = ApiToken.user_for(token)
        if user is None:
            raise exceptions.AuthenticationFailed(
                "this API token is unknown or revoked; create one at /settings/tokens")
        return user, token

    def authenticate_header(self, request):
        return self.keyword  # 401 (not 403) when no credentials came


class ReadOrOperator(permissions.BasePermission):
    """Any logged-in user reads; only operators change state."""

    message = OPERATORS_ONLY

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(request.user)


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema names the token (drf-spectacular finds it on import)."""

    target_class = ApiTokenAuthentication
    name = "token"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer",
                "description": "a token from /settings/tokens; it acts with its user's role"}

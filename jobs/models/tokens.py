"""Per-user API tokens for the REST API and the CLI: shown once, stored as a sha256 hash.

A token acts as its user, with that user's role (jobs.auth): a viewer's token reads, an
operator's token also launches, stops, forks and acknowledges.
"""

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.models.run import hash_token

PREFIX = "rlp_"


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # The first characters, so the owner can tell tokens apart on the settings page.
    hint = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}..., {self.user})"

    @classmethod
    def issue(cls, user, name: str) -> tuple["ApiToken", str]:
        """A new token for ``user``: the row, and the raw token (returned only here)."""
        raw = PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, token_hash=hash_token(raw),
                                   hint=raw[:len(PREFIX) + 6])
        return token, raw

    @classmethod
    def user_for(cls, raw: str):
        """The active user a live token belongs to, or None."""
        token = (cls.objects.select_related("user")
                 .filter(token_hash=hash_token(raw), revoked_at=None).first())
        if token is None or not token.user.is_active:
            return None
        cls.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
        return token.user

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            ApiToken.objects.filter(pk=self.pk, revoked_at=None).update(
                revoked_at=self.revoked_at)

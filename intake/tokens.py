"""API tokens: made once, stored as a digest, checked on every request, revoked by staff."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.db import transaction

from clock import Clock, default_clock
from intake.models import ApiToken, Integration

TOKEN_PREFIX = "wr_"
SCOPES = tuple(ApiToken.Scope.values)


def shown_prefix(secret: str) -> str:
    """The token's first characters, as the admin shows them: enough to name it, not to use it."""
    return secret[: len(TOKEN_PREFIX) + 6]


def digest_of(token: str) -> str:
    """SHA-256 of the whole token: 32 random bytes need no slow hash to resist guessing."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class NewToken:
    token: ApiToken
    secret: str  # shown once, never stored


def token_create(
    *, integration: str, name: str, scopes: list[str], created_by: str, clock: Clock | None = None
) -> NewToken:
    """Make a token for ``integration`` (created if new) with ``scopes``; return it with its secret."""
    integration = integration.strip()
    name = name.strip() or "default"
    unknown = sorted(set(scopes) - set(SCOPES))
    if not integration:
        raise ValueError("Name the integration the token is for, e.g. 'shop'.")
    for what, value, field in (
        ("the integration's name", integration, Integration._meta.get_field("name")),
        ("the label", name, ApiToken._meta.get_field("name")),
    ):
        if len(value) > field.max_length:
            raise ValueError(f"Shorten {what} to {field.max_length} characters or fewer.")
    if unknown:
        raise ValueError(f"Unknown scope {', '.join(unknown)}; choose from {', '.join(SCOPES)}.")
    if not scopes:
        raise ValueError(f"Give the token at least one scope: {', '.join(SCOPES)}.")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        owner, _ = Integration.objects.get_or_create(name=integration)
        token = ApiToken.objects.create(
            integration=owner,
            name=name,
            prefix=shown_prefix(secret),
            digest=digest_of(secret),
            scopes=[scope for scope in SCOPES if scope in scopes],
            created_at=(clock or default_clock()).now(),
            created_by=created_by,
        )
    return NewToken(token, secret)


def token_revoke(*, token: ApiToken, revoked_by: str, clock: Clock | None = None) -> bool:
    """Revoke ``token`` from now on; False if it already was."""
    return bool(
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=(clock or default_clock()).now(), revoked_by=revoked_by
        )
    )


def token_authenticate(secret: str, *, clock: Clock | None = None) -> ApiToken | None:
    """The live token whose secret this is, or None (unknown, malformed or revoked)."""
    if not secret.startswith(TOKEN_PREFIX) or len(secret) > 100:
        return None
    token = (
        ApiToken.objects.select_related("integration")
        .filter(digest=digest_of(secret), revoked_at__isnull=True)
        .first()
    )
    if token is None:
        return None
    now = (clock or default_clock()).now()
    # At most one write a minute per token: the column says "in use", not a request log.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


__all__ = [
    "SCOPES",
    "NewToken",
    "digest_of",
    "shown_prefix",
    "token_authenticate",
    "token_create",
    "token_revoke",
]

"""API tokens from the command line: printed once, stored as a digest, scoped, revoked."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from intake.models import ApiToken
from tests.intake.conftest import Api

pytestmark = pytest.mark.django_db


def create(*argv: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("create_api_token", *argv, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_command_prints_the_token_alone_on_its_last_line_and_stores_only_a_digest(client):
    out, err = create("shop", "--scope", "read", "--label", "production")
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("wr_") and " " not in secret and len(secret) > 40
    token = ApiToken.objects.get()
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {token.prefix, token.digest, token.name}
    assert token.scopes == ["read"] and token.integration.name == "shop"
    assert token.prefix in err and "shown once" in err
    api = Api(client, secret)
    assert api.get("/api/workshops").status_code == 200
    assert api.post("/api/attendees", {"email": "a@example.com", "name": "A"}).status_code == 403


def test_without_a_scope_a_token_may_read_and_enrol_but_not_change_workshops():
    create("lms")
    assert ApiToken.objects.get().scopes == ["read", "enrolments"]


def test_an_unknown_scope_or_a_blank_name_is_refused_and_nothing_is_made():
    with pytest.raises(CommandError, match="invalid choice: 'admin'"):
        create("shop", "--scope", "admin")
    with pytest.raises(CommandError, match="Name the integration"):
        create("  ")
    assert not ApiToken.objects.exists()


def test_revoke_by_prefix_then_the_token_gets_401(client):
    out, _ = create("shop")
    secret = out.strip().splitlines()[-1]
    token = ApiToken.objects.get()
    said = StringIO()
    call_command("revoke_api_token", token.prefix + "…", stdout=said)
    assert said.getvalue().startswith("Revoked shop/default")
    assert Api(client, secret).get("/api/workshops").status_code == 401
    with pytest.raises(CommandError, match="No API token starts with 'wr_nope'"):
        call_command("revoke_api_token", "wr_nope")


def test_a_leaked_token_pasted_whole_is_revoked(client):
    """The token itself does start with its prefix: an operator revoking a leaked one pastes
    what leaked, and must not be told no token starts with it."""
    out, _ = create("shop")
    secret = out.strip().splitlines()[-1]
    said = StringIO()
    call_command("revoke_api_token", secret, stdout=said)
    assert said.getvalue().startswith("Revoked shop/default")
    assert secret not in said.getvalue()
    assert Api(client, secret).get("/api/workshops").status_code == 401


def test_a_name_or_label_too_long_to_store_is_refused_saying_so_and_nothing_is_made():
    with pytest.raises(CommandError, match="Shorten the integration's name to 100 characters"):
        create("s" * 101)
    with pytest.raises(CommandError, match="Shorten the label to 100 characters"):
        create("shop", "--label", "l" * 101)
    assert not ApiToken.objects.exists()


def test_an_integrations_name_is_kept_once_made_as_its_ids_are_found_by_it(admin_client):
    """The CSV import and tokens name an integration: renamed in the admin, the next import
    under the old name made a new integration, its ids no longer naming the same people."""
    from intake.models import Integration

    csv = Integration.objects.create(name="csv")
    page = f"/admin/intake/integration/{csv.pk}/change/"
    assert admin_client.post(page, {"name": "csv-old"}).status_code in (200, 302)
    csv.refresh_from_db()
    assert csv.name == "csv"
    assert admin_client.post("/admin/intake/integration/add/", {"name": "lms"}).status_code == 302
    assert Integration.objects.filter(name="lms").exists()

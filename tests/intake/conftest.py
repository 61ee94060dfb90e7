"""API fixtures: tokens made through the service, a client that sends them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest


@pytest.fixture(autouse=True)
def plain_static_files(settings):
    """Serve the docs' assets without collectstatic's manifest (DEBUG is off in the tests)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def make_token(db):
    from intake.tokens import token_create

    def make(scopes=("read", "enrolments", "workshops"), integration="shop", name="test"):
        return token_create(
            integration=integration, name=name, scopes=list(scopes), created_by="tests"
        )

    return make


class Api:
    """The Django test client speaking JSON with a Bearer token."""

    def __init__(self, client, secret: str | None) -> None:
        self.client = client
        self.secret = secret

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.secret}"} if self.secret else {}

    def get(self, path: str, **params):
        return self.client.get(path, params, headers=self._headers())

    def post(self, path: str, body=None):
        return self.client.post(
            path, json.dumps(body or {}), content_type="application/json", headers=self._headers()
        )

    def patch(self, path: str, body):
        return self.client.patch(
            path, json.dumps(body), content_type="application/json", headers=self._headers()
        )


@pytest.fixture
def api(client, make_token):
    return Api(client, make_token().secret)


@pytest.fixture
def api_as(client, make_token):
    def as_(*scopes, integration="shop"):
        return Api(client, make_token(scopes, integration=integration).secret)

    return as_


@pytest.fixture
def workshop_body(clock):
    def body(**changes):
        start = clock.now() + timedelta(days=2)
        return {
            "title": "Pottery",
            "starts_at": start.isoformat(),
            "ends_at": (start + timedelta(hours=2)).isoformat(),
            "timezone": "Europe/Berlin",
            **changes,
        }

    return body

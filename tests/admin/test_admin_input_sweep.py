"""Every admin form and action that takes input, fed what Hypothesis makes up (issue 34,
item 14): no answer is a 500, and a submission the admin turns down changes nothing.

Found by hand before this sweep: ``attendee=²`` and 5,000 digits on the preview, a start
in the year 9999 in ``Etc/GMT+12``, and the date-hierarchy link to that year. The sweep
posts as a superuser, so no permission stops a value before the code that reads it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reminders.models import Reminder, StaffDecision
from workshops.models import Attendee, Enrollment, Workshop

pytestmark = pytest.mark.django_db

SWEEP = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same inputs every run: a failure here is reproducible
)

# Text a browser can send: any character but lone surrogates (not encodable), with the
# nasty ones over-represented.
NASTY = ["", " ", "\r\n", "\x00", "²", "٣", "9" * 5000, "-1", "1e9", "{0}", "%s", "<b>", "'"]
text = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=300),
)
ids = st.lists(st.one_of(st.sampled_from(["1", "0", "-1", "²", "9" * 40, "x"]), text), max_size=4)
moments = st.one_of(
    st.sampled_from(["9999-12-31", "0001-01-01", "1970-01-01", "2026-02-30", ""]),
    st.dates().map(str),
    text,
)
clock_times = st.one_of(st.sampled_from(["20:00", "24:00", "00:00", ""]), st.times().map(str), text)
zones = st.one_of(
    st.sampled_from(["Etc/GMT+12", "Etc/GMT-14", "Europe/Berlin", "UTC", "", "Mars/Base"]), text
)


def _state() -> tuple:
    """Everything a submission could change, as plain values."""
    return tuple(
        list(model.objects.order_by("pk").values())
        for model in (Workshop, Attendee, Enrollment, Reminder, StaffDecision)
    )


def _submit(client, url: str, data: dict, *, method: str = "post"):
    before = _state()
    answer = getattr(client, method)(url, data)
    assert answer.status_code != 500, (url, data)
    turned_down = answer.status_code >= 400 or (
        answer.status_code == 200 and method == "post" and _has_errors(answer)
    )
    if turned_down:
        assert _state() == before, f"a refused {url} changed something: {data!r}"
    return answer


def _has_errors(answer) -> bool:
    context = answer.context
    if context is None:
        return False
    for key in ("errors", "form", "adminform"):
        value = context.get(key) if hasattr(context, "get") else None
        if key == "errors" and value:
            return True
        form = getattr(value, "form", value)
        if getattr(form, "errors", None):
            return True
    return False


@pytest.fixture
def site(admin_client, make_workshop, enrol):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, 2)
    return admin_client, workshop


@pytest.mark.long
@SWEEP
@given(title=text, zone=zones, day=moments, time=clock_times, intro=text, email=text)
@example(title="t", zone="Etc/GMT+12", day="9999-12-31", time="20:00", intro="", email="")
@example(title="t", zone="Etc/GMT-14", day="0001-01-01", time="00:00", intro="x" * 10**6, email="")
def test_the_workshop_form(site, title, zone, day, time, intro, email):
    client, workshop = site
    data = {
        "title": title, "timezone": zone,
        "starts_at_0": day, "starts_at_1": time, "ends_at_0": day, "ends_at_1": time,
        "location": title, "join_url": title, "contact_name": title, "contact_email": email,
        "language": "en", "reminder_subject": title, "reminder_intro": intro,
        "enrollments-TOTAL_FORMS": "0", "enrollments-INITIAL_FORMS": "0",
        "texts-TOTAL_FORMS": "0", "texts-INITIAL_FORMS": "0",
    }  # fmt: skip
    _submit(client, "/admin/workshops/workshop/add/", data)
    _submit(client, f"/admin/workshops/workshop/{workshop.pk}/change/", data)


@SWEEP
@given(name=text, email=text, zone=zones, language=text)
def test_the_attendee_form(site, name, email, zone, language):
    client, _ = site
    data = {"name": name, "email": email, "timezone": zone, "language": language}
    _submit(client, "/admin/workshops/attendee/add/", data)


@SWEEP
@given(attendee=text, workshop=text, status=text)
def test_the_enrollment_form(site, attendee, workshop, status):
    client, _ = site
    data = {"attendee": attendee, "workshop": workshop, "status": status}
    _submit(client, "/admin/workshops/enrollment/add/", data)


ACTIONS = {
    "/admin/workshops/workshop/": ["cancel_selected", "reinstate_selected", "replay_for_selected"],
    "/admin/workshops/attendee/": ["erase_selected"],
    "/admin/workshops/enrollment/": ["cancel_selected"],
    "/admin/reminders/reminder/": ["replay_selected", "resolve_unknown"],
}


@SWEEP
@given(
    changelist=st.sampled_from(sorted(ACTIONS)),
    pick=st.integers(0, 2),
    selected=ids,
    reason=text,
    decision=text,
    confirm=st.sampled_from(["yes", "", "no"]),
    across=st.sampled_from(["0", "1", "x"]),
)
def test_every_action(site, changelist, pick, selected, reason, decision, confirm, across):
    client, _ = site
    actions = ACTIONS[changelist]
    data = {
        "action": actions[pick % len(actions)],
        "_selected_action": selected,
        "select_across": across,
        "index": "0",
        "post": confirm,
        "reason": reason,
        "decision": decision,
    }
    _submit(client, changelist, data)


@SWEEP
@given(attendee=text, token=text)
@example(attendee="²", token="")
@example(attendee="9" * 5000, token="f" * 32)
def test_the_preview_and_the_test_send(site, attendee, token, monkeypatch):
    client, workshop = site
    monkeypatch.setattr("reminders.queue.publish_test", lambda decision_id: None)
    url = f"/admin/workshops/workshop/{workshop.pk}/preview/"
    _submit(client, url, {"attendee": attendee}, method="get")
    _submit(client, url, {"attendee": attendee, "request_token": token})


@SWEEP
@given(query=text, year=text, status=text, order=text)
@example(query="", year="9999", status="", order="")
def test_changelist_search_filters_and_dates(site, query, year, status, order):
    client, _ = site
    for changelist in (*ACTIONS, "/admin/reminders/staffdecision/"):
        _submit(
            client,
            changelist,
            {"q": query, "starts_at__year": year, "status": status, "o": order},
            method="get",
        )


@pytest.mark.django_db
def test_no_list_answers_a_nul_in_a_filter_value_with_a_500(admin_client):
    """PostgreSQL refuses NUL in text: every list of ours, on each of its filters, answers as
    to a filter it cannot apply (back to the whole list), not with a DataError."""
    from django.contrib import admin
    from django.urls import reverse

    failed = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("workshops", "reminders", "intake"):
            continue
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for entry in model_admin.list_filter:
            name = entry if isinstance(entry, str) else getattr(entry, "parameter_name", None)
            if isinstance(entry, tuple):
                name = entry[0]
            if not name:
                continue
            response = admin_client.get(f"{url}?{name}=%00")
            if response.status_code not in (200, 302):
                failed.append(f"{url}?{name}=%00: {response.status_code}")
    assert failed == []

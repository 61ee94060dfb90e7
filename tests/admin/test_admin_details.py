"""What staff read in the admin: every time with its zone, no "Now" that lies about the
zone, search by name, provider errors apart from staff notes, replay reasons (issue 11,
item 9)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format

from reminders.admin.columns import format_utc
from reminders.models import DeliveryAttempt, Reminder, StaffDecision
from reminders.services.replay import reminder_resolve_unknown
from tests.admin.conftest import PERMANENT_ERROR
from workshops.models import Enrollment

pytestmark = pytest.mark.django_db

# Django's own rendering of a datetime, e.g. "March 2, 2026, 10:00 a.m.": no zone at all.
BARE = re.compile(r"\b\w+ \d{1,2}, \d{4}, \d{1,2}(:\d\d)? [ap]\.m\.|\bmidnight\b|\bnoon\b")


def _page(client, url) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_every_time_on_the_reminder_page_carries_its_zone(admin_client, make_reminders, clock):
    [pk] = make_reminders(1, "failed")
    moments = {
        "next_attempt_at": clock.now() + timedelta(minutes=7),
        "queued_until": clock.now() + timedelta(minutes=9),
        "lease_expires_at": clock.now() + timedelta(minutes=11),
        "sent_at": clock.now() + timedelta(minutes=13),
    }
    Reminder.objects.filter(pk=pk).update(**moments)
    page = _page(admin_client, reverse("admin:reminders_reminder_change", args=[pk]))
    for value in moments.values():
        assert format_utc(value) in page
        # Django's own, unlabelled rendering of the value must not be there.
        assert date_format(timezone.localtime(value), "DATETIME_FORMAT") not in page  # noqa: TID251
    attempt = DeliveryAttempt.objects.get(reminder_id=pk)
    assert format_utc(attempt.claimed_at) in page
    assert not BARE.search(page), BARE.search(page).group(0)


def test_audit_workshop_and_enrollment_times_carry_their_zone(
    admin_client, make_reminders, replayer
):
    [pk] = make_reminders(1, "failed")
    reminder = Reminder.objects.select_related("workshop", "enrollment").get(pk=pk)
    from reminders.services.replay import reminder_replay

    reminder_replay(reminders=Reminder.objects.filter(pk=pk), actor=replayer)
    audit = StaffDecision.objects.get()
    pages = [
        _page(admin_client, reverse("admin:reminders_staffdecision_changelist")),
        _page(admin_client, reverse("admin:reminders_staffdecision_change", args=[audit.pk])),
        _page(admin_client, reverse("admin:workshops_workshop_change", args=[reminder.workshop_id])),
        _page(admin_client, reverse("admin:workshops_enrollment_changelist")),
        _page(admin_client, reverse("admin:workshops_enrollment_change", args=[reminder.enrollment_id])),
    ]  # fmt: skip
    assert format_utc(audit.created_at) in pages[0] and format_utc(audit.created_at) in pages[1]
    assert format_utc(reminder.workshop.created_at) in pages[2]
    enrolled = Enrollment.objects.get(pk=reminder.enrollment_id).created_at
    assert format_utc(enrolled) in pages[3] and format_utc(enrolled) in pages[4]
    for page in pages:
        assert not BARE.search(page), BARE.search(page).group(0)


def test_the_workshop_form_has_no_now_shortcut_for_its_zone_read_times(admin_client):
    page = _page(admin_client, reverse("admin:workshops_workshop_add"))
    assert 'name="starts_at_0"' in page and 'name="starts_at_1"' in page
    assert "vDateField" in page  # the calendar stays
    assert "vTimeField" not in page  # DateTimeShortcuts.js adds "Now" to these


def test_reminders_can_be_found_by_attendee_name(admin_client, make_reminders):
    [pk] = make_reminders(1, "failed")
    Reminder.objects.get(pk=pk).attendee.__class__.objects.filter(reminders__pk=pk).update(
        name="Grace Hopper"
    )
    make_reminders(1, "failed")
    response = admin_client.get(reverse("admin:reminders_reminder_changelist"), {"q": "hopper"})
    assert [r.pk for r in response.context["cl"].result_list] == [pk]


def test_the_error_column_shows_provider_errors_never_staff_notes(
    admin_client, make_reminders, resolver
):
    [failed] = make_reminders(1, "failed")
    [unknown] = make_reminders(1, "unknown")
    Reminder.objects.filter(pk=unknown).update(last_error="")
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=unknown),
        decision="mark_sent",
        reason="attendee confirmed by phone",
        actor=resolver,
    )
    response = admin_client.get(reverse("admin:reminders_reminder_changelist"))
    admin = response.context["cl"].model_admin
    rows = {r.pk: admin.short_error(r) for r in response.context["cl"].result_list}
    assert rows[failed] == PERMANENT_ERROR
    assert rows[unknown] == "-"
    assert "attendee confirmed by phone" not in response.content.decode()


def test_a_replay_takes_an_optional_reason_and_records_it(login, replayer, make_reminders):
    client = login(replayer)
    first, second = make_reminders(1, "failed"), make_reminders(1, "failed")
    url = reverse("admin:reminders_reminder_changelist")
    base = {"action": "replay_selected", "select_across": "0", "post": "yes"}
    client.post(url, {**base, "_selected_action": first, "reason": "provider fixed its DNS"})
    client.post(url, {**base, "_selected_action": second})
    reasons = list(StaffDecision.objects.order_by("id").values_list("reason", "changed"))
    assert reasons == [("provider fixed its DNS", 1), ("", 1)]


def test_every_time_on_the_api_and_csv_pages_carries_its_zone(admin_client, make_workshop, clock):
    """API tokens, API writes, integrations and CSV imports and exports showed Django's own
    rendering, in TIME_ZONE with no zone named, beside pages that say UTC."""
    from intake.models import ApiWrite, CsvTransfer, Integration
    from intake.tokens import token_create, token_revoke

    made = token_create(integration="shop", name="prod", scopes=["read"], created_by="tests")
    token = made.token
    token.__class__.objects.filter(pk=token.pk).update(last_used_at=clock.now())
    token_revoke(token=token, revoked_by="tests")
    token.refresh_from_db()
    write = ApiWrite.objects.create(
        token=token, token_label=token.label, created_at=clock.now(), method="POST",
        path="/api/v1/enrolments", status=201,
    )  # fmt: skip
    workshop = make_workshop()
    assert admin_client.get(f"/admin/intake/csvtransfer/export/{workshop.pk}/").status_code == 200
    transfer = CsvTransfer.objects.get()
    integration = Integration.objects.get(name="shop")
    pages = {
        url: _page(admin_client, url)
        for url in (
            "/admin/intake/apitoken/",
            f"/admin/intake/apitoken/{token.pk}/change/",
            "/admin/intake/apiwrite/",
            f"/admin/intake/apiwrite/{write.pk}/change/",
            "/admin/intake/csvtransfer/",
            f"/admin/intake/csvtransfer/{transfer.pk}/change/",
            "/admin/intake/integration/",
        )
    }
    bare = {url: m.group(0) for url, page in pages.items() if (m := BARE.search(page))}
    assert bare == {}
    assert format_utc(token.revoked_at) in pages["/admin/intake/apitoken/"]
    assert format_utc(write.created_at) in pages["/admin/intake/apiwrite/"]
    assert format_utc(transfer.created_at) in pages["/admin/intake/csvtransfer/"]
    assert format_utc(integration.created_at) in pages["/admin/intake/integration/"]

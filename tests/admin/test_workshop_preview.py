"""The workshop admin's reminder preview (issue 12, item 3): what one enrolled attendee would
receive, in their zone, with nothing sent, claimed or stored."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest

from delivery.message import key_digest
from reminders.models import DeliveryAttempt, Reminder
from workshops.models import Workshop
from workshops.services import attendee_get_or_create, enrollment_cancel, enrollment_create

pytestmark = pytest.mark.django_db


def _url(workshop, **query) -> str:
    base = f"/admin/workshops/workshop/{workshop.pk}/preview/"
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


@pytest.fixture
def workshop(make_workshop):
    workshop = make_workshop(title="Kiln <basics>", zone="Europe/Berlin")
    Workshop.objects.filter(pk=workshop.pk).update(
        location="Room 4", contact_name="Ada", contact_email="ada@example.org"
    )
    workshop.refresh_from_db()
    return workshop


def test_the_preview_shows_headers_text_html_and_calendar_for_the_chosen_attendee(
    client, viewer, workshop
):
    first, _ = attendee_get_or_create(email="a@example.com", name="Anna")
    second, _ = attendee_get_or_create(email="t@example.com", name="Taro", timezone="Asia/Tokyo")
    for person in (first, second):
        enrollment_create(attendee=person, workshop=workshop)
    client.force_login(viewer)
    statuses = list(Reminder.objects.order_by("pk").values_list("status", "updated_at"))

    page = client.get(_url(workshop, attendee=second.pk))
    assert page.status_code == 200
    text = page.content.decode()
    reminder = Reminder.objects.get(attendee=second)
    assert "Reminder: Kiln &lt;basics&gt; starts" in text
    assert "&quot;Kiln &lt;basics&gt;&quot; starts" in text  # the text part, escaped
    assert "JST (Asia/Tokyo)" in text  # the attendee's zone, not the workshop's
    assert "Ada &lt;ada@example.org&gt;" in text
    assert "Workshop reminders &lt;reminders." in text
    assert f"UID:{key_digest(reminder.key)}@workshop-reminders" in text
    # The HTML part sits escaped in a sandboxed iframe's srcdoc: it cannot run or navigate.
    assert 'sandbox=""' in text
    assert html.escape("<bdi>Taro</bdi>") in text
    # Read only: nothing claimed, sent or touched.
    assert list(Reminder.objects.order_by("pk").values_list("status", "updated_at")) == statuses
    assert not DeliveryAttempt.objects.exists()


def test_the_preview_defaults_to_the_first_attendee_and_refuses_one_not_enrolled(
    client, viewer, workshop
):
    enrolled, _ = attendee_get_or_create(email="a@example.com", name="Anna")
    gone, _ = attendee_get_or_create(email="g@example.com", name="Gone")
    enrollment_create(attendee=enrolled, workshop=workshop)
    enrollment_cancel(enrollment=enrollment_create(attendee=gone, workshop=workshop))
    client.force_login(viewer)

    assert "Hello Anna," in client.get(_url(workshop)).content.decode()
    refused = client.get(_url(workshop, attendee=gone.pk)).content.decode()
    assert "That attendee is not enrolled in this workshop" in refused
    assert "Gone &lt;g@example.com&gt;" not in refused  # not offered in the list either


def test_a_workshop_nobody_enrolled_in_says_so(client, viewer, workshop):
    client.force_login(viewer)
    page = client.get(_url(workshop)).content.decode()
    assert "Nobody is enrolled yet" in page


def test_the_preview_needs_the_view_permission(client, make_staff, workshop):
    client.force_login(make_staff("reminders.view_reminder"))
    assert client.get(_url(workshop)).status_code == 403


def test_the_change_page_links_to_the_preview(client, viewer, workshop):
    client.force_login(viewer)
    page = client.get(f"/admin/workshops/workshop/{workshop.pk}/change/").content.decode()
    assert _url(workshop) in page


def test_the_preview_of_an_attendee_whose_reminder_is_not_planned_yet_shows_it(
    client, viewer, make_workshop
):
    """A workshop beyond the planning lead has no reminder rows yet: the preview still shows
    the message its attendee will get, with the deadline the policy gives its start."""
    workshop = make_workshop(title="Glazing", starts_in=timedelta(days=30))
    person, _ = attendee_get_or_create(email="p@example.com", name="Pia")
    enrollment_create(attendee=person, workshop=workshop)
    assert not Reminder.objects.filter(workshop=workshop).exists()
    client.force_login(viewer)

    page = client.get(_url(workshop, attendee=person.pk))

    assert page.status_code == 200
    assert "Reminder: Glazing starts" in page.content.decode()
    assert not Reminder.objects.filter(workshop=workshop).exists()


@pytest.mark.parametrize("wanted", ["²", "٣", "9" * 5000, "-1", "1e3"])
def test_an_attendee_parameter_that_is_not_an_id_is_an_error_on_the_page_not_a_500(
    client, viewer, workshop, wanted
):
    person, _ = attendee_get_or_create(email="a@example.com", name="Anna")
    enrollment_create(attendee=person, workshop=workshop)
    client.force_login(viewer)

    page = client.get(_url(workshop), {"attendee": wanted})

    assert page.status_code == 200
    assert "That attendee is not enrolled in this workshop" in page.content.decode()


def test_no_staff_page_shows_the_attendees_own_links(client, viewer, workshop, settings):
    """The "can't attend" and unsubscribe links act for the attendee, with no login: a page
    showing them would let whoever may view the workshop or the reminder cancel the attendee's
    place, recorded as the attendee's own decision."""
    settings.REMINDERS_PUBLIC_URL = "https://reminders.example.com"
    person, _ = attendee_get_or_create(email="a@example.com", name="Anna")
    enrollment_create(attendee=person, workshop=workshop)
    client.force_login(viewer)

    reminder = Reminder.objects.get(attendee=person)
    pages = {
        "reminder preview": _url(workshop, attendee=person.pk),
        "notice preview": _url(workshop, attendee=person.pk, message="notice"),
        "reminder's page": f"/admin/reminders/reminder/{reminder.pk}/change/",
    }
    for name, url in pages.items():
        page = client.get(url).content.decode()
        assert "Hello Anna," in page, name
        assert "/attend/" not in page and "/unsubscribe/" not in page, name

"""Staff write a workshop's reminder text in the admin: placeholders are checked, texts in
other languages are edited inline, and the page says what an edit reaches before saving."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reminders.models import Reminder
from reminders.services import reminder_claim_batch, reminder_release
from tests.admin.test_workshop_admin import CHANGELIST, field_errors, form_data
from workshops.models import Workshop, WorkshopText
from workshops.services import enrollment_create, workshop_update

pytestmark = pytest.mark.django_db


def _post(workshop: Workshop, **changes) -> dict:
    local = workshop.zone
    start, end = workshop.starts_at.astimezone(local), workshop.ends_at.astimezone(local)
    return form_data(
        title=workshop.title,
        zone=workshop.timezone,
        starts=start.strftime("%Y-%m-%d %H:%M"),
        ends=end.strftime("%Y-%m-%d %H:%M"),
        **changes,
    )


def _texts(*rows) -> dict:
    data = {"texts-TOTAL_FORMS": str(len(rows))}
    for index, (language, subject, intro) in enumerate(rows):
        data |= {
            f"texts-{index}-language": language,
            f"texts-{index}-reminder_subject": subject,
            f"texts-{index}-reminder_intro": intro,
        }
    return data


def test_a_misspelt_placeholder_is_a_field_error_and_nothing_is_saved(admin_client, make_workshop):
    workshop = make_workshop(starts_in=timedelta(days=3), title="Kiln basics")
    url = f"{CHANGELIST}{workshop.pk}/change/"
    response = admin_client.post(url, _post(workshop, reminder_intro="Hi {atendee_name}"))
    assert response.status_code == 200
    [error] = field_errors(response)["reminder_intro"]
    assert "Unknown placeholder {atendee_name}. Did you mean {attendee_name}?" in error
    assert "Valid placeholders: {attendee_name}, {workshop_title}" in error
    workshop.refresh_from_db()
    assert workshop.reminder_intro == ""


def test_texts_in_other_languages_are_saved_inline_and_the_own_language_is_refused(
    admin_client, make_workshop
):
    workshop = make_workshop(starts_in=timedelta(days=3))
    url = f"{CHANGELIST}{workshop.pk}/change/"
    own = admin_client.post(url, _post(workshop, **_texts(("en", "Hi", ""))))
    assert own.status_code == 200
    formset = next(f for f in own.context["inline_admin_formsets"] if f.formset.prefix == "texts")
    assert "the workshop's own language" in str(formset.formset.errors)
    assert not WorkshopText.objects.exists()

    bad = admin_client.post(url, _post(workshop, **_texts(("de", "Hallo {vorname}", ""))))
    assert bad.status_code == 200
    assert not WorkshopText.objects.exists()

    saved = admin_client.post(
        url, _post(workshop, **_texts(("de", "Erinnerung an {workshop_title}", "Hallo!")))
    )
    assert saved.status_code == 302
    text = WorkshopText.objects.get()
    assert (text.language, text.reminder_subject) == ("de", "Erinnerung an {workshop_title}")


def test_the_page_says_what_an_edit_reaches_and_which_text_each_language_gets(
    admin_client, clock, make_workshop, make_attendee
):
    workshop = make_workshop(starts_in=timedelta(hours=2), reminder_subject="Bring clay")
    WorkshopText.objects.create(workshop=workshop, language="fr", reminder_intro="Salut !")
    people = [make_attendee(language=code) for code in ("", "", "de", "fr")]
    for person in people:
        enrollment_create(attendee=person, workshop=workshop)
    # One English reminder was claimed and handed back (pending again, to be
    # retried): it keeps its text whatever is edited now.
    first = Reminder.objects.get(workshop=workshop, attendee=people[0])
    reminder_release(
        claim=reminder_claim_batch(ids=[first.pk], channel="http", clock=clock), clock=clock
    )
    assert Reminder.objects.get(pk=first.pk).status == "pending"

    page = admin_client.get(f"{CHANGELIST}{workshop.pk}/change/").content.decode()
    assert (
        "Saving a changed text reaches <strong>3 reminders not yet claimed</strong>; "
        "1 already claimed keeps the text it was frozen with." in page
    )
    rows = page.split('<table id="text-reach">')[1].split("</table>")[0]
    assert (
        "<tr><td>Deutsch</td><td>1</td><td>1</td><td>the workshop&#x27;s own text</td>"
        "<td>the built-in text</td></tr>" in rows
    )
    assert "<tr><td>English</td><td>2</td><td>1</td>" in rows
    assert (
        "<tr><td>Français</td><td>1</td><td>1</td><td>the built-in text</td>"
        "<td>the workshop&#x27;s text in this language</td></tr>" in rows
    )

    saved = admin_client.post(
        f"{CHANGELIST}{workshop.pk}/change/",
        _post(workshop, reminder_subject="Bring an apron", **_texts()),
        follow=True,
    )
    notes = [str(m) for m in saved.context["messages"]]
    assert (
        "The new text reaches 3 reminders not yet claimed; 1 already claimed keeps the text it "
        "was frozen with." in notes
    )


def test_the_reminder_page_shows_its_frozen_text_and_what_it_says(
    admin_client, clock, make_workshop, make_attendee
):
    workshop = make_workshop(
        starts_in=timedelta(hours=2), reminder_intro="Bring clay, {attendee_name}."
    )
    attendee = make_attendee(language="de")
    enrollment_create(attendee=attendee, workshop=workshop)
    reminder = Reminder.objects.get(workshop=workshop)
    url = f"/admin/reminders/reminder/{reminder.pk}/change/"
    assert "Not frozen yet" in admin_client.get(url).content.decode()

    reminder_claim_batch(ids=[reminder.pk], channel="http", clock=clock)
    workshop_update(workshop=workshop, reminder_intro="Edited since.")
    page = admin_client.get(url).content.decode()
    assert (
        "Frozen at the first claim: Deutsch; the subject is the built-in text, the intro "
        "the workshop&#x27;s own text." in page
    )
    text = page.split('<pre id="reminder-text"')[1].split("</pre>")[0]
    assert f"Bring clay, {attendee.name}." in text and "Wann:" in text
    assert "Edited since." not in text


def test_a_new_workshop_refuses_a_text_in_its_own_language_as_its_page_does_later(admin_client):
    """On the add page (and "Save as new") the inline text has no workshop id yet: a text in
    the workshop's own language was saved, never used, and then every later save of the
    workshop was refused until staff deleted it."""
    data = form_data(starts="2030-03-02 10:00", ends="2030-03-02 12:00")
    response = admin_client.post(f"{CHANGELIST}add/", {**data, **_texts(("en", "Hi", ""))})
    assert response.status_code == 200
    formset = next(
        f for f in response.context["inline_admin_formsets"] if f.formset.prefix == "texts"
    )
    assert "the workshop's own language" in str(formset.formset.errors)
    assert not Workshop.objects.exists() and not WorkshopText.objects.exists()


def test_moving_the_workshop_to_a_language_it_has_a_text_in_is_refused_until_that_text_goes(
    admin_client, make_workshop
):
    workshop = make_workshop(starts_in=timedelta(days=3))
    german = WorkshopText.objects.create(workshop=workshop, language="de", reminder_subject="Hallo")
    url = f"{CHANGELIST}{workshop.pk}/change/"
    row = {
        "texts-INITIAL_FORMS": "1",
        "texts-0-id": str(german.pk),
        "texts-0-workshop": str(workshop.pk),
    }
    refused = admin_client.post(
        url, _post(workshop, language="de", **_texts(("de", "Hallo", "")), **row)
    )
    assert refused.status_code == 200
    formset = next(
        f for f in refused.context["inline_admin_formsets"] if f.formset.prefix == "texts"
    )
    assert "the workshop's own language" in str(formset.formset.errors)
    workshop.refresh_from_db()
    assert workshop.language == "en"

    dropped = admin_client.post(
        url,
        _post(
            workshop,
            language="de",
            **_texts(("de", "Hallo", "")),
            **row,
            **{"texts-0-DELETE": "on"},
        ),
    )
    assert dropped.status_code == 302
    workshop.refresh_from_db()
    assert workshop.language == "de" and not WorkshopText.objects.exists()


def test_an_intro_longer_than_the_limit_is_a_field_error_that_names_it(admin_client, make_workshop):
    """Issue 34, item 16: a 1 MB intro was accepted."""
    workshop = make_workshop(starts_in=timedelta(days=3), title="Kiln basics")
    url = f"{CHANGELIST}{workshop.pk}/change/"
    response = admin_client.post(url, _post(workshop, reminder_intro="x" * 1_000_000))
    assert response.status_code == 200
    [error] = field_errors(response)["reminder_intro"]
    assert "at most 5,000 characters" in error and "1,000,000" in error
    workshop.refresh_from_db()
    assert workshop.reminder_intro == ""


def test_an_address_the_engine_would_refuse_is_refused_at_the_form(admin_client):
    """Issue 34, item 16: 'a@localhost' passed Django's EmailField and failed at send time."""
    from workshops.models import Attendee

    response = admin_client.post(
        "/admin/workshops/attendee/add/",
        {"name": "Local", "email": "a@localhost", "timezone": "", "language": "en"},
    )
    assert response.status_code == 200
    [error] = field_errors(response)["email"]
    assert "has an invalid domain" in error
    assert not Attendee.objects.exists()

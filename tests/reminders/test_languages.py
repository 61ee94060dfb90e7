"""Reminders in the attendee's language: the fixed lines, dates and built-in text through
Django's i18n, staff texts per language with their fallbacks, and the committed catalogs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import polib
import pytest
from django.conf import settings

from reminders.content import choose_notice_text, choose_text, reminder_envelope
from reminders.models import Reminder
from workshops.models import Attendee, Workshop, WorkshopText
from workshops.services import workshop_update

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
# Sunday 29 March 2026: Europe/Berlin moves from CET to CEST at 02:00.
DST_START = datetime(2026, 3, 29, 8, 0, tzinfo=UTC)


def _envelope(
    *, language="", workshop_language="en", name="Zoë", zone="", title="Glaze lab", start=DST_START,
    **texts,
):  # fmt: skip
    workshop = Workshop(
        title=title,
        starts_at=start,
        ends_at=start.replace(hour=10),
        timezone="Europe/Berlin",
        language=workshop_language,
        location="Room 2",
        contact_name="Ops",
        contact_email="ops@example.org",
        **texts,
    )
    attendee = Attendee(pk=7, name=name, email="z@example.org", timezone=zone, language=language)
    reminder = Reminder(pk=9, key="t-w1-a7", created_at=DST_START)
    reminder.workshop, reminder.attendee = workshop, attendee
    return reminder_envelope(reminder=reminder)


@pytest.mark.parametrize(
    ("language", "subject", "lines"),
    [
        (
            "en",
            "Reminder: Glaze lab starts Sunday 29 March 2026 at 10:00 CEST",
            ["When: Sunday 29 March 2026 at 10:00 CEST (Europe/Berlin)", "Until: 12:00 CEST",
             "Where: Room 2", "See you there!"],
        ),
        (
            "de",
            "Erinnerung: Glaze lab am Sonntag, 29. März 2026 um 10:00 Uhr CEST",
            ["Wann: Sonntag, 29. März 2026 um 10:00 Uhr CEST (Europe/Berlin)",
             "Bis: 12:00 Uhr CEST", "Wo: Room 2", "Bis bald!"],
        ),
        (
            "fr",
            "Rappel : Glaze lab commence le dimanche 29 mars 2026 à 10h00 CEST",
            # A no-break space before ":", "!" and "?" and inside « »: never a line of its own.
            ["Quand\u00a0: dimanche 29 mars 2026 à 10h00 CEST (Europe/Berlin)",
             "Jusqu’à\u00a0: 12h00 CEST", "Où\u00a0: Room 2", "À bientôt\u00a0!",
             "Bonjour Zoë,\n\nNous vous rappelons que «\u00a0Glaze lab\u00a0» commence le"],
        ),
    ],
)  # fmt: skip
def test_each_language_renders_its_fixed_lines_and_dates_on_a_dst_day(language, subject, lines):
    envelope = _envelope(language=language)
    assert envelope.subject == subject
    for line in lines:
        assert line in envelope.text_body
    assert f'<html lang="{language}">' in envelope.html_body
    assert envelope.payload["language"] == language
    # Before the change the same wall clock was CET: the abbreviation follows the date.
    assert "CET" not in envelope.text_body.replace("CEST", "")


@pytest.mark.parametrize(
    ("language", "line"),
    [("en", "<strong>Organiser:</strong> <bdi>Ops</bdi> &lt;ops@example.org&gt; "
            "(reply to this message to reach them)"),
     ("de", "<strong>Veranstalter:</strong> <bdi>Ops</bdi> &lt;ops@example.org&gt; "
            "(per Antwort auf diese Nachricht erreichbar)"),
     ("fr", "<strong>Organisation\u00a0:</strong> <bdi>Ops</bdi> &lt;ops@example.org&gt; "
            "(joignable en répondant à ce message)")],
)  # fmt: skip
def test_the_organiser_line_has_no_pronoun_to_misread(language, line):
    """German "sie" after "diese Nachricht" read as the message; French "les" had no plural."""
    assert line in _envelope(language=language).html_body


@pytest.mark.parametrize(
    ("language", "line"),
    [("de", "Wann: Sonntag, 1. März 2026 um 09:00 Uhr CET"),
     ("fr", "Quand\u00a0: dimanche 1er mars 2026 à 09h00 CET")],
)  # fmt: skip
def test_the_first_day_of_a_month_is_written_as_the_language_writes_it(language, line):
    envelope = _envelope(language=language, start=datetime(2026, 3, 1, 8, 0, tzinfo=UTC))
    assert line in envelope.text_body


def test_no_line_of_a_french_text_part_starts_with_its_closing_guillemet_or_colon():
    """The text part wraps at 72 characters; "»" and ":" stay with the word before them."""
    for length in range(20, 70):
        text = _envelope(language="fr", title="x" * length).text_body
        assert not [line for line in text.splitlines() if line.startswith(("»", ":", "!", "?"))]


def test_the_calendar_sentence_is_in_the_message_language():
    ics = _envelope(language="de").attachments[0].content.decode()
    assert "DESCRIPTION:Zeitzone des Veranstaltungsorts: Europe/Berlin." in ics


@pytest.mark.parametrize("name", ["Ζωή Παπαδοπούλου", "陈静", "محمد الأحمد", "אורי כהן"])
def test_non_latin_and_right_to_left_names_come_through_whole_and_isolated(name):
    for language in ("en", "de", "fr"):
        envelope = _envelope(language=language, name=name)
        assert name in envelope.text_body.splitlines()[0]
        assert f"<bdi>{name}</bdi>" in envelope.html_body
        assert envelope.recipient_name == name


@pytest.mark.parametrize("title", ["ورشة الخزف 2", "סדנת קרמיקה 2"], ids=["arabic", "hebrew"])
def test_a_change_notices_html_isolates_each_name_title_and_place_as_a_reminders_does(
    title, clock, make_workshop, enrol
):
    """A right-to-left title or place beside the notice's own words keeps its digits and
    punctuation where they belong, in the intro, the changed lines and the reason."""
    from reminders.content import notice_preview
    from workshops.services import workshop_cancel

    workshop = make_workshop(title=title, location="قاعة 3، الطابق 2")
    [enrollment] = enrol(workshop)
    attendee = enrollment.attendee
    Reminder.objects.filter(attendee=attendee).update(
        told_starts_at=workshop.starts_at,
        told_ends_at=workshop.ends_at,
        told_location="אולם 1, קומה 3",
    )
    changed = notice_preview(workshop=workshop, attendee=attendee, now=clock.now())
    html = changed.envelope.html_body
    for value in (attendee.name, title, "قاعة 3، الطابق 2", "אולם 1, קומה 3"):
        assert f"<bdi>{value}</bdi>" in html, html
    workshop_cancel(workshop=workshop, reason="المدرّب مريض، 2 أيام")
    cancelled = notice_preview(workshop=workshop, attendee=attendee, now=clock.now())
    assert "<bdi>المدرّب مريض، 2 أيام</bdi>" in cancelled.envelope.html_body
    # The text part stays as it was: no markup, no isolating characters.
    assert f'"{title}" has changed' in changed.envelope.text_body


def test_a_change_notices_html_links_the_join_link_to_follow_not_the_old_one(
    clock, make_workshop, enrol
):
    from reminders.content import notice_preview

    workshop = make_workshop(join_url="https://meet.example/new?a=1&b=2")
    [enrollment] = enrol(workshop)
    Reminder.objects.filter(attendee=enrollment.attendee).update(
        told_starts_at=workshop.starts_at,
        told_ends_at=workshop.ends_at,
        told_join_url="https://meet.example/old",
    )
    notice = notice_preview(workshop=workshop, attendee=enrollment.attendee, now=clock.now())
    html = notice.envelope.html_body
    # In the changed line and in the facts now, as a reminder's HTML links it.
    assert html.count('<a href="https://meet.example/new?a=1&amp;b=2"') == 2, html
    assert "<bdi>https://meet.example/old</bdi>" in html


@pytest.mark.parametrize(
    ("language", "opening"),
    [("de", "Hallo Attendee 1,\n\nes tut uns leid: „Atelier“, geplant für Montag"),
     ("fr", "Bonjour Attendee 1,\n\nNous sommes désolés\u00a0: «\u00a0Atelier\u00a0», prévu "
            "le lundi")],
)  # fmt: skip
def test_a_letter_goes_on_after_its_greeting_as_its_language_writes_it(
    language, opening, clock, make_workshop, make_attendee
):
    """German goes on in lower case after "Hallo …,", French with a capital after "Bonjour …,"."""
    from reminders.content import notice_preview

    workshop = make_workshop(title="Atelier")
    attendee = make_attendee(language=language)  # not enrolled: a cancellation's notice
    notice = notice_preview(workshop=workshop, attendee=attendee, now=clock.now())
    assert notice.envelope.text_body.startswith(opening)


def test_a_blank_attendee_language_takes_the_workshops():
    assert _envelope(language="", workshop_language="fr").subject.startswith("Rappel : ")
    assert _envelope(language="de", workshop_language="fr").subject.startswith("Erinnerung: ")


def test_a_language_no_longer_offered_falls_back_to_the_sites_language(settings):
    """A workshop and an attendee saved in French before French was dropped from LANGUAGES
    (the column keeps any code): the reminder is in LANGUAGE_CODE, not in French."""
    settings.LANGUAGES = [("en", "English"), ("de", "Deutsch")]
    envelope = _envelope(language="fr", workshop_language="fr")
    assert envelope.payload["language"] == "en"
    assert envelope.subject.startswith("Reminder: Glaze lab starts Sunday")
    settings.LANGUAGE_CODE = "de"
    envelope = _envelope(language="fr", workshop_language="fr")
    assert envelope.payload["language"] == "de"
    assert envelope.subject.startswith("Erinnerung: Glaze lab am Sonntag")


def test_a_language_without_a_text_of_its_own_gets_the_workshops_text_with_its_own_fixed_lines():
    envelope = _envelope(
        language="de",
        reminder_subject="Bring clay: {workshop_title}",
        reminder_intro="Hi {attendee_name}!",
    )
    assert envelope.subject == "Bring clay: Glaze lab"
    assert envelope.text_body.startswith("Hi Zoë!\n\nWann: ")


def test_a_text_in_the_attendees_language_wins_and_its_blank_parts_are_built_in(
    make_workshop, make_attendee
):
    workshop = make_workshop(reminder_subject="Bring clay", reminder_intro="Hi {attendee_name}!")
    WorkshopText.objects.create(
        workshop=workshop, language="fr", reminder_intro="Salut {attendee_name} !"
    )
    french, german, english = (make_attendee(language=code) for code in ("fr", "de", ""))
    chosen = {
        a.language or "en": choose_text(workshop=workshop, attendee=a)
        for a in (french, german, english)
    }
    assert (chosen["fr"].subject_source, chosen["fr"].intro_source) == ("built_in", "language")
    assert chosen["fr"].subject == "Rappel : {workshop_title} commence le {start_local}"
    assert chosen["fr"].intro == "Salut {attendee_name} !"
    assert (chosen["de"].subject, chosen["de"].intro_source) == ("Bring clay", "workshop")
    assert (chosen["en"].subject, chosen["en"].language) == ("Bring clay", "en")


def test_the_workshops_notice_intro_is_for_readers_of_its_language_and_others_get_the_built_in(
    make_workshop, make_attendee
):
    """docs/staff.md: the notice intro is for attendees reading the workshop's language;
    anyone else, and everyone while it is blank, gets the built-in one of their language."""
    own = "Salut {attendee_name} ! {workshop_title} bouge : {old_start_local} -> {start_local}."
    workshop = make_workshop(language="fr", notice_intro=own)
    # A reminder text in German is no notice text: German readers still get the built-in one.
    WorkshopText.objects.create(workshop=workshop, language="de", reminder_intro="Hallo!")
    french, blank, german, english = (
        make_attendee(language=code) for code in ("fr", "", "de", "en")
    )

    def chosen(attendee):
        text = choose_notice_text(workshop=workshop, attendee=attendee, kind="changed")
        return text.language, text.intro_source, text.intro

    assert chosen(french) == chosen(blank) == ("fr", "workshop", own)
    assert chosen(german) == (
        "de",
        "built_in",
        "Hallo {attendee_name},\n\n„{workshop_title}“ hat sich seit unserer Erinnerung "
        "geändert. Das ist neu.",
    )
    assert chosen(english) == (
        "en",
        "built_in",
        'Hello {attendee_name},\n\n"{workshop_title}" has changed since we reminded you. '
        "Here is what is different.",
    )
    workshop = workshop_update(workshop=workshop, notice_intro=" \n ")
    assert chosen(french) == (
        "fr",
        "built_in",
        "Bonjour {attendee_name},\n\n«\u00a0{workshop_title}\u00a0» a changé depuis notre rappel. "
        "Voici ce qui est différent.",
    )


def test_the_html_part_escapes_staff_text_and_keeps_its_paragraphs():
    envelope = _envelope(reminder_intro="Hi {attendee_name} <b>&</b>\nline two\n\nParagraph two")
    assert (
        "<p>Hi <bdi>Zoë</bdi> &lt;b&gt;&amp;&lt;/b&gt;<br>line two</p>\n<p>Paragraph two</p>"
        in (envelope.html_body)
    )
    assert envelope.text_body.startswith("Hi Zoë <b>&</b>\nline two\n\nParagraph two\n")


def test_the_subject_stays_on_one_line_whatever_is_filled_in():
    envelope = _envelope(reminder_subject="{workshop_title} {location}", name="A\r\nBcc: x@y")
    assert "\n" not in envelope.subject and "\r" not in envelope.subject


@pytest.mark.parametrize("code", [code for code, _name in settings.LANGUAGES if code != "en"])
def test_the_committed_catalogs_are_complete_and_compiled_from_their_po_files(code):
    directory = ROOT / "locale" / code / "LC_MESSAGES"
    source = polib.pofile(str(directory / "django.po"))
    compiled = polib.mofile(str(directory / "django.mo"))
    wanted = {(e.msgctxt, e.msgid): e.msgstr for e in source if e.msgstr and not e.obsolete}
    assert {(e.msgctxt, e.msgid): e.msgstr for e in compiled if e.msgid} == wanted, (
        "run `make messages` and commit the .mo files"
    )
    # Every text a reminder uses is translated (the admin's own strings stay English).
    used = [
        e.msgid for e in source if not e.obsolete and e.msgid not in ("Home", "No, take me back")
    ]
    assert all(e.msgstr for e in source if e.msgid in used and not e.fuzzy), "untranslated entries"

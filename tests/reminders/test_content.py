"""What a reminder says: plain text stays plain, HTML is escaped, the .ics cannot be broken.

Staff type workshop titles and attendees give their names: both reach the
subject, the text and HTML bodies, the http body and the calendar file.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from reminders.content import reminder_envelope
from reminders.models import Reminder
from reminders.services import reminders_plan

pytestmark = pytest.mark.django_db

MARKUP = """R&D <b>"Tools"</b> & 'friends' > others"""
NAME = """Zoë O'Neil & <Co> "QA\""""


@pytest.fixture
def reminder(clock, make_workshop, make_attendee):
    from workshops.services import enrollment_create

    workshop = make_workshop(starts_in=timedelta(hours=2), title=MARKUP)
    enrollment_create(attendee=make_attendee(name=NAME), workshop=workshop)
    reminders_plan(clock=clock)
    return Reminder.objects.select_related("attendee", "workshop").get(workshop=workshop)


def _ics(reminder) -> str:
    [calendar] = reminder_envelope(reminder=reminder).attachments
    return calendar.content.decode()


def test_subject_and_text_body_carry_the_title_and_name_exactly(reminder):
    envelope = reminder_envelope(reminder=reminder)
    assert envelope.subject.startswith(f"Reminder: {MARKUP} starts ")
    name = reminder.attendee.name
    assert name.startswith(NAME)
    assert f"Hello {name}," in envelope.text_body
    assert f'"{MARKUP}" starts on' in " ".join(envelope.text_body.split())
    for text in (envelope.subject, envelope.text_body):
        assert "&amp;" not in text and "&lt;" not in text and "&#x27;" not in text
    assert envelope.payload["workshop_title"] == MARKUP


def test_html_body_escapes_every_special_character(reminder):
    html = reminder_envelope(reminder=reminder).html_body
    assert "R&amp;D &lt;b&gt;&quot;Tools&quot;&lt;/b&gt; &amp; &#x27;friends&#x27; &gt; others" in (
        html
    )
    assert "Zoë O&#x27;Neil &amp; &lt;Co&gt; &quot;QA&quot;" in html
    assert "<b>" not in html and "<Co>" not in html


def test_calendar_file_keeps_the_title_as_one_escaped_value(reminder):
    ics = _ics(reminder)
    unfolded = ics.replace("\r\n ", "")
    assert f"SUMMARY:{MARKUP}" in unfolded  # no , ; \\ or line break in it to escape


@pytest.mark.parametrize(
    "title, summary",
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\nb"),
        ("a\rb", "a\\nb"),
        ("a\u2028b", "a\\nb"),  # Unicode line separator
        ("a\u2029b", "a\\nb"),  # paragraph separator
        ("a\x85b\x0bc\x0cd", "a\\nb\\nc\\nd"),  # NEL, vertical tab, form feed
        ("a\x00b\x1bc\x7fd", "abcd"),  # other control characters are dropped
        ("a\tb", "a\tb"),
        ("x;y,z\\w", "x\\;y\\,z\\\\w"),
    ],
)
def test_no_character_of_a_title_can_end_its_line_in_the_calendar_file(reminder, title, summary):
    reminder.workshop.title = title
    ics = _ics(reminder)
    lines = ics.replace("\r\n ", "").split("\r\n")
    assert f"SUMMARY:{summary}" in lines
    assert [re.split("[:;]", line, maxsplit=1)[0] for line in lines if line] == [
        "BEGIN", "VERSION", "PRODID", "METHOD", "BEGIN", "UID", "DTSTAMP", "SEQUENCE",
        "DTSTART", "DTEND", "SUMMARY", "DESCRIPTION", "STATUS", "ORGANIZER", "END", "END",
    ]  # fmt: skip
    assert not any(ch in ics for ch in "\u2028\u2029\x85\x0b\x0c\x00\x1b\x7f")


def test_the_text_is_wrapped_for_mail_readers_and_a_link_stays_whole(reminder):
    from reminders.content import TEXT_WIDTH
    from workshops.models import Workshop

    link = "https://meet.example.org/" + "k" * 80
    Workshop.objects.filter(pk=reminder.workshop_id).update(join_url=link, location="Hall 2")
    reminder.workshop.refresh_from_db()
    text = reminder_envelope(reminder=reminder).text_body
    lines = text.splitlines()
    assert all(len(line) <= TEXT_WIDTH or " " not in line for line in lines), lines
    assert link in lines  # alone on its line, unbroken
    assert "Where: Hall 2" in lines
    # Paragraphs keep their blank line between them.
    assert text.count("\n\n") >= 4


def test_a_line_of_spaces_past_the_width_still_parts_two_paragraphs():
    """The HTML part shows two paragraphs there; the text part must not run them together."""
    from reminders.content import wrap_text

    assert wrap_text("Hello\n" + " " * 80 + "\nBye\n") == "Hello\n\nBye\n"


def test_a_long_line_breaks_at_spaces_and_never_at_a_no_break_space():
    """Staff texts in French carry no-break spaces ("10 km", "sport !"): the text part keeps
    them, and a line is never broken there."""
    from reminders.content import wrap_text

    line = (
        "Apportez vos chaussures de sport et une bouteille d’eau, la salle est à 10\u00a0km\u00a0!"
    )
    assert wrap_text(line + "\n") == (
        "Apportez vos chaussures de sport et une bouteille d’eau, la salle est à\n"
        "10\u00a0km\u00a0!\n"
    )
    assert wrap_text("x" * 66 + " Mme\u202fDupont\u2007et\tses amis") == (
        "x" * 66 + "\nMme\u202fDupont\u2007et ses amis"
    )


def test_a_workshop_without_details_shows_none_of_their_lines(reminder):
    text = reminder_envelope(reminder=reminder).text_body
    assert "Where:" not in text and "Join:" not in text and "Organiser:" not in text
    assert "calendar.\n\nSee you there!" in text


def test_the_http_body_carries_the_title_on_one_line_as_the_subject_does(reminder):
    """Issue 34, item 16: the subject and names were cleaned of CR/LF, the payload's title not."""
    type(reminder.workshop).objects.filter(pk=reminder.workshop_id).update(
        title="Kiln\r\nX-Injected: yes\tbasics"
    )
    reminder.workshop.refresh_from_db()
    envelope = reminder_envelope(reminder=reminder)
    assert envelope.payload["workshop_title"] == "Kiln X-Injected: yes basics"


@pytest.mark.parametrize(
    "sender",
    [
        "reminders@example.org",
        "Workshop Reminders <reminders@example.org>",
        '"Reminders <fast>" <reminders@example.org>',
        "reminders@example.org (Workshop Reminders)",
    ],
)
def test_the_list_id_and_message_domain_come_from_the_sender_however_it_is_written(
    reminder, settings, sender
):
    """Message-IDs, the default DKIM domain and the List-Id sit under the sender's domain."""
    from reminders.content import sender_domain

    settings.DEFAULT_FROM_EMAIL = sender

    assert sender_domain() == "example.org"
    assert reminder_envelope(reminder=reminder).list_id == (
        "Workshop reminders <reminders.example.org>"
    )


@pytest.mark.parametrize(
    "name, parameter",
    [
        ("Ana ^n Lee", ';CN="Ana ^^n Lee"'),  # RFC 6868: a calendar reads ^n as a line break
        ('Bo "QA"', ";CN=\"Bo 'QA'\""),
        ("  ", ""),
    ],
)
def test_a_name_in_a_calendar_parameter_reads_back_as_written(name, parameter):
    from reminders.content import _ics_cn

    assert _ics_cn(name) == parameter


# A mailto URI (RFC 6068, section 2): unreserved characters, the sub-delims an address may
# hold raw and percent-encoded octets before the @; an ASCII host name after it.
MAILTO = re.compile(r"mailto:((?:[A-Za-z0-9._~!$'*+-]|%[0-9A-F]{2})+)@([A-Za-z0-9.-]+)")


@pytest.mark.parametrize(
    "address",
    [
        "ana?subject=x@example.com",  # read raw, the address was "ana" and the rest a query
        "ana#b@example.com",
        "a%41na@example.com",  # read raw, "aAna"
        "ops/team@example.com",
        "{ana}|b^c`d@example.com",
        "ana&b=c@example.com",
        "ana@bücher.example",
        "o'neil+tag~x@example.com",
    ],
)
def test_a_calendar_address_is_a_uri_that_reads_back_as_the_address(reminder, address):
    """The address the project accepts goes into ORGANIZER and ATTENDEE percent-encoded
    where RFC 6068 asks (a domain in its IDNA form, as the RFC advises), never raw."""
    from urllib.parse import unquote

    from reminders.content import event_ics

    workshop = reminder.workshop
    workshop.contact_email = address
    ics = event_ics(
        uid="u@x",
        workshop=workshop,
        facts=workshop,
        stamp=workshop.starts_at,
        language="en",
        method="CANCEL",
        attendee=("Ana", address),
    )
    lines = ics.decode().replace("\r\n ", "").split("\r\n")
    local, domain = address.rsplit("@", 1)
    for name in ("ORGANIZER", "ATTENDEE"):
        [line] = [line for line in lines if line.startswith(name)]
        match = MAILTO.fullmatch(line.partition(":")[2])
        assert match is not None, line
        assert unquote(match[1]) == local
        assert match[2].encode().decode("idna") == domain

"""delivery.message writes messages by hand: read back, they equal the email package's own build.

The reference below is how the channel built messages before (the stdlib
``email`` package, SMTP policy, 7-bit): each case is written both ways,
parsed with ``email.policy.default`` and compared header by header and part
by part, so a difference in what a mail client shows fails here.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from email import message_from_bytes
from email import policy as email_policy
from email.headerregistry import Address
from email.message import EmailMessage

import pytest

from clock import SystemClock
from delivery import Attachment
from delivery.addresses import address_problem, clean_header_text, idna_domain
from delivery.message import (
    LINE,
    key_digest,
    message_id_for,
    parse_sender,
    write_message,
)
from tests.delivery.conftest import envelope_factory

DATE = datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
HEADERS = ("From", "To", "Subject", "Date", "Message-ID", "Auto-Submitted", "Reply-To", "List-Id")


def reference(envelope, *, sender, domain: str) -> bytes:
    """The email package's build of ``envelope`` (the channel's code before the writer)."""
    policy = email_policy.SMTP.clone(cte_type="7bit")
    local, _, rdomain = envelope.recipient.rpartition("@")
    message = EmailMessage(policy=policy)
    message["From"] = Address(display_name=sender.name, addr_spec=sender.address)
    message["To"] = Address(
        display_name=clean_header_text(envelope.recipient_name),
        username=local,
        domain=idna_domain(rdomain),
    )
    message["Subject"] = clean_header_text(envelope.subject)
    message["Date"] = DATE.strftime("%a, %d %b %Y %H:%M:%S +0000")
    message["Message-ID"] = message_id_for(envelope.key, domain)
    message["Auto-Submitted"] = "auto-generated"
    if envelope.reply_to and address_problem(envelope.reply_to) is None:
        rlocal, _, rdom = envelope.reply_to.rpartition("@")
        message["Reply-To"] = Address(
            display_name=clean_header_text(envelope.reply_to_name),
            username=rlocal,
            domain=idna_domain(rdom),
        )
    if envelope.list_id:
        message["List-Id"] = clean_header_text(envelope.list_id)
    message.set_content(envelope.text_body)
    if envelope.html_body is not None:
        message.add_alternative(envelope.html_body, subtype="html")
    for attachment in envelope.attachments:
        maintype, _, subtype = attachment.content_type.partition("/")
        message.add_attachment(
            attachment.content,
            maintype=maintype,
            subtype=subtype,
            filename=clean_header_text(attachment.filename),
        )
    return message.as_bytes()


def shown(data: bytes) -> dict:
    """What a mail client shows of a message: decoded headers, and each part's type and content."""
    parsed = message_from_bytes(data, policy=email_policy.default)
    headers = {name: [str(value) for value in parsed.get_all(name, [])] for name in HEADERS}
    for name in ("From", "To", "Reply-To"):
        headers[f"{name} addresses"] = [
            (a.display_name, a.addr_spec)
            for value in parsed.get_all(name, [])
            for a in value.addresses
        ]
    parts = []
    for part in parsed.walk():
        entry = [part.get_content_type(), part.get_content_disposition(), part.get_filename()]
        if not part.is_multipart():
            content = part.get_content()
            entry.append(content if isinstance(content, bytes) else content.replace("\r\n", "\n"))
            entry.append(part.get_content_charset())
        parts.append(tuple(entry))
    return {"headers": headers, "parts": parts}


NAMES = [
    "",
    "Ada Lovelace",
    "J. R. Smith",
    'Ada "the Countess" \\ Lovelace',
    "Ada\r\nBcc: victim@example.com",
    "Zoë Ångström",
    "Ελένη Παπαδοπούλου",
    "王小明",
    "محمد الأحمد",
    "=?utf-8?q?not_an_encoded_word?=",
    "A very long display name that goes on and on well past seventy-eight characters in all",
    "Jörg, the organiser; (room 2) <not an address>",
]
SUBJECTS = [
    "Reminder: Pottery starts in an hour",
    "Reminder\r\nBcc: victim@example.com\r\n\r\nInjected body",
    "Erinnerung: Töpferkurs 🎨 beginnt in einer Stunde",
    "Rappel : « Atelier d’écriture » commence à 10 h 00, salle Émile-Zola, deuxième étage",
    "提醒：陶艺工作坊将在一小时后开始，请准时到达。地点：市中心图书馆三楼多功能厅",
    "A subject that is long enough to need folding somewhere " * 3,
    "=?utf-8?b?SGVsbG8=?= looks encoded but is not",
    "x" * 120,
    "",
]
BODIES = [
    "See you there.",
    "See you there.\n",
    "Line one\nLine two\r\nLine three\rLine four\n\n\nafter blanks",
    "Bis gleich — 10:00 Uhr (Europe/Berlin).\nÄrger? Öl! Übermorgen.",
    "Ελληνικά κείμενα και 中文内容 混合在一起，" * 20,
    "trailing spaces   \nand a tab\t\n= signs = here\n.\n..leading dots\nFrom the start",
    "a" * 100 + "\n" + "b" * 2000,
    "line with\u2028a line separator and \x0c a form feed",
    "contains the boundary =_ prefix of a part",
]
HTML = [None, "<p>See you there.</p>", "<p>Zoë — <b>ün</b></p>\n" * 30]
ATTACHMENTS = [
    (),
    (Attachment(filename="workshop.ics", content_type="text/calendar", content=b"BEGIN:X\r\n"),),
    (
        Attachment(
            filename="workshop.ics", content_type="text/calendar", content=bytes(range(256))
        ),
        Attachment(filename="plan.pdf", content_type="application/pdf", content=b"%PDF" * 200),
    ),
]


def _cases():
    """Every name, subject, body, HTML and attachment value at least once, in varied company."""
    make = envelope_factory(SystemClock())
    columns = [NAMES, SUBJECTS, BODIES, HTML, ATTACHMENTS]
    longest = max(map(len, columns))
    for index in range(longest * 2):
        name, subject, body, html, attachments = (
            column[(index + 3 * step) % len(column)] for step, column in enumerate(columns)
        )
        yield make(
            recipient="ada@bücher.example" if index % 5 == 0 else "ada@example.com",
            recipient_name=name,
            subject=subject,
            text_body=body,
            html_body=html,
            attachments=list(attachments),
            reply_to="" if index % 3 == 0 else "organiser@example.org",
            reply_to_name=NAMES[(index + 3) % len(NAMES)],
            list_id="" if index % 4 == 1 else "Workshop reminders <reminders.example.org>",
        )


CASES = list(_cases())
SENDERS = [
    parse_sender("Workshop Reminders <reminders@example.org>", setting="FROM"),
    parse_sender("reminders@example.org", setting="FROM"),
    parse_sender("Rappels Ça Va <rappels@example.org>", setting="FROM"),
]


def _spaced(text: str) -> str:
    """Runs of spaces as one: the email package keeps the space between two encoded words
    of a display name (RFC 2047 6.2 drops it), so a long name reads back with two."""
    return " ".join(text.split())


@pytest.mark.parametrize("index", range(len(CASES)))
def test_a_written_message_reads_back_as_typed_and_as_the_email_packages_build(index):
    """Headers read back as the cleaned text; the parts as the email package's own build.

    The headers are not compared with the email package's build: it loses a
    space when it folds some long subjects, and writes a look-alike encoded
    word as it is, so that a reader decodes it.
    """
    envelope = CASES[index]
    sender = SENDERS[index % len(SENDERS)]

    written = shown(write_message(envelope, sender=sender, date=DATE).data)
    expected = shown(reference(envelope, sender=sender, domain="example.org"))

    headers = written["headers"]
    assert headers["Subject"] == [clean_header_text(envelope.subject)]
    local, _, domain = envelope.recipient.rpartition("@")
    assert [(_spaced(name), address) for name, address in headers["To addresses"]] == [
        (clean_header_text(envelope.recipient_name), f"{local}@{idna_domain(domain)}")
    ]
    assert headers["From addresses"] == [(sender.name, sender.address)]
    if envelope.reply_to:
        assert [(_spaced(name), address) for name, address in headers["Reply-To addresses"]] == [
            (clean_header_text(envelope.reply_to_name), envelope.reply_to)
        ]
    else:
        assert headers["Reply-To"] == []
    assert headers["List-Id"] == ([envelope.list_id] if envelope.list_id else [])
    for name in ("Date", "Message-ID", "Auto-Submitted"):
        assert headers[name] == expected["headers"][name]
    assert written["parts"] == expected["parts"]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_a_written_message_is_7bit_crlf_with_short_header_lines(index):
    envelope = CASES[index]
    data = write_message(envelope, sender=SENDERS[0], date=DATE).data

    assert data.isascii()
    assert b"\n" not in data.replace(b"\r\n", b"")  # no bare LF
    assert b"\r" not in data.replace(b"\r\n", b"")  # no bare CR
    head = data.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n"):
        # Folded within 78 where a space allows it; an encoded word never longer than 75.
        assert len(line) <= LINE or b" " not in line.strip(), line
    assert max(map(len, data.split(b"\r\n"))) <= 998


def test_the_recipient_is_the_ascii_mailbox_for_rcpt_to():
    envelope = envelope_factory(SystemClock())(recipient="zoë@bücher.example")
    with pytest.raises(Exception, match="non-ASCII local part"):
        write_message(envelope, sender=SENDERS[0], date=DATE)
    envelope = envelope_factory(SystemClock())(recipient="ada@bücher.example")
    written = write_message(envelope, sender=SENDERS[0], date=DATE)
    assert written.recipient == "ada@xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("domain", "wire"),
    [
        ("straße.example", "xn--strae-oqa.example"),
        ("STRAẞE.Example", "xn--strae-oqa.example"),
        ("ςa.example", "xn--a-xmb.example"),
    ],
)
def test_a_domain_is_written_as_registries_write_it(domain, wire):
    """IDNA 2008: Python's own codec (IDNA 2003) would write strasse.example, another domain."""
    envelope = envelope_factory(SystemClock())(recipient=f"ada@{domain}")
    written = write_message(envelope, sender=SENDERS[0], date=DATE)
    assert written.recipient == f"ada@{wire}"
    assert f"<ada@{wire}>".encode() in written.data


def test_every_case_list_covers_each_value():
    """The comparison above sees every listed value at least once."""
    seen = {
        "names": {c.recipient_name for c in CASES},
        "subjects": {c.subject for c in CASES},
        "bodies": {c.text_body for c in CASES},
        "html": {c.html_body for c in CASES},
        "attachments": {tuple(c.attachments) for c in CASES},
    }
    assert seen["names"] == set(NAMES)
    assert seen["subjects"] == set(SUBJECTS)
    assert seen["bodies"] == set(BODIES)
    assert seen["html"] == set(HTML)
    assert seen["attachments"] == {tuple(a) for a in ATTACHMENTS}
    assert len(list(itertools.islice(_cases(), 5))) == 5


def test_a_body_that_holds_the_boundary_is_encoded_so_the_parts_stay_whole():
    make = envelope_factory(SystemClock())
    envelope = make(key="known-key")
    boundary = f"=_{key_digest('known-key')}"
    envelope = make(
        key="known-key",
        text_body=f"before\n--{boundary}.a\nContent-Type: text/html\n\n<p>forged</p>\n--{boundary}.a--",
        html_body="<p>real</p>",
    )

    written = write_message(envelope, sender=SENDERS[0], date=DATE)

    assert (
        shown(written.data)["parts"]
        == shown(reference(envelope, sender=SENDERS[0], domain="example.org"))["parts"]
    )
    assert len(shown(written.data)["parts"]) == 3  # the alternative, its text and its HTML


@pytest.mark.parametrize("length", range(70, 80))
@pytest.mark.parametrize("last", [" ", "\t", "=", "é"])
def test_quoted_printable_lines_stay_within_76_and_read_back_whole(length, last):
    """RFC 2045 6.7; binascii alone writes 77 when a 75-character line ends in a space."""
    envelope = envelope_factory(SystemClock())(text_body=f"Grüße\n{'a' * length}{last}\nnext")

    data = write_message(envelope, sender=SENDERS[0], date=DATE).data

    body = data.split(b"\r\n\r\n", 1)[1]
    assert b"quoted-printable" in data.split(b"\r\n\r\n", 1)[0]
    assert max(map(len, body.split(b"\r\n"))) <= 76
    [(*_, content, _)] = shown(data)["parts"]
    assert content == f"Grüße\n{'a' * length}{last}\nnext\n"


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        ("Ελληνικά κείμενα και άλλα πράγματα", b"base64"),
        ("Привет, увидимся на мастер-классе", b"base64"),
        ("陶艺工作坊将在一小时后开始", b"base64"),
        (
            "Bis gleich, wir sehen uns am Montag um zehn Uhr in der Bibliothek. Grüße",
            b"quoted-printable",
        ),
        ("Grüße aus München", b"base64"),  # 6 of its 22 bytes above 127: base64 is shorter
    ],
)
def test_the_shorter_transfer_encoding_is_chosen(body, encoding):
    envelope = envelope_factory(SystemClock())(text_body=body)
    data = write_message(envelope, sender=SENDERS[0], date=DATE).data
    assert f"Content-Transfer-Encoding: {encoding.decode()}".encode() in data
    assert shown(data)["parts"][0][3] == body + "\n"


def test_a_list_id_keeps_its_identifier_unencoded_however_long():
    long_id = "reminders." + "sub." * 20 + "example.org"
    envelope = envelope_factory(SystemClock())(list_id=f"Rappels d’ateliers <{long_id}>")
    data = write_message(envelope, sender=SENDERS[0], date=DATE).data
    assert f"<{long_id}>".encode() in data
    assert shown(data)["headers"]["List-Id"] == [f"Rappels d’ateliers <{long_id}>"]


def test_the_date_header_follows_the_clock_second_by_second():
    """The Date text is kept for the second it was made in, never longer."""
    from datetime import timedelta
    from email.utils import format_datetime
    from zoneinfo import ZoneInfo

    envelope = CASES[0]
    moments = [
        DATE,
        DATE + timedelta(microseconds=999_999),
        DATE + timedelta(seconds=1),
        (DATE + timedelta(seconds=1)).astimezone(ZoneInfo("Europe/Berlin")),
        DATE,
    ]
    for moment in moments:
        written = write_message(envelope, sender=SENDERS[0], date=moment)
        assert f"\r\nDate: {format_datetime(moment)}\r\n".encode() in written.data, moment


def test_a_reply_to_that_needs_smtputf8_is_dropped_and_the_message_still_written():
    """Workshop.contact_email is staff input: a non-ASCII local part passes address_problem."""
    envelope = envelope_factory(SystemClock())(reply_to="jürgen@example.org")
    data = write_message(envelope, sender=SENDERS[0], date=DATE).data
    assert b"\nReply-To:" not in data

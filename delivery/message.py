"""Write RFC 5322 messages from envelopes as 7-bit CRLF bytes.

Header text is folded onto one line and non-ASCII encoded, so no header can be injected; the
output matches the stdlib ``email`` package's (tests/delivery/test_message.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import re
from dataclasses import dataclass
from datetime import datetime
from email.utils import format_datetime, parseaddr

from delivery.addresses import address_problem, clean_header_text, idna_domain
from delivery.envelope import Envelope
from delivery.errors import PermanentError

__all__ = [
    "Message",
    "calendar_of",
    "Sender",
    "key_digest",
    "message_id_for",
    "parse_sender",
    "write_message",
]

CRLF = "\r\n"
# RFC 5322 2.1.1: lines SHOULD be at most 78 characters; an encoded word at most 75.
LINE = 78
# Raw bytes per base64 encoded word, so "Reply-To: " and one word fit in LINE.
_WORD_BYTES = 42
# Characters a display name may carry bare (RFC 5322 atext and spaces).
_BARE_PHRASE = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~ -]*$")
# RFC 2045 6.7: quoted-printable lines are at most 76 characters.
_QP_LINE = 76


def key_digest(key: str) -> str:
    """Return a short, stable, file-name-safe digest of ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def message_id_for(key: str, domain: str) -> str:
    """Return the ``Message-ID`` every send of ``key`` carries."""
    return f"<{key_digest(key)}.reminder@{domain}>"


@dataclass(frozen=True, slots=True)
class Sender:
    """A checked ``From`` address: display name, mailbox and the mailbox's domain."""

    name: str
    address: str
    domain: str


def parse_sender(from_email: str, *, setting: str) -> Sender:
    """Parse ``"Name <addr>"`` or ``"addr"``; raise ``ValueError`` naming ``setting``."""
    if not from_email or not from_email.strip():
        raise ValueError(f"{setting} is empty; pass the address reminders are sent from.")
    if "\r" in from_email or "\n" in from_email:
        raise ValueError(f"{setting} contains a line break; pass one address.")
    name, address = parseaddr(from_email)
    problem = address_problem(address)
    if problem is not None or not address.isascii():
        raise ValueError(
            f"{setting} {from_email!r} is not a usable sender address "
            f"({problem or 'non-ASCII mailbox'}); pass e.g. 'Reminders <reminders@example.com>'."
        )
    return Sender(clean_header_text(name), address, address.rpartition("@")[2])


@dataclass(frozen=True, slots=True)
class Message:
    """A written message and the ASCII recipient for RCPT TO."""

    data: bytes
    recipient: str


def _ascii_address(address: str) -> str | None:
    """Return ``address`` with a punycode domain, or None if its local part needs SMTPUTF8."""
    local, _, domain = address.rpartition("@")
    # address_problem refused a domain it cannot encode.
    return f"{local}@{idna_domain(domain)}" if local.isascii() else None


def _reply_to(envelope: Envelope) -> str | None:
    """Return the Reply-To mailbox, or None when there is none usable."""
    if not envelope.reply_to or address_problem(envelope.reply_to) is not None:
        return None
    address = _ascii_address(envelope.reply_to)
    if address is None:
        return None
    return _mailbox(clean_header_text(envelope.reply_to_name), address)


_last_date: tuple[tuple[datetime, object], str] | None = None


def _date(date: datetime) -> str:
    """Return ``format_datetime(date)``, cached per second and offset."""
    global _last_date
    key = (date.replace(microsecond=0, tzinfo=None), date.utcoffset())
    last = _last_date  # one read: another thread may replace it meanwhile
    if last is None or last[0] != key:
        last = _last_date = (key, format_datetime(date))
    return last[1]


def write_message(envelope: Envelope, *, sender: Sender, date: datetime) -> Message:
    """Return the email for ``envelope``."""
    recipient = _ascii_address(envelope.recipient)
    if recipient is None:
        raise PermanentError(
            f"recipient {envelope.recipient!r} has a non-ASCII local part, which needs "
            "SMTPUTF8; this channel does not send it",
            reached=False,
        )
    boundary = f"=_{key_digest(envelope.key)}"
    headers = [
        _header("From", _mailbox(sender.name, sender.address)),
        _header("To", _mailbox(clean_header_text(envelope.recipient_name), recipient)),
        _header("Subject", _unstructured(clean_header_text(envelope.subject))),
        f"Date: {_date(date)}",
        f"Message-ID: {message_id_for(envelope.key, sender.domain)}",
        # RFC 3834: automatic replies must not answer an automated message.
        "Auto-Submitted: auto-generated",
    ]
    reply_to = _reply_to(envelope)
    if reply_to is not None:
        headers.append(_header("Reply-To", reply_to))
    if envelope.list_id:
        headers.append(_header("List-Id", _list_id(clean_header_text(envelope.list_id))))
    if envelope.unsubscribe_url:
        # RFC 8058: a client's unsubscribe button POSTs here, no cookies, no confirmation.
        headers.append(_header("List-Unsubscribe", f"<{envelope.unsubscribe_url}>"))
        headers.append("List-Unsubscribe-Post: List-Unsubscribe=One-Click")
    headers.append("MIME-Version: 1.0")
    body = _text_part("plain", envelope.text_body, boundary)
    alternatives = [body]
    if envelope.html_body is not None:
        alternatives.append(_text_part("html", envelope.html_body, boundary))
    if calendar := calendar_of(envelope):
        # RFC 6047: the iTIP object as an alternative, where clients look for it.
        alternatives.append(_calendar_part(calendar.content, envelope.calendar_method))
    if len(alternatives) > 1:
        body = _multipart("alternative", alternatives, f"{boundary}.a")
    if envelope.attachments:
        parts = [body, *map(_attachment_part, envelope.attachments)]
        body = _multipart("mixed", parts, f"{boundary}.m")
    text = CRLF.join(headers) + CRLF + body
    return Message(data=text.encode("ascii"), recipient=recipient)


def _header(name: str, value: str) -> str:
    """Return ``name: value`` folded at spaces to fit ``LINE`` where possible."""
    line = f"{name}: {value}"
    if len(line) <= LINE:
        return line
    first, *words = value.split(" ")
    lines: list[str] = []
    current = f"{name}: {first}"
    for word in words:
        if len(current) + 1 + len(word) > LINE:
            lines.append(current)
            current = f" {word}"
        else:
            current = f"{current} {word}"
    lines.append(current)
    return CRLF.join(lines)


def _encoded_words(text: str) -> list[str]:
    """Return ``text`` as base64 encoded words of at most 75 characters.

    Split after a space where possible: readers join adjacent encoded words,
    and a stray space is better than a word cut in two.
    """
    data = text.encode("utf-8")
    if len(data) <= _WORD_BYTES:
        return [_encoded_word(data)]
    words = []
    chunk = ""
    size = 0
    for character in text:
        width = len(character.encode("utf-8"))
        if size + width > _WORD_BYTES:
            cut = chunk.rfind(" ") + 1 or len(chunk)
            words.append(_encoded_word(chunk[:cut].encode("utf-8")))
            chunk = chunk[cut:]
            size = len(chunk.encode("utf-8"))
        chunk += character
        size += width
    words.append(_encoded_word(chunk.encode("utf-8")))
    return words


def _encoded_word(data: bytes) -> str:
    return f"=?utf-8?b?{base64.b64encode(data).decode('ascii')}?="


def _needs_encoding(word: str) -> bool:
    # A plain word that looks like an encoded word would be decoded by the reader.
    return not word.isascii() or "=?" in word or len(word) > LINE - 12


def _unstructured(text: str) -> str:
    """Return header text with each run of non-ASCII words encoded as one (RFC 2047 6.2)."""
    if not _needs_encoding(text):
        return text
    out: list[str] = []
    for encode, words in itertools.groupby(text.split(" "), key=_needs_encoding):
        if encode:
            out.extend(_encoded_words(" ".join(words)))
        else:
            out.extend(words)
    return " ".join(out)


def _list_id(text: str) -> str:
    """Return a List-Id (``phrase <id>``) with only the phrase encoded."""
    phrase, _, rest = text.rpartition(" <")
    return f"{_unstructured(phrase)} <{rest}"


def _mailbox(name: str, address: str) -> str:
    """Return ``name <address>``: the name bare, quoted, or as encoded words."""
    if not name:
        return address
    if _BARE_PHRASE.match(name) and not any(map(_needs_encoding, name.split(" "))):
        return f"{name} <{address}>"
    if name.isascii() and "=?" not in name:
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{quoted}" <{address}>'
    return f"{' '.join(_encoded_words(name))} <{address}>"


def _text_part(subtype: str, text: str, boundary: str) -> str:
    """Return a text part: 7bit, quoted-printable or base64, whichever fits.

    Lines split on CR, LF or CRLF only, as the ``email`` package does.
    """
    data = text.encode("utf-8")
    lines = data.splitlines()
    body = b"\r\n".join(lines) + b"\r\n"
    if (
        len(data) == len(text)  # ASCII
        and max(map(len, lines), default=0) <= LINE
        and boundary.encode("ascii") not in data
    ):
        encoding, written = "7bit", body.decode("ascii")
    elif len(body.translate(None, _ASCII_BYTES)) * 6 > len(body):
        # Past one non-ASCII byte in six, base64 is shorter than quoted-printable.
        encoding, written = "base64", _base64(body)
    else:
        encoding, written = "quoted-printable", _quoted_printable(body)
    return (
        f'Content-Type: text/{subtype}; charset="utf-8"{CRLF}'
        f"Content-Transfer-Encoding: {encoding}{CRLF}{CRLF}{written}"
    )


_ASCII_BYTES = bytes(range(128))


def _quoted_printable(body: bytes) -> str:
    """Return ``body`` quoted-printable with lines of at most 76 characters.

    ``b2a_qp`` can leave a trailing ``=20``/``=09`` past 76: such lines get one more soft break.
    """
    written = binascii.b2a_qp(body, istext=True).decode("ascii")
    lines = written.split(CRLF)
    if max(map(len, lines)) <= _QP_LINE:
        return written
    return CRLF.join(
        f"{line[:-3]}={CRLF}{line[-3:]}" if len(line) > _QP_LINE else line for line in lines
    )


def calendar_of(envelope: Envelope):
    """Return the text/calendar attachment mail clients should see inline, or None."""
    if not envelope.calendar_method:
        return None
    return next((a for a in envelope.attachments if a.content_type == "text/calendar"), None)


def _base64(data: bytes) -> str:
    """Return ``data`` base64 encoded in lines of 76 characters, each ending in CRLF."""
    return base64.encodebytes(data).decode("ascii").replace("\n", CRLF)


def _calendar_part(content: bytes, method: str) -> str:
    return (
        f'Content-Type: text/calendar; charset="utf-8"; method={method}{CRLF}'
        f"Content-Transfer-Encoding: base64{CRLF}{CRLF}{_base64(content)}"
    )


def _attachment_part(attachment) -> str:
    filename = clean_header_text(attachment.filename)
    disposition = f'attachment; filename="{filename}"'
    return (
        f"Content-Type: {attachment.content_type}{CRLF}"
        f"Content-Transfer-Encoding: base64{CRLF}"
        f"{_header('Content-Disposition', disposition)}{CRLF}{CRLF}{_base64(attachment.content)}"
    )


def _multipart(subtype: str, parts: list[str], boundary: str) -> str:
    """Return a multipart body; a part's last CRLF belongs to the delimiter."""
    return (
        f'Content-Type: multipart/{subtype}; boundary="{boundary}"{CRLF}{CRLF}'
        + "".join(f"--{boundary}{CRLF}{part}{CRLF}" for part in parts)
        + f"--{boundary}--{CRLF}"
    )

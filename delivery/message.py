"""Build RFC 5322 messages from envelopes, safely, with the stdlib email package.

Header injection is impossible by construction: display text (names,
subjects) is folded onto one line by ``clean_header_text`` before it reaches
a header, addresses were checked by ``address_problem``, and the ``SMTP``
policy encodes non-ASCII text as RFC 2047 encoded words (bodies as
quoted-printable or base64: the whole message is 7-bit ASCII).

The ``Message-ID`` is derived from the envelope's key, so every attempt and
every re-send of one reminder carries the same id and a duplicate is
recognisable downstream.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from email import policy as email_policy
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, parseaddr

from delivery.addresses import address_problem, clean_header_text, idna_domain
from delivery.envelope import Envelope
from delivery.errors import PermanentError

__all__ = ["Sender", "build_message", "message_id_for", "key_digest", "parse_sender"]

# 7-bit output: non-ASCII bodies are quoted-printable or base64, so the message
# is valid over any SMTP server, with or without the 8BITMIME extension.
MESSAGE_POLICY = email_policy.SMTP.clone(cte_type="7bit")


def key_digest(key: str) -> str:
    """Return a short, stable, file-name-safe digest of an idempotency key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def message_id_for(key: str, domain: str) -> str:
    """Return the ``Message-ID`` every send of ``key`` carries."""
    return f"<{key_digest(key)}.reminder@{domain}>"


class Sender:
    """A checked ``From`` address: display name and mailbox."""

    __slots__ = ("name", "address", "domain")

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address
        self.domain = address.rpartition("@")[2]

    def __repr__(self) -> str:
        return f"Sender({self.name!r}, {self.address!r})"


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
    return Sender(clean_header_text(name), address)


def _ascii_recipient(address: str) -> tuple[str, str]:
    local, _, domain = address.rpartition("@")
    if not local.isascii():
        raise PermanentError(
            f"recipient {address!r} has a non-ASCII local part, which needs SMTPUTF8; "
            "this channel does not send it",
            reached=False,
        )
    ascii_domain = idna_domain(domain)
    if ascii_domain is None:  # address_problem already rejected this in the engine
        raise PermanentError(f"recipient {address!r} has an invalid domain", reached=False)
    return local, ascii_domain


def _reply_to(envelope: Envelope) -> Address | None:
    """Return the Reply-To mailbox, or None when there is none or it cannot be written."""
    if not envelope.reply_to or address_problem(envelope.reply_to) is not None:
        return None
    local, _, domain = envelope.reply_to.rpartition("@")
    ascii_domain = idna_domain(domain)
    if not local.isascii() or ascii_domain is None:
        return None
    return Address(
        display_name=clean_header_text(envelope.reply_to_name), username=local, domain=ascii_domain
    )


def build_message(
    envelope: Envelope,
    *,
    sender: Sender,
    message_id_domain: str,
    date: datetime,
) -> EmailMessage:
    """Return the email for ``envelope``.

    Raise ``PermanentError(reached=False)`` for a recipient that cannot be
    written as ASCII (plain SMTP without SMTPUTF8).
    """
    local, domain = _ascii_recipient(envelope.recipient)
    message = EmailMessage(policy=MESSAGE_POLICY)
    message["From"] = Address(display_name=sender.name, addr_spec=sender.address)
    message["To"] = Address(
        display_name=clean_header_text(envelope.recipient_name), username=local, domain=domain
    )
    message["Subject"] = clean_header_text(envelope.subject)
    message["Date"] = format_datetime(date)
    message["Message-ID"] = message_id_for(envelope.key, message_id_domain)
    # RFC 3834: automatic replies must not answer an automated message.
    message["Auto-Submitted"] = "auto-generated"
    reply_to = _reply_to(envelope)
    if reply_to is not None:
        message["Reply-To"] = reply_to
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
    return message

"""Check recipient addresses and hosts, and make display text safe for one header line."""

from __future__ import annotations

import ipaddress
import re
import unicodedata

import idna

__all__ = ["address_problem", "clean_header_text", "idna_domain", "is_loopback_host"]

# RFC 5321 limits.
MAX_ADDRESS_LENGTH = 254
MAX_LOCAL_PART_LENGTH = 64

_ATOM_CHARS = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.\-\u0080-\U0010ffff]+$")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
# Control characters (category Cc) and the line and paragraph separators.
_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def clean_header_text(text: str) -> str:
    """Return ``text`` on one line, control characters turned into spaces."""
    return " ".join(_BREAKING.sub(" ", text).split())


def idna_domain(domain: str) -> str | None:
    """Return ``domain`` in punycode, or None if it has none.

    IDNA 2008, as registries use: straße.de is xn--strae-oqa.de (Python's own codec, IDNA 2003,
    would write strasse.de, another registrant's domain).
    """
    try:
        if domain.isascii():
            return domain.encode("idna").decode("ascii")  # checks the labels' lengths
        return idna.encode(domain, uts46=True).decode("ascii")
    except UnicodeError:  # idna.IDNAError is one
        return None


def is_loopback_host(host: str) -> bool:
    """Return True for ``localhost`` and loopback IP addresses (IPv4-mapped ones too)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # another name: DNS may send it anywhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def address_problem(address: str) -> str | None:
    """Return why ``address`` is syntactically undeliverable, or None."""
    if not address:
        return "recipient address is empty"
    if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in address):
        return f"recipient address {address!r} contains whitespace or control characters"
    if len(address) > MAX_ADDRESS_LENGTH:
        return f"recipient address is longer than {MAX_ADDRESS_LENGTH} characters"
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        return f"recipient address {address!r} is not of the form local@domain"
    if len(local) > MAX_LOCAL_PART_LENGTH:
        return f"recipient address {address!r} has a local part over {MAX_LOCAL_PART_LENGTH} characters"
    if (
        not _ATOM_CHARS.match(local)
        or local.startswith(".")
        or local.endswith(".")
        or ".." in local
    ):
        return f"recipient address {address!r} has an invalid local part"
    ascii_domain = idna_domain(domain)
    if ascii_domain is None:
        return f"recipient address {address!r} has a domain that cannot be encoded"
    labels = ascii_domain.split(".")
    if len(labels) < 2 or not all(_LABEL.match(label) for label in labels):
        return f"recipient address {address!r} has an invalid domain"
    return None


def address_slip(address: str) -> str | None:
    """What to correct in ``address`` if it is one of the usual slips of typing or pasting it,
    else None. Each is refused by Django's EmailValidator (whose words, 'Enter a valid email
    address.', do not say why) and by address_problem; these say what to do."""
    if address.endswith("."):
        return "The address ends with a dot: remove it."
    if any(ch.isspace() for ch in address):
        return "The address has a space in it: remove it."
    if address.count("@") > 1:
        return "The address has more than one @: keep only the one before the domain."
    return None


def attendee_address_refusal(address: str) -> tuple[str, str] | None:
    """(message, code) if an attendee may not be given ``address``, else None.

    Shared by the admin's attendee form and the intake (API, CSV): an address no reminder
    could reach, or one under ``.invalid`` (RFC 2606), where erasure writes its placeholders.
    """
    if address and (problem := address_problem(address)) is not None:
        return f"No reminder could reach it: {problem}.", "undeliverable"
    if address.lower().rstrip(".").endswith(".invalid"):
        return (
            "An address under .invalid can not receive mail; enter the attendee's real address.",
            "reserved_domain",
        )
    return None

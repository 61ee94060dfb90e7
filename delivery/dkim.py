"""DKIM signatures (RFC 6376) for the smtp channel, with dkimpy.

RFC 8058's one-click unsubscribe counts only if a DKIM signature covers List-Unsubscribe and
List-Unsubscribe-Post. Providers sign for the http and django channels and a relay may for
smtp; where neither does, the smtp channel signs with the configured key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Signed headers: what a forger would change to make the message say something else,
# and the two RFC 8058 asks for. A header listed but absent is signed as absent.
SIGNED_HEADERS = (
    b"from", b"to", b"subject", b"date", b"message-id", b"reply-to", b"list-id",
    b"list-unsubscribe", b"list-unsubscribe-post", b"mime-version", b"content-type",
    b"auto-submitted",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class DkimKey:
    """A private key (PEM) published at ``<selector>._domainkey.<domain>``."""

    selector: str
    domain: str
    private_key: bytes = field(repr=False)


def dkim_sign(data: bytes, key: DkimKey) -> bytes:
    """Return ``data`` (a whole message, CRLF line ends) with a DKIM-Signature header first."""
    import dkim  # imported on first use: a worker without a key never loads it

    signature = dkim.sign(
        data,
        key.selector.encode("ascii"),
        key.domain.encode("ascii"),
        key.private_key,
        canonicalize=(b"relaxed", b"relaxed"),
        include_headers=list(SIGNED_HEADERS),
    )
    return signature + data


def check_key(key: DkimKey) -> None:
    """Raise ValueError, saying what to fix, when ``key`` cannot sign a message."""
    try:
        dkim_sign(b"From: a@example.com\r\nSubject: check\r\n\r\nbody\r\n", key)
    except Exception as exc:
        raise ValueError(
            f"The DKIM key cannot sign ({exc}): give an RSA private key in PEM form."
        ) from exc

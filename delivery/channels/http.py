"""POST each envelope as signed JSON to a provider (see HTTP_CONTRACT.md).

Redirects are permanent errors, never followed with a signed body. The
provider deduplicates by ``Idempotency-Key``, so lost answers are retried.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Self
from urllib.parse import SplitResult, urlsplit

import aiohttp

from clock import Clock
from delivery.addresses import clean_header_text, is_loopback_host
from delivery.envelope import Envelope
from delivery.errors import (
    OutcomeUnknownError,
    PermanentError,
    RateLimitedError,
    TransientError,
)
from delivery.hedge import hedged_send
from delivery.redact import redact_text, redact_url

__all__ = ["HttpSettings", "HttpChannel", "encode_body", "signed_headers", "parse_retry_after"]

logger = logging.getLogger(__name__)

# Version 2 signs the Idempotency-Key too.
CONTRACT_VERSION = 2
SIGNATURE_HEADER = "X-Reminders-Signature"
TIMESTAMP_HEADER = "X-Reminders-Timestamp"
USER_AGENT = "workshop-reminders-delivery/1"
_TRANSIENT_STATUSES = frozenset({408, 409, 425})
_MAX_ERROR_TEXT = 300
#: The most of an answer's body read: a message id or a reason is far shorter.
_MAX_ANSWER_BYTES = 64 * 1024
#: The longest wait a Retry-After is taken for; longer ones outlast any deadline.
_MAX_RETRY_AFTER = 366 * 24 * 3600.0
_MAX_CONNECTIONS = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpSettings:
    """The endpoint and its shared secret."""

    url: str
    secret: str = field(repr=False)
    timeout: float = 10.0
    hedge_urls: tuple[str, ...] = ()
    hedge_stagger: float = 0.0
    #: Plain http:// to a host other than this machine (REMINDERS_HTTP_ALLOW_INSECURE).
    allow_insecure_http: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "hedge_urls", tuple(self.hedge_urls))
        for name, url in [("url", self.url)] + [("hedge_urls", u) for u in self.hedge_urls]:
            parts = urlsplit(url or "")
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"HttpSettings.{name} {redact_url(url)!r} is not an http(s) URL; pass the "
                    "provider's endpoint, e.g. https://notify.example.com/v1/reminders."
                )
            if parts.scheme == "http" and not self.allow_insecure_http and not _loopback(parts):
                raise ValueError(
                    f"HttpSettings.{name} {redact_url(url)!r} is plain http to another machine: "
                    "attendees' names, addresses and the signed requests would cross the "
                    "network unencrypted. Use https://, or set REMINDERS_HTTP_ALLOW_INSECURE=1 "
                    "for a provider on a trusted network."
                )
        if len(set((self.url, *self.hedge_urls))) != 1 + len(self.hedge_urls):
            raise ValueError("HttpSettings.hedge_urls repeats a URL; list each endpoint once.")
        if not self.secret:
            raise ValueError(
                "HttpSettings.secret is empty; pass the shared secret the provider uses to "
                "verify the X-Reminders-Signature header."
            )
        if not (isinstance(self.timeout, int | float) and 0 < self.timeout < math.inf):
            raise ValueError(f"HttpSettings.timeout must be seconds > 0 (got {self.timeout!r}).")
        if not math.isfinite(self.hedge_stagger) or self.hedge_stagger < 0:
            raise ValueError("HttpSettings.hedge_stagger must be seconds >= 0.")


def encode_body(envelope: Envelope) -> bytes:
    """Return the JSON body for ``envelope``, the same bytes on every retry."""
    document = {
        "version": CONTRACT_VERSION,
        "key": envelope.key,
        "reminder_id": envelope.reminder_id,
        "recipient": {
            "email": envelope.recipient,
            "name": clean_header_text(envelope.recipient_name),
        },
        "subject": clean_header_text(envelope.subject),
        "text_body": envelope.text_body,
        "html_body": envelope.html_body,
        "attachments": [
            {
                "filename": attachment.filename,
                "content_type": attachment.content_type,
                "content_base64": base64.b64encode(attachment.content).decode("ascii"),
            }
            for attachment in envelope.attachments
        ],
        "deadline_at": envelope.deadline_at.isoformat().replace("+00:00", "Z"),
        "payload": dict(envelope.payload),
    }
    return json.dumps(document, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def _loopback(parts: SplitResult) -> bool:
    host = (parts.hostname or "").rstrip(".").lower()
    return host.endswith(".localhost") or is_loopback_host(host)


def signed_headers(*, secret: str, key: str, body: bytes, timestamp: str) -> dict[str, str]:
    """Return the contract's request headers for ``body``, signed at ``timestamp``.

    The signature is HMAC-SHA256 of ``timestamp LF key LF body``: the timestamp (digits) and the
    key (printable ASCII, as ``Envelope`` checks) hold no line break, so the parts cannot shift.
    """
    message = b"\n".join((timestamp.encode("ascii"), key.encode("ascii"), body))
    digest = hmac.new(secret.encode(), message, hashlib.sha256)
    return {
        "Content-Type": "application/json; charset=utf-8",
        "Accept": "application/json",
        "Idempotency-Key": key,
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: f"sha256={digest.hexdigest()}",
    }


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Return the seconds a ``Retry-After`` value (seconds or HTTP date) asks for.

    At most ``_MAX_RETRY_AFTER``: a wait of centuries would overflow the deadline arithmetic.
    A date already past is no hint (None): it tells of the provider's clock, not of its load;
    nor is a negative number (the header is digits), which would pause nobody.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if moment.tzinfo is None:
            return None
        seconds = (moment - now).total_seconds()
        if seconds <= 0:
            return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, _MAX_RETRY_AFTER)


def _json_string(body: bytes | str, name: str) -> str | None:
    """Return the string ``name`` holds in the JSON object ``body``, else None."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    value = document.get(name) if isinstance(document, dict) else None
    return value if isinstance(value, str) else None


async def _read_answer(response: aiohttp.ClientResponse) -> bytes:
    """Return the body, or its first ``_MAX_ANSWER_BYTES`` (the rest is never read)."""
    if response.content_length is not None and response.content_length <= _MAX_ANSWER_BYTES:
        return await response.read()  # the usual answer: one read, as before the bound
    answer = bytearray()
    while len(answer) < _MAX_ANSWER_BYTES:
        chunk = await response.content.read(_MAX_ANSWER_BYTES - len(answer))
        if not chunk:
            break
        answer += chunk
    return bytes(answer)


def _error_text(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    error = _json_string(text, "error")
    return " ".join((text if error is None else error).split())[:_MAX_ERROR_TEXT]


class _Endpoint:
    """One URL of an ``HttpChannel``, shaped like a channel for hedging."""

    honours_idempotency_keys = True

    def __init__(self, channel: HttpChannel, url: str) -> None:
        self.name = redact_url(url)  # errors and task names quote it
        self._channel = channel
        self._url = url

    async def send(self, envelope: Envelope) -> str:
        return await self._channel._post(self._url, envelope)


class HttpChannel:
    """Deliver envelopes by POSTing signed JSON, one ``aiohttp`` session per batch."""

    name = "http"
    honours_idempotency_keys = True
    max_concurrency = None

    def __init__(self, settings: HttpSettings, *, clock: Clock) -> None:
        self.settings = settings
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._endpoints = [_Endpoint(self, url) for url in (settings.url, *settings.hedge_urls)]

    async def __aenter__(self) -> Self:
        settings = self.settings
        # aiohttp verifies certificates with its default context, made once at import.
        connector = aiohttp.TCPConnector(limit=_MAX_CONNECTIONS, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=settings.timeout, connect=settings.timeout),
            # An answer is read to _MAX_ANSWER_BYTES as it came: inflated, 64 KiB of gzip
            # would be 64 MB. A compressed one anyway reads as no message id or reason.
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        return self

    async def __aexit__(self, *exc_info) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def send(self, envelope: Envelope) -> str:
        if len(self._endpoints) == 1:
            return await self._post(self.settings.url, envelope)
        return await hedged_send(
            envelope, self._endpoints, clock=self._clock, stagger=self.settings.hedge_stagger
        )

    async def _post(self, url: str, envelope: Envelope) -> str:
        body = encode_body(envelope)
        timestamp = str(int(self._clock.now().timestamp()))
        headers = signed_headers(
            secret=self.settings.secret, key=envelope.key, body=body, timestamp=timestamp
        )
        try:
            async with self._session.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                status, answer = response.status, await _read_answer(response)
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # Never connected: nothing was sent.
            raise TransientError(
                f"could not connect to {redact_url(url)}: {type(exc).__name__}: "
                f"{redact_text(str(exc))}",
                reached=False,
            ) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            # The answer is lost: the provider may have the message.
            raise OutcomeUnknownError(
                f"request to {redact_url(url)} failed after it was sent: {type(exc).__name__}: "
                f"{redact_text(str(exc)) or 'no answer in time'}"
            ) from exc
        if 200 <= status < 300:
            if message_id := _json_string(answer, "message_id"):
                return message_id
            # Accepted is accepted: failing here would invite a duplicate.
            logger.warning(
                "%s accepted reminder %s without a message_id in its answer",
                redact_url(url),
                envelope.reminder_id,
            )
            return ""
        wait = parse_retry_after(retry_after, now=self._clock.now())
        text = f"HTTP {status} from {redact_url(url)}: {redact_text(_error_text(answer))}"
        if status == 429:
            raise RateLimitedError(text, wait)
        if status >= 500 or status in _TRANSIENT_STATUSES:
            raise TransientError(text, wait)
        raise PermanentError(text)

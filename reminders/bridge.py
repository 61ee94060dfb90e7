"""The one place where synchronous and asynchronous code meet.

Everything above this module is synchronous: the admin, the services, the
ORM, the Celery task. Everything below it is asyncio: the delivery engine and
its channels (package ``delivery``, which never imports Django). The crossing
is ``deliver_envelopes``: a Celery task that has claimed reminders and built
their envelopes with the ORM calls it, it runs one fresh event loop for the
batch (``delivery.deliver_sync``) and returns plain results, which the task
then records with the ORM. No ORM call happens while the loop runs; no
coroutine escapes it.

This module also turns Django settings into the engine's plain values
(channel settings, policy, rate limiter), so the engine never reads settings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection

from clock import Clock
from delivery.addresses import clean_header_text
from delivery.channel import Channel
from delivery.channels.file import FileChannel
from delivery.channels.http import HttpChannel, HttpSettings
from delivery.channels.smtp import SmtpChannel, SmtpSettings, translate_smtplib_error
from delivery.channels.threaded import ThreadedChannel
from delivery.engine import deliver_sync
from delivery.envelope import Envelope
from delivery.limiter import RateLimiter, RedisRateLimiter
from delivery.message import message_id_for
from delivery.policy import DeliveryPolicy
from delivery.results import DeliveryResult

RATE_LIMIT_ACCOUNT = "reminders:provider"
LIMITER_MARGIN = 0.05


def smtp_settings() -> SmtpSettings:
    """Return Django's EMAIL_* settings as the smtp channel's plain values."""
    return SmtpSettings(
        host=settings.EMAIL_HOST,
        port=settings.EMAIL_PORT,
        username=settings.EMAIL_HOST_USER,
        password=settings.EMAIL_HOST_PASSWORD,
        starttls=settings.EMAIL_USE_TLS,
        use_tls=settings.EMAIL_USE_SSL,
        timeout=float(settings.EMAIL_TIMEOUT),
        from_email=settings.DEFAULT_FROM_EMAIL,
        max_connections=settings.REMINDERS_SMTP_CONNECTIONS,
    )


def send_with_django(envelope: Envelope) -> str:
    """Send one envelope through Django's configured EMAIL_BACKEND (runs in a thread)."""
    message_id = message_id_for(envelope.key, domain=_from_domain())
    message = EmailMultiAlternatives(
        subject=clean_header_text(envelope.subject),
        body=envelope.text_body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[_mailbox(clean_header_text(envelope.recipient_name), envelope.recipient)],
        headers={"Message-ID": message_id},
    )
    if envelope.html_body:
        message.attach_alternative(envelope.html_body, "text/html")
    for attachment in envelope.attachments:
        message.attach(attachment.filename, attachment.content, attachment.content_type)
    try:
        with get_connection(fail_silently=False) as connection:
            sent = connection.send_messages([message])
    except Exception as exc:
        # smtplib errors become the engine's transient or permanent errors, so
        # a refused recipient is "failed", not an unknown outcome.
        raise translate_smtplib_error(exc) from exc
    if not sent:
        raise RuntimeError("Django's email backend reported that it sent nothing")
    return message_id


def _mailbox(name: str, address: str) -> str:
    """Return ``"name" <address>`` with the name quoted, so ':' or ',' in it stay text."""
    if not name:
        return address
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}" <{address}>'


def _from_domain() -> str:
    address = settings.DEFAULT_FROM_EMAIL.rsplit("<", 1)[-1].rstrip(">")
    return address.rsplit("@", 1)[-1] or "localhost"


def channel_factory(name: str, *, clock: Clock) -> Callable[[], Channel]:
    """Return a factory building the named channel inside the batch's event loop."""
    if name == "smtp":
        values = smtp_settings()
        return lambda: SmtpChannel(values, clock=clock)
    if name == "http":
        values = HttpSettings(
            url=settings.REMINDERS_HTTP_URL,
            secret=settings.REMINDERS_HTTP_SECRET,
            timeout=settings.REMINDERS_CALL_TIMEOUT,
        )
        return lambda: HttpChannel(values, clock=clock)
    if name == "file":
        directory = settings.REMINDERS_FILE_DIR
        sender = settings.DEFAULT_FROM_EMAIL
        return lambda: FileChannel(directory, from_email=sender, clock=clock)
    if name == "django":
        return lambda: ThreadedChannel("django", send_with_django)
    raise ValueError(
        f"Unknown channel {name!r}; REMINDERS_CHANNEL accepts {settings.REMINDERS_CHANNELS}."
    )


def check_channel(name: str, *, clock: Clock) -> int:
    """Build the named channel once, so a bad setting fails before any reminder is claimed.

    Raise ``ValueError`` naming the setting (channel constructors do no I/O).
    Return how many provider calls may really be in flight at once: the
    smaller of REMINDERS_CONCURRENCY and the channel's own limit (an SMTP
    connection carries one message at a time).
    """
    channel = channel_factory(name, clock=clock)()
    own_limit = getattr(channel, "max_concurrency", None)
    concurrency = settings.REMINDERS_CONCURRENCY
    return min(concurrency, own_limit) if own_limit else concurrency


def limiter_factory(*, clock: Clock) -> Callable[[], RateLimiter] | None:
    """Return the cross-worker limiter for REMINDERS_RATE_LIMIT, or None when unlimited."""
    per_second = settings.REMINDERS_RATE_LIMIT
    if not per_second:
        return None
    if not settings.REMINDERS_REDIS_URL:
        from delivery.limiter import LocalRateLimiter

        return lambda: LocalRateLimiter(per_second, clock=clock, margin=LIMITER_MARGIN)
    url = settings.REMINDERS_REDIS_URL
    # 50 ms of margin per window: a start granted at the edge of a window can
    # reach a provider on a loaded host that much later (seen at 20 ms).
    return lambda: RedisRateLimiter(
        url=url,
        account=RATE_LIMIT_ACCOUNT,
        per_second=per_second,
        clock=clock,
        margin=LIMITER_MARGIN,
    )


def delivery_policy(*, budget: float) -> DeliveryPolicy:
    """Return the engine's policy from settings, bounded by what is left of the batch budget.

    At the budget no new call starts, and calls already in flight may finish
    (the drain), so their outcome is known instead of ``unknown`` (a call cut
    off on SMTP may have reached the server).
    """
    return DeliveryPolicy(
        concurrency=settings.REMINDERS_CONCURRENCY,
        call_timeout=settings.REMINDERS_CALL_TIMEOUT,
        max_attempts=settings.REMINDERS_ENGINE_ATTEMPTS,
        budget=max(1.0, budget),
        # A call in flight can always finish: the drain is one call timeout,
        # and Celery's time limits sit above budget + call timeout.
        drain=settings.REMINDERS_CALL_TIMEOUT,
    )


def deliver_envelopes(
    envelopes: list[Envelope],
    *,
    channel: str,
    clock: Clock,
    budget: float,
    stop: threading.Event | None = None,
) -> list[DeliveryResult]:
    """Deliver a batch on a fresh event loop and return one result per envelope (blocking)."""
    if not envelopes:
        return []
    return deliver_sync(
        envelopes,
        channel_factory(channel, clock=clock),
        policy=delivery_policy(budget=budget),
        clock=clock,
        limiter_factory=limiter_factory(clock=clock),
        stop=stop,
    )

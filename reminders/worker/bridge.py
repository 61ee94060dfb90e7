"""Where Django meets the asyncio engine (``delivery``, which never imports Django).

``deliver_envelopes`` runs a chunk on the event loop and returns plain results; settings
become the engine's plain values here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import smtplib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection

from clock import Clock
from delivery.addresses import address_problem, clean_header_text
from delivery.channel import Channel
from delivery.channels.file import FileChannel
from delivery.channels.http import HttpChannel, HttpSettings
from delivery.channels.smtp import (
    SmtpChannel,
    SmtpSettings,
    plaintext_smtp_allowed,
    translate_smtplib_error,
)
from delivery.channels.threaded import ThreadedChannel
from delivery.dkim import DkimKey, check_key
from delivery.envelope import Envelope
from delivery.limiter import LocalRateLimiter, RateLimiter, RedisRateLimiter
from delivery.limits import DeliveryLimits
from delivery.message import calendar_of, message_id_for
from delivery.results import DeliveryResult
from delivery.session import Session
from reminders.content import sender_domain
from reminders.services.watch import WATCH_INTERVAL, ClaimWatch
from reminders.worker import telemetry

RATE_LIMIT_ACCOUNT = "reminders:provider"
LIMITER_MARGIN = 0.03

logger = logging.getLogger(__name__)


def smtp_settings() -> SmtpSettings:
    """Return Django's EMAIL_* settings as the smtp channel's plain values."""
    return SmtpSettings(
        host=settings.EMAIL_HOST,
        port=settings.EMAIL_PORT,
        username=settings.EMAIL_HOST_USER,
        password=settings.EMAIL_HOST_PASSWORD,
        # EMAIL_USE_TLS=1 requires STARTTLS; otherwise it is used whenever offered, and
        # required all the same unless EMAIL_HOST is this machine or in EMAIL_PLAINTEXT_HOSTS.
        starttls=True if settings.EMAIL_USE_TLS else None,
        require_tls=not plaintext_smtp_allowed(settings.EMAIL_HOST, settings.EMAIL_PLAINTEXT_HOSTS),
        allow_plaintext_auth=settings.EMAIL_ALLOW_PLAINTEXT_AUTH,
        use_tls=settings.EMAIL_USE_SSL,
        timeout=float(settings.EMAIL_TIMEOUT),
        from_email=settings.DEFAULT_FROM_EMAIL,
        max_connections=settings.REMINDERS_SMTP_CONNECTIONS,
        dkim=dkim_key(),
    )


def dkim_key() -> DkimKey | None:
    """Return the smtp channel's DKIM key (REMINDERS_DKIM_*), or None; ValueError if unusable."""
    if not settings.REMINDERS_DKIM_KEY_FILE:
        return None
    domain = settings.REMINDERS_DKIM_DOMAIN or sender_domain()
    return _loaded_key(settings.REMINDERS_DKIM_SELECTOR, domain, settings.REMINDERS_DKIM_KEY_FILE)


@functools.lru_cache(maxsize=4)
def _loaded_key(selector: str, domain: str, path: str) -> DkimKey:
    """Read and check the key once per process and setting (every batch builds the channel)."""
    with open(path, "rb") as handle:
        key = DkimKey(selector=selector, domain=domain, private_key=handle.read())
    try:
        check_key(key)
    except ValueError as exc:
        raise ValueError(f"REMINDERS_DKIM_KEY_FILE: {exc}") from None
    return key


def send_with_django(envelope: Envelope) -> str:
    """Send one envelope through Django's configured EMAIL_BACKEND (runs in a thread)."""
    message_id = message_id_for(envelope.key, domain=sender_domain())
    headers = {"Message-ID": message_id}
    if envelope.list_id:
        headers["List-Id"] = clean_header_text(envelope.list_id)
    if envelope.unsubscribe_url:
        headers["List-Unsubscribe"] = f"<{envelope.unsubscribe_url}>"
        headers["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    reply_to = []
    if envelope.reply_to and address_problem(envelope.reply_to) is None:
        reply_to = [_mailbox(clean_header_text(envelope.reply_to_name), envelope.reply_to)]
    message = EmailMultiAlternatives(
        subject=clean_header_text(envelope.subject),
        body=envelope.text_body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[_mailbox(clean_header_text(envelope.recipient_name), envelope.recipient)],
        reply_to=reply_to,
        headers=headers,
    )
    # django-anymail sends it to the provider, whose reports carry it back (receivers.py).
    message.metadata = {"reminder_key": envelope.key}
    if envelope.html_body:
        message.attach_alternative(envelope.html_body, "text/html")
    if calendar := calendar_of(envelope):
        message.attach_alternative(
            calendar.content.decode(), f"text/calendar; method={envelope.calendar_method}"
        )
    for attachment in envelope.attachments:
        message.attach(attachment.filename, attachment.content, attachment.content_type)
    connection = get_connection(fail_silently=False)
    try:
        connection.open()  # connect, STARTTLS, login: a failure here sent nothing of the message
    except Exception as exc:
        with contextlib.suppress(Exception):
            connection.close()
        raise translate_smtplib_error(exc, opening=True) from exc
    in_data = _watch_data(getattr(connection, "connection", None))
    try:
        with connection:
            sent = connection.send_messages([message])
    except Exception as exc:
        # Mapped to the engine's errors, a refused recipient is "failed", not unknown.
        raise translate_smtplib_error(exc, before_data=in_data == [False]) from exc
    if not sent:
        raise RuntimeError("Django's email backend reported that it sent nothing")
    # The provider's own id where django-anymail reports one: its reports name it.
    status = getattr(message, "anymail_status", None)
    provider_id = getattr(status, "message_id", None)
    if isinstance(provider_id, str | int) and not isinstance(provider_id, bool):
        return str(provider_id)
    return message_id


def _watch_data(session: object) -> list[bool]:
    """Return ``[False]``, made ``[True]`` once ``session`` (Django's ``smtplib.SMTP``) starts
    DATA; ``[]`` for a backend that is not one, whose phase is not known."""
    if not isinstance(session, smtplib.SMTP):
        return []
    started, data = [False], session.data

    def watched(message):
        started[0] = True
        return data(message)

    session.data = watched
    return started


def _mailbox(name: str, address: str) -> str:
    """Return ``"name" <address>`` with the name quoted, so ':' or ',' in it stay text."""
    if not name:
        return address
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{quoted}" <{address}>'


def channel_factory(name: str, *, clock: Clock) -> Callable[[], Channel]:
    """Return a factory building the named channel inside the batch's event loop."""
    values = _channel_values(name)
    if name == "smtp":
        return lambda: SmtpChannel(values, clock=clock)
    if name == "http":
        return lambda: HttpChannel(values, clock=clock)
    if name == "file":
        directory, sender = values
        return lambda: FileChannel(directory, from_email=sender, clock=clock)
    return lambda: ThreadedChannel("django", send_with_django)


def _channel_values(name: str):
    """Return the named channel's plain settings (a change of any of them is a new channel)."""
    if name == "smtp":
        return smtp_settings()
    if name == "http":
        return HttpSettings(
            url=settings.REMINDERS_HTTP_URL,
            secret=settings.REMINDERS_HTTP_SECRET,
            timeout=settings.REMINDERS_CALL_TIMEOUT,
            hedge_urls=tuple(settings.REMINDERS_HTTP_HEDGE_URLS),
            hedge_stagger=settings.REMINDERS_HTTP_HEDGE_STAGGER,
            allow_insecure_http=settings.REMINDERS_HTTP_ALLOW_INSECURE,
        )
    if name == "file":
        return (settings.REMINDERS_FILE_DIR, settings.DEFAULT_FROM_EMAIL)
    if name == "django":
        # Django's EMAIL_* settings are read by its backend at each send. Its SMTP
        # backend never upgrades a plain connection, so whatever goes over one is in clear.
        plain = not (settings.EMAIL_USE_TLS or settings.EMAIL_USE_SSL)
        smtp = settings.EMAIL_BACKEND == "django.core.mail.backends.smtp.EmailBackend"
        host = settings.EMAIL_HOST
        if smtp and settings.EMAIL_USE_TLS and settings.EMAIL_USE_SSL:
            # Django's backend would raise it at every send, each reminder left unknown.
            raise ValueError(
                "EMAIL_USE_TLS and EMAIL_USE_SSL are both set; set one: EMAIL_USE_TLS=1 for "
                "STARTTLS (port 587), EMAIL_USE_SSL=1 for implicit TLS (port 465)."
            )
        if smtp and plain and not plaintext_smtp_allowed(host, settings.EMAIL_PLAINTEXT_HOSTS):
            raise ValueError(
                f"EMAIL_HOST={host!r} is another machine and neither EMAIL_USE_TLS nor "
                "EMAIL_USE_SSL is set, so Django's SMTP backend would send every message in "
                "clear text: set EMAIL_USE_TLS=1 (or EMAIL_USE_SSL=1), or, for a relay on a "
                f"trusted private network only, list {host} in EMAIL_PLAINTEXT_HOSTS."
            )
        if smtp and plain and settings.EMAIL_HOST_USER and not settings.EMAIL_ALLOW_PLAINTEXT_AUTH:
            raise ValueError(
                "EMAIL_HOST_USER is set but the connection is not encrypted, so the login "
                "would cross the network in clear: set EMAIL_USE_TLS=1 (or EMAIL_USE_SSL=1), "
                "or, on a trusted network only, EMAIL_ALLOW_PLAINTEXT_AUTH=1."
            )
        return ()
    raise ValueError(
        f"Unknown channel {name!r}; REMINDERS_CHANNEL accepts {settings.REMINDERS_CHANNELS}."
    )


def check_channel(name: str, *, clock: Clock) -> int:
    """Build the named channel, so a bad setting fails before a claim; return the concurrency."""
    concurrency = settings.REMINDERS_CONCURRENCY
    return min(concurrency, channel_factory(name, clock=clock)().max_concurrency or concurrency)


def channel_problem(*, clock: Clock) -> str | None:
    """Return why REMINDERS_CHANNEL cannot be built, or None (the system check and a worker's
    start both ask)."""
    try:
        check_channel(settings.REMINDERS_CHANNEL, clock=clock)
    except (ValueError, TypeError) as exc:
        return f"REMINDERS_CHANNEL={settings.REMINDERS_CHANNEL} cannot be built: {exc}"
    return None


def limiter_factory(*, clock: Clock) -> Callable[[], RateLimiter] | None:
    """Return the cross-worker limiter for REMINDERS_RATE_LIMIT, or None when unlimited."""
    per_second = settings.REMINDERS_RATE_LIMIT
    if not per_second:
        return None
    url = settings.REMINDERS_REDIS_URL
    if not url:
        return lambda: LocalRateLimiter(per_second, clock=clock, margin=LIMITER_MARGIN)
    # The margin covers network and provider jitter, not stalls: a start woken too late is skipped.
    return lambda: RedisRateLimiter(
        url=url,
        account=RATE_LIMIT_ACCOUNT,
        per_second=per_second,
        clock=clock,
        margin=LIMITER_MARGIN,
    )


def delivery_limits(*, budget: float) -> DeliveryLimits:
    """Return the engine's policy from settings, bounded by what is left of the batch budget."""
    bounds = settings.REMINDERS_TIME_BOUNDS
    return DeliveryLimits(
        concurrency=settings.REMINDERS_CONCURRENCY,
        call_timeout=settings.REMINDERS_CALL_TIMEOUT,
        max_attempts=settings.REMINDERS_ENGINE_ATTEMPTS,
        budget=max(1.0, budget),
        drain=bounds.drain,
        close_timeout=bounds.close,
    )


@contextmanager
def delivery_session(*, channel: str, clock: Clock) -> Iterator[Session]:
    """Yield the engine session a Celery batch delivers its chunks on.

    With REMINDERS_KEEP_CONNECTIONS, the main thread keeps one across batches, replaced when
    idle longer, built for other settings or inherited, and closed when a batch raises.
    """
    keep = float(settings.REMINDERS_KEEP_CONNECTIONS)
    # A session serves one thread at a time; a prefork pool process runs tasks in its main one.
    if not keep or threading.current_thread() is not threading.main_thread():
        with _new_session(channel=channel, clock=clock) as session:
            yield session
        return
    session = _kept_session(channel=channel, clock=clock, keep=keep)
    try:
        yield session
    except BaseException:
        # Interrupted, or the database went away: the next batch starts clean.
        close_kept_session()
        raise
    finally:
        if _kept is not None and _kept.session is session:
            _kept.last_used = clock.monotonic()


def close_kept_session() -> None:
    """Close this process's kept session, if it has one (worker process shutdown)."""
    global _kept
    kept, _kept = _kept, None
    if kept is None or kept.pid != os.getpid():
        return  # another process's (inherited across a fork): not ours to close
    try:
        kept.session.close()
    except Exception:
        logger.warning("The kept delivery session did not close cleanly", exc_info=True)


@dataclass
class _Kept:
    pid: int
    key: str
    session: Session
    last_used: float


_kept: _Kept | None = None


def _kept_session(*, channel: str, clock: Clock, keep: float) -> Session:
    global _kept
    limiter = (settings.REMINDERS_RATE_LIMIT, settings.REMINDERS_REDIS_URL)
    key = repr((channel, _channel_values(channel), limiter, id(clock)))
    if _kept is not None and (
        _kept.pid != os.getpid() or _kept.key != key or clock.monotonic() - _kept.last_used > keep
    ):
        close_kept_session()  # dropped unclosed if inherited across a fork
    if _kept is None:
        session = _new_session(channel=channel, clock=clock)
        session.__enter__()
        _kept = _Kept(pid=os.getpid(), key=key, session=session, last_used=clock.monotonic())
    return _kept.session


def _new_session(*, channel: str, clock: Clock) -> Session:
    return Session(
        channel_factory(channel, clock=clock),
        clock=clock,
        limiter_factory=limiter_factory(clock=clock),
        close_timeout=settings.REMINDERS_TIME_BOUNDS.close,
    )


def deliver_envelopes(
    envelopes: list[Envelope],
    *,
    channel: str,
    clock: Clock,
    budget: float,
    stop=None,
    watch: ClaimWatch | None = None,
    session: Session | None = None,
) -> list[DeliveryResult]:
    """Deliver a chunk on the event loop and return one result per envelope (blocking).

    With ``watch``, no call starts for an envelope it withdrew. Interrupted mid-chunk, raise
    ``delivery.session.Interrupted`` with the results.
    """
    if not envelopes:
        return []
    context = (
        delivery_session(channel=channel, clock=clock) if session is None else nullcontext(session)
    )
    with context as session:
        return session.deliver(
            envelopes,
            policy=delivery_limits(budget=budget),
            stop=stop,
            gate=watch.gate if watch is not None else None,
            tick=watch.refresh if watch is not None else None,
            tick_interval=WATCH_INTERVAL,
            observer=telemetry.observer(),
        )

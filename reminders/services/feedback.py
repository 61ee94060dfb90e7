"""What providers report after accepting a reminder: delivered, deferred, bounced, complained."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import idna
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q, Value
from django.db.models.functions import Coalesce, NullIf
from django.utils.crypto import salted_hmac

from clock import Clock, default_clock
from delivery.redact import redact_text
from reminders.models import DeliveryEvent, DroppedReports, Notice, Reminder, Suppression
from reminders.services import dispatch
from workshops.models import Attendee

logger = logging.getLogger(__name__)

# One request's events at most, and the longest id and reason taken.
MAX_EVENTS = 1000
MAX_EVENT_ID = 200
MAX_REASON = 2000

Kind = DeliveryEvent.Kind
Bounce = DeliveryEvent.Bounce


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    event_id: str
    key: str
    kind: str
    bounce: str
    occurred_at: datetime
    reason: str


class MalformedEvents(ValueError):
    """A document that is not a list of events; ``problems`` names every item's fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class TooManyEvents(MalformedEvents):
    """More than MAX_EVENTS events in one document: the contract's 413, split them."""


def parse_events(document: object) -> list[ProviderEvent]:
    """Return the events of ``{"events": [...]}``, or raise MalformedEvents naming each fault.

    All or nothing: one bad item refuses the document, so a provider fixes and resends it whole.
    """
    if not isinstance(document, dict) or not isinstance(document.get("events"), list):
        raise MalformedEvents(['the body must be an object {"events": [...]}'])
    items = document["events"]
    if not 1 <= len(items) <= MAX_EVENTS:
        error = TooManyEvents if items else MalformedEvents
        raise error([f"send 1 to {MAX_EVENTS} events per request, not {len(items)}"])
    events, problems = [], []
    for index, item in enumerate(items):
        try:
            events.append(_event(item))
        except ValueError as exc:
            problems.append(f"events[{index}]: {exc}")
    if problems:
        raise MalformedEvents(problems)
    return events


# Half a UTF-16 pair, which JSON may escape ("\\ud800") and UTF-8 cannot carry.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _storable(text: str) -> bool:
    """Return whether PostgreSQL can store ``text``: no NUL, no lone surrogate."""
    return "\x00" not in text and not _LONE_SURROGATE.search(text)


def _event(item: object) -> ProviderEvent:
    if not isinstance(item, dict):
        raise ValueError("each event must be an object")
    event_id, key = item.get("id"), item.get("key")
    # PostgreSQL stores no NUL in text: a 500 would have the provider retry the body forever.
    if (
        not isinstance(event_id, str)
        or not 1 <= len(event_id) <= MAX_EVENT_ID
        or not _storable(event_id)
    ):
        raise ValueError(
            f"id must be a string of 1 to {MAX_EVENT_ID} characters, none NUL or a lone surrogate"
        )
    if not isinstance(key, str) or not 1 <= len(key) <= 64 or not _storable(key):
        raise ValueError("key must be the Idempotency-Key of the reminder's request")
    kind = item.get("type")
    if kind not in Kind.values:
        raise ValueError(f"type must be one of {', '.join(Kind.values)}, not {kind!r}")
    bounce = item.get("bounce")
    if kind == Kind.BOUNCED and bounce not in ("hard", "soft"):
        raise ValueError('a bounce needs "bounce": "hard" or "soft"')
    if kind != Kind.BOUNCED and bounce is not None:
        raise ValueError('"bounce" belongs to bounces only')
    at = item.get("at")
    try:
        # RFC 3339 lets "T" and "Z" be written in lower case; Python reads upper case only.
        occurred_at = datetime.fromisoformat(at.upper()) if isinstance(at, str) else None
        if occurred_at is not None and occurred_at.utcoffset() is not None:
            occurred_at = occurred_at.astimezone(UTC)
    except (ValueError, OverflowError):
        occurred_at = None
    if occurred_at is None or occurred_at.utcoffset() is None:
        raise ValueError('at must be an RFC 3339 time with its offset, e.g. "2026-03-02T09:00:00Z"')
    if not 1971 <= occurred_at.year <= 9998:  # as the API's times: shown in any zone
        raise ValueError("at must be a time between the years 1971 and 9998")
    reason = item.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ValueError(f"reason must be text of at most {MAX_REASON} characters")
    return ProviderEvent(event_id, key, kind, bounce or "", occurred_at, reason)


def delivery_events_record(*, channel: str, events: list[ProviderEvent]) -> dict[str, int]:
    """Store each event once; return how many were recorded, seen before, or dropped.

    An event whose key names no reminder or change notice sent here, or one of an erased
    attendee, is dropped; a notice's is kept on its reminder. The unique (channel, event id)
    keeps a retried webhook's events once, whoever races.
    """
    keys = {event.key for event in events}

    def sent(model):
        # Sent, or perhaps: a report may come before the worker recorded its call (still
        # sending, or pending a retry under the same key after a call that timed out).
        done = (model.Status.SENT, model.Status.UNKNOWN, model.Status.SENDING)
        return model.objects.filter(
            Q(status__in=done) | Q(maybe_sent=True), key__in=keys, attendee__erased_at__isnull=True
        )

    # The address each went to: one corrected since is not the one that bounced. None
    # recorded, the attendee's is the nearest record (as the upgrade took for those sent before).
    went_to = Coalesce(NullIf("sent_to", Value("")), "attendee__email")
    rows = list(sent(Reminder).values_list("key", "pk", "attendee_id", went_to))
    # A change notice goes out under a key of its own (notice_key): kept on its reminder.
    rows += sent(Notice).values_list("key", "reminder_id", "attendee_id", went_to)
    reminder_of = {key: pk for key, pk, _, _ in rows}
    sent_to = {key: (attendee, email) for key, _, attendee, email in rows}
    now = default_clock().now()
    new: dict[str, DeliveryEvent] = {}
    addressed: dict[str, tuple[int, str]] = {}
    dropped = seen = 0
    for event in events:
        if event.key not in reminder_of:
            dropped += 1
        elif event.event_id in new:  # twice in this request
            seen += 1
        else:
            new[event.event_id] = DeliveryEvent(
                reminder_id=reminder_of[event.key],
                channel=channel,
                event_id=event.event_id,
                kind=event.kind,
                bounce=event.bounce,
                # No later than its receipt: one dated ahead (a clock, a typo) would come after
                # every later report and break each run of soft bounces there.
                occurred_at=min(event.occurred_at, now),
                received_at=now,
                # PostgreSQL stores no NUL, and UTF-8 no lone surrogate.
                reason=redact_text(_LONE_SURROGATE.sub("\ufffd", event.reason.replace("\x00", ""))),
                address_key=address_key(sent_to[event.key][1]),
            )
            addressed[event.event_id] = sent_to[event.key]
    with transaction.atomic():
        # Their attendees locked, as an erasure locks them: one erased since the read above
        # is dropped; one erased later waits for this commit, then scrubs what it kept. A
        # concurrent request's reports of them wait too, so each run of soft bounces is
        # counted with the other's committed.
        live = set(
            Attendee.objects.filter(
                pk__in={attendee for attendee, _ in addressed.values()}, erased_at__isnull=True
            )
            .order_by("pk")
            .select_for_update(no_key=True)
            .values_list("pk", flat=True)
        )
        for event_id, (attendee, _) in list(addressed.items()):
            if attendee not in live:
                del new[event_id], addressed[event_id]
                dropped += 1
        # Recorded before, or by a retry while this request waited on the lock: seen.
        for event_id in DeliveryEvent.objects.filter(
            channel=channel, event_id__in=list(new)
        ).values_list("event_id", flat=True):
            del new[event_id], addressed[event_id]
            seen += 1
        # A retry racing its first delivery: the constraint keeps one row.
        DeliveryEvent.objects.bulk_create(new.values(), ignore_conflicts=True)
        for event in sorted(new.values(), key=lambda event: event.occurred_at):
            _suppress_after(event, *addressed[event.event_id], now=now)
    if dropped:
        DroppedReports.objects.get_or_create(channel=channel)
        DroppedReports.objects.filter(channel=channel).update(count=F("count") + dropped)
        logger.info("Dropped %s %s delivery events for no reminder sent here", dropped, channel)
    return {"recorded": len(new), "duplicates": seen, "dropped": dropped}


def delivery_events_prune(*, clock: Clock | None = None) -> int:
    """Delete delivery events older than REMINDERS_EVENT_RETENTION_DAYS; return how many.

    ``PRUNE_BATCH`` rows a transaction, at most ``PRUNE_PER_SCAN`` in one call, as dispatches.
    """
    clock = clock or default_clock()
    cutoff = clock.now() - timedelta(days=settings.REMINDERS_EVENT_RETENTION_DAYS)
    old = DeliveryEvent.objects.filter(received_at__lt=cutoff).order_by()
    deleted = 0
    while deleted < dispatch.PRUNE_PER_SCAN:
        ids = list(old.values_list("pk", flat=True)[: dispatch.PRUNE_BATCH])
        # QuerySet.delete(): it unlinks the suppressions the events caused first.
        deleted += DeliveryEvent.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < dispatch.PRUNE_BATCH:
            break
    return deleted


def address_key(email: str) -> str:
    """Return the keyed HMAC (SECRET_KEY) an address is suppressed under, case aside, and its
    domain however it is written (punycode or not, composed or not: one mailbox on the wire)."""
    return salted_hmac(
        "reminders.suppression", _one_spelling(email), algorithm="sha256"
    ).hexdigest()


def _one_spelling(email: str) -> str:
    """Return ``email`` in lower case with its domain in Unicode as IDNA (UTS 46) maps it.

    An ASCII domain not in punycode is left as it is, so its key stays that of before.
    """
    local, at, domain = email.strip().lower().rpartition("@")
    if at and (not domain.isascii() or "xn--" in domain):
        try:
            domain = idna.decode(idna.encode(domain, uts46=True))
        except UnicodeError:  # idna.IDNAError is one: no such domain, kept as written
            pass
    return f"{local}{at}{domain}"


def _suppress_after(event: DeliveryEvent, attendee_id: int, email: str, *, now) -> None:
    """Suppress the address after a hard bounce, a complaint, or a run of soft bounces."""
    if event.kind == Kind.COMPLAINED:
        cause = Suppression.Cause.COMPLAINED
    elif event.kind == Kind.BOUNCED and (
        event.bounce == Bounce.HARD
        or _soft_bounces_in_a_row(attendee_id, email) >= settings.REMINDERS_SOFT_BOUNCES_TO_SUPPRESS
    ):
        cause = Suppression.Cause.BOUNCED
    else:
        return
    try:
        with transaction.atomic():
            Suppression.objects.create(
                address_key=address_key(email),
                address=email,
                cause=cause,
                caused_at=event.occurred_at,
                # Its row: a bulk insert that skips conflicts returns no ids.
                event=DeliveryEvent.objects.filter(
                    channel=event.channel, event_id=event.event_id
                ).first(),
                created_at=now,
            )
    except IntegrityError:
        pass  # suppressed already: the first cause stays
    else:
        logger.warning("Suppressed an address after a %s report (event %s)", cause, event.event_id)


def _soft_bounces_in_a_row(attendee_id: int, email: str) -> int:
    """Count the latest soft bounces of the attendee's messages to ``email`` since the last one
    delivered there, and since staff last lifted the address's suppression."""
    key = address_key(email)
    reports = DeliveryEvent.objects.filter(
        reminder__attendee_id=attendee_id, address_key=key
    ).order_by("-occurred_at", "-id")
    lifted = Suppression.objects.filter(address_key=key).aggregate(Max("lifted_at"))[
        "lifted_at__max"
    ]
    if lifted is not None:
        reports = reports.filter(received_at__gt=lifted)
    count = 0
    for kind, bounce in reports.values_list("kind", "bounce")[:100]:
        if kind == Kind.DELIVERED or (kind == Kind.BOUNCED and bounce == Bounce.HARD):
            break
        if kind == Kind.BOUNCED:
            count += 1
    return count


def suppressions_refusing(rows) -> dict[int, str]:
    """Return why no call is made, for each of ``rows`` whose address is suppressed now."""
    # By row: two spellings of one address share its key.
    keys = {row.pk: address_key(row.attendee.email) for row in rows}
    live = Suppression.objects.filter(
        address_key__in=set(keys.values()), lifted_at__isnull=True
    ).order_by()
    by_key = {
        row.address_key: row.refusal for row in live.only("address_key", "cause", "caused_at")
    }
    return {pk: by_key[key] for pk, key in keys.items() if key in by_key}


def suppression_addresses(ids: list[int]) -> dict[int, tuple[str, str]]:
    """Return each reminder's address and its ``address_key``, by id: one statement a batch.

    Each chunk's claim then reads their suppressions in its own statement (services.claim).
    """
    rows = Reminder.objects.filter(pk__in=ids).order_by().values_list("pk", "attendee__email")
    return {pk: (email, address_key(email)) for pk, email in rows}


# django-anymail's normalized event types this project keeps, as (kind, bounce).
_ANYMAIL_KINDS = {
    "delivered": (Kind.DELIVERED, ""),
    "deferred": (Kind.DEFERRED, ""),
    "bounced": (Kind.BOUNCED, Bounce.HARD),
    # Refused by the provider (its suppression list, an invalid address): final as a hard bounce.
    "rejected": (Kind.BOUNCED, Bounce.HARD),
    "complained": (Kind.COMPLAINED, ""),
}


def anymail_report(event, esp_name: str) -> ProviderEvent | None:
    """Return the report in a django-anymail tracking event, or None when it keeps none.

    The reminder is found by the ``reminder_key`` metadata the django channel sets. Opens,
    clicks, queued, sent and "unsubscribed" are not kept (the provider then refuses later
    messages as "rejected", which suppresses). Without an event id, a digest of the payload
    makes a retried webhook one report.
    """
    kind, bounce = _ANYMAIL_KINDS.get(event.event_type, (None, ""))
    key = (event.metadata or {}).get("reminder_key")
    if kind is None or not isinstance(key, str) or not key or not _storable(key):
        return None  # a key no message has (nothing unstorable is one)
    if kind == Kind.BOUNCED and (event.esp_event or {}).get("Type") == "SoftBounce":
        bounce = Bounce.SOFT  # Postmark says soft where anymail says bounced
    event_id = event.event_id
    if event_id and not _storable(event_id):
        event_id = hashlib.sha256(event_id.encode("utf-8", "surrogatepass")).hexdigest()
    event_id = (
        event_id
        or hashlib.sha256(
            json.dumps(event.esp_event, sort_keys=True, default=str).encode()
        ).hexdigest()
    )
    reason = " ".join(filter(None, (event.description, event.mta_response)))
    return ProviderEvent(
        event_id=f"{esp_name.lower()}:{event_id}"[:MAX_EVENT_ID],
        key=key,
        kind=kind,
        bounce=bounce,
        occurred_at=event.timestamp or default_clock().now(),
        reason=reason[:MAX_REASON],
    )

"""What providers report after they accepted a reminder: delivered, deferred, bounced, complained."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from clock import Clock, default_clock
from delivery.redact import redact_text
from reminders.models import DeliveryEvent, Reminder

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


def parse_events(document: object) -> list[ProviderEvent]:
    """Return the events of ``{"events": [...]}``, or raise MalformedEvents naming each fault.

    All or nothing: one bad item refuses the document, so a provider fixes and
    resends it whole.
    """
    if not isinstance(document, dict) or not isinstance(document.get("events"), list):
        raise MalformedEvents(['the body must be an object {"events": [...]}'])
    items = document["events"]
    if not 1 <= len(items) <= MAX_EVENTS:
        raise MalformedEvents([f"send 1 to {MAX_EVENTS} events per request, not {len(items)}"])
    events, problems = [], []
    for index, item in enumerate(items):
        try:
            events.append(_event(item))
        except ValueError as exc:
            problems.append(f"events[{index}]: {exc}")
    if problems:
        raise MalformedEvents(problems)
    return events


def _event(item: object) -> ProviderEvent:
    if not isinstance(item, dict):
        raise ValueError("each event must be an object")
    event_id, key = item.get("id"), item.get("key")
    if not isinstance(event_id, str) or not 1 <= len(event_id) <= MAX_EVENT_ID:
        raise ValueError(f"id must be a string of 1 to {MAX_EVENT_ID} characters")
    if not isinstance(key, str) or not 1 <= len(key) <= 64:
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
        occurred_at = datetime.fromisoformat(at) if isinstance(at, str) else None
    except ValueError:
        occurred_at = None
    if occurred_at is None or occurred_at.utcoffset() is None:
        raise ValueError('at must be an RFC 3339 time with its offset, e.g. "2026-03-02T09:00:00Z"')
    reason = item.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ValueError(f"reason must be text of at most {MAX_REASON} characters")
    return ProviderEvent(event_id, key, kind, bounce or "", occurred_at, reason)


def delivery_events_record(
    *, channel: str, events: list[ProviderEvent], clock: Clock | None = None
) -> dict[str, int]:
    """Store each event once; return how many were recorded, seen before, or dropped.

    An event is dropped, and nothing of it stored, when its key names no
    reminder this system sent (or may have sent), or one whose attendee was
    erased. A provider retrying a webhook records nothing new: the unique
    (channel, event id) holds that, whoever races.
    """
    clock = clock or default_clock()
    sent = Reminder.objects.filter(
        key__in={event.key for event in events},
        status__in=[Reminder.Status.SENT, Reminder.Status.UNKNOWN],
        attendee__erased_at__isnull=True,
    )
    reminder_of = dict(sent.values_list("key", "pk"))
    known = set(
        DeliveryEvent.objects.filter(
            channel=channel, event_id__in=[event.event_id for event in events]
        ).values_list("event_id", flat=True)
    )
    now = clock.now()
    new: dict[str, DeliveryEvent] = {}
    dropped = seen = 0
    for event in events:
        if event.key not in reminder_of:
            dropped += 1
        elif event.event_id in known or event.event_id in new:
            seen += 1
        else:
            new[event.event_id] = DeliveryEvent(
                reminder_id=reminder_of[event.key],
                channel=channel,
                event_id=event.event_id,
                kind=event.kind,
                bounce=event.bounce,
                occurred_at=event.occurred_at,
                received_at=now,
                reason=redact_text(event.reason),
            )
    # A retry racing its first delivery: the constraint keeps one row.
    DeliveryEvent.objects.bulk_create(new.values(), ignore_conflicts=True)
    if dropped:
        logger.info("Dropped %s %s delivery events for no reminder sent here", dropped, channel)
    return {"recorded": len(new), "duplicates": seen, "dropped": dropped}


def delivery_events_prune(*, clock: Clock | None = None) -> int:
    """Delete delivery events older than REMINDERS_EVENT_RETENTION_DAYS; return how many."""
    clock = clock or default_clock()
    cutoff = clock.now() - timedelta(days=settings.REMINDERS_EVENT_RETENTION_DAYS)
    return DeliveryEvent.objects.filter(received_at__lt=cutoff).delete()[0]

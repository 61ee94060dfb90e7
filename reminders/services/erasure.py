"""Erase an attendee's personal data (GDPR), keeping what stops a second send.

Reminder rows stay (a ``sent`` row is the durable sent marker). A worker that claimed before
the erasure withdraws calls not yet started and scrubs what it records (``erased_among``
orders the two). The ``file`` channel's ``.eml`` files are not touched.
"""

from __future__ import annotations

import json
import logging
import re
import secrets

from django.contrib.admin.models import LogEntry
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Length, Lower

from clock import Clock, default_clock
from reminders.models import (
    DeliveryAttempt,
    DeliveryEvent,
    Notice,
    Reminder,
    StaffDecision,
    Suppression,
)
from reminders.selectors import selection_of
from reminders.services import notices
from reminders.services.feedback import address_key
from reminders.services.personal import (
    json_strings,
    personal_words,
    scrub_cut_end,
    scrub_json_text,
    scrubber,
)
from reminders.services.replay import clean_reason, skipped_as
from reminders.services.workshop_decisions import DecisionPreview, DecisionResult, cancel_effects
from workshops.models import Attendee, Enrollment
from workshops.services import enrollment_cancel

logger = logging.getLogger(__name__)

ERASED_NAME = "(erased)"
ERASURE_EFFECT_LABELS = {
    "enrollments": "Active enrollments that will be cancelled",
    "to_cancel": "Reminders that will be cancelled",
    "in_flight": "Messages being sent to them right now (one already at the provider may still "
    "reach the old address; no new call starts)",
    "sent": "Reminders already sent (kept, so never sent again)",
}


def attendee_erase_preview(*, attendees: QuerySet[Attendee]) -> DecisionPreview:
    """Count the attendees an erasure would change, their active enrollments and reminders."""
    selection = selection_of(attendees)
    eligible = selection.filter(erased_at__isnull=True).values("pk")
    total, count = selection.count(), eligible.count()
    effects = cancel_effects(Reminder.objects.filter(attendee__in=eligible))
    # Change notices on their way too: the claim watch withdraws those not yet called.
    effects["in_flight"] += Notice.objects.filter(
        attendee__in=eligible, status=Notice.Status.SENDING
    ).count()
    effects["enrollments"] = Enrollment.objects.filter(
        attendee__in=eligible, status=Enrollment.Status.ACTIVE
    ).count()
    skipped = skipped_as("already_erased", total, count)
    return DecisionPreview(StaffDecision.Action.ERASE, total, count, skipped, effects)


def attendees_erase(
    *,
    attendees: QuerySet[Attendee],
    reason: str,
    actor: AbstractBaseUser,
    clock: Clock | None = None,
) -> DecisionResult:
    """Erase the personal data of every selected attendee not erased yet; return what changed."""
    reason = clean_reason(reason)
    clock = clock or default_clock()
    now = clock.now()
    with transaction.atomic(durable=True):
        selection = selection_of(attendees)
        selected = selection.count()
        targets = list(selection.filter(erased_at__isnull=True).order_by("pk").select_for_update())
        skipped = skipped_as("already_erased", selected, len(targets))
        # Recorded first, so each erasure scrubs its reason too ("Ada asked by email").
        audit = StaffDecision.record(
            action=StaffDecision.Action.ERASE,
            actor=actor,
            created_at=now,
            reason=reason,
            selected=selected,
            changed=len(targets),
            skipped=skipped,
            attendee_ids=[a.pk for a in targets],
        )
        cancelled: list[int] = []
        for attendee in targets:
            cancelled += _erase_one(attendee, now=now, clock=clock)
        StaffDecision.objects.filter(pk=audit.pk).update(reminder_ids=sorted(cancelled))
    logger.info(
        "Personal data of %s attendee(s) erased by %s (ids %s)",
        len(targets),
        audit.actor_name,
        [a.pk for a in targets],
    )
    return DecisionResult(audit.action, selected, len(targets), len(cancelled), skipped, audit.pk)


def _erase_one(attendee: Attendee, *, now, clock: Clock) -> list[int]:
    """Erase one locked attendee; return the ids of the reminders it cancelled."""
    enrollments = list(Enrollment.objects.filter(attendee=attendee).values_list("pk", flat=True))
    identities = _identities(attendee, enrollments)
    words = _words_of(identities)
    anyone = _words_of(identities, short_names=False)
    about, longer = scrubber(words), scrubber(anyone)
    addresses = [address.lower() for address in _words_of((email, "") for email, _ in identities)]

    def scrub(text: str) -> str:
        """Return ``text`` without the attendee's address and longer name parts; without every
        form of them if it quotes the address (texts about them use ``about``)."""
        quotes_email = any(address in text.lower() for address in addresses)
        return about(text) if quotes_email else longer(text)

    open_before = set(
        Reminder.objects.filter(attendee=attendee, status__in=Reminder.OPEN_STATUSES).values_list(
            "pk", flat=True
        )
    )
    for enrollment in Enrollment.objects.filter(attendee=attendee, status=Enrollment.Status.ACTIVE):
        enrollment_cancel(enrollment=enrollment, clock=clock)
    mine = Reminder.objects.filter(attendee=attendee)
    _scrub_rows(mine, words, about, "last_error", "status_reason")
    mine.exclude(sent_to="").update(sent_to="")
    Notice.objects.filter(attendee=attendee).exclude(sent_to="").update(sent_to="")
    # Their notices: none is sent any more (the address is gone), none quotes them.
    Notice.objects.filter(attendee=attendee, status=Notice.Status.PENDING).update(
        status=Notice.Status.SILENCED, status_reason=notices.ERASED, updated_at=now
    )
    _scrub_rows(
        Notice.objects.filter(attendee=attendee), words, about, "last_error", "status_reason"
    )
    _scrub_rows(
        DeliveryAttempt.objects.filter(reminder__in=mine.values("pk")), words, about, "error"
    )
    # A suppressed address stays suppressed under its key, without the address.
    Suppression.objects.filter(
        address_key__in=[address_key(email) for email, _ in identities if email]
    ).update(address="")
    # A provider's bounce reason quotes the address it bounced.
    _scrub_rows(
        DeliveryEvent.objects.filter(reminder__in=mine.values("pk")), words, about, "reason"
    )
    # A resolution copies its reason into each of its reminders, other attendees' too.
    noted = StaffDecision.objects.filter(_quoting(anyone, "reason")).values_list(
        "reminder_ids", flat=True
    )
    _scrub_rows(
        Reminder.objects.filter(pk__in=[pk for ids in noted for pk in ids]),
        anyone,
        scrub,
        "status_reason",
    )
    _scrub_rows(StaffDecision.objects.all(), anyone, scrub, "reason", "outcome")
    _scrub_admin_log(
        scrub,
        about,
        anyone,
        {
            Attendee: [attendee.pk],
            Enrollment: enrollments,
            Reminder: list(mine.values_list("pk", flat=True)),
        },
    )
    # An address nobody can guess and so create first (the admin refuses .invalid).
    email = f"erased-{secrets.token_hex(12)}@erased.invalid"
    Attendee.objects.filter(pk=attendee.pk).update(
        name=ERASED_NAME, email=email, timezone="", erased_at=now
    )
    return sorted(
        Reminder.objects.filter(pk__in=open_before, status=Reminder.Status.CANCELLED).values_list(
            "pk", flat=True
        )
    )


def _identities(attendee: Attendee, enrollments: list[int]) -> list[tuple[str, str]]:
    """Return each (email, name) the attendee had, now and before a correction, as far as her
    messages and the admin's history show: the addresses her reminders and notices went to,
    her attendee's and enrollments' reprs ("Ada <ada@…> in Pottery"), and the names beside
    one of her addresses in any entry (a workshop's inline). An address
    another attendee holds now is theirs, not hers. Email or name may be empty."""
    types = ContentType.objects.get_for_models(Attendee, Enrollment)
    tied = Q(content_type=types[Attendee], object_id=str(attendee.pk)) | Q(
        content_type=types[Enrollment], object_id__in=[str(pk) for pk in enrollments]
    )
    found = [(attendee.email, attendee.name)]
    # The addresses her messages went to.
    for model in (Reminder, Notice):
        sent_to = model.objects.filter(attendee=attendee).exclude(sent_to="")
        found += [(email, "") for email in sent_to.values_list("sent_to", flat=True).distinct()]
    for text in LogEntry.objects.filter(tied).values_list("object_repr", flat=True):
        if shown := _SHOWN_AS.match(text):
            found.append((shown["email"], shown["name"]))
    others = set(
        Attendee.objects.annotate(key=Lower("email"))
        .filter(key__in={email.lower() for email, _ in found})
        .exclude(pk=attendee.pk)
        .values_list("key", flat=True)
    )
    found = [(email, name) for email, name in found if email.lower() not in others]
    hers = {email.lower() for email, _ in found}
    escaped = {json.dumps(email)[1:-1] for email in hers}
    quoting = _quoting(hers, "object_repr") | _quoting(hers | escaped, "change_message")
    for entry in LogEntry.objects.filter(quoting):
        for text in [entry.object_repr, *json_strings(entry.change_message)]:
            if (shown := _SHOWN_AS.match(text)) and shown["email"].lower() in hers:
                found.append(("", shown["name"]))
    return list(dict.fromkeys(found))


# The start of Attendee.__str__, and so of Enrollment.__str__: "name <email>".
_SHOWN_AS = re.compile(r"(?P<name>.*?) <(?P<email>[^<>\s]+@[^<>\s]+)>")


def _words_of(identities, *, short_names: bool = True) -> list[str]:
    """Return ``personal_words`` of each (email, name) in ``identities``, once each."""
    words = []
    for email, name in identities:
        words += personal_words(email=email, name=name, short_names=short_names)
    return list(dict.fromkeys(words))


def _scrub_admin_log(scrub, about, words: list[str], objects: dict[type, list[int]]) -> None:
    """Scrub admin log entries on the attendee, their enrollments and reminders, and any other
    quoting them (an inline "added enrollment 'Zoë <zoe@…>'"), JSON-escaped forms included."""
    types = ContentType.objects.get_for_models(*objects)
    on_them = Q()
    for model, ids in objects.items():
        on_them |= Q(content_type=types[model], object_id__in=[str(pk) for pk in ids])
    escaped = [json.dumps(word)[1:-1] for word in words]
    quoting = (
        _quoting(words, "object_repr")
        | _quoting(words, "change_message")
        | _quoting(escaped, "change_message")
    )
    tied = set(LogEntry.objects.filter(on_them).values_list("pk", flat=True))
    for entry in LogEntry.objects.filter(on_them | quoting):
        this = about if entry.pk in tied else scrub
        LogEntry.objects.filter(pk=entry.pk).update(
            object_repr=this(entry.object_repr)[:200],
            change_message=scrub_json_text(entry.change_message, this),
        )


def _scrub_rows(rows: QuerySet, words: list[str], scrub, *fields: str) -> None:
    """Scrub ``fields`` of each of ``rows`` quoting one of ``words``, cut to the field's length;
    a text as long as its field was cut there when written, perhaps inside one of them."""
    model = rows.model
    limits = {name: model._meta.get_field(name).max_length for name in fields}
    quoting = Q()
    for name, limit in limits.items():
        quoting |= _quoting(words, name)
        if limit:
            rows = rows.alias(**{f"{name}_length": Length(name)})
            quoting |= Q(**{f"{name}_length__gte": limit})

    def scrubbed(text: str, limit: int | None) -> str:
        if limit and len(text) >= limit:
            text = scrub_cut_end(text, words)
        return scrub(text)[:limit]

    for row in rows.filter(quoting):
        model.objects.filter(pk=row.pk).update(
            **{name: scrubbed(getattr(row, name), limit) for name, limit in limits.items()}
        )


def _quoting(words: list[str], field: str) -> Q:
    query = Q()
    for word in words:
        query |= Q(**{f"{field}__icontains": word})
    return query

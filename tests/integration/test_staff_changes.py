"""Staff cancel or move a workshop while its reminders are claimed and being sent.

Real PostgreSQL, a real HTTP provider on loopback, the system clock, and the
batch running in its own thread while the test commits the change: the
reminders still waiting in the rate limiter must not be sent more than
``REVOCATION_WINDOW`` (1 s) after the change commits (judged at the sink, with
``ARRIVAL_SLACK`` for the way there), and the rows end with the status the
workshop now calls for.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connections

from clock import SystemClock
from loopback.http_sink import HttpSink
from reminders.models import DeliveryAttempt, Reminder
from reminders.policy import ReminderPolicy
from reminders.services.watch import REVOCATION_WINDOW
from reminders.worker import pipeline
from workshops.services import enrollment_cancel, workshop_cancel, workshop_update

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

_real = SystemClock()
# A call started inside the window reaches the sink a little later (loopback latency,
# thread hand-over, a loaded machine): arrivals are judged against the window plus this.
ARRIVAL_SLACK = 0.25


@pytest.fixture
def provider(settings):
    with HttpSink(clock=_real) as sink:
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL = sink.url
        settings.REMINDERS_HTTP_SECRET = "s3cret"
        settings.REMINDERS_CONCURRENCY = 40  # one claim holds all 40: they wait in the limiter
        settings.REMINDERS_RATE_LIMIT = 10
        yield sink


def _run_batch(ids: list[int]) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["counts"] = pipeline.deliver(ids, clock=_real, channel="http")
        except BaseException as exc:  # collected: a thread's exception is otherwise lost
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def _wait_for_requests(sink: HttpSink, count: int) -> None:
    give_up = _real.monotonic() + 20
    while len(sink.requests) < count:
        assert _real.monotonic() < give_up, "the batch did not start sending"
        _real.sleep_blocking(0.01)


def test_cancel_while_sending_stops_new_calls_within_the_window(
    live_clock, provider, make_workshop, enrol
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=40)
    ids = list(Reminder.objects.values_list("id", flat=True))
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 10)
    workshop_cancel(workshop=workshop)
    committed = _real.monotonic()
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    late = [
        t - committed
        for t in provider.arrivals()
        if t > committed + REVOCATION_WINDOW + ARRIVAL_SLACK
    ]
    assert late == [], f"calls started after the window: {late}"
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    print(f"\ncancel while sending: {dict(statuses)}, {len(provider.requests)} requests")
    assert set(statuses) == {"sent", "cancelled"}
    assert statuses["sent"] == len(provider.requests) < 40
    withdrawn = DeliveryAttempt.objects.filter(outcome="withdrawn").count()
    assert withdrawn == statuses["cancelled"]


def test_enrollment_cancelled_while_sending_is_not_sent(live_clock, provider, make_workshop, enrol):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrollments = enrol(workshop, count=40)
    ids = list(Reminder.objects.order_by("workshop__starts_at", "id").values_list("id", flat=True))
    last = Reminder.objects.get(pk=ids[-1]).enrollment
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 5)
    enrollment_cancel(enrollment=last)
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    row = Reminder.objects.get(pk=ids[-1])
    assert row.status == "cancelled"
    assert provider.requests_for(row.key) == []
    assert Reminder.objects.filter(status="sent").count() == len(enrollments) - 1


def test_move_while_sending_sends_no_message_with_the_old_time(
    live_clock, provider, make_workshop, enrol
):
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=40)
    old_start = workshop.starts_at
    ids = list(Reminder.objects.values_list("id", flat=True))
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 10)
    new_start = old_start + timedelta(hours=2)
    workshop_update(workshop=workshop, starts_at=new_start, ends_at=new_start + timedelta(hours=1))
    committed = _real.monotonic()
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    old = old_start.isoformat()
    stale = [
        r.arrived_at - committed
        for r in provider.requests
        if r.json()["payload"]["starts_at"] == old
        and r.arrived_at > committed + REVOCATION_WINDOW + ARRIVAL_SLACK
    ]
    assert stale == [], f"messages with the old start after the window: {stale}"
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    assert set(statuses) == {"sent", "pending"}
    policy = ReminderPolicy.from_settings()
    pending = Reminder.objects.filter(status="pending")
    assert {r.deadline_at for r in pending} == {policy.deadline_at(new_start)}
    # Sent again at the next scan, with the new time.
    thread, outcome = _run_batch(list(pending.values_list("id", flat=True)))
    thread.join(60)
    assert Reminder.objects.filter(status="sent").count() == 40
    assert {
        r.json()["payload"]["starts_at"] for r in provider.requests[-statuses["pending"] :]
    } == {new_start.isoformat()}


def test_a_move_inside_the_cutoff_while_sending_starts_no_call_after_the_window(
    live_clock, provider, make_workshop, enrol
):
    """Moved so that its new deadline has already passed at the commit: the calls still
    waiting in the limiter are withdrawn within the window and end ``missed`` under the
    new deadline; a call that starts inside the window starts after that deadline (the
    window's known cost, counted here)."""
    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=40)
    ids = list(Reminder.objects.values_list("id", flat=True))
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 10)
    new_start = _real.now() + timedelta(minutes=20)  # the 30-minute cutoff is behind it
    workshop_update(workshop=workshop, starts_at=new_start, ends_at=new_start + timedelta(hours=1))
    committed = _real.monotonic()
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    arrivals = provider.arrivals()
    late = [t - committed for t in arrivals if t > committed + REVOCATION_WINDOW + ARRIVAL_SLACK]
    assert late == [], f"calls started after the window: {late}"
    inside = [round(t - committed, 3) for t in arrivals if t > committed]
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    print(f"\nmoved inside the cutoff: {dict(statuses)}, {len(inside)} calls inside the window")
    assert set(statuses) == {"sent", "missed"}
    assert statuses["sent"] == len(provider.requests) < 40
    deadline = ReminderPolicy.from_settings().deadline_at(new_start)
    missed = Reminder.objects.filter(status="missed")
    assert {r.deadline_at for r in missed} == {deadline}
    assert DeliveryAttempt.objects.filter(outcome="withdrawn").count() == statuses["missed"]


def test_a_workshop_cancelled_then_reinstated_mid_batch_sends_each_reminder_once(
    live_clock, provider, make_workshop, enrol
):
    """Staff cancel a workshop while its 40 claimed reminders wait in the limiter, then
    reinstate it. The reminders the watch withdrew go back to ``pending`` with the current
    deadline (the workshop is scheduled again), not ``cancelled``; the next run sends them,
    and the provider receives every key once."""
    from workshops.services import workshop_reinstate

    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=40)
    ids = list(Reminder.objects.values_list("id", flat=True))
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 5)
    workshop_cancel(workshop=workshop)
    # Long enough for the claim watch to see the cancel and withdraw the rest.
    _real.sleep_blocking(REVOCATION_WINDOW)
    workshop_reinstate(workshop=workshop)
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    statuses = Counter(Reminder.objects.values_list("status", flat=True))
    print(f"\ncancel then reinstate while sending: {dict(statuses)}")
    assert set(statuses) == {"sent", "pending"}, statuses
    assert statuses["sent"] == len(provider.requests)
    policy = ReminderPolicy.from_settings()
    pending = Reminder.objects.filter(status="pending")
    assert {r.deadline_at for r in pending} == {policy.deadline_at(workshop.starts_at)}
    # Withdrawn before any call: the attempt is refunded, so none counts twice.
    assert {r.attempts for r in pending} == {0}
    thread, outcome = _run_batch(list(pending.values_list("id", flat=True)))
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"sent": 40}
    assert Counter(r.headers["idempotency-key"] for r in provider.requests) == Counter(
        Reminder.objects.values_list("key", flat=True)
    ), "a key reached the provider twice, or not at all"


def test_an_attendee_erased_while_waiting_in_the_limiter_is_never_sent_to(
    live_clock, provider, make_workshop, enrol, django_user_model
):
    """Staff erase an attendee whose reminder is claimed and waiting in the limiter: the
    claim loaded the old address, but no request carrying it starts after the window; the
    row ends ``cancelled`` and no text quotes the address."""
    from reminders.services.erasure import attendees_erase
    from workshops.models import Attendee

    workshop = make_workshop(starts_in=timedelta(hours=3))
    enrol(workshop, count=40)
    ids = list(Reminder.objects.order_by("workshop__starts_at", "id").values_list("id", flat=True))
    last = Reminder.objects.select_related("attendee").get(pk=ids[-1])
    email, name = last.attendee.email, last.attendee.name
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 5)
    attendees_erase(
        attendees=Attendee.objects.filter(pk=last.attendee_id),
        reason="request",
        actor=django_user_model.objects.create_user("eraser"),
    )
    committed = _real.monotonic()
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    late = [
        r.arrived_at - committed
        for r in provider.requests
        if r.json()["recipient"]["email"] == email
        and r.arrived_at > committed + REVOCATION_WINDOW + ARRIVAL_SLACK
    ]
    assert late == [], f"requests to the erased address after the window: {late}"
    row = Reminder.objects.get(pk=last.pk)
    assert row.status == "cancelled", row.status
    assert provider.requests_for(row.key) == []
    texts = " ".join(
        [row.last_error, row.status_reason]
        + list(DeliveryAttempt.objects.filter(reminder=row).values_list("error", flat=True))
    )
    assert email not in texts and name not in texts, texts
    assert Reminder.objects.filter(status="sent").count() == 39


def test_a_text_edited_while_the_batch_waits_in_the_limiter_changes_none_of_its_messages(
    live_clock, provider, make_workshop, enrol
):
    """The claim froze the text: an edit mid-batch withdraws nothing and sends no new words."""
    workshop = make_workshop(
        starts_in=timedelta(hours=3), reminder_subject="Kiln: {workshop_title}",
        reminder_intro="Bring an apron, {attendee_name}.",
    )  # fmt: skip
    enrol(workshop, count=40)
    ids = list(Reminder.objects.values_list("id", flat=True))
    thread, outcome = _run_batch(ids)
    _wait_for_requests(provider, 10)
    workshop_update(workshop=workshop, reminder_subject="Edited", reminder_intro="Edited words.")
    thread.join(60)
    assert "error" not in outcome, outcome.get("error")
    bodies = [r.json() for r in provider.requests]
    assert len(bodies) == 40 and outcome["counts"]["sent"] == 40
    assert {body["subject"] for body in bodies} == {f"Kiln: {workshop.title}"}
    assert all(body["text_body"].startswith("Bring an apron, ") for body in bodies)
    assert DeliveryAttempt.objects.filter(outcome="withdrawn").count() == 0

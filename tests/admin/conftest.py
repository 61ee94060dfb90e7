"""Fixtures for the staff surface: users with and without the staff permissions,
reminders in every status made through the services, and a recorder of publishes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from delivery.results import DeliveryResult, Outcome
from reminders.models import Reminder
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_dispatch
from workshops.models import Attendee, Enrollment
from workshops.services import enrollment_cancel, workshop_update

PERMANENT_ERROR = "550 5.1.1 mailbox unavailable"


@pytest.fixture(autouse=True)
def plain_static_files(settings):
    """Serve admin assets without collectstatic's manifest (DEBUG is off in the tests)."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture
def published(monkeypatch):
    """Record the batches published to the broker instead of sending them."""
    sent: list[list[int]] = []

    def fake_publish(ids):
        sent.append(list(ids))
        return True

    monkeypatch.setattr("reminders.queue.publish_batch", fake_publish)
    return sent


def post_action(client, changelist, action, ids, *, confirm=False, reason=None):
    """Post a changelist action for ``ids``: its confirmation page, or with ``confirm`` the
    confirmed decision (followed to the changelist's message)."""
    data = {"action": action, "_selected_action": [str(i) for i in ids], "select_across": "0"}
    if confirm:
        data["post"] = "yes"
        if reason is not None:
            data["reason"] = reason
    else:
        data["index"] = "0"
    return client.post(changelist, data, follow=confirm)


@pytest.fixture
def make_staff(django_user_model):
    """Create a staff user holding exactly ``perms`` ("app_label.codename")."""
    counter = iter(range(1, 1_000_000))

    def make(*perms: str, username: str | None = None):
        user = django_user_model.objects.create_user(
            username=username or f"staff{next(counter)}", password="pw-for-tests", is_staff=True
        )
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
        return user

    return make


VIEW = ("reminders.view_reminder", "workshops.view_workshop", "workshops.change_workshop")


@pytest.fixture
def replayer(make_staff):
    return make_staff(*VIEW, "reminders.replay_reminder", username="replayer")


@pytest.fixture
def viewer(make_staff):
    """Staff who may see and change workshops and see reminders, but not replay or resolve."""
    return make_staff(*VIEW, username="viewer")


@pytest.fixture
def resolver(make_staff):
    return make_staff(*VIEW, "reminders.resolve_unknown_reminder", username="resolver")


@pytest.fixture
def login():
    def make(user, *, enforce_csrf_checks: bool = False) -> Client:
        client = Client(enforce_csrf_checks=enforce_csrf_checks)
        client.force_login(user)
        return client

    return make


def result_for(reminder: Reminder, outcome: Outcome, **fields) -> DeliveryResult:
    values = {
        "reminder_id": reminder.pk,
        "key": reminder.key,
        "outcome": outcome,
        "message_id": "<msg@example.com>" if outcome == Outcome.SENT else None,
        "error": "" if outcome == Outcome.SENT else PERMANENT_ERROR,
        "attempts": 1,
        "provider_reached": True,
        "maybe_delivered": outcome in (Outcome.SENT, Outcome.TIMED_OUT),
    }
    values.update(fields)
    return DeliveryResult(**values)


def move_later(reminder_id: int, by: timedelta) -> None:
    """Move the workshop of ``reminder_id`` later by ``by``, through the service staff use."""
    workshop = Reminder.objects.get(pk=reminder_id).workshop
    workshop_update(
        workshop=workshop, starts_at=workshop.starts_at + by, ends_at=workshop.ends_at + by
    )


def settle(ids: list[int], outcome: Outcome, *, clock, channel: str = "smtp") -> None:
    """Claim ``ids`` and record ``outcome`` for each, as a worker would."""
    claim = reminder_claim_batch(ids=ids, channel=channel, worker="test", clock=clock)
    assert sorted(claim.ids) == sorted(ids), "the reminders were not claimable"
    results = [result_for(reminder, outcome) for reminder in claim.reminders]
    reminder_record_batch(claim=claim, results=results, clock=clock)


@pytest.fixture
def make_reminders(clock, make_workshop, enrol):
    """Create ``count`` reminders of one workshop and bring them to ``status``; return their ids.

    Through the services (claim and record a delivery result, dispatch,
    cancel an enrollment), except ``missed`` before the deadline, which the
    pipeline only produces through retry timing; that one is a guarded update.
    """

    def make(count: int, status: str = "failed", *, workshop=None, starts_in=timedelta(hours=3)):
        workshop = workshop or make_workshop(starts_in=starts_in)
        enrollments = enrol(workshop, count)
        ids = list(
            Reminder.objects.filter(enrollment__in=enrollments)
            .order_by("id")
            .values_list("id", flat=True)
        )
        assert len(ids) == count
        if status == "failed":
            settle(ids, Outcome.PERMANENT, clock=clock)
        elif status == "sent":
            settle(ids, Outcome.SENT, clock=clock)
        elif status == "unknown":
            settle(ids, Outcome.TIMED_OUT, clock=clock)
        elif status == "sending":
            reminder_claim_batch(ids=ids, channel="smtp", clock=clock)
        elif status == "queued":
            reminders_dispatch(ids=ids, clock=clock, publish=lambda ids: True)
        elif status == "cancelled":
            for enrollment in enrollments:
                enrollment_cancel(enrollment=enrollment)
        elif status == "missed":
            Reminder.objects.filter(pk__in=ids, status="pending").update(
                status="missed", status_reason="deadline passed while retrying: 451 try later"
            )
        else:
            assert status == "pending", f"make_reminders cannot make {status!r}"
        assert set(Reminder.objects.filter(pk__in=ids).values_list("status", flat=True)) == {status}
        return ids

    return make


@pytest.fixture
def bulk_failed(clock, make_workshop):
    """Create ``count`` failed reminders of one new workshop in a handful of statements."""
    from reminders.services import reminders_plan

    counter = iter(range(1_000_000))

    def make(count: int):
        batch = next(counter)
        workshop = make_workshop(starts_in=timedelta(hours=3))
        attendees = Attendee.objects.bulk_create(
            Attendee(name=f"Bulk {batch}-{i}", email=f"bulk{batch}-{i}@example.com")
            for i in range(count)
        )
        Enrollment.objects.bulk_create(Enrollment(attendee=a, workshop=workshop) for a in attendees)
        reminders_plan(clock=clock)
        reminders = Reminder.objects.filter(workshop=workshop)
        assert reminders.count() == count
        # What reminder_record_batch writes for a permanent failure, set-based.
        reminders.update(
            status="failed",
            attempts=1,
            channel="smtp",
            last_error=PERMANENT_ERROR,
            status_reason=PERMANENT_ERROR,
        )
        return workshop

    return make


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]] if response.context else []


@pytest.fixture(autouse=True)
def fake_clock(clock):
    """Install the FakeClock for every test here: forms and services read the process clock."""
    return clock

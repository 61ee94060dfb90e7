"""Replay and the resolution of unknown outcomes (reminders.services.replay): the guarded UPDATE decides.

Every test counts what was published to the broker: a replay queues each
eligible reminder once, after commit, and never a sent one (FAULTS D3, D4, S3).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from delivery.results import Outcome
from reminders import queue
from reminders.models import DeliveryAttempt, Reminder, StaffDecision
from reminders.selectors import reminder_replay_preview
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_dispatch
from reminders.services.replay import reminder_replay, reminder_resolve_unknown
from tests.admin.conftest import PERMANENT_ERROR, move_later, result_for, settle
from tests.support.races import after, race
from workshops.services import workshop_cancel

pytestmark = pytest.mark.django_db


def _all(ids):
    return Reminder.objects.filter(pk__in=ids)


def _statuses(ids) -> Counter:
    return Counter(_all(ids).values_list("status", flat=True))


def test_replay_rearms_failed_reminders_and_publishes_them_after_commit(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    ids = make_reminders(3, "failed")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        result = reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
        assert published == [], "published before commit"
    for callback in callbacks:
        callback()
    assert (result.selected, result.changed, result.queued, result.skipped) == (3, 3, 3, {})
    assert sorted(i for batch in published for i in batch) == sorted(ids)
    rows = list(_all(ids))
    assert {r.status for r in rows} == {"queued"}
    assert {r.status_reason for r in rows} == {"replayed by replayer"}
    assert {r.last_error for r in rows} == {PERMANENT_ERROR}  # history kept
    assert {r.next_attempt_at for r in rows} == {None}


def test_replay_leaves_every_other_status_alone_and_says_why(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    failed = make_reminders(2, "failed")
    missed_on_time = make_reminders(1, "missed")
    sent = make_reminders(2, "sent")
    unknown = make_reminders(1, "unknown")
    cancelled = make_reminders(1, "cancelled")
    queued = make_reminders(1, "queued")
    sending = make_reminders(1, "sending")
    pending = make_reminders(1, "pending")
    everything = failed + missed_on_time + sent + unknown + cancelled + queued + sending + pending
    sent_before = list(_all(sent).values("status", "sent_at", "provider_message_id", "attempts"))
    with django_capture_on_commit_callbacks(execute=True):
        result = reminder_replay(reminders=_all(everything), actor=replayer, clock=clock)
    assert (result.selected, result.changed, result.queued) == (10, 3, 3)
    assert result.skipped == {"sent": 2, "unknown": 1, "cancelled": 1, "in_progress": 3}
    assert sorted(i for batch in published for i in batch) == sorted(failed + missed_on_time)
    assert list(_all(sent).values("status", "sent_at", "provider_message_id", "attempts")) == (
        sent_before
    )
    assert _statuses(unknown + cancelled + sending) == {"unknown": 1, "cancelled": 1, "sending": 1}


def test_missed_and_failed_reminders_past_the_deadline_are_not_replayed(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    failed = make_reminders(1, "failed", starts_in=timedelta(hours=1))
    missed = make_reminders(1, "missed", starts_in=timedelta(hours=1))
    clock.advance(31 * 60)  # past both deadlines (start minus 30 minutes)
    with django_capture_on_commit_callbacks(execute=True):
        result = reminder_replay(reminders=_all(failed + missed), actor=replayer, clock=clock)
    assert (result.changed, result.skipped) == (0, {"past_cutoff": 2})
    assert published == []
    assert _statuses(failed + missed) == {"failed": 1, "missed": 1}


def test_failed_reminder_of_a_cancelled_workshop_counts_as_cancelled(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    ids = make_reminders(2, "failed")
    workshop_cancel(workshop=Reminder.objects.get(pk=ids[0]).workshop)
    with django_capture_on_commit_callbacks(execute=True):
        result = reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
    assert (result.changed, result.skipped) == (0, {"cancelled": 2})
    assert published == []


def test_replay_before_the_window_opens_rearms_without_queueing(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    """A workshop moved later: the reminder waits, pending, for the scan to queue it."""
    ids = make_reminders(1, "failed")
    move_later(ids[0], timedelta(days=3))
    with django_capture_on_commit_callbacks(execute=True):
        result = reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
    assert (result.changed, result.queued, result.waiting) == (1, 0, 1)
    assert published == []
    assert _statuses(ids) == {"pending": 1}


def test_replay_writes_one_audit_record(clock, make_reminders, published, replayer):
    failed = make_reminders(2, "failed")
    sent = make_reminders(1, "sent")
    result = reminder_replay(reminders=_all(failed + sent), actor=replayer, clock=clock)
    audit = StaffDecision.objects.get()
    assert audit.pk == result.audit_id
    assert (audit.action, audit.actor, audit.actor_name, audit.created_at) == (
        "replay",
        replayer,
        "replayer",
        clock.now(),
    )
    assert (audit.selected, audit.changed, audit.queued) == (3, 2, 2)
    assert audit.skipped == {"sent": 1}
    assert audit.reminder_ids == sorted(failed)


def test_replay_that_rolls_back_publishes_nothing_and_changes_nothing(
    clock, make_reminders, published, replayer, monkeypatch, django_capture_on_commit_callbacks
):
    """S3: the audit insert fails after the UPDATE and the dispatch; the transaction rolls back."""
    ids = make_reminders(3, "failed")

    def broken(**kwargs):
        raise RuntimeError("audit table unavailable")

    monkeypatch.setattr(StaffDecision.objects, "create", broken)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError):
            reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
    assert callbacks == []
    assert published == []
    assert _statuses(ids) == {"failed": 3}


def test_second_replay_of_the_same_reminders_queues_nothing(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    """D3, double click: the second guarded UPDATE finds nothing in failed or missed."""
    ids = make_reminders(4, "failed")
    with django_capture_on_commit_callbacks(execute=True):
        first = reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
        second = reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
    assert (first.changed, second.changed) == (4, 0)
    assert second.skipped == {"in_progress": 4}
    assert Counter(i for batch in published for i in batch) == Counter(ids)


def test_replayed_reminder_is_claimed_again_with_its_attempt_history_intact(
    clock, make_reminders, published, replayer, django_capture_on_commit_callbacks
):
    """The next claim numbers its DeliveryAttempt after the earlier ones, and can succeed."""
    ids = make_reminders(2, "failed")
    with django_capture_on_commit_callbacks(execute=True):
        reminder_replay(reminders=_all(ids), actor=replayer, clock=clock)
    settle(ids, Outcome.SENT, clock=clock)
    assert _statuses(ids) == {"sent": 2}
    numbers = list(
        DeliveryAttempt.objects.filter(reminder_id=ids[0]).values_list("number", "outcome")
    )
    assert numbers == [(1, "permanent"), (2, "sent")]


def test_preview_counts_without_changing_anything(clock, make_reminders):
    failed = make_reminders(2, "failed")
    sent = make_reminders(1, "sent")
    preview = reminder_replay_preview(reminders=_all(failed + sent + [999_999]), clock=clock)
    assert (preview.selected, preview.eligible, preview.skipped) == (3, 2, {"sent": 1})
    assert _statuses(failed + sent) == {"failed": 2, "sent": 1}


# --- Unknown outcomes -----------------------------------------------------------


def test_marking_unknown_reminders_as_sent_records_the_reason(
    clock, make_reminders, published, resolver
):
    unknown = make_reminders(2, "unknown")
    failed = make_reminders(1, "failed")
    result = reminder_resolve_unknown(
        reminders=_all(unknown + failed),
        decision="mark_sent",
        reason="provider log shows delivery",
        actor=resolver,
        clock=clock,
    )
    assert (result.changed, result.queued, result.skipped) == (2, 0, {"not_unknown": 1})
    assert published == []
    rows = list(_all(unknown))
    assert {r.status for r in rows} == {"sent"}
    assert {r.status_reason for r in rows} == {
        "marked as sent by resolver: provider log shows delivery"
    }
    audit = StaffDecision.objects.get()
    assert (audit.action, audit.reason, audit.reminder_ids) == (
        "mark_sent",
        "provider log shows delivery",
        sorted(unknown),
    )
    assert _statuses(failed) == {"failed": 1}


def test_sending_unknown_reminders_again_rearms_and_dispatches_them(
    clock, make_reminders, published, resolver, django_capture_on_commit_callbacks
):
    unknown = make_reminders(2, "unknown")
    with django_capture_on_commit_callbacks(execute=True):
        result = reminder_resolve_unknown(
            reminders=_all(unknown),
            decision="send_again",
            reason="provider has no record",
            actor=resolver,
            clock=clock,
        )
    assert (result.changed, result.queued) == (2, 2)
    assert sorted(i for batch in published for i in batch) == sorted(unknown)
    assert _statuses(unknown) == {"queued": 2}
    assert StaffDecision.objects.get().action == "send_again"


def test_unknown_reminder_past_its_deadline_cannot_be_sent_again_but_can_be_marked_sent(
    clock, make_reminders, published, resolver, django_capture_on_commit_callbacks
):
    unknown = make_reminders(1, "unknown", starts_in=timedelta(hours=1))
    clock.advance(45 * 60)
    with django_capture_on_commit_callbacks(execute=True):
        again = reminder_resolve_unknown(
            reminders=_all(unknown), decision="send_again", reason="r", actor=resolver, clock=clock
        )
    assert (again.changed, again.skipped) == (0, {"past_cutoff": 1})
    assert published == []
    marked = reminder_resolve_unknown(
        reminders=_all(unknown), decision="mark_sent", reason="r", actor=resolver, clock=clock
    )
    assert marked.changed == 1


def test_an_unknown_reminder_whose_attendee_unsubscribed_through_it_is_not_sent_again(
    clock, make_reminders, published, resolver, django_capture_on_commit_callbacks
):
    """The unsubscribe link is in the message: its attendee used it, so it reached them, and
    they asked for no more messages about the workshop. It can be marked sent."""
    from reminders.services.attendance import reminder_unsubscribe

    unknown = make_reminders(2, "unknown")
    reminder_unsubscribe(reminder=Reminder.objects.get(pk=unknown[0]), clock=clock)
    with django_capture_on_commit_callbacks(execute=True):
        again = reminder_resolve_unknown(
            reminders=_all(unknown), decision="send_again", reason="r", actor=resolver, clock=clock
        )
    assert (again.changed, again.skipped) == (1, {"unsubscribed": 1})
    assert sorted(i for batch in published for i in batch) == [unknown[1]]
    assert Reminder.objects.get(pk=unknown[0]).status == "unknown"
    marked = reminder_resolve_unknown(
        reminders=_all(unknown[:1]), decision="mark_sent", reason="r", actor=resolver, clock=clock
    )
    assert marked.changed == 1


@pytest.mark.parametrize(
    ("decision", "reason", "field"),
    [
        ("mark_sent", "   ", "reason"),
        ("mark_sent", "x" * 501, "reason"),
        ("forget", "r", "decision"),
    ],
)
def test_resolution_without_a_valid_reason_or_decision_changes_nothing(
    clock, make_reminders, resolver, decision, reason, field
):
    unknown = make_reminders(1, "unknown")
    with pytest.raises(ValidationError) as error:
        reminder_resolve_unknown(
            reminders=_all(unknown), decision=decision, reason=reason, actor=resolver, clock=clock
        )
    assert field in error.value.message_dict
    assert _statuses(unknown) == {"unknown": 1}
    assert not StaffDecision.objects.exists()


# --- Races ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_two_staff_replaying_the_same_reminders_at_once_queue_each_once(
    clock, make_reminders, published, make_staff, settings
):
    """D3: two concurrent replays of the same 60 reminders; the guarded UPDATE decides."""
    settings.REMINDERS_BATCH_SIZE = 7
    ids = make_reminders(60, "failed")
    alice, bob = make_staff(username="alice"), make_staff(username="bob")
    for _ in range(3):
        results = race(
            lambda: reminder_replay(reminders=_all(ids), actor=alice, clock=clock),
            lambda: reminder_replay(reminders=_all(ids), actor=bob, clock=clock),
        )
        per_id = Counter(i for batch in published for i in batch)
        assert sum(r.changed for r in results) == 60
        assert per_id == Counter(ids), "a reminder was published twice, or not at all"
        assert max(len(batch) for batch in published) <= 7
        print(f"\nreplay race: changed {[r.changed for r in results]}, published {len(per_id)} ids")
        # Fail them again for the next round.
        Reminder.objects.filter(pk__in=ids).update(status="failed", queued_until=None)
        published.clear()
    assert StaffDecision.objects.count() == 6


@pytest.mark.django_db(transaction=True)
def test_replay_racing_the_automatic_dispatch_queues_each_reminder_once(
    clock, make_reminders, published, replayer
):
    """D4: a replay and the scan's dispatch run together on failed and due pending reminders."""
    failed = make_reminders(40, "failed")
    pending = make_reminders(40, "pending")
    for _ in range(3):
        race(
            lambda: reminder_replay(reminders=_all(failed + pending), actor=replayer, clock=clock),
            lambda: reminders_dispatch(clock=clock, publish=queue.publish_batch),
        )
        per_id = Counter(i for batch in published for i in batch)
        assert per_id == Counter(failed + pending)
        Reminder.objects.filter(pk__in=failed).update(status="failed", queued_until=None)
        Reminder.objects.filter(pk__in=pending).update(status="pending", queued_until=None)
        published.clear()


@pytest.mark.django_db(transaction=True)
def test_replay_racing_a_worker_claim_never_resends_what_the_worker_holds(
    clock, make_reminders, published, replayer
):
    """D4: a worker claims due reminders while staff replay them; nothing claimed is re-armed."""
    pending = make_reminders(30, "pending")
    claims = race(
        lambda: reminder_claim_batch(ids=pending, channel="smtp", clock=clock),
        lambda: reminder_replay(reminders=_all(pending), actor=replayer, clock=clock),
    )
    assert len(claims[0].reminders) == 30
    assert claims[1].changed == 0
    assert published == []


def _each_once_or_left(ids, published, left: str = "failed") -> Counter:
    """Check every reminder ended re-armed and published once, or ``left`` and not published;
    return how many ended each way."""
    per_id = Counter(i for batch in published for i in batch)
    ends: Counter = Counter()
    for pk, status in _all(ids).values_list("pk", "status"):
        end = (status, per_id[pk])
        assert end in {("queued", 1), (left, 0)}, (pk, end)
        ends[end] += 1
    return ends


@pytest.mark.django_db(transaction=True)
def test_send_again_racing_the_reaper_on_the_same_rows_rearms_each_unknown_reminder_once(
    clock, make_reminders, published, resolver, settings
):
    """Item 4: the reaper makes 20 keyed rows whose lease ran out at the attempt cap
    ``unknown`` (the lost worker may have reached the provider) while staff send them
    again. A row is re-armed only after the reaper resolved it, and published once; the
    expired claim's attempt is closed either way."""
    from reminders.services import reminders_reap

    settings.REMINDERS_MAX_ATTEMPTS = 1
    ends: Counter = Counter()
    # Seconds the reaper, then the resolution, waits after the start: the first and last
    # rounds fix the order, the middle ones stagger by about a reap's duration.
    staggers = [(0, 0.3), (0, 0), (0.01, 0), (0, 0.01), (0.02, 0), (0, 0.02), (0, 0.04)]
    staggers += [(0, 0.08), (0.3, 0), (0, 0)]
    for reap_wait, resolve_wait in staggers:
        ids = make_reminders(20, "pending")
        claim = reminder_claim_batch(ids=ids, channel="http", clock=clock)
        assert len(claim.ids) == 20
        clock.advance(settings.REMINDERS_LEASE_SECONDS)
        published.clear()
        _, replay = race(
            after(reap_wait, reminders_reap, clock=clock),
            after(
                resolve_wait,
                reminder_resolve_unknown,
                reminders=_all(ids),
                decision="send_again",
                reason="the provider has no record of them",
                actor=resolver,
                clock=clock,
            ),
        )
        attempts = Counter(
            DeliveryAttempt.objects.filter(claim_token=claim.token).values_list(
                "outcome", flat=True
            )
        )
        assert attempts == {"lease_expired": 20}, attempts
        round_ends = _each_once_or_left(ids, published, left="unknown")
        assert replay.changed == round_ends[("queued", 1)]
        ends += round_ends
    print(f"\nsend again vs reaper, 10 rounds x 20: {dict(ends)}")


@pytest.mark.django_db(transaction=True)
def test_replay_racing_a_worker_record_on_the_same_rows_never_takes_a_row_from_its_claim(
    clock, make_reminders, published, replayer
):
    """Item 4: a worker records its claim of 20 (10 sent, 10 refused for good) while staff
    replay the same 20. The record lands in full every time: a row the replay saw still
    ``sending`` belongs to the worker, so only rows the record had already failed are
    re-armed, each published once; a sent row is never published again."""
    ends: Counter = Counter()
    # Seconds the record, then the replay, waits after the start: the first and last
    # rounds fix the order, the middle ones stagger by about a record's duration.
    staggers = [(0.3, 0), (0, 0), (0.01, 0), (0, 0.01), (0.02, 0), (0, 0.02), (0, 0.04)]
    staggers += [(0, 0.08), (0, 0.15), (0, 0.3)]
    for record_wait, replay_wait in staggers:
        ids = make_reminders(20, "pending")
        claim = reminder_claim_batch(ids=ids, channel="smtp", worker="test", clock=clock)
        assert len(claim.ids) == 20
        half = {r.pk for r in claim.reminders[:10]}
        results = [
            result_for(r, Outcome.SENT if r.pk in half else Outcome.PERMANENT)
            for r in claim.reminders
        ]
        published.clear()
        recorded, replay = race(
            after(record_wait, reminder_record_batch, claim=claim, results=results, clock=clock),
            after(replay_wait, reminder_replay, reminders=_all(ids), actor=replayer, clock=clock),
        )
        # The record is fenced on (claim token, sending): a replay that took a row from
        # the worker would leave that row's result unwritten.
        assert recorded == {"sent": 10, "failed": 10}, recorded
        attempts = Counter(
            DeliveryAttempt.objects.filter(claim_token=claim.token).values_list(
                "outcome", flat=True
            )
        )
        assert attempts == {"sent": 10, "permanent": 10}, attempts
        per_id = Counter(i for batch in published for i in batch)
        assert _statuses(list(half)) == {"sent": 10}
        assert not any(per_id[pk] for pk in half), "a sent reminder was published again"
        round_ends = _each_once_or_left([pk for pk in ids if pk not in half], published)
        assert replay.changed == round_ends[("queued", 1)]
        ends += round_ends
    print(f"\nreplay vs record, 10 rounds x 10 refused: {dict(ends)}")
    # Both orders happened: some rows were replayed after their record, some were not.
    assert ends[("queued", 1)] and ends[("failed", 0)], ends

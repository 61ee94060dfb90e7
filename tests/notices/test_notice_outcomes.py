"""What each delivery outcome writes on a claimed change notice (notice_record), on a channel
with idempotency keys (http) and one without (smtp)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from delivery.results import DeliveryResult, Outcome
from reminders.models import Notice, Reminder
from reminders.services.notices import ERASED, STARTED, notice_claim, notice_record
from reminders.services.record import retry_delay
from reminders.worker import pipeline
from workshops.services import workshop_update

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claimed(clock, make_workshop, enrol, mail, published, notices_published, settings):
    """Remind one attendee, move the workshop and claim its notice on ``channel``."""

    def claimed(channel: str, **notice_values) -> tuple:
        settings.REMINDERS_NOTICE_SETTLE = 0
        workshop = make_workshop(starts_in=timedelta(hours=3))
        enrol(workshop, count=1)
        pipeline.scan(clock=clock)
        for batch in published:
            pipeline.deliver(batch, clock=clock)
        workshop.refresh_from_db()
        workshop_update(workshop=workshop, starts_at=workshop.starts_at - timedelta(hours=1))
        pipeline.scan(clock=clock)  # the revision
        pipeline.scan(clock=clock)  # its notice
        [[notice_id]] = notices_published
        Notice.objects.filter(pk=notice_id).update(**notice_values)
        claim = notice_claim(ids=[notice_id], channel=channel, clock=clock)
        [notice] = claim.notices
        return claim, notice

    return claimed


def _result(notice, outcome, *, reached=True, maybe=False, attempts=1, error="refused"):
    return DeliveryResult(
        reminder_id=notice.pk,
        key=notice.key,
        outcome=outcome,
        message_id="<m@example.com>" if outcome == Outcome.SENT else None,
        error="" if outcome == Outcome.SENT else error,
        attempts=attempts,
        provider_reached=reached,
        maybe_delivered=maybe,
    )


def _told(notice) -> int:
    return Reminder.objects.get(pk=notice.reminder_id).told_revision


@pytest.mark.parametrize("channel", ["smtp", "http"])
def test_a_sent_notice_moves_what_the_attendee_was_told(claimed, clock, channel):
    claim, notice = claimed(channel)
    told = _told(notice)
    assert notice_record(claim=claim, results=[_result(notice, Outcome.SENT)], clock=clock) == {
        "notices_sent": 1
    }
    notice.refresh_from_db()
    assert (notice.status, notice.provider_message_id) == ("sent", "<m@example.com>")
    assert _told(notice) == notice.number > told


def test_a_refusal_fails_the_notice_and_tells_nothing(claimed, clock):
    claim, notice = claimed("http")
    told = _told(notice)
    notice_record(claim=claim, results=[_result(notice, Outcome.PERMANENT)], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason, notice.last_error) == (
        "failed",
        "refused",
        "refused",
    )
    assert notice.claim_token is None and _told(notice) == told


def test_a_refusal_after_an_unanswered_call_is_unknown(claimed, clock):
    """An earlier call may have reached the provider: a refusal now does not say it did not."""
    claim, notice = claimed("http", maybe_sent=True)
    notice_record(claim=claim, results=[_result(notice, Outcome.PERMANENT)], clock=clock)
    notice.refresh_from_db()
    assert notice.status == "unknown"
    assert _told(notice) == notice.number  # they may hold it


def test_an_unanswered_call_without_keys_is_unknown_and_never_sent_again(claimed, clock):
    claim, notice = claimed("smtp")
    result = _result(notice, Outcome.TIMED_OUT, maybe=True, error="timed out")
    assert notice_record(claim=claim, results=[result], clock=clock) == {"notices_unknown": 1}
    notice.refresh_from_db()
    assert notice.status == "unknown" and notice.maybe_sent
    assert "timed out" in notice.status_reason and _told(notice) == notice.number
    assert "smtp" in notice.status_reason  # the channel that keeps no keys


def test_an_unanswered_call_with_keys_is_retried_later_marked_maybe_sent(claimed, clock):
    claim, notice = claimed("http")
    result = _result(notice, Outcome.TIMED_OUT, maybe=True, error="timed out")
    notice_record(claim=claim, results=[result], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.maybe_sent, notice.attempts) == ("pending", True, 1)
    assert notice.next_attempt_at == clock.now() + retry_delay(1)


def test_a_transient_failure_is_retried_after_the_backoff(claimed, clock):
    claim, notice = claimed("smtp")
    notice_record(claim=claim, results=[_result(notice, Outcome.TRANSIENT)], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.maybe_sent, notice.last_error) == ("pending", False, "refused")
    assert notice.next_attempt_at == clock.now() + retry_delay(1)


def test_a_transient_failure_at_the_attempt_cap_gives_up(claimed, clock, settings):
    settings.REMINDERS_MAX_ATTEMPTS = 1
    claim, notice = claimed("smtp")
    notice_record(claim=claim, results=[_result(notice, Outcome.TRANSIENT)], clock=clock)
    notice.refresh_from_db()
    assert notice.status == "failed"
    assert notice.status_reason == "gave up after 1 attempts: refused"


def test_a_notice_stopped_before_any_call_goes_back_with_its_attempt_refunded(claimed, clock):
    claim, notice = claimed("smtp")
    result = _result(notice, Outcome.CANCELLED, reached=False, attempts=0, error="stopped")
    notice_record(claim=claim, results=[result], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.attempts, notice.next_attempt_at) == ("pending", 0, None)


@pytest.mark.parametrize(("maybe", "status"), [(False, "missed"), (True, "unknown")])
def test_a_notice_past_the_start_is_missed_or_unknown_if_a_call_may_have_arrived(
    claimed, clock, maybe, status
):
    claim, notice = claimed("http", maybe_sent=maybe)
    result = _result(notice, Outcome.EXPIRED, reached=False, attempts=0, error="too late")
    notice_record(claim=claim, results=[result], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason) == (status, STARTED)


def test_a_record_under_another_claims_token_changes_nothing(claimed, clock):
    """The fence: a worker whose claim was reaped and taken again writes nothing."""
    claim, notice = claimed("smtp")
    Notice.objects.filter(pk=notice.pk).update(claim_token=uuid.uuid4())  # claimed again
    assert notice_record(claim=claim, results=[_result(notice, Outcome.SENT)], clock=clock) == {}
    notice.refresh_from_db()
    assert notice.status == "sending"


def test_a_long_refusal_is_recorded_whole_its_reason_cut_to_the_column(claimed, clock):
    """The reason column holds 200 characters; the error is kept whole beside it."""
    claim, notice = claimed("http")
    error = "550 " + "x" * 300
    result = _result(notice, Outcome.PERMANENT, error=error)
    assert notice_record(claim=claim, results=[result], clock=clock) == {"notices_failed": 1}
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason, notice.last_error) == (
        "failed",
        error[:200],
        error,
    )


def test_a_result_of_a_notice_not_in_the_claim_is_skipped_and_the_rest_recorded(claimed, clock):
    claim, notice = claimed("smtp")
    stranger = dataclasses.replace(_result(notice, Outcome.SENT), reminder_id=0)
    results = [stranger, _result(notice, Outcome.SENT)]
    assert notice_record(claim=claim, results=results, clock=clock) == {"notices_sent": 1}
    notice.refresh_from_db()
    assert notice.status == "sent"


def test_the_record_stamps_the_row_by_the_clock_it_is_given(claimed, clock):
    """Not the process's clock: the worker's (the trace dates a notice by ``updated_at``)."""
    from clock import FakeClock

    claim, notice = claimed("smtp")
    later = FakeClock(clock.now() + timedelta(minutes=7))
    notice_record(claim=claim, results=[_result(notice, Outcome.SENT)], clock=later)
    notice.refresh_from_db()
    assert notice.sent_at == notice.updated_at == later.now() != clock.now()


def test_a_refusal_quoting_an_attendee_not_erased_is_kept_as_the_provider_wrote_it(claimed, clock):
    """Only an erased attendee's name and address are scrubbed from what the provider said."""
    claim, notice = claimed("smtp")
    attendee = notice.attendee
    error = f"550 mailbox of {attendee.name} <{attendee.email}> is full"
    notice_record(
        claim=claim, results=[_result(notice, Outcome.PERMANENT, error=error)], clock=clock
    )
    notice.refresh_from_db()
    assert (notice.status_reason, notice.last_error) == (error, error)


@pytest.mark.parametrize(("given", "kept"), [(None, ""), ("<" + "m" * 300 + ">", "<" + "m" * 254)])
def test_a_sent_notice_keeps_the_providers_message_id_up_to_its_column(claimed, clock, given, kept):
    """Empty when the provider named none (the trace names no message), cut to 255 characters."""
    claim, notice = claimed("http")
    result = dataclasses.replace(_result(notice, Outcome.SENT), message_id=given)
    assert notice_record(claim=claim, results=[result], clock=clock) == {"notices_sent": 1}
    notice.refresh_from_db()
    assert notice.provider_message_id == kept


def test_a_notice_sent_on_its_retry_keeps_no_error_of_the_attempt_before(claimed, clock):
    claim, notice = claimed("smtp")
    notice_record(claim=claim, results=[_result(notice, Outcome.TRANSIENT)], clock=clock)
    clock.advance(retry_delay(1).total_seconds())
    claim = notice_claim(ids=[notice.pk], channel="smtp", clock=clock)
    [notice] = claim.notices
    assert notice.last_error == "refused"
    notice_record(claim=claim, results=[_result(notice, Outcome.SENT)], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason, notice.last_error) == ("sent", "", "")


def test_a_connection_refused_before_reaching_the_provider_counts_its_attempt(claimed, clock):
    """No call reached the provider, but one was tried: the attempt counts toward the cap and
    the retry waits the backoff (only a notice stopped before any call is refunded)."""
    claim, notice = claimed("smtp")
    result = _result(notice, Outcome.TRANSIENT, reached=False, attempts=1, error="refused")
    notice_record(claim=claim, results=[result], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.attempts) == ("pending", 1)
    assert notice.next_attempt_at == clock.now() + retry_delay(1)


@pytest.mark.parametrize("maybe", [False, True])
def test_a_notice_withdrawn_for_an_erasure_is_silenced_its_attempt_refunded(claimed, clock, maybe):
    claim, notice = claimed("http", maybe_sent=maybe, last_error="timed out")
    result = _result(notice, Outcome.WITHDRAWN, reached=False, attempts=0, error="")
    assert notice_record(claim=claim, results=[result], clock=clock) == {"notices_silenced": 1}
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason, notice.last_error) == ("silenced", ERASED, "")
    assert (notice.attempts, notice.maybe_sent) == (0, maybe)


def test_a_transient_failure_at_the_cap_after_an_unanswered_call_gives_up_as_unknown(
    claimed, clock, settings
):
    settings.REMINDERS_MAX_ATTEMPTS = 1
    claim, notice = claimed("http", maybe_sent=True)
    notice_record(claim=claim, results=[_result(notice, Outcome.TRANSIENT)], clock=clock)
    notice.refresh_from_db()
    assert (notice.status, notice.status_reason) == ("unknown", "gave up after 1 attempts: refused")
    assert _told(notice) == notice.number  # they may hold it


@pytest.mark.parametrize("maybe", [True, False], ids=["unanswered", "refused for now"])
def test_a_notice_passed_over_before_its_backoff_is_still_retried(claimed, clock, maybe):
    """Its batch delivered again before the retry is due takes nothing, closes nothing and
    counts nothing as told: the retry (with the same key) still goes."""
    claim, notice = claimed("http")
    outcome = Outcome.TIMED_OUT if maybe else Outcome.TRANSIENT
    notice_record(claim=claim, results=[_result(notice, outcome, maybe=maybe)], clock=clock)
    told = _told(notice)
    assert notice_claim(ids=[notice.pk], channel="http", clock=clock).notices == []
    assert _told(notice) == told
    assert Notice.objects.get(pk=notice.pk).status == "pending"
    clock.advance(retry_delay(1).total_seconds())
    assert [n.pk for n in notice_claim(ids=[notice.pk], channel="http", clock=clock).notices] == [
        notice.pk
    ]


def test_a_notice_perhaps_sent_claimed_after_the_start_is_left_for_the_settle_to_close_unknown(
    claimed, clock
):
    """Not missed: a call may have reached the provider."""
    from clock import FakeClock
    from reminders.services.notices import notices_settle

    claim, notice = claimed("http")
    result = _result(notice, Outcome.TIMED_OUT, maybe=True, error="timed out")
    notice_record(claim=claim, results=[result], clock=clock)
    started = FakeClock(notice.workshop.starts_at)
    assert notice_claim(ids=[notice.pk], channel="http", clock=started).notices == []
    assert Notice.objects.get(pk=notice.pk).status == "pending"
    assert notices_settle(clock=started) == {"notices_unknown": 1}


def test_a_notice_sending_without_a_lease_or_holding_a_token_outside_sending_is_refused(
    claimed,
):
    """The claim fence of a notice is the database's, as a reminder's is: a write that leaves
    a sending notice without its token and lease, or a token on one not sending, fails."""
    from django.db import IntegrityError, transaction

    _, notice = claimed("smtp")
    rows = Notice.objects.filter(pk=notice.pk)
    for values in ({"lease_expires_at": None}, {"claim_token": None}, {"status": "pending"}):
        with (
            pytest.raises(IntegrityError, match="notice_claimed_while_sending"),
            transaction.atomic(),
        ):
            rows.update(**values)
    assert rows.get().status == "sending"

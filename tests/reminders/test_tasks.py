"""The tasks are thin: they validate arguments and call one pipeline job."""

from datetime import timedelta

import pytest

from reminders.models import Reminder
from reminders.tasks import deliver_batch, parse_ids


@pytest.mark.parametrize(
    "value",
    [
        None, "1,2", [], ["1"], [1.5], [0], [-3], [True], {"ids": [1]}, list(range(1, 2000)),
        [1, 2**63], [10**30],
    ],
)  # fmt: skip
def test_malformed_ids_are_refused(value):
    assert parse_ids(value) is None


@pytest.mark.django_db
def test_the_largest_id_the_database_holds_is_accepted_and_one_more_is_rejected(caplog):
    """An id past the bigint range would fail inside the query; it is refused up front."""
    assert deliver_batch.run([2**63 - 1]) == {"skipped": 1}  # no such reminder: a no-op
    assert deliver_batch.run([2**63]) == {"rejected": 1}


def test_a_database_outage_inside_a_claim_retries_with_that_claims_token(monkeypatch):
    """The retry's message names the claim the outage cut off, so the retry releases it."""
    import uuid

    from reminders import tasks
    from reminders.worker import pipeline

    token = uuid.uuid4()
    calls = []

    def unavailable(ids, **kwargs):
        calls.append(kwargs["held"])
        raise pipeline.DatabaseUnavailable(ids, held=(token, ids[:2]))

    retried = {}

    def retry(**kwargs):
        retried.update(kwargs)
        return RuntimeError("retry")

    monkeypatch.setattr(tasks.pipeline, "deliver", unavailable)
    monkeypatch.setattr(deliver_batch, "retry", retry)
    with pytest.raises(RuntimeError, match="retry"):
        deliver_batch.run([5, 6, 7])
    assert calls == [None]
    assert retried["args"] == [[5, 6, 7]]
    assert retried["kwargs"] == {"held_by": [token.hex, [5, 6]]}
    # The retry hands that claim to the pipeline; a malformed one is logged and left out.
    with pytest.raises(RuntimeError, match="retry"):
        deliver_batch.run([5, 6, 7], held_by=[token.hex, [5, 6]])
    assert calls[-1] == (token, [5, 6])
    for malformed in (["nope", [5]], [token.hex, [9]], [token.hex], "x"):
        with pytest.raises(RuntimeError, match="retry"):
            deliver_batch.run([5, 6, 7], held_by=malformed)
        assert calls[-1] is None


def test_a_batch_retries_with_a_growing_wait_then_leaves_its_ids_to_the_scan(monkeypatch):
    """Five retries 1, 2, 4, 8 and 16 s apart ride out a database restart; after the last,
    the task returns (nothing was sent, the ids are queued) and the next scan dispatches
    them again once their message expires."""
    from reminders import tasks
    from reminders.worker import pipeline

    def unavailable(ids, **kwargs):
        raise pipeline.DatabaseUnavailable(ids)

    waits = []

    def retry(**kwargs):
        waits.append(kwargs["countdown"])
        return RuntimeError("retry")

    monkeypatch.setattr(tasks.pipeline, "deliver", unavailable)
    monkeypatch.setattr(deliver_batch, "retry", retry)
    for retries in range(tasks.DATABASE_RETRIES + 1):
        deliver_batch.push_request(retries=retries)
        try:
            if retries < tasks.DATABASE_RETRIES:
                with pytest.raises(RuntimeError, match="retry"):
                    deliver_batch.run([5, 6, 7])
            else:
                assert deliver_batch.run([5, 6, 7]) == {"database_unavailable": 3}
        finally:
            deliver_batch.pop_request()
    assert waits == [1, 2, 4, 8, 16]


def test_ids_are_deduplicated_in_order():
    assert parse_ids([3, 1, 3, 2, 1]) == [3, 1, 2]


@pytest.mark.parametrize(
    ("name", "argument", "logged"),
    [
        ("deliver_batch", ["not", "ids"], "Rejected deliver_batch with malformed ids ['not', 'ids']"),
        ("deliver_notices", [0], "Rejected deliver_notices with malformed ids [0]"),
        ("replay_selection", "7", "Rejected replay_selection with a malformed id '7'"),
        ("send_test", True, "Rejected send_test with a malformed id True"),
    ],
)  # fmt: skip
def test_malformed_arguments_are_rejected_once_without_retry(caplog, name, argument, logged):
    """Bad input on the worker side: logged once, a small result, no exception to retry."""
    from reminders import tasks

    assert getattr(tasks, name).run(argument) == {"rejected": 1}
    assert [r.getMessage() for r in caplog.records] == [logged]


@pytest.mark.django_db(transaction=True)
def test_missing_sent_and_cancelled_ids_are_a_no_op(clock, due_reminders, outbox):
    from workshops.services import workshop_cancel

    ids = due_reminders(3, starts_in=timedelta(hours=2))
    from reminders.worker import pipeline

    pipeline.deliver([ids[0]], clock=clock)
    workshop_cancel(workshop=Reminder.objects.get(pk=ids[1]).workshop)
    counts = pipeline.deliver([ids[0], 987654], clock=clock)
    assert counts == {"skipped": 2}
    assert Reminder.objects.get(pk=ids[0]).status == "sent"
    assert Reminder.objects.get(pk=ids[1]).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_scan_command_runs_one_scan(clock, due_reminders, published):
    from django.core.management import call_command

    due_reminders(4)
    out = __import__("io").StringIO()
    call_command("scan", stdout=out)
    assert "dispatched 4" in out.getvalue()
    assert sum(len(batch) for batch in published) == 4

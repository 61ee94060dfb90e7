"""A replay too large for one request runs on a worker, chunk by chunk, and its staff
decision shows the progress and the final counts (issue 11, item 8)."""

from __future__ import annotations

from collections import Counter

import pytest
from django.urls import reverse

from reminders.models import Reminder, StaffDecision
from reminders.services import replay as replay_module
from reminders.services.replay import reminder_replay, reminder_replay_later, replay_step
from reminders.tasks import replay_selection

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/reminders/reminder/"


def _ids(workshop) -> list[int]:
    return sorted(Reminder.objects.filter(workshop=workshop).values_list("pk", flat=True))


def test_a_confirmed_replay_above_the_limit_records_it_and_changes_nothing_in_the_request(
    login,
    replayer,
    bulk_failed,
    make_reminders,
    settings,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    settings.REMINDERS_REPLAY_INLINE_LIMIT = 20
    workshop = bulk_failed(30)
    sent = make_reminders(2, "sent")
    Reminder.objects.filter(pk__in=sent).update(workshop=workshop)
    tasks: list[int] = []
    monkeypatch.setattr("reminders.queue.publish_replay", tasks.append)
    with django_capture_on_commit_callbacks(execute=True):
        response = login(replayer).post(
            f"{CHANGELIST}?workshop__id__exact={workshop.pk}",
            {
                "action": "replay_selected", "select_across": "1", "post": "yes",
                "_selected_action": _ids(workshop)[:1], "reason": "DNS fixed",
            },
            follow=True,
        )  # fmt: skip
    decision = StaffDecision.objects.get()
    assert tasks == [decision.pk], "one task, published after commit"
    assert Counter(Reminder.objects.filter(workshop=workshop).values_list("status", flat=True)) == {
        "failed": 30, "sent": 2,
    }  # fmt: skip
    assert (decision.state, decision.selected, decision.progress) == ("running", 32, 0)
    assert decision.skipped == {"sent": 2} and decision.reason == "DNS fixed"
    assert decision.selection_ids == _ids(workshop)
    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith("Replaying 32 selected reminders in the background")
    assert reverse("admin:reminders_staffdecision_change", args=[decision.pk]) in message


def _to_the_end(decision_id: int, clock, *, chunk: int = 5):
    """Run the replay's chunks one after the other, as its chain of tasks does."""
    while True:
        decision = replay_step(decision_id=decision_id, clock=clock, chunk=chunk)
        if decision.state == "done":
            return decision


def test_the_worker_replays_the_selection_in_chunks_with_the_counts_of_an_inline_replay(
    replayer, bulk_failed, make_reminders, published, clock, django_capture_on_commit_callbacks
):
    workshop = bulk_failed(23)
    sent = make_reminders(2, "sent")
    Reminder.objects.filter(pk__in=sent).update(workshop=workshop)
    selection = Reminder.objects.filter(workshop=workshop)
    recorded = reminder_replay_later(
        reminders=selection, actor=replayer, clock=clock, publish_task=lambda pk: None
    )
    with django_capture_on_commit_callbacks(execute=True):
        decision = _to_the_end(recorded.audit_id, clock)
    assert (decision.state, decision.progress, decision.selection_ids) == ("done", 25, [])
    assert (decision.changed, decision.queued, decision.skipped) == (23, 23, {"sent": 2})
    assert Counter(i for batch in published for i in batch) == Counter(decision.reminder_ids)
    assert len(decision.reminder_ids) == 23
    # The same selection replayed inline: the same counts.
    Reminder.objects.filter(pk__in=decision.reminder_ids).update(status="failed")
    inline = reminder_replay(reminders=selection, actor=replayer, clock=clock)
    assert (inline.changed, inline.queued, inline.skipped) == (23, 23, {"sent": 2})


def test_a_worker_that_dies_mid_replay_is_resumed_and_replays_each_reminder_once(
    replayer, bulk_failed, published, clock, monkeypatch, django_capture_on_commit_callbacks
):
    workshop = bulk_failed(20)
    recorded = reminder_replay_later(
        reminders=Reminder.objects.filter(workshop=workshop),
        actor=replayer,
        clock=clock,
        publish_task=lambda pk: None,
    )
    real_rearm, calls = replay_module._rearm, []

    def dies_on_the_third_chunk(**kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise SystemExit("worker killed")
        return real_rearm(**kwargs)

    monkeypatch.setattr(replay_module, "_rearm", dies_on_the_third_chunk)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(SystemExit):
        _to_the_end(recorded.audit_id, clock)
    assert StaffDecision.objects.get().progress == 10  # two chunks committed, the third not
    monkeypatch.setattr(replay_module, "_rearm", real_rearm)
    with django_capture_on_commit_callbacks(execute=True):
        decision = _to_the_end(recorded.audit_id, clock)
    assert (decision.state, decision.changed, decision.queued) == ("done", 20, 20)
    assert Counter(i for batch in published for i in batch) == Counter(_ids(workshop))
    # A redelivered task after the end changes nothing.
    assert replay_selection.run(recorded.audit_id) == {"changed": 20, "queued": 20}
    assert Counter(i for batch in published for i in batch) == Counter(_ids(workshop))


@pytest.mark.parametrize("value", [None, "7", 0, -1, True, [1]])
def test_the_task_rejects_a_malformed_decision_id(value):
    assert replay_selection.run(value) == {"rejected": 1}


def test_the_scan_hands_a_stalled_replay_to_a_worker_again_once(
    replayer, bulk_failed, clock, settings, django_capture_on_commit_callbacks
):
    """Its task was lost (a worker killed, a time limit, a publish that failed): once its
    heartbeat is older than the claim lease, one scan of two publishes it again."""
    from reminders.services import replays_resume

    workshop = bulk_failed(12)
    recorded = reminder_replay_later(
        reminders=Reminder.objects.filter(workshop=workshop),
        actor=replayer,
        clock=clock,
        publish_task=lambda pk: None,  # the task that never ran
    )
    resumed: list[int] = []
    with django_capture_on_commit_callbacks(execute=True):
        assert replays_resume(clock=clock, publish=resumed.append) == 0, "resumed while fresh"
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)
    for expected in (1, 0):  # the second scan finds its heartbeat moved on
        with django_capture_on_commit_callbacks(execute=True):
            assert replays_resume(clock=clock, publish=resumed.append) == expected
    assert resumed == [recorded.audit_id]
    with django_capture_on_commit_callbacks(execute=True):
        decision = _to_the_end(recorded.audit_id, clock)
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)
    assert replays_resume(clock=clock, publish=resumed.append) == 0, "a finished replay resumed"
    assert (decision.state, decision.changed) == ("done", 12)

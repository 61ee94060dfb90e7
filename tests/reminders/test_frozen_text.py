"""Frozen content: the first claim fixes a reminder's language and text, and every later
send under its key renders the same bytes, whatever staff edit in between."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

from delivery.results import Outcome
from reminders.content import reminder_envelope
from reminders.models import MessageText, Reminder, StaffDecision
from reminders.services import claim as claim_module
from reminders.services import reminder_claim_batch, reminder_record_batch, reminders_reap
from reminders.services.replay import reminder_replay, reminder_replay_later, replay_step
from tests.reminders.test_claim import _result
from workshops.models import WorkshopText
from workshops.services import enrollment_create, workshop_update

pytestmark = pytest.mark.django_db


def _bytes(envelope) -> tuple:
    return (
        envelope.subject,
        envelope.text_body,
        envelope.html_body,
        tuple(a.content for a in envelope.attachments),
    )


def _loaded(pk: int) -> Reminder:
    return Reminder.objects.select_related("attendee", "workshop", "text").get(pk=pk)


def test_a_reaped_retry_after_staff_edit_the_text_sends_the_same_bytes(
    clock, make_workshop, enrol, settings
):
    workshop = make_workshop(
        starts_in=timedelta(hours=2),
        reminder_subject="Soon: {workshop_title}",
        reminder_intro="Dear {attendee_name}, bring an apron.",
    )
    first, second = (e.attendee for e in enrol(workshop, count=2))
    claimed_id, unclaimed_id = (
        Reminder.objects.get(workshop=workshop, attendee=attendee).pk
        for attendee in (first, second)
    )
    claim = reminder_claim_batch(ids=[claimed_id], channel="http", clock=clock)
    sent_first = _bytes(reminder_envelope(reminder=claim.reminders[0]))
    assert sent_first[0] == f"Soon: {workshop.title}"
    assert "bring an apron." in sent_first[1]

    workshop_update(
        workshop=workshop, reminder_subject="Changed {workshop_title}", reminder_intro="New words."
    )
    # The worker is lost; the reaper hands the reminder back and another claims it.
    clock.advance(settings.REMINDERS_LEASE_SECONDS + 1)
    assert reminders_reap(clock=clock)["requeued"] == 1
    retry = reminder_claim_batch(ids=[claimed_id], channel="http", clock=clock)
    assert retry.ids == [claimed_id]
    assert _bytes(reminder_envelope(reminder=retry.reminders[0])) == sent_first
    assert _bytes(reminder_envelope(reminder=_loaded(claimed_id))) == sent_first

    # The reminder not yet claimed gets the edited text at its first claim.
    later = reminder_claim_batch(ids=[unclaimed_id], channel="http", clock=clock)
    envelope = reminder_envelope(reminder=later.reminders[0])
    assert envelope.subject == f"Changed {workshop.title}"
    assert "New words." in envelope.text_body and "apron" not in envelope.text_body


def test_the_built_in_text_is_frozen_too_with_the_language(clock, make_workshop, make_attendee):
    workshop = make_workshop(starts_in=timedelta(hours=2))
    attendee = make_attendee(language="de")
    enrollment_create(attendee=attendee, workshop=workshop)
    reminder = Reminder.objects.get(workshop=workshop)
    claim = reminder_claim_batch(ids=[reminder.pk], channel="http", clock=clock)
    text = claim.reminders[0].text
    assert (text.language, text.subject_source, text.intro_source) == ("de", "built_in", "built_in")
    assert text.subject == "Erinnerung: {workshop_title} am {start_local}"
    before = _bytes(reminder_envelope(reminder=claim.reminders[0]))
    # The attendee changes language and staff add a German text: the claimed
    # reminder keeps the German built-in text it was frozen with.
    type(attendee).objects.filter(pk=attendee.pk).update(language="fr")
    WorkshopText.objects.create(workshop=workshop, language="fr", reminder_subject="Salut")
    assert _bytes(reminder_envelope(reminder=_loaded(reminder.pk))) == before


def test_one_claim_freezes_each_attendee_of_a_workshop_in_their_own_language(
    clock, make_workshop, make_attendee
):
    """Attendees of one workshop claimed together, in three languages (one with a text of
    the workshop's in it, one built in): each is frozen with their language's text."""
    workshop = make_workshop(starts_in=timedelta(hours=2))
    WorkshopText.objects.create(workshop=workshop, language="fr", reminder_subject="Salut")
    for language in ("de", "en", "fr", "de", "en"):
        enrollment_create(attendee=make_attendee(language=language), workshop=workshop)
    ids = list(
        Reminder.objects.filter(workshop=workshop).order_by("pk").values_list("pk", flat=True)
    )
    reminder_claim_batch(ids=ids, channel="http", clock=clock)
    frozen = [
        (row.attendee.language, row.text.language, row.text.subject)
        for row in Reminder.objects.filter(pk__in=ids)
        .order_by("pk")
        .select_related("attendee", "text")
    ]
    german = "Erinnerung: {workshop_title} am {start_local}"
    english = "Reminder: {workshop_title} starts {start_local}"
    assert frozen == [
        ("de", "de", german),
        ("en", "en", english),
        ("fr", "fr", "Salut"),
        ("de", "de", german),
        ("en", "en", english),
    ]


def test_a_thousand_reminders_of_one_workshop_share_one_frozen_text(clock, due_reminders):
    ids = due_reminders(300, per_workshop=100)
    for offset in range(0, 300, 50):
        reminder_claim_batch(ids=ids[offset : offset + 50], channel="http", clock=clock)
    assert MessageText.objects.count() == 1
    assert Reminder.objects.filter(pk__in=ids, text__isnull=True).count() == 0


@pytest.mark.django_db(transaction=True)
def test_claimers_freezing_the_same_new_text_at_once_store_it_once(clock, due_reminders):
    """Four threads claim batches of one workshop whose text is new, at the same moment."""
    ids = due_reminders(200, per_workshop=200)
    barrier = threading.Barrier(4)
    texts: list[set[int]] = [set() for _ in range(4)]
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            claim = reminder_claim_batch(
                ids=ids[index * 50 : (index + 1) * 50], channel="http", clock=clock
            )
            texts[index] = {reminder.text_id for reminder in claim.reminders}
        except BaseException as exc:  # the assertion below reports it
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    (only,) = MessageText.objects.values_list("pk", flat=True)
    assert texts == [{only}] * 4
    assert set(Reminder.objects.filter(pk__in=ids).values_list("text_id", flat=True)) == {only}


def test_a_claim_overtaken_before_it_fixed_its_texts_gives_the_rows_up(
    clock, make_workshop, enrol, settings, monkeypatch
):
    """A worker frozen between its claim and the fixing of texts (two statements) wakes
    to find its rows reaped, claimed again and their texts fixed: they are not its own."""
    enrol(make_workshop(starts_in=timedelta(hours=2)), count=2)
    ids = sorted(Reminder.objects.values_list("pk", flat=True))
    fix_texts = claim_module._freeze_texts
    newer = []

    def overtaken(reminders):
        monkeypatch.setattr(claim_module, "_freeze_texts", fix_texts)
        clock.advance(settings.REMINDERS_LEASE_SECONDS + settings.REMINDERS_REQUEUE_AFTER)
        assert reminders_reap(clock=clock)["requeued"] == 2
        newer.append(reminder_claim_batch(ids=ids, channel="http", clock=clock))
        return fix_texts(reminders)

    monkeypatch.setattr(claim_module, "_freeze_texts", overtaken)
    stale = reminder_claim_batch(ids=ids, channel="http", clock=clock)
    assert (stale.ids, stale.attempt_numbers) == ([], {})
    assert newer[0].ids == ids
    (text,) = MessageText.objects.values_list("pk", flat=True)
    assert {r.text_id for r in newer[0].reminders} == {text}
    assert set(Reminder.objects.filter(pk__in=ids).values_list("claim_token", flat=True)) == {
        newer[0].token
    }


def _failed_after_edit(clock, make_workshop, enrol):
    """A reminder claimed with the first text, failed for good, and the text edited since."""
    workshop = make_workshop(starts_in=timedelta(hours=2), reminder_intro="First words.")
    (enrollment,) = enrol(workshop)
    reminder = Reminder.objects.get(enrollment=enrollment)
    claim = reminder_claim_batch(ids=[reminder.pk], channel="http", clock=clock)
    sent = _bytes(reminder_envelope(reminder=claim.reminders[0]))
    failed = _result(claim.reminders[0], Outcome.PERMANENT, error="400 mailbox full")
    assert reminder_record_batch(claim=claim, results=[failed], clock=clock) == {"failed": 1}
    workshop_update(workshop=workshop, reminder_intro="Edited words.")
    return reminder, sent


@pytest.mark.parametrize("later", [False, True], ids=["in the request", "in the background"])
def test_a_replay_sends_the_frozen_text_unless_staff_choose_the_edited_one(
    clock, make_workshop, enrol, admin_user, later
):
    reminder, sent = _failed_after_edit(clock, make_workshop, enrol)
    replay(reminder, admin_user, clock=clock, later=later, use_edited_text=False)
    again = reminder_claim_batch(ids=[reminder.pk], channel="http", clock=clock)
    assert _bytes(reminder_envelope(reminder=again.reminders[0])) == sent
    failed = _result(again.reminders[0], Outcome.PERMANENT, error="400 mailbox full")
    reminder_record_batch(claim=again, results=[failed], clock=clock)

    decision = replay(reminder, admin_user, clock=clock, later=later, use_edited_text=True)
    assert decision.use_edited_text and decision.reminder_ids == [reminder.pk]
    edited = reminder_claim_batch(ids=[reminder.pk], channel="http", clock=clock)
    body = reminder_envelope(reminder=edited.reminders[0]).text_body
    assert body.startswith("Edited words.\n") and "First words." not in body
    decisions = StaffDecision.objects.filter(action="replay").order_by("pk")
    assert list(decisions.values_list("use_edited_text", flat=True)) == [False, True]


def replay(reminder, actor, *, clock, later: bool, use_edited_text: bool) -> StaffDecision:
    selection = Reminder.objects.filter(pk=reminder.pk)
    options = {"actor": actor, "clock": clock, "use_edited_text": use_edited_text}
    if later:
        result = reminder_replay_later(
            reminders=selection, publish_task=lambda _pk: None, **options
        )
        while (
            replay_step(decision_id=result.audit_id, clock=clock, publish=lambda *a, **k: None)
        ).state != "done":
            pass
    else:
        result = reminder_replay(reminders=selection, publish=lambda *a, **k: None, **options)
    return StaffDecision.objects.get(pk=result.audit_id)

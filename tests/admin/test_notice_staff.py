"""What staff see and decide about change notices: counts before a cancel or reinstate, the
message after a move, a reasoned "don't notify", the revisions on the workshop's page, the
notices in a reminder's trace, and the notice intro's validation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from reminders.models import Notice, Reminder, StaffDecision, WorkshopRevision
from reminders.services.workshop_decisions import workshop_silence_preview, workshops_silence
from tests.admin.conftest import messages_of, post_action
from tests.admin.test_workshop_admin import form_data
from workshops.models import Workshop
from workshops.services import workshop_cancel, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/admin/workshops/workshop/"


@pytest.fixture
def reminded(make_reminders):
    """A workshop three hours ahead whose three attendees were reminded, and one who was not."""
    ids = make_reminders(3, "sent")
    workshop = Reminder.objects.get(pk=ids[0]).workshop
    make_reminders(1, "pending", workshop=workshop)
    return workshop


def _rows(page) -> dict:
    return dict(page.context["effect_rows"])


def test_cancel_and_reinstate_confirmations_say_how_many_will_be_told(
    admin_client, reminded, clock, notices_scan
):
    page = post_action(admin_client, CHANGELIST, "cancel_selected", [reminded.pk])
    assert _rows(page)["Reminded attendees who will be told it is cancelled (a change notice)"] == 3
    post_action(
        admin_client, CHANGELIST, "cancel_selected", [reminded.pk], confirm=True, reason="Ill"
    )
    assert Workshop.objects.get(pk=reminded.pk).cancellation_reason == "Ill"
    notices_scan(sent=True)
    assert Notice.objects.filter(kind="cancelled", status="sent").count() == 3
    page = post_action(admin_client, CHANGELIST, "reinstate_selected", [reminded.pk])
    assert _rows(page)["Attendees told it was cancelled who will be told it is back on"] == 3


def test_the_enrollment_cancel_confirmation_says_how_many_will_be_told(
    admin_client, reminded, notices_scan
):
    """An attendee already reminded whose enrollment staff cancel gets a cancellation notice,
    as for a cancelled workshop: the confirmation counts them, as the workshop's does."""
    enrollments = list(reminded.enrollments.order_by("pk").values_list("pk", flat=True))
    page = post_action(admin_client, "/admin/workshops/enrollment/", "cancel_selected", enrollments)
    told = "Reminded attendees who will be told their enrollment is cancelled (a change notice)"
    assert _rows(page).get(told) == 3
    post_action(
        admin_client,
        "/admin/workshops/enrollment/",
        "cancel_selected",
        enrollments,
        confirm=True,
        reason="Room too small",
    )
    notices_scan(sent=True)
    assert Notice.objects.filter(kind="cancelled", status="sent").count() == 3


def test_setting_a_cancelled_enrollment_back_to_active_says_a_notice_will_follow(
    admin_client, reminded, notices_scan
):
    """A reminded attendee told their enrollment was cancelled is told it is back on when
    staff set it active again; the page said only that the enrollment was changed."""
    from workshops.models import Enrollment

    enrollment = Enrollment.objects.filter(workshop=reminded, reminders__status="sent").first()
    post_action(
        admin_client,
        "/admin/workshops/enrollment/",
        "cancel_selected",
        [enrollment.pk],
        confirm=True,
        reason="Asked to leave",
    )
    notices_scan(sent=True)
    assert Notice.objects.filter(kind="cancelled", status="sent").count() == 1
    saved = admin_client.post(
        f"/admin/workshops/enrollment/{enrollment.pk}/change/", {"status": "active"}, follow=True
    )
    said = [m for m in messages_of(saved) if "change notice" in m]
    assert said == [
        "The attendee was told this enrollment is cancelled: they will get a change notice "
        "that it is active again."
    ]
    notices_scan(sent=True)
    assert Notice.objects.filter(status="sent").exclude(kind="cancelled").count() == 1


def test_saving_a_move_says_who_will_hear_of_it_and_when(admin_client, reminded, settings):
    settings.REMINDERS_NOTICE_SETTLE = 300
    local = reminded.starts_at.astimezone(reminded.zone) + timedelta(hours=1)
    response = admin_client.post(
        f"{CHANGELIST}{reminded.pk}/change/",
        form_data(
            title=reminded.title,
            zone=reminded.timezone,
            starts=f"{local:%Y-%m-%d %H:%M}",
            ends=f"{local + timedelta(hours=1):%Y-%m-%d %H:%M}",
        ),
        follow=True,
    )
    [said] = [m for m in messages_of(response) if "change notice" in m]
    assert said.startswith("3 reminded attendees will get a change notice")
    assert "in about 5 minutes" in said


def test_saving_a_new_zone_under_the_same_wall_clock_time_says_who_will_hear_of_the_move(
    admin_client, reminded, settings
):
    """The times are typed in the workshop's zone: a new zone with the same typed times moves
    the start and end, and the reminded attendees are told; the save said nothing of it."""
    settings.REMINDERS_NOTICE_SETTLE = 300
    assert reminded.timezone == "Europe/Berlin"
    start, end = (
        moment.astimezone(reminded.zone) for moment in (reminded.starts_at, reminded.ends_at)
    )
    response = admin_client.post(
        f"{CHANGELIST}{reminded.pk}/change/",
        form_data(
            title=reminded.title,
            zone="Europe/Helsinki",
            starts=f"{start:%Y-%m-%d %H:%M}",
            ends=f"{end:%Y-%m-%d %H:%M}",
        ),
        follow=True,
    )
    moved = Workshop.objects.get(pk=reminded.pk)
    assert moved.starts_at == reminded.starts_at - timedelta(hours=1)
    [said] = [m for m in messages_of(response) if "change notice" in m]
    assert said.startswith("3 reminded attendees will get a change notice")


def test_dont_notify_is_reasoned_recorded_and_sends_nothing(
    admin_client, reminded, mail, notices_scan
):
    workshop_update(workshop=reminded, location="Room 12")
    page = post_action(admin_client, CHANGELIST, "silence_selected", [reminded.pk])
    assert _rows(page)["Reminded attendees who will not be told of the latest change"] == 3
    refused = post_action(
        admin_client, CHANGELIST, "silence_selected", [reminded.pk], confirm=True, reason=""
    )
    assert refused.status_code == 200 and not StaffDecision.objects.exists()
    post_action(
        admin_client,
        CHANGELIST,
        "silence_selected",
        [reminded.pk],
        confirm=True,
        reason="Same building, signs on the door",
    )
    decision = StaffDecision.objects.get()
    assert decision.action == "silence" and decision.workshop_ids == [reminded.pk]
    assert decision.reason == "Same building, signs on the door"
    notices_scan(sent=True)
    assert set(Notice.objects.values_list("status", flat=True)) == {"silenced"}
    assert len(mail.messages) == 0
    # A later change is news again.
    workshop_update(workshop=Workshop.objects.get(pk=reminded.pk), location="Room 14")
    notices_scan(sent=True)
    assert Notice.objects.filter(status="sent").count() == 3


def test_silencing_a_selection_records_only_the_workshops_with_a_change_to_silence(
    admin_user, reminded, make_reminders, notices_scan
):
    told = Reminder.objects.get(pk=make_reminders(2, "sent")[0]).workshop
    workshop_update(workshop=told, location="Room 5")
    notices_scan(sent=True)  # its attendees heard of it: nothing left to silence
    workshop_update(workshop=reminded, location="Room 12")
    result = workshops_silence(
        workshops=Workshop.objects.filter(pk__in=[reminded.pk, told.pk]),
        reason="Same building",
        actor=admin_user,
    )
    assert (result.selected, result.changed, result.reminders) == (2, 1, 3)
    assert result.skipped == {"nothing_to_tell": 1}
    decision = StaffDecision.objects.get(pk=result.audit_id)
    assert (decision.changed, decision.workshop_ids) == (1, [reminded.pk])
    # The revisions say the same: only the workshop it silenced names the decision.
    assert list(
        WorkshopRevision.objects.filter(silenced_by=decision).values_list("workshop", flat=True)
    ) == [reminded.pk]
    assert decision.skipped == {"nothing_to_tell": 1}
    notices_scan(sent=True)
    statuses = Notice.objects.values_list("reminder__workshop_id", "status")
    assert sorted(statuses) == sorted([(reminded.pk, "silenced")] * 3 + [(told.pk, "sent")] * 2)


def test_notices_planned_but_not_yet_sent_count_as_ones_to_silence(
    admin_user, reminded, notices_scan
):
    """Between the scan that plans the notices and their send, staff are told there are three
    attendees to leave untold, and the decision records the workshop it silenced."""
    workshop_update(workshop=reminded, location="Room 12")
    notices_scan(sent=False)
    assert Notice.objects.filter(status="pending").count() == 3
    selection = Workshop.objects.filter(pk=reminded.pk)
    preview = workshop_silence_preview(workshops=selection)
    assert (preview.eligible, preview.effects, preview.skipped) == (1, {"to_silence": 3}, {})
    result = workshops_silence(workshops=selection, reason="Same building", actor=admin_user)
    assert (result.changed, result.reminders, result.skipped) == (1, 3, {})
    assert StaffDecision.objects.get(pk=result.audit_id).workshop_ids == [reminded.pk]
    assert set(Notice.objects.values_list("status", flat=True)) == {"silenced"}


def test_a_workshop_whose_notices_went_out_between_the_count_and_the_silence_is_recorded_raced(
    admin_user, reminded, make_reminders, notices_scan, monkeypatch
):
    """Counted with a change to silence, then its notices sent by a worker before the decision
    reached it: the decision's selected, changed and skipped add up, as the other decisions'
    do. On the old code it recorded 2 selected, 1 changed and nothing skipped."""
    from reminders.services import workshop_decisions

    other = Reminder.objects.get(pk=make_reminders(2, "sent")[0]).workshop
    for workshop in (reminded, other):
        workshop_update(workshop=workshop, location="Room 12")
    notices_scan(sent=False)
    count = workshop_decisions.workshop_silence_preview

    def count_then_send(**kwargs):
        counted = count(**kwargs)
        Notice.objects.filter(workshop=other).update(status="sent")  # a worker, meanwhile
        return counted

    monkeypatch.setattr(workshop_decisions, "workshop_silence_preview", count_then_send)
    result = workshops_silence(
        workshops=Workshop.objects.filter(pk__in=[reminded.pk, other.pk]),
        reason="Same building",
        actor=admin_user,
    )
    decision = StaffDecision.objects.get(pk=result.audit_id)
    assert (decision.selected, decision.changed, decision.skipped) == (2, 1, {"raced": 1})
    assert (result.changed, result.skipped) == (1, {"raced": 1})


def test_planned_notices_of_a_change_since_changed_again_are_not_counted_twice(
    reminded, notices_scan
):
    workshop_update(workshop=reminded, location="Room 12")
    notices_scan(sent=False)
    workshop_update(workshop=reminded, location="Room 14")
    preview = workshop_silence_preview(workshops=Workshop.objects.filter(pk=reminded.pk))
    assert (preview.eligible, preview.effects) == (1, {"to_silence": 3})


def test_counting_planned_notices_reads_the_same_for_one_workshop_or_two(
    reminded, make_reminders, notices_scan
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from reminders.services.notices import notices_pending

    other = Reminder.objects.get(pk=make_reminders(2, "sent")[0]).workshop
    for workshop in (reminded, other):
        workshop_update(workshop=workshop, location="Room 12")
    notices_scan(sent=False)
    counted = []
    for workshops in ([reminded.pk], [reminded.pk, other.pk]):
        with CaptureQueriesContext(connection) as queries:
            pending = notices_pending(workshops=workshops)
        counted.append((len(pending), len(queries)))
    assert counted[1] == (2, counted[0][1]), counted


def test_the_workshop_page_lists_revisions_with_notices_by_status(
    admin_client, reminded, notices_scan
):
    workshop_update(workshop=reminded, location="Room 12")
    notices_scan(sent=True)
    workshop_cancel(workshop=Workshop.objects.get(pk=reminded.pk), reason="Flooded")
    notices_scan(sent=False)
    page = admin_client.get(f"{CHANGELIST}{reminded.pk}/change/").content.decode()
    table = page[page.index('id="notice-revisions"') :]
    table = table[: table.index("</table>")]
    assert "<td>2</td><td>cancelled (Flooded)</td>" in table
    assert "3 pending" in table
    assert "Room 12" in table and "3 sent" in table


def test_a_reminders_trace_shows_its_notices(reminded, notices_scan, capsys):
    workshop_update(workshop=reminded, location="Room 12")
    notices_scan(sent=True)
    reminder = Reminder.objects.filter(workshop=reminded, status="sent").first()
    call_command("reminder_trace", str(reminder.pk))
    out = capsys.readouterr().out
    assert f"notice 1 (changed (time, place or link), {reminder.key}-r1) planned" in out
    assert f"notice 1 (changed (time, place or link), {reminder.key}-r1) sent on smtp" in out
    # One that ended without a send says how, with its tries and the last error.
    workshop_update(workshop=Workshop.objects.get(pk=reminded.pk), location="Room 14")
    notices_scan(sent=False)
    Notice.objects.filter(reminder=reminder, number=2).update(
        status="failed", status_reason="refused", attempts=2, last_error="550 5.1.1 no such user"
    )
    call_command("reminder_trace", str(reminder.pk))
    out = capsys.readouterr().out
    assert (
        f"notice 2 (changed (time, place or link), {reminder.key}-r2) failed (refused), "
        "2 attempt(s), last error: 550 5.1.1 no such user"
    ) in out


def test_the_notice_intro_refuses_an_unknown_placeholder_and_names_the_valid_ones(make_workshop):
    workshop = make_workshop()
    workshop.notice_intro = "Moved from {old_start_local} to {start_local}, see {old_room}"
    with pytest.raises(ValidationError) as raised:
        workshop.full_clean()
    [message] = raised.value.message_dict["notice_intro"]
    assert "Unknown placeholder {old_room}" in message and "{cancellation_reason}" in message
    workshop.reminder_intro = "Starts {old_start_local}"
    with pytest.raises(ValidationError) as raised:
        workshop.full_clean()
    assert "reminder_intro" in raised.value.message_dict  # notices' placeholders only


def test_the_preview_shows_the_change_notice_from_what_was_told_to_what_is(admin_client, reminded):
    workshop_update(workshop=reminded, location="Room 12")
    reminder = Reminder.objects.filter(workshop=reminded, status="sent").first()
    page = admin_client.get(
        f"{CHANGELIST}{reminded.pk}/preview/",
        {"attendee": reminder.attendee_id, "message": "notice"},
    )
    envelope = page.context["envelope"]
    assert envelope.subject.startswith("Changed: ")
    assert "Where: Room 12 (was none)" in envelope.text_body
    assert "METHOD:PUBLISH" in page.context["ics"] and "SEQUENCE:1" in page.context["ics"]
    assert Notice.objects.count() == 0  # read only


def test_the_change_notice_of_an_attendee_whose_enrollment_was_cancelled_can_be_previewed(
    admin_client, reminded
):
    """A cancellation notice goes to a reminded attendee whose enrollment was cancelled, and a
    test of it may be sent: the preview offers them too. It listed active enrollments only
    (the page refused her as not enrolled and showed another attendee's notice)."""
    from workshops.models import Enrollment
    from workshops.services import enrollment_cancel

    reminder = Reminder.objects.filter(workshop=reminded, status="sent").first()
    enrollment_cancel(enrollment=Enrollment.objects.get(pk=reminder.enrollment_id))
    url = f"{CHANGELIST}{reminded.pk}/preview/"
    page = admin_client.get(url, {"attendee": reminder.attendee_id, "message": "notice"})
    assert page.context["error"] == ""
    assert page.context["chosen"].pk == reminder.attendee_id
    assert page.context["envelope"].subject.startswith("Cancelled: ")
    # The reminder preview still offers active enrollments only: she gets no reminder.
    page = admin_client.get(url, {"attendee": reminder.attendee_id})
    assert reminder.attendee_id not in [person.pk for person in page.context["enrolled"]]
    assert "That attendee is not enrolled in this workshop" in page.content.decode()


def test_an_erased_attendee_is_not_offered_a_change_notice_they_will_never_get(
    admin_client, admin_user, reminded
):
    """Erasure cancels her enrollment and no notice goes to her again (the address is gone):
    the change-notice preview offered her as '(erased)' with a cancellation notice, and
    'Send me a test' sent one, of a message nobody will receive."""
    from reminders.services.erasure import attendees_erase
    from workshops.models import Attendee

    reminder = Reminder.objects.filter(workshop=reminded, status="sent").first()
    attendees_erase(
        attendees=Attendee.objects.filter(pk=reminder.attendee_id), reason="asked", actor=admin_user
    )
    url = f"{CHANGELIST}{reminded.pk}/preview/"
    page = admin_client.get(url, {"attendee": reminder.attendee_id, "message": "notice"})
    offered = [person.pk for person in page.context["enrolled"]]
    assert (reminder.attendee_id in offered, page.context["error"]) == (
        False,
        "That attendee is not enrolled in this workshop; choose one from the list.",
    )
    admin_user.email = "ops@example.org"
    admin_user.save()
    sent = admin_client.post(
        url,
        {"attendee": reminder.attendee_id, "message": "notice", "request_token": "a" * 32},
        follow=True,
    )
    assert "not enrolled" in " ".join(messages_of(sent))
    assert not StaffDecision.objects.filter(action="send_test").exists()


def test_the_notice_preview_of_an_attendee_who_unsubscribed_says_they_get_none(
    admin_client, reminded, clock
):
    """One-click unsubscribe stops the workshop's notices to that attendee; the preview showed
    'what this attendee would get if the workshop changed now' as for anyone else."""
    reminder = Reminder.objects.filter(workshop=reminded, status="sent").first()
    Reminder.objects.filter(pk=reminder.pk).update(unsubscribed_at=clock.now())
    url = f"{CHANGELIST}{reminded.pk}/preview/"
    page = admin_client.get(url, {"attendee": reminder.attendee_id, "message": "notice"})
    said = "This attendee unsubscribed from this workshop's messages: they get no change notice."
    assert said in page.content.decode()
    other = Reminder.objects.filter(workshop=reminded, status="sent").exclude(pk=reminder.pk)[0]
    page = admin_client.get(url, {"attendee": other.attendee_id, "message": "notice"})
    assert said not in page.content.decode()


def test_send_me_a_test_of_the_change_notice(admin_client, admin_user, reminded, mail, live_clock):
    from reminders.worker.testsend import reminder_send_test_run

    admin_user.email = "ops@example.org"
    admin_user.save()
    workshop_cancel(workshop=reminded, reason="Flooded")
    reminder = Reminder.objects.filter(workshop=reminded, status="sent").first()
    queued: list[int] = []
    from reminders.services.testsend import reminder_send_test_request

    decision = reminder_send_test_request(
        workshop=reminded,
        attendee=reminder.attendee,
        actor=admin_user,
        publish_task=queued.append,
        notice=True,
    )
    done = reminder_send_test_run(decision_id=decision.pk)
    assert done.outcome.startswith("sent to ops@example.org")
    [message] = mail.received()
    assert message.rcpt_tos == ("ops@example.org",)
    assert message.subject.startswith("[Test] Cancelled: ")
    assert "Reason given: Flooded" in message.parsed().get_body(("plain",)).get_content()
    assert not Notice.objects.exists()

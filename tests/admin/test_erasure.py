"""Erase an attendee's personal data (issue 11, item 10): name and email gone everywhere
staff can read them, enrollments and unsent reminders cancelled, sent markers kept so
nothing is sent again, and one audit row with ids and counts only."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from delivery.results import Outcome
from reminders.models import DeliveryAttempt, Reminder, StaffDecision
from reminders.services import reminder_claim_batch, reminder_record_batch
from reminders.services.erasure import ERASED_NAME, attendees_erase
from reminders.services.replay import reminder_resolve_unknown
from tests.admin.conftest import result_for
from workshops.models import Attendee, Enrollment
from workshops.services import enrollment_create

pytestmark = pytest.mark.django_db

EMAIL = "Ada.Lovelace@Example.org"
NAME = "Ada Lovelace"


@pytest.fixture
def eraser(make_staff):
    return make_staff(
        "workshops.view_attendee", "workshops.change_attendee", "workshops.erase_attendee",
        username="eraser",
    )  # fmt: skip


@pytest.fixture
def ada(clock, make_workshop, resolver):
    """Ada with a sent reminder, a failed one quoting her address, a pending one, and a
    staff note naming her."""
    from reminders.services import reminders_plan

    ada = Attendee.objects.create(name=NAME, email=EMAIL)
    workshops = [make_workshop() for _ in range(3)]
    for workshop in workshops:
        enrollment_create(attendee=ada, workshop=workshop)
    reminders_plan(clock=clock)
    sent, failed, pending = Reminder.objects.filter(attendee=ada).order_by("workshop__pk")
    for reminder, outcome, error in (
        (sent, Outcome.SENT, ""),
        (failed, Outcome.PERMANENT, f"550 5.1.1 <{EMAIL.lower()}>: mailbox unavailable"),
    ):
        claim = reminder_claim_batch(ids=[reminder.pk], channel="smtp", worker="t", clock=clock)
        [claimed] = claim.reminders
        reminder_record_batch(
            claim=claim, results=[result_for(claimed, outcome, error=error)], clock=clock
        )
    Reminder.objects.filter(pk=sent.pk).update(status="unknown")
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk=sent.pk),
        decision="mark_sent",
        reason=f"{NAME} confirmed by phone",
        actor=resolver,
        clock=clock,
    )
    return ada, sent.pk, failed.pk, pending.pk


def test_erasure_removes_name_and_email_from_every_text_and_keeps_the_sent_marker(
    ada, eraser, clock
):
    attendee, sent, failed, pending = ada
    result = attendees_erase(
        attendees=Attendee.objects.filter(pk=attendee.pk),
        reason="request by email, ticket 4711",
        actor=eraser,
        clock=clock,
    )
    assert (result.changed, result.reminders) == (1, 1)
    attendee.refresh_from_db()
    assert attendee.name == ERASED_NAME and attendee.email.endswith("@erased.invalid")
    assert attendee.erased_at == clock.now()
    statuses = dict(Reminder.objects.filter(attendee=attendee).values_list("pk", "status"))
    assert statuses == {sent: "sent", failed: "failed", pending: "cancelled"}
    assert set(Enrollment.objects.filter(attendee=attendee).values_list("status", flat=True)) == {
        "cancelled"
    }
    texts = [
        *Reminder.objects.values_list("last_error", flat=True),
        *Reminder.objects.values_list("status_reason", flat=True),
        *DeliveryAttempt.objects.values_list("error", flat=True),
        *StaffDecision.objects.values_list("reason", flat=True),
    ]
    blob = "\n".join(texts).lower()
    assert EMAIL.lower() not in blob and NAME.lower() not in blob
    assert "550 5.1.1 <[erased]>: mailbox unavailable" in texts
    audit = StaffDecision.objects.get(action="erase")
    assert audit.attendee_ids == [attendee.pk] and audit.reminder_ids == [pending]
    assert "[erased] confirmed by phone" in texts


def test_an_erased_attendee_cannot_be_enrolled_again_and_nothing_is_resent(
    ada, eraser, clock, make_workshop
):
    attendee, *_ = ada
    attendees_erase(attendees=Attendee.objects.filter(pk=attendee.pk), reason="r", actor=eraser)
    attendee.refresh_from_db()
    with pytest.raises(ValidationError, match="personal data was erased"):
        enrollment_create(attendee=attendee, workshop=make_workshop())
    again = attendees_erase(
        attendees=Attendee.objects.filter(pk=attendee.pk), reason="r", actor=eraser
    )
    assert again.changed == 0
    assert StaffDecision.objects.filter(action="erase").latest("id").skipped == {
        "already_erased": 1
    }


def test_the_admin_erases_only_with_the_permission_after_a_confirmation_with_a_reason(
    ada, eraser, login, make_staff
):
    attendee, *_ = ada
    url = reverse("admin:workshops_attendee_changelist")
    data = {"action": "erase_selected", "_selected_action": [attendee.pk], "select_across": "0"}
    editor = login(make_staff("workshops.view_attendee", "workshops.change_attendee"))
    assert "erase_selected" not in editor.get(url).content.decode()
    assert editor.post(url, {**data, "post": "yes", "reason": "x"}).status_code == 403
    client = login(eraser)
    page = client.post(url, {**data, "index": "0"})
    rows = dict(page.context["effect_rows"])
    assert rows == {
        "Active enrollments that will be cancelled": 3,
        "Reminders that will be cancelled": 1,
        "Messages being sent to them right now (one already at the provider may still reach "
        "the old address; no new call starts)": 0,
        "Reminders already sent (kept, so never sent again)": 1,
    }
    no_reason = client.post(url, {**data, "post": "yes", "reason": ""})
    assert "This field is required." in no_reason.content.decode()
    assert Attendee.objects.get(pk=attendee.pk).name == NAME
    done = client.post(url, {**data, "post": "yes", "reason": "GDPR request"}, follow=True)
    assert [str(m) for m in done.context["messages"]] == [
        "Erased the personal data of 1 attendee; 1 reminder cancelled. The decision is recorded."
    ]
    assert Attendee.objects.get(pk=attendee.pk).name == ERASED_NAME
    assert NAME not in client.get(url).content.decode()


def test_the_erase_page_counts_what_is_being_sent_to_her_right_now(ada, eraser, login, clock):
    """A call already started when the erasure commits may still reach her old address (the
    claim watch stops only calls not started): the page said nothing of those."""
    attendee, _sent, _failed, pending = ada
    reminder_claim_batch(ids=[pending], channel="smtp", worker="t", clock=clock)
    url = reverse("admin:workshops_attendee_changelist")
    data = {"action": "erase_selected", "_selected_action": [attendee.pk], "select_across": "0"}
    page = login(eraser).post(url, {**data, "index": "0"})
    rows = dict(page.context["effect_rows"])
    assert rows["Messages being sent to them right now (one already at the provider may still "
                "reach the old address; no new call starts)"] == 1  # fmt: skip


def test_the_erase_page_and_message_count_the_already_erased_and_the_ids_gone(ada, eraser, login):
    """Ticked attendees already erased, and ids gone meanwhile, are skipped rows on the page
    and in the message, as in every decision; a warning when nothing was erased."""
    attendee, *_ = ada
    old = Attendee.objects.create(name="Old Timer", email="old@example.org")
    attendees_erase(attendees=Attendee.objects.filter(pk=old.pk), reason="r", actor=eraser)
    url = reverse("admin:workshops_attendee_changelist")
    ticked = [attendee.pk, old.pk, old.pk + 1000]
    data = {"action": "erase_selected", "_selected_action": ticked, "select_across": "0"}
    client = login(eraser)
    page = client.post(url, {**data, "index": "0"})
    assert page.context["skipped_rows"] == [
        ("already erased", 1),
        ("selected attendees no longer exist", 1),
    ]
    assert page.context["submit_label"] == "Yes, erase 1 attendee"
    for expected, skipped, level in (
        ("Erased the personal data of 1 attendee; 1 reminder cancelled.", "1 already erased", "success"),
        ("Erased the personal data of 0 attendees; 0 reminders cancelled.", "2 already erased", "warning"),
    ):  # fmt: skip
        done = client.post(url, {**data, "post": "yes", "reason": "GDPR request"}, follow=True)
        assert [(str(m), m.level_tag) for m in done.context["messages"]] == [
            (
                f"{expected} The decision is recorded. Skipped: {skipped}, "
                "1 selected attendees no longer exist.",
                level,
            )
        ]


# --- Erasure while a reminder is in flight -----------------------------------------------


def _claimed_for(name: str, email: str, workshops, clock):
    """Enrol a new attendee in each workshop and claim their reminders as a worker would."""
    from reminders.services import reminders_plan

    attendee = Attendee.objects.create(name=name, email=email)
    for workshop in workshops:
        enrollment_create(attendee=attendee, workshop=workshop)
    reminders_plan(clock=clock)
    ids = list(
        Reminder.objects.filter(attendee=attendee).order_by("pk").values_list("pk", flat=True)
    )
    claim = reminder_claim_batch(ids=ids, channel="smtp", worker="w1", clock=clock)
    assert claim.ids == ids
    return attendee, claim


def _texts_of(attendee) -> str:
    reminders = Reminder.objects.filter(attendee=attendee)
    texts = [
        *reminders.values_list("last_error", flat=True),
        *reminders.values_list("status_reason", flat=True),
        *DeliveryAttempt.objects.filter(reminder__in=reminders).values_list("error", flat=True),
    ]
    return "\n".join(texts)


def test_outcomes_recorded_after_the_erasure_never_quote_the_old_address_or_name(
    eraser, clock, make_workshop
):
    """The worker claimed Ada's three reminders (and loaded her address) before staff erased
    her; its record comes after the erasure, with provider errors that echo the address and
    name. What lands in the rows and attempts is scrubbed, whatever the outcome."""
    attendee, claim = _claimed_for(NAME, EMAIL, [make_workshop() for _ in range(3)], clock)
    result = attendees_erase(
        attendees=Attendee.objects.filter(pk=attendee.pk), reason="ticket 9", actor=eraser
    )
    assert result.changed == 1
    refused, greylisted, cut_off = claim.reminders
    echo = f"<{EMAIL}> ({NAME})"
    recorded = reminder_record_batch(
        claim=claim,
        results=[
            result_for(refused, Outcome.PERMANENT, error=f"550 5.1.1 {echo}: no such user"),
            result_for(greylisted, Outcome.TRANSIENT, error=f"451 4.7.1 {echo}: try later"),
            result_for(cut_off, Outcome.TIMED_OUT, error=f"timed out talking about {echo}"),
        ],
        clock=clock,
    )
    # The enrollment is cancelled, so the greylisted one is handed back as cancelled.
    assert recorded == {"failed": 1, "cancelled": 1, "unknown": 1}, recorded
    texts = _texts_of(attendee)
    assert EMAIL.lower() not in texts.lower() and NAME.lower() not in texts.lower(), texts
    assert "550 5.1.1 <[erased]> ([erased]): no such user" in texts
    assert "451 4.7.1 <[erased]> ([erased]): try later" in texts
    assert DeliveryAttempt.objects.filter(claim_token=claim.token).count() == 3
    assert set(
        DeliveryAttempt.objects.filter(claim_token=claim.token).values_list("outcome", flat=True)
    ) == {"permanent", "transient", "timed_out"}


def test_one_chunk_with_an_erased_and_a_kept_attendee_scrubs_only_the_erased_one(
    eraser, clock, make_workshop
):
    """A chunk holds reminders of several attendees; the one kept first in the chunk keeps
    its text, the erased one after it is scrubbed."""
    workshop = make_workshop()
    kept, kept_claim = _claimed_for("Alan Turing", "alan@example.org", [workshop], clock)
    ada, ada_claim = _claimed_for(NAME, EMAIL, [workshop], clock)
    attendees_erase(attendees=Attendee.objects.filter(pk=ada.pk), reason="r", actor=eraser)
    chunk = kept_claim.reminders + ada_claim.reminders
    # One record over both claims' rows, as one chunk would be: same token, so merge them.
    Reminder.objects.filter(pk=ada_claim.reminders[0].pk).update(claim_token=kept_claim.token)
    DeliveryAttempt.objects.filter(claim_token=ada_claim.token).update(claim_token=kept_claim.token)
    claim = type(kept_claim)(
        token=kept_claim.token,
        channel=kept_claim.channel,
        reminders=chunk,
    )
    recorded = reminder_record_batch(
        claim=claim,
        results=[
            result_for(r, Outcome.PERMANENT, error=f"550 <{r.attendee.email}> refused")
            for r in chunk
        ],
        clock=clock,
    )
    assert recorded == {"failed": 2}
    assert "550 <alan@example.org> refused" in _texts_of(kept)
    assert EMAIL.lower() not in _texts_of(ada).lower()


def test_a_record_without_errors_reads_no_attendee_row(clock, make_workshop):
    """The check costs nothing on the common path: a chunk that was all sent carries no text,
    so the record sends no statement about attendees."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _, claim = _claimed_for(NAME, EMAIL, [make_workshop() for _ in range(2)], clock)
    with CaptureQueriesContext(connection) as queries:
        recorded = reminder_record_batch(
            claim=claim,
            results=[result_for(r, Outcome.SENT) for r in claim.reminders],
            clock=clock,
        )
    assert recorded == {"sent": 2}
    assert not [q["sql"] for q in queries if "workshops_attendee" in q["sql"]]


@pytest.mark.django_db(transaction=True)
def test_an_erasure_racing_a_record_on_the_same_reminder_never_leaves_the_address(
    eraser, clock, make_workshop
):
    """Staff erase an attendee while the worker that holds her reminder records a refusal
    echoing her address, staggered over both orders. Whichever commits first, the address
    and name are gone from every text, the record lands in full and the erasure too."""
    from tests.support.races import after, race

    workshop = make_workshop()
    # Seconds the record, then the erasure, waits after the start: the first and last
    # rounds fix the order, the middle ones stagger by about one transaction.
    staggers = [(0.3, 0), (0, 0), (0.005, 0), (0, 0.005), (0.01, 0), (0, 0.01), (0.02, 0)]
    staggers += [(0, 0.02), (0, 0.05), (0, 0.3)]
    for round_number, (record_wait, erase_wait) in enumerate(staggers):
        name, email = f"Grace Hopper {round_number}", f"grace{round_number}@example.org"
        attendee, claim = _claimed_for(name, email, [workshop], clock)
        [reminder] = claim.reminders
        refusal = result_for(reminder, Outcome.PERMANENT, error=f"550 <{email}> {name} unknown")
        recorded, erased = race(
            after(record_wait, reminder_record_batch, claim=claim, results=[refusal], clock=clock),
            after(
                erase_wait,
                attendees_erase,
                attendees=Attendee.objects.filter(pk=attendee.pk),
                reason="request",
                actor=eraser,
                clock=clock,
            ),
        )
        assert recorded == {"failed": 1}, (round_number, recorded)
        assert erased.changed == 1
        texts = _texts_of(attendee)
        assert email not in texts and name not in texts, (round_number, texts)
        assert "550 <[erased]> [erased] unknown" in texts


def test_staff_cannot_block_or_undo_an_erasure(client, make_staff, ada, eraser):
    """Issue 34, item 3: a user with add/change attendee made the placeholder address
    first (the erasure then failed with a 500), and wrote real values back afterwards."""
    ada, *_ = ada
    clerk = make_staff(
        "workshops.view_attendee", "workshops.add_attendee", "workshops.change_attendee",
        username="clerk",
    )  # fmt: skip
    client.force_login(clerk)
    squat = client.post(
        "/admin/workshops/attendee/add/",
        {"name": "Squatter", "email": f"erased-{ada.pk}@erased.invalid", "language": "en"},
    )
    assert squat.status_code == 200, "an .invalid address was accepted"
    assert "can not receive mail" in squat.content.decode()

    attendees_erase(attendees=Attendee.objects.filter(pk=ada.pk), reason="asked", actor=eraser)
    ada.refresh_from_db()
    assert ada.erased_at is not None and ada.email.endswith("@erased.invalid")
    assert ada.email != f"erased-{ada.pk}@erased.invalid", "the placeholder is guessable"
    assert len(ada.email.split("@")[0]) >= len("erased-") + 24  # 96 random bits

    page = client.get(f"/admin/workshops/attendee/{ada.pk}/change/").content.decode()
    assert 'name="email"' not in page and 'name="name"' not in page
    client.post(
        f"/admin/workshops/attendee/{ada.pk}/change/",
        {"name": NAME, "email": EMAIL, "language": "en"},
    )
    ada.refresh_from_db()
    assert (ada.name, ada.email) != (NAME, EMAIL)
    assert ada.name == ERASED_NAME


def test_an_erasure_leaves_no_form_of_the_name_or_address_in_the_admin_log_or_any_text(
    admin_client, admin_user, make_workshop, eraser, clock
):
    """Issue 34, items 1 and 2: Django's admin log ("Recent actions") kept the attendee's
    and enrollments' reprs; the punycode address, a provider's "Dear Zoë", a name under 4
    characters and a test send's outcome survived the scrub."""
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    from reminders.services import reminders_plan
    from tests.admin.test_workshop_admin import _post_inline

    workshop = make_workshop(title="Pottery")
    added = admin_client.post(
        "/admin/workshops/attendee/add/",
        {"name": "Zoë Müller", "email": "zoe@bücher.example", "language": "en"},
    )
    assert added.status_code == 302, added.content.decode()[:300]
    zoe = Attendee.objects.get(email="zoe@bücher.example")
    inline = _post_inline(admin_client, workshop, [("", zoe.pk, "active")])
    assert inline.status_code == 302
    bo = Attendee.objects.create(name="Bo", email="bo@example.net")
    enrollment_create(attendee=bo, workshop=workshop)
    reminders_plan(clock=clock)
    echoes = {
        zoe: "550 Dear Zoë, <zoe@xn--bcher-kva.example> is unknown",
        bo: "550 Hi Bo, mailbox <BO@example.net> full",
    }
    for person, error in echoes.items():
        reminder = Reminder.objects.get(attendee=person)
        claim = reminder_claim_batch(ids=[reminder.pk], channel="smtp", worker="t", clock=clock)
        [claimed] = claim.reminders
        reminder_record_batch(
            claim=claim,
            results=[result_for(claimed, Outcome.PERMANENT, error=error)],
            clock=clock,
        )
    StaffDecision.objects.create(
        action="send_test", actor_name="x", created_at=clock.now(), selected=0, changed=0,
        outcome="previewed as zoe@xn--bcher-kva.example (Zoë Müller)",
        reason="Bob and Bo checked the text",
    )  # fmt: skip
    logged = LogEntry.objects.values_list("object_repr", "change_message")
    assert any("zoe@bücher.example" in repr_ for repr_, _ in logged), "nothing to erase"
    assert any("Z\\u00f6" in message or "Zo\\u00eb" in message for _, message in logged)

    attendees_erase(attendees=Attendee.objects.filter(pk__in=[zoe.pk, bo.pk]), reason="asked",
                    actor=eraser, clock=clock)  # fmt: skip

    texts = [
        *(f"{r} {m}" for r, m in LogEntry.objects.values_list("object_repr", "change_message")),
        *Reminder.objects.values_list("last_error", flat=True),
        *Reminder.objects.values_list("status_reason", flat=True),
        *DeliveryAttempt.objects.values_list("error", flat=True),
        *StaffDecision.objects.values_list("reason", flat=True),
        *StaffDecision.objects.values_list("outcome", flat=True),
    ]
    blob = "\n".join(texts)
    for trace in ("zoe@", "Zoë", "Zo\\u00eb", "Müller", "M\\u00fcller", "xn--bcher", "bo@"):
        assert trace.lower() not in blob.lower(), trace
    assert "550 Dear [erased], <[erased]> is unknown" in texts
    assert "550 Hi [erased], mailbox <[erased]> full" in texts
    # Other people's notes keep ordinary words: "Bo" alone is scrubbed only where it is hers.
    assert "Bob and Bo checked the text" in texts
    attendee_type = ContentType.objects.get_for_model(Attendee)
    assert LogEntry.objects.filter(content_type=attendee_type, object_id=str(zoe.pk)).exists()


def test_the_erasures_own_reason_does_not_keep_the_name_or_address(ada, eraser, clock):
    """Staff naturally say whose data they erase ("Ada Lovelace asked ..."): the erasure's
    own decision is a staff note too, and keeps no form of the name or address."""
    attendee, *_ = ada
    attendees_erase(
        attendees=Attendee.objects.filter(pk=attendee.pk),
        reason=f"{NAME} <{EMAIL}> asked by email, ticket 4711",
        actor=eraser,
        clock=clock,
    )
    audit = StaffDecision.objects.get(action="erase")
    assert audit.reason == "[erased] <[erased]> asked by email, ticket 4711"


def test_a_decision_naming_her_is_scrubbed_from_the_other_reminders_it_was_copied_to(
    make_reminders, resolver, eraser, clock
):
    """A resolution copies its reason into each reminder's status reason: one naming Ada,
    over her reminder and Bob's, kept her name on Bob's."""
    ids = make_reminders(2, "unknown")
    ada, bob = (Reminder.objects.get(pk=pk).attendee for pk in ids)
    Attendee.objects.filter(pk=ada.pk).update(name=NAME, email=EMAIL)
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk__in=ids),
        decision="mark_sent",
        reason=f"{NAME} says both of them got it",
        actor=resolver,
        clock=clock,
    )
    attendees_erase(
        attendees=Attendee.objects.filter(pk=ada.pk), reason="GDPR", actor=eraser, clock=clock
    )
    reasons = list(Reminder.objects.filter(pk__in=ids).values_list("status_reason", flat=True))
    assert reasons == ["marked as sent by resolver: [erased] says both of them got it"] * 2


def test_names_and_addresses_she_had_before_a_correction_are_scrubbed_too(
    admin_client, make_workshop, eraser, clock
):
    """The admin's history keeps the reprs of before a correction ("Added" with her old
    address, an enrollment and a workshop's inline quoting it), and a provider's error from
    then quotes it: the erasure took only her name and address as they are now."""
    from django.contrib.admin.models import LogEntry

    from reminders.services import reminders_plan
    from tests.admin.test_workshop_admin import _post_inline

    pottery, weaving = make_workshop(title="Pottery"), make_workshop(title="Weaving")
    added = admin_client.post(
        "/admin/workshops/attendee/add/",
        {"name": "Ada Byron", "email": "ada.byron@old.example", "language": "en"},
    )
    assert added.status_code == 302, added.content.decode()[:300]
    ada = Attendee.objects.get(email="ada.byron@old.example")
    assert _post_inline(admin_client, pottery, [("", ada.pk, "active")]).status_code == 302
    enrolled = admin_client.post(
        "/admin/workshops/enrollment/add/",
        {"attendee": ada.pk, "workshop": weaving.pk, "status": "active"},
    )
    assert enrolled.status_code == 302, enrolled.content.decode()[:300]
    reminders_plan(clock=clock)
    reminder = Reminder.objects.get(attendee=ada, workshop=pottery)
    claim = reminder_claim_batch(ids=[reminder.pk], channel="smtp", worker="t", clock=clock)
    reminder_record_batch(
        claim=claim,
        results=[
            result_for(
                claim.reminders[0],
                Outcome.TRANSIENT,
                error="451 Dear Ada Byron, <ada.byron@old.example> try later",
            )
        ],
        clock=clock,
    )
    corrected = admin_client.post(
        f"/admin/workshops/attendee/{ada.pk}/change/",
        {"name": NAME, "email": EMAIL, "language": "en"},
    )
    assert corrected.status_code == 302, corrected.content.decode()[:300]
    logged = "\n".join(
        f"{r} {m}" for r, m in LogEntry.objects.values_list("object_repr", "change_message")
    )
    assert "ada.byron@old.example" in logged and "Ada Byron" in logged, "nothing to erase"

    attendees_erase(
        attendees=Attendee.objects.filter(pk=ada.pk), reason="asked", actor=eraser, clock=clock
    )

    texts = [
        *(f"{r} {m}" for r, m in LogEntry.objects.values_list("object_repr", "change_message")),
        *Reminder.objects.values_list("last_error", flat=True),
        *DeliveryAttempt.objects.values_list("error", flat=True),
    ]
    blob = "\n".join(texts).lower()
    for trace in ("old.example", "byron", NAME.lower(), EMAIL.lower()):
        assert trace not in blob, (trace, texts)
    assert "451 Dear [erased], <[erased]> try later" in texts


@pytest.mark.parametrize("quoted, cut", [(NAME, "Ada Lovel"), (EMAIL, "Ada.Lovelace@Exam")])
def test_a_name_or_address_cut_off_at_the_end_of_a_status_reason_is_scrubbed(
    make_reminders, resolver, eraser, clock, quoted, cut
):
    """A status reason is cut to 200 characters when written: a resolution's reason naming
    Ada just there left "Ada Lovel" (or the start of her address) on her reminder and Bob's,
    which the scrubber did not recognise as hers."""
    ids = make_reminders(2, "unknown")
    ada = Reminder.objects.get(pk=ids[0]).attendee
    Attendee.objects.filter(pk=ada.pk).update(name=NAME, email=EMAIL)
    prefix = "marked as sent by resolver: "
    filler = ("the provider's log shows delivery " * 10)[: 200 - len(prefix) - len(cut) - 1]
    reason = f"{filler} {quoted} confirmed"
    reminder_resolve_unknown(
        reminders=Reminder.objects.filter(pk__in=ids),
        decision="mark_sent",
        reason=reason,
        actor=resolver,
        clock=clock,
    )
    reasons = list(Reminder.objects.filter(pk__in=ids).values_list("status_reason", flat=True))
    assert all(text.endswith(f" {cut}") for text in reasons), reasons
    attendees_erase(
        attendees=Attendee.objects.filter(pk=ada.pk), reason="GDPR", actor=eraser, clock=clock
    )
    reasons = list(Reminder.objects.filter(pk__in=ids).values_list("status_reason", flat=True))
    assert reasons == [f"{prefix}{filler} [erased]"] * 2

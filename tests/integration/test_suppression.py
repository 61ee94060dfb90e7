"""Addresses that bounced hard or complained get no more reminders (issue 37, item 3).

Real HTTP both ways: reminders go to the loopback provider through the http channel,
its reports come back as signed POSTs to the live server, and the next reminder to a
suppressed address is refused before any call.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import httpx
import pytest
from django.db import connection

from clock import SystemClock
from loopback.http_sink import HttpSink
from reminders.models import Notice, Reminder, StaffDecision, Suppression
from reminders.services.erasure import attendees_erase
from reminders.services.feedback import address_key
from reminders.services.suppression_decisions import suppressions_lift
from reminders.worker import pipeline
from reminders.worker.notices import deliver_notices
from tests.admin.conftest import post_action
from tests.support.races import Step
from workshops.models import Attendee
from workshops.services import attendee_get_or_create, enrollment_create, workshop_update

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "callback-secret-0a1b2c3d4e5f6a7b8c9d"
SEND_SECRET = "send-secret-0a1b2c3d4e5f6a7b8c9d0e1f"


@pytest.fixture
def provider(live_clock, published, settings):
    settings.REMINDERS_HTTP_CALLBACK_SECRET = SECRET
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    with HttpSink(secret=SEND_SECRET) as sink:
        settings.REMINDERS_CHANNEL = "http"
        settings.REMINDERS_HTTP_URL = sink.url
        settings.REMINDERS_HTTP_SECRET = SEND_SECRET
        yield sink


@pytest.fixture
def send(provider, live_clock, published):
    """Scan and deliver whatever is due; return the keys the provider received."""

    def send() -> list[str]:
        before = len(provider.requests)
        published.clear()
        pipeline.scan(clock=live_clock)
        for batch in list(published):
            pipeline.deliver(batch, clock=live_clock)
        return [request.key for request in provider.requests[before:]]

    return send


@pytest.fixture
def report(live_server, live_clock):
    """POST one signed report for ``key`` to the live server."""
    counter = iter(range(1, 1_000_000))

    def report(key: str, kind: str, *, bounce: str | None = None, minutes: int = 0) -> None:
        at = live_clock.now() + timedelta(minutes=minutes)
        event = {"id": f"r{next(counter)}", "key": key, "type": kind, "at": at.isoformat()}
        if bounce:
            event["bounce"] = bounce
            event["reason"] = "550 5.1.1 mailbox unknown"
        body = json.dumps({"events": [event]}).encode()
        stamp = str(int(live_clock.now().timestamp()))
        digest = hmac.new(SECRET.encode(), stamp.encode() + b"\n" + body, hashlib.sha256)
        answer = httpx.post(
            f"{live_server.url}/hooks/http/events",
            content=body,
            headers={"X-Reminders-Timestamp": stamp, "X-Reminders-Signature": f"sha256={digest.hexdigest()}"},
            timeout=10,
        )  # fmt: skip
        assert answer.json()["recorded"] == 1, answer.text

    return report


@pytest.fixture
def workshops_for(make_workshop):
    """Enrol ``attendees`` in a new workshop starting within the lead; return its reminders' keys."""
    hours = iter(range(2, 20))

    def make(*attendees) -> dict[int, str]:
        workshop = make_workshop(starts_in=timedelta(hours=next(hours)))
        for attendee in attendees:
            enrollment_create(attendee=attendee, workshop=workshop)
        return dict(Reminder.objects.filter(workshop=workshop).values_list("attendee_id", "key"))

    return make


def _people(*names: str) -> list[Attendee]:
    return [attendee_get_or_create(email=f"{name}@example.org", name=name)[0] for name in names]


def test_a_hard_bounce_stops_the_next_reminder_to_that_address_before_any_call(
    send, report, workshops_for
):
    ada, bob = _people("ada", "bob")
    first = workshops_for(ada, bob)
    assert sorted(send()) == sorted(first.values())
    report(first[ada.pk], "bounced", bounce="hard")

    second = workshops_for(ada, bob)
    assert send() == [second[bob.pk]]  # no call for Ada's
    refused = Reminder.objects.get(key=second[ada.pk])
    suppression = Suppression.objects.get()
    assert (refused.status, refused.last_error) == (
        "failed",
        f"suppressed: bounced on {suppression.caused_at:%Y-%m-%d}",
    )
    assert suppression.address == "ada@example.org" and suppression.cause == "bounced"
    assert Reminder.objects.get(key=second[bob.pk]).status == "sent"


def test_a_report_after_a_correction_suppresses_the_address_the_message_went_to(
    send, report, workshops_for, provider, live_clock, notices_published, settings, admin_user
):
    """Staff correct Lea's address after her reminder and change notice went out; the hard
    bounce and the complaint then reported name the old address, not the corrected one, and
    her next reminder goes to the corrected one."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    lea, max_ = _people("lea", "max")
    first = workshops_for(lea, max_)
    send()
    workshop_update(workshop=Reminder.objects.get(key=first[max_.pk]).workshop, location="Room 4")
    notices_published.clear()
    pipeline.scan(clock=live_clock)
    pipeline.scan(clock=live_clock)
    for batch in list(notices_published):
        deliver_notices(batch, clock=live_clock)
    notice = Notice.objects.get(reminder__key=first[max_.pk])
    sent_to = {r.key: r.json()["recipient"]["email"] for r in provider.requests}
    assert (sent_to[first[lea.pk]], sent_to[notice.key]) == ("lea@example.org", "max@example.org")
    for attendee in (lea, max_):
        attendee.email = f"{attendee.name}@example.net"
        attendee.save()

    report(first[lea.pk], "bounced", bounce="hard")
    report(notice.key, "complained")
    suppressed = dict(Suppression.objects.values_list("address", "cause"))
    assert suppressed == {"lea@example.org": "bounced", "max@example.org": "complained"}
    second = workshops_for(lea, max_)
    assert sorted(send()) == sorted(second.values())
    sent_to = {r.key: r.json()["recipient"]["email"] for r in provider.requests}
    assert sent_to[second[lea.pk]] == "lea@example.net"
    # Erased, she leaves no address behind: neither where her messages went nor the old one.
    attendees_erase(attendees=Attendee.objects.filter(pk=lea.pk), reason="asked", actor=admin_user)
    assert not Reminder.objects.filter(attendee=lea).exclude(sent_to="").exists()
    assert not Suppression.objects.filter(address__startswith="lea@").exists()


def test_a_notice_goes_to_the_address_its_claim_records_though_corrected_at_once(
    send, report, workshops_for, provider, live_clock, notices_published, settings
):
    """Staff correct Ola's address just after her change notice's claim recorded the old one,
    before the worker read her to write the message: it goes to the recorded address, so the
    bounce reported for it suppresses the address it went to."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    (ola,) = _people("ola")
    first = workshops_for(ola)
    send()
    workshop_update(workshop=Reminder.objects.get(key=first[ola.pk]).workshop, location="Room 5")
    notices_published.clear()
    pipeline.scan(clock=live_clock)
    pipeline.scan(clock=live_clock)
    notice_table = connection.ops.quote_name(Notice._meta.db_table)
    corrected = []

    def correct_after_the_claim(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith(f"UPDATE {notice_table}") and "sent_to" in sql and not corrected:
            correction = Step(
                lambda: Attendee.objects.filter(pk=ola.pk).update(email="ola@example.net")
            )
            correction.start()
            corrected.append(correction.finish())
        return result

    with connection.execute_wrapper(correct_after_the_claim):
        for batch in list(notices_published):
            deliver_notices(batch, clock=live_clock)
    assert corrected == [1]
    notice = Notice.objects.get(reminder__key=first[ola.pk])
    called = {r.key: r.json()["recipient"]["email"] for r in provider.requests}
    assert (notice.status, called[notice.key], notice.sent_to) == (
        "sent",
        "ola@example.org",
        "ola@example.org",
    )
    report(notice.key, "bounced", bounce="hard")
    assert Suppression.objects.get().address == "ola@example.org"


def test_each_chunk_reads_suppressions_as_it_claims_even_after_an_address_changes(
    provider, published, live_clock, workshops_for, monkeypatch, settings
):
    """A batch reads its addresses once; each chunk's claim reads their suppressions in its
    own statement. Between the chunks, Gus's address is suppressed and Hal's changes to one
    suppressed before the batch began: neither gets a call."""
    settings.REMINDERS_CONCURRENCY = 2
    suppress("ida@example.org")  # an address no attendee holds yet
    people = _people("ann", "ben", "gus", "hal")
    keys = workshops_for(*people)
    published.clear()
    pipeline.scan(clock=live_clock)
    (batch,) = published
    by_id = dict(Reminder.objects.values_list("pk", "attendee_id"))
    second = [by_id[pk] for pk in batch[2:]]
    gus, hal = (Attendee.objects.get(pk=pk) for pk in second)
    claim = pipeline.reminder_claim_batch
    claims = []

    def between_the_chunks(**kwargs):
        claims.append(kwargs["ids"])
        if len(claims) == 2:
            suppress(gus.email)
            Attendee.objects.filter(pk=hal.pk).update(email="ida@example.org")
        return claim(**kwargs)

    monkeypatch.setattr(pipeline, "reminder_claim_batch", between_the_chunks)
    pipeline.deliver(batch, clock=live_clock)

    assert claims == [batch[:2], batch[2:]]
    called = {request.key for request in provider.requests}
    assert called == {keys[pk] for pk in keys if pk not in second}
    for attendee in (gus, hal):
        refused = Reminder.objects.get(key=keys[attendee.pk])
        assert (refused.status, refused.last_error[:19]) == ("failed", "suppressed: bounced")


def suppress(email: str) -> None:
    now = SystemClock().now()
    Suppression.objects.create(
        address_key=address_key(email),
        address=email,
        cause="bounced",
        caused_at=now,
        created_at=now,
    )


def test_a_complaint_suppresses_and_soft_bounces_only_in_a_run(
    send, report, workshops_for, settings
):
    settings.REMINDERS_SOFT_BOUNCES_TO_SUPPRESS = 3
    cleo, dan = _people("cleo", "dan")
    sent = [workshops_for(cleo, dan) for _ in range(4)]
    for _ in sent:
        send()
    report(sent[0][cleo.pk], "complained")
    assert Suppression.objects.get().cause == "complained"

    # Dan: soft, soft, delivered, soft, soft: never three in a row.
    for minutes, (keys, kind) in enumerate(
        zip(
            sent + [sent[3]], ["bounced", "bounced", "delivered", "bounced", "bounced"], strict=True
        )
    ):
        report(keys[dan.pk], kind, bounce="soft" if kind == "bounced" else None, minutes=minutes)
    assert not Suppression.objects.filter(address="dan@example.org").exists()
    report(sent[3][dan.pk], "bounced", bounce="soft", minutes=10)
    assert Suppression.objects.get(address="dan@example.org").cause == "bounced"


def test_soft_bounces_count_at_the_address_they_went_to(send, report, workshops_for, settings):
    """Two soft bounces at Liv's old address, then her correction and one at the new: no
    three in a row at either address. Two more at the new one make three there."""
    settings.REMINDERS_SOFT_BOUNCES_TO_SUPPRESS = 3
    (liv,) = _people("liv")
    old = [workshops_for(liv) for _ in range(2)]
    send()
    liv.email = "liv@example.net"
    liv.save()
    new = [workshops_for(liv) for _ in range(3)]
    send()
    sent_to = dict(Reminder.objects.values_list("key", "sent_to"))
    assert {sent_to[keys[liv.pk]] for keys in old} == {"liv@example.org"}
    assert {sent_to[keys[liv.pk]] for keys in new} == {"liv@example.net"}
    for minutes, keys in enumerate([*old, new[0]]):
        report(keys[liv.pk], "bounced", bounce="soft", minutes=minutes)
    assert not Suppression.objects.exists()
    for minutes, keys in enumerate(new[1:], start=5):
        report(keys[liv.pk], "bounced", bounce="soft", minutes=minutes)
    assert list(Suppression.objects.values_list("address", "cause")) == [
        ("liv@example.net", "bounced")
    ]


def test_a_report_for_a_message_whose_address_was_not_recorded_suppresses_the_attendees(
    send, report, workshops_for
):
    """A message sent whose address is blank (none recorded, as the field allows) is taken to
    have gone to the attendee's address, as the upgrade took those sent before: its hard
    bounce suppresses that address, not an empty one."""
    (uma,) = _people("uma")
    first = workshops_for(uma)
    send()
    Reminder.objects.filter(key=first[uma.pk]).update(sent_to="")
    report(first[uma.pk], "bounced", bounce="hard")
    suppression = Suppression.objects.get()
    assert (suppression.address, suppression.address_key) == (
        "uma@example.org",
        address_key("uma@example.org"),
    )


def test_a_complaint_about_a_change_notice_suppresses_the_address(
    send, report, workshops_for, provider, live_clock, notices_published, settings
):
    """A notice goes out under its own key; the provider's report names that key."""
    settings.REMINDERS_NOTICE_SETTLE = 0
    gil, hap = _people("gil", "hap")
    first = workshops_for(gil, hap)
    send()
    workshop = Reminder.objects.get(key=first[gil.pk]).workshop
    workshop_update(workshop=workshop, location="Room 9")
    notices_published.clear()
    pipeline.scan(clock=live_clock)
    pipeline.scan(clock=live_clock)
    before = len(provider.requests)
    for batch in list(notices_published):
        deliver_notices(batch, clock=live_clock)
    notice = Notice.objects.get(reminder__key=first[gil.pk])
    assert notice.status == "sent" and notice.key in {r.key for r in provider.requests[before:]}

    report(notice.key, "complained")  # recorded, not dropped as naming no message sent here
    assert Suppression.objects.get().address == "gil@example.org"
    second = workshops_for(gil, hap)
    assert send() == [second[hap.pk]]


def test_a_lift_starts_the_run_of_soft_bounces_again(
    send, report, workshops_for, settings, admin_user, live_clock
):
    """Three soft bounces suppress; once staff lift it, one more soft bounce does not."""
    settings.REMINDERS_SOFT_BOUNCES_TO_SUPPRESS = 3
    (kit,) = _people("kit")
    sent = [workshops_for(kit) for _ in range(6)]
    send()
    for minutes, keys in enumerate(sent[:3]):
        report(keys[kit.pk], "bounced", bounce="soft", minutes=minutes)
    assert Suppression.objects.get().cause == "bounced"
    live_clock.advance(60)
    suppressions_lift(
        suppressions=Suppression.objects.all(), reason="mailbox emptied", actor=admin_user
    )
    live_clock.advance(60)
    report(sent[3][kit.pk], "bounced", bounce="soft", minutes=5)
    assert not Suppression.objects.filter(lifted_at__isnull=True).exists()
    # A new run of three suppresses again.
    report(sent[4][kit.pk], "bounced", bounce="soft", minutes=6)
    report(sent[5][kit.pk], "bounced", bounce="soft", minutes=7)
    assert Suppression.objects.filter(lifted_at__isnull=True).count() == 1


def test_staff_lift_a_suppression_with_a_reason_and_reminders_go_again(
    send, report, workshops_for, admin_client
):
    (eve,) = _people("eve")
    first = workshops_for(eve)
    send()
    report(first[eve.pk], "bounced", bounce="hard")
    suppression = Suppression.objects.get()
    changelist = "/admin/reminders/suppression/"
    page = post_action(admin_client, changelist, "lift_selected", [suppression.pk])
    assert "Lift the selected suppressions" in page.content.decode()
    # No reason, no lift.
    post_action(admin_client, changelist, "lift_selected", [suppression.pk], confirm=True)
    assert Suppression.objects.get().lifted_at is None
    reason = "the mailbox exists again (asked Eve)"
    page = post_action(
        admin_client, changelist, "lift_selected", [suppression.pk], confirm=True, reason=reason
    )
    assert "Lifted 1 suppression" in page.content.decode()
    lifted = Suppression.objects.get()
    assert lifted.lifted_at is not None
    decision = StaffDecision.objects.get(action="lift_suppress")
    assert lifted.lift_decision == decision and decision.reason.startswith("the mailbox exists")
    second = workshops_for(eve)
    assert send() == [second[eve.pk]]


def test_the_suppression_list_filters_those_in_force_from_those_lifted(
    send, report, workshops_for, admin_client
):
    ida, jon = _people("ida", "jon")
    first = workshops_for(ida, jon)
    send()
    report(first[ida.pk], "bounced", bounce="hard")
    report(first[jon.pk], "complained")
    changelist = "/admin/reminders/suppression/"
    lifted = Suppression.objects.get(address="ida@example.org")
    post_action(
        admin_client, changelist, "lift_selected", [lifted.pk], confirm=True, reason="asked Ida"
    )
    in_force = Suppression.objects.get(address="jon@example.org")

    def listed(query: str) -> list[int]:
        page = admin_client.get(f"{changelist}{query}")
        assert page.status_code == 200
        return sorted(row.pk for row in page.context["cl"].result_list)

    assert listed("") == sorted([lifted.pk, in_force.pk])
    assert listed("?live=yes") == [in_force.pk]
    assert listed("?live=no") == [lifted.pk]
    page = admin_client.get(changelist).content.decode()
    assert 'href="?live=yes"' in page and 'href="?live=no"' in page


def test_an_erased_address_stays_suppressed_without_being_kept(
    send, report, workshops_for, admin_user
):
    (fay,) = _people("fay")
    first = workshops_for(fay)
    send()
    report(first[fay.pk], "complained")
    attendees_erase(attendees=Attendee.objects.filter(pk=fay.pk), reason="asked", actor=admin_user)
    kept = Suppression.objects.get()
    assert kept.address == "" and "fay" not in str(kept)
    # The same person enrols again, as a new attendee with the same address.
    (again,) = _people("fay")
    assert again.pk != fay.pk
    second = workshops_for(again)
    assert send() == []
    assert Reminder.objects.get(key=second[again.pk]).last_error.startswith(
        "suppressed: complained"
    )


def test_an_address_is_suppressed_however_its_domain_is_spelled(send, report, workshops_for):
    """Ana's reminder to ana@bücher.example bounced hard. The same mailbox written with the
    domain in punycode (as it goes on the wire), or with the ü decomposed, is the address
    the provider refused: no call for either."""
    (ana,) = [attendee_get_or_create(email="ana@bücher.example", name="Ana")[0]]
    first = workshops_for(ana)
    assert send() == [first[ana.pk]]
    report(first[ana.pk], "bounced", bounce="hard")
    spellings = ["ana@xn--bcher-kva.example", "ana@bu\u0308cher.example"]
    others = [attendee_get_or_create(email=email, name="Ana")[0] for email in spellings]
    assert len({ana.pk, *(other.pk for other in others)}) == 3
    second = workshops_for(*others)
    called = send()
    statuses = {
        Attendee.objects.get(pk=pk).email: Reminder.objects.get(key=key).status
        for pk, key in second.items()
    }
    assert (called, statuses) == ([], dict.fromkeys(spellings, "failed"))


@pytest.mark.slow
@pytest.mark.long
def test_end_to_end_a_real_worker_makes_no_call_for_an_address_that_bounced(live_server, settings):
    """A Celery worker sends through the http channel; the provider posts a hard bounce for
    Ada's reminder; the next workshop's reminder to Ada makes no call and says why, while
    Bob's goes out."""
    from config.celery import app
    from tests.support.processes import celery_worker, process_env
    from tests.support.races import wait_until
    from workshops.models import Enrollment, Workshop

    settings.REMINDERS_HTTP_CALLBACK_SECRET = SECRET
    now = SystemClock().now()
    ada, bob = (
        Attendee.objects.create(name=name, email=f"{name}@example.org") for name in ("ada", "bob")
    )

    def workshop(hours: int) -> dict[int, str]:
        starts = now + timedelta(hours=hours)
        held = Workshop.objects.create(
            title=f"In {hours} hours", starts_at=starts, ends_at=starts + timedelta(hours=1),
            timezone="Europe/Berlin",
        )  # fmt: skip
        Enrollment.objects.bulk_create(Enrollment(attendee=a, workshop=held) for a in (ada, bob))
        app.send_task("reminders.scan")
        wait_until(
            lambda: (
                Reminder.objects.filter(workshop=held, status__in=["sent", "failed"]).count() == 2
            ),
            what="both reminders of the workshop to end",
        )
        return dict(Reminder.objects.filter(workshop=held).values_list("attendee_id", "key"))

    with HttpSink(secret=SEND_SECRET) as sink:
        env = process_env(
            REMINDERS_CHANNEL="http", REMINDERS_HTTP_URL=sink.url,
            REMINDERS_HTTP_SECRET=SEND_SECRET,
        )  # fmt: skip
        with celery_worker(env, name="suppressing"):
            first = workshop(2)
            body = json.dumps({"events": [{
                "id": "e2e-1", "key": first[ada.pk], "type": "bounced", "bounce": "hard",
                "at": SystemClock().now().isoformat(), "reason": "550 5.1.1 unknown user",
            }]}).encode()  # fmt: skip
            stamp = str(int(SystemClock().now().timestamp()))
            digest = hmac.new(SECRET.encode(), stamp.encode() + b"\n" + body, hashlib.sha256)
            answer = httpx.post(
                f"{live_server.url}/hooks/http/events",
                content=body,
                headers={"X-Reminders-Timestamp": stamp,
                         "X-Reminders-Signature": f"sha256={digest.hexdigest()}"},
                timeout=10,
            )  # fmt: skip
            assert answer.json() == {"recorded": 1, "duplicates": 0, "dropped": 0}
            second = workshop(3)
        keys = [request.key for request in sink.requests]

    assert sorted(keys) == sorted([first[ada.pk], first[bob.pk], second[bob.pk]])
    refused = Reminder.objects.get(key=second[ada.pk])
    assert refused.status == "failed"
    assert refused.last_error.startswith("suppressed: bounced on ")
    assert Reminder.objects.get(key=second[bob.pk]).status == "sent"

"""The http provider's signed reports after it accepted a reminder: POST /hooks/http/events.

Real HTTP POSTs to the test's live server, signed as delivery/HTTP_CONTRACT.md says.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.conf import settings as django_settings

from delivery.results import DeliveryResult, Outcome
from reminders.models import DeliveryEvent, Reminder, Suppression
from reminders.services.claim import reminder_claim_batch
from reminders.services.erasure import attendees_erase
from reminders.services.record import reminder_record_batch
from reminders.trace import trace_lines
from reminders.worker import pipeline
from workshops.models import Attendee

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "callback-secret-0a1b2c3d4e5f6a7b8c9d"
CONTRACT = Path(__file__).resolve().parents[2] / "delivery" / "HTTP_CONTRACT.md"


def _contract_signer():
    """The contract's sample callback signer, run as it stands in the document."""
    blocks = re.findall(r"```python\n(.*?)```", CONTRACT.read_text(), flags=re.DOTALL)
    [code] = [block for block in blocks if "def sign_events(" in block]
    namespace: dict = {}
    exec(compile(code, str(CONTRACT), "exec"), namespace)  # the document's own code
    return namespace["sign_events"]


def _signed(body: bytes, *, at: float, secret: str = SECRET) -> dict[str, str]:
    timestamp = str(int(at))
    digest = hmac.new(secret.encode(), timestamp.encode() + b"\n" + body, hashlib.sha256)
    return {
        "X-Reminders-Timestamp": timestamp,
        "X-Reminders-Signature": f"sha256={digest.hexdigest()}",
    }


def _event(key: str, kind: str, *, event_id: str, at: str, **extra) -> dict:
    return {"id": event_id, "key": key, "type": kind, "at": at, **extra}


@pytest.fixture
def sent(live_clock, due_reminders, settings):
    """The keys of three reminders marked sent (tests/integration/test_suppression.py sends
    through a real worker and provider first)."""
    settings.REMINDERS_HTTP_CALLBACK_SECRET = SECRET
    ids = due_reminders(3)
    Reminder.objects.filter(pk__in=ids).update(status="sent")
    return list(Reminder.objects.filter(pk__in=ids).order_by("pk").values_list("key", flat=True))


@pytest.fixture
def post(live_server, live_clock):
    def post(document, *, headers=None, raw: bytes | None = None):
        body = raw if raw is not None else json.dumps(document).encode()
        signed = _signed(body, at=live_clock.now().timestamp()) if headers is None else headers
        return httpx.post(
            f"{live_server.url}/hooks/http/events",
            content=body,
            headers={"Content-Type": "application/json", **signed},
            timeout=10,
        )

    return post


def test_reports_signed_as_the_contract_says_show_on_each_reminder(
    sent, post, live_clock, live_server
):
    first, second, third = sent
    now = live_clock.now()
    events = [
        _event(first, "delivered", event_id="e1", at=now.isoformat()),
        _event(second, "deferred", event_id="e2", at=now.isoformat(), reason="mailbox full, retrying"),
        _event(second, "bounced", event_id="e3", at=(now + timedelta(seconds=5)).isoformat(),
               bounce="soft", reason="452 4.2.2 over quota"),
        _event(third, "complained", event_id="e4", at=now.isoformat()),
    ]  # fmt: skip
    body = json.dumps({"events": events}).encode()
    # The document's own signer, as a provider would copy it.
    headers = _contract_signer()(SECRET, body, timestamp=int(now.timestamp()))
    answer = post(None, raw=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"recorded": 4, "duplicates": 0, "dropped": 0}
    by_key = {r.key: r for r in Reminder.objects.all()}
    states = {key: list(by_key[key].delivery_events.values_list("kind", "bounce")) for key in sent}
    assert states == {
        first: [("delivered", "")],
        second: [("deferred", ""), ("bounced", "soft")],
        third: [("complained", "")],
    }
    assert any(
        "provider reports on http: bounced (soft), 452 4.2.2 over quota (event e3" in line
        for line in trace_lines(by_key[second])
    )


def test_a_signature_in_upper_case_hex_is_taken(sent, post, live_clock):
    """The contract asks for the HMAC in hex, and some libraries write hex in upper case
    (Java's HexFormat.of().withUpperCase(), .NET's Convert.ToHexString): the same digits."""
    body = json.dumps(
        {"events": [_event(sent[0], "delivered", event_id="up", at=live_clock.now().isoformat())]}
    ).encode()
    headers = _signed(body, at=live_clock.now().timestamp())
    digest = headers["X-Reminders-Signature"].removeprefix("sha256=")
    headers["X-Reminders-Signature"] = "sha256=" + digest.upper()
    answer = post(None, raw=body, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["recorded"] == 1


def test_a_retried_report_is_recorded_once(sent, post, live_clock):
    document = {
        "events": [_event(sent[0], "delivered", event_id="d-1", at=live_clock.now().isoformat())]
    }
    assert post(document).json() == {"recorded": 1, "duplicates": 0, "dropped": 0}
    assert post(document).json() == {"recorded": 0, "duplicates": 1, "dropped": 0}
    assert DeliveryEvent.objects.count() == 1


def _bad_requests(at: float, key: str, when: str):
    good = json.dumps({"events": [_event(key, "delivered", event_id="x", at=when)]}).encode()
    send_direction = hmac.new(
        SECRET.encode(), b"\n".join((str(int(at)).encode(), key.encode(), good)), hashlib.sha256
    ).hexdigest()
    return {
        "unsigned": (good, {}, 401),
        "another key": (good, _signed(good, at=at, secret="x" * 32), 401),
        "ten minutes old": (good, _signed(good, at=at - 600), 401),
        "altered after signing": (good.replace(b"delivered", b"deferred "), _signed(good, at=at), 401),
        "the delivery direction's signature": (
            good,
            {"X-Reminders-Timestamp": str(int(at)), "X-Reminders-Signature": f"sha256={send_direction}"},
            401,
        ),
        "malformed signature": (good, {"X-Reminders-Timestamp": "soon", "X-Reminders-Signature": "md5=1"}, 401),
        "not JSON": (b"{events", None, 400),
        "no list": (b'{"events": {}}', None, 400),
        "an unknown type": (good.replace(b'"delivered"', b'"opened"'), None, 400),
        "a bounce without its kind": (good.replace(b'"delivered"', b'"bounced"'), None, 400),
        "a time without offset": (good.replace(when.encode(), b"2026-03-02T09:00:00"), None, 400),
        # Stored by PostgreSQL, past what Python reads back: every page listing it would fail.
        "a time out of range": (good.replace(when.encode(), b"9999-12-31T23:59:59-14:00"), None, 400),
        "one good and one bad": (
            json.dumps({"events": [json.loads(good)["events"][0], {"id": "y", "key": key}]}).encode(),
            None,
            400,
        ),
    }  # fmt: skip


def test_every_bad_request_is_refused_and_records_nothing(sent, post, live_clock):
    """Each kind of bad request in turn (one live server for all): its status, a problem
    document, and no row."""
    now = live_clock.now()
    wrong = []
    for case, (body, headers, status) in _bad_requests(
        now.timestamp(), sent[0], now.isoformat()
    ).items():
        if headers is None:
            headers = _signed(body, at=now.timestamp())
        answer = post(None, raw=body, headers=headers)
        problem = (
            answer.json() if answer.headers["Content-Type"] == "application/problem+json" else {}
        )
        if (
            answer.status_code != status
            or problem.get("status") != status
            or not problem.get("detail")
            or (status == 400 and not problem.get("errors"))
            or DeliveryEvent.objects.exists()
        ):
            wrong.append(f"{case}: {answer.status_code} {answer.text[:200]}")
            DeliveryEvent.objects.all().delete()  # the next case starts clean
    assert wrong == [], "\n".join(wrong)
    assert len(_bad_requests(0, "k", "t")) == 13


def test_a_nul_character_is_refused_or_dropped_not_answered_with_a_500(sent, post, live_clock):
    """PostgreSQL stores no NUL in text: a 500 would have the provider retry the same body
    forever. A reason quoting one (a raw SMTP reply) is kept without it; an id or key with
    one names nothing and is refused, as any malformed event."""
    when = live_clock.now().isoformat()
    bounce = _event(sent[0], "bounced", event_id="n-1", at=when, bounce="hard",
                    reason="550 5.1.1 unknown\x00user")  # fmt: skip
    answer = post({"events": [bounce]})
    assert answer.json() == {"recorded": 1, "duplicates": 0, "dropped": 0}, answer.text
    assert DeliveryEvent.objects.get().reason == "550 5.1.1 unknownuser"
    for field in ("id", "key"):
        event = _event(sent[1], "delivered", event_id="n-2", at=when)
        event[field] += "\x00"
        answer = post({"events": [event]})
        assert answer.status_code == 400, answer.text
        assert answer.json()["errors"][0].startswith(f"events[0]: {field} ")
    assert DeliveryEvent.objects.count() == 1


def test_a_lone_surrogate_is_refused_or_replaced_not_answered_with_a_500(sent, post, live_clock):
    """JSON may escape half a UTF-16 pair ("\\ud800"); Python reads it, PostgreSQL's UTF-8
    cannot store it: a 500 would have the provider retry the same body forever. A reason keeps
    the rest of its text; an id or key with one names nothing and is refused."""
    when = live_clock.now().isoformat()
    outcomes = {}
    bounce = _event(sent[0], "bounced", event_id="s-1", at=when, bounce="hard",
                    reason="550 5.1.1 unknown\ud800user")  # fmt: skip
    answer = post({"events": [bounce]})
    outcomes["reason"] = (answer.status_code, answer.text[:120])
    for field in ("id", "key"):
        event = _event(sent[1], "delivered", event_id="s-2", at=when)
        event[field] += "\udfff"
        answer = post({"events": [event]})
        outcomes[field] = (answer.status_code, answer.text[:120])
    assert outcomes["reason"][0] == 200, outcomes
    assert DeliveryEvent.objects.get().reason == "550 5.1.1 unknown\ufffduser"
    assert [outcomes["id"][0], outcomes["key"][0]] == [400, 400], outcomes
    assert DeliveryEvent.objects.count() == 1


def test_a_body_past_the_size_limit_is_refused_with_what_to_do(sent, post, live_clock):
    """Within the contract's counts (1,000 events, reasons of 2,000 characters) a body can pass
    Django's 2.5 MB; it gets the contract's problem document, not Django's bare 400 page."""
    when = live_clock.now().isoformat()
    events = [
        _event(sent[0], "deferred", event_id=f"big-{i}", at=when, reason="é" * 2000)
        for i in range(300)
    ]
    answer = post({"events": events})
    assert answer.status_code == 413, answer.text[:200]
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert "split the events over several requests" in answer.json()["detail"]
    assert not DeliveryEvent.objects.exists()
    limit = f"{django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes per request"
    assert limit in CONTRACT.read_text()  # the contract quotes the limit that holds


def test_more_events_than_the_contract_allows_are_refused_as_too_large(sent, post, live_clock):
    """The contract: up to 1,000 events and 2,621,440 bytes per request, past that 413, split
    the events. A provider reading it splits on a 413 and gives up a 400 as a bad body."""
    when = live_clock.now().isoformat()
    events = [_event(sent[0], "delivered", event_id=f"many-{i}", at=when) for i in range(1001)]
    answer = post({"events": events})
    assert (answer.status_code, answer.headers["Content-Type"]) == (
        413,
        "application/problem+json",
    ), answer.text[:200]
    assert "split the events over several requests" in answer.json()["detail"]
    assert "Up to 1,000 events and" in CONTRACT.read_text()
    assert not DeliveryEvent.objects.exists()
    assert post({"events": events[:1000]}).json()["recorded"] == 1000


def test_an_rfc_3339_time_with_a_lower_case_t_and_z_is_taken(sent, post, live_clock):
    """RFC 3339 (section 5.6) lets "T" and "Z" be written "t" and "z": a provider writing
    them so follows the contract, and one such time must not refuse its whole request."""
    when = live_clock.now().replace(microsecond=0)
    written = when.strftime("%Y-%m-%dt%H:%M:%Sz")
    answer = post({"events": [_event(sent[0], "delivered", event_id="lower", at=written)]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"recorded": 1, "duplicates": 0, "dropped": 0}
    assert DeliveryEvent.objects.get().occurred_at == when


def test_the_refusal_names_each_bad_event(sent, post, live_clock):
    when = live_clock.now().isoformat()
    document = {
        "events": [
            _event(sent[0], "delivered", event_id="ok", at=when),
            _event(sent[1], "bounced", event_id="b", at=when),
            _event(sent[2], "opened", event_id="o", at=when),
        ]
    }
    answer = post(document)
    assert answer.status_code == 400
    assert answer.json()["errors"] == [
        'events[1]: a bounce needs "bounce": "hard" or "soft"',
        "events[2]: type must be one of delivered, deferred, bounced, complained, not 'opened'",
    ]
    assert not DeliveryEvent.objects.exists()


def test_reports_for_no_reminder_sent_here_or_an_erased_attendee_are_dropped(
    sent, post, live_clock, admin_user
):
    erased = Reminder.objects.get(key=sent[2]).attendee
    attendees_erase(
        attendees=Attendee.objects.filter(pk=erased.pk), reason="asked", actor=admin_user
    )
    pending = Reminder.objects.exclude(status="sent").values_list("key", flat=True).first()
    when = live_clock.now().isoformat()
    unknown = [
        _event("no-such-key", "bounced", event_id="u1", at=when, bounce="hard",
               reason="550 <stranger@example.org> unknown"),
        _event(sent[2], "bounced", event_id="u2", at=when, bounce="hard",
               reason="550 <erased@example.org> unknown"),
    ]  # fmt: skip
    if pending:
        unknown.append(_event(pending, "delivered", event_id="u3", at=when))
    answer = post({"events": unknown})
    assert answer.json() == {"recorded": 0, "duplicates": 0, "dropped": len(unknown)}
    assert not DeliveryEvent.objects.exists()


def test_a_report_arriving_before_the_worker_records_its_call_is_kept(
    live_clock, due_reminders, settings, post
):
    """A provider may report before the worker wrote what its call returned: while the
    reminder is still sending, or back pending for a retry after a call timed out (the
    provider had it; the retry under the same key sends nothing twice). Dropped, the report
    was lost for good: the provider had its 200."""
    settings.REMINDERS_HTTP_CALLBACK_SECRET = SECRET
    first, second = due_reminders(2)
    claim = reminder_claim_batch(ids=[first, second], channel="http", clock=live_clock)
    timed_out = DeliveryResult(
        reminder_id=second, key=Reminder.objects.get(pk=second).key, outcome=Outcome.TIMED_OUT,
        message_id=None, error="timed out", attempts=1, provider_reached=True,
        maybe_delivered=True,
    )  # fmt: skip
    reminder_record_batch(claim=claim, results=[timed_out], clock=live_clock)
    states = dict(Reminder.objects.values_list("pk", "status"))
    assert (states[first], states[second]) == ("sending", "pending")
    when = live_clock.now().isoformat()
    events = [
        _event(Reminder.objects.get(pk=pk).key, "bounced", event_id=f"early-{pk}", at=when,
               bounce="hard")
        for pk in (first, second)
    ]  # fmt: skip
    assert post({"events": events}).json() == {"recorded": 2, "duplicates": 0, "dropped": 0}
    assert Suppression.objects.count() == 2


def test_the_admin_filters_by_what_happened_after_sent(
    sent, post, live_clock, admin_client, settings
):
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    when = live_clock.now()
    post({"events": [
        _event(sent[0], "bounced", event_id="h", at=when.isoformat(), bounce="hard"),
        _event(sent[1], "bounced", event_id="s1", at=when.isoformat(), bounce="soft"),
        # A report that happened earlier but arrives later does not hide the newer one.
        _event(sent[1], "delivered", event_id="s0", at=(when - timedelta(minutes=1)).isoformat()),
    ]})  # fmt: skip
    listed = {}
    for state in ("bounced:hard", "bounced:soft", "delivered", "none"):
        page = admin_client.get("/admin/reminders/reminder/", {"delivery": state})
        assert page.status_code == 200
        listed[state] = sorted(r.key for r in page.context["cl"].result_list)
    assert listed == {
        "bounced:hard": [sent[0]],
        "bounced:soft": [sent[1]],
        "delivered": [],
        "none": sorted(Reminder.objects.exclude(key__in=sent[:2]).values_list("key", flat=True)),
    }
    page = admin_client.get("/admin/reminders/reminder/", {"delivery": "bounced:hard"})
    assert "Bounced (hard), " in page.content.decode()


def test_erasure_scrubs_the_address_a_bounce_quoted(sent, post, live_clock, admin_user):
    reminder = Reminder.objects.select_related("attendee").get(key=sent[0])
    address = reminder.attendee.email
    post({"events": [_event(sent[0], "bounced", event_id="q", at=live_clock.now().isoformat(),
                            bounce="hard", reason=f"550 5.1.1 <{address}>: no such user")]})  # fmt: skip
    assert address in DeliveryEvent.objects.get().reason
    attendees_erase(
        attendees=Attendee.objects.filter(pk=reminder.attendee_id), reason="asked", actor=admin_user
    )
    reason = DeliveryEvent.objects.get().reason
    assert address not in reason and address.split("@")[0] not in reason
    assert reason.startswith("550 5.1.1")


def test_a_report_recorded_while_its_attendee_is_erased_keeps_no_address(
    sent, live_clock, admin_user
):
    """The erasure commits between the report's read of its reminder (attendee not erased yet)
    and its insert: the bounce must not keep the address the erasure just scrubbed, neither in
    its reason nor in the suppression it causes."""
    from django.db import connection

    from reminders.services.feedback import ProviderEvent, delivery_events_record
    from tests.support.races import Step, blocked_or_done

    reminder = Reminder.objects.select_related("attendee").get(key=sent[0])
    address = reminder.attendee.email
    table = connection.ops.quote_name(DeliveryEvent._meta.db_table)
    erasures = []

    def erase_before_the_insert(execute, sql, params, many, context):
        if sql.startswith(f"INSERT INTO {table}") and not erasures:
            erasure = Step(
                lambda: attendees_erase(
                    attendees=Attendee.objects.filter(pk=reminder.attendee_id),
                    reason="asked",
                    actor=admin_user,
                )
            )
            erasures.append(erasure)
            erasure.start()
            blocked_or_done(erasure)
        return execute(sql, params, many, context)

    bounce = ProviderEvent(
        event_id="during-erasure", key=sent[0], kind="bounced", bounce="hard",
        occurred_at=live_clock.now(), reason=f"550 5.1.1 <{address}>: no such user",
    )  # fmt: skip
    with connection.execute_wrapper(erase_before_the_insert):
        delivery_events_record(channel="http", events=[bounce])
    [erasure] = erasures
    erasure.finish()
    kept = {
        "reasons quoting it": DeliveryEvent.objects.filter(reason__icontains=address).count(),
        "suppressions naming it": Suppression.objects.filter(address__iexact=address).count(),
    }
    assert kept == {"reasons quoting it": 0, "suppressions naming it": 0}
    assert Attendee.objects.get(pk=reminder.attendee_id).erased_at is not None


def test_soft_bounces_recorded_at_once_by_two_requests_still_make_a_run(sent, live_clock, settings):
    """Two deliveries of the provider's webhook, each with one soft bounce at the same
    address, each counting the run before the other committed: the third of a run must
    suppress all the same."""
    import threading

    from django.db import connection

    from reminders.services.feedback import ProviderEvent, delivery_events_record
    from tests.support.races import race

    settings.REMINDERS_SOFT_BOUNCES_TO_SUPPRESS = 3
    table = connection.ops.quote_name(DeliveryEvent._meta.db_table)
    both_inserted = threading.Barrier(2)

    def soft(n: int) -> ProviderEvent:
        return ProviderEvent(
            event_id=f"soft-{n}", key=sent[0], kind="bounced", bounce="soft",
            occurred_at=live_clock.now() + timedelta(seconds=n), reason="452 over quota",
        )  # fmt: skip

    def meet_after_the_insert(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith(f"INSERT INTO {table}"):
            try:
                both_inserted.wait(3)  # each counts while the other's row is uncommitted
            except threading.BrokenBarrierError:
                pass  # the other waits on a lock this one holds
        return result

    def record(n: int):
        def job():
            with connection.execute_wrapper(meet_after_the_insert):
                return delivery_events_record(channel="http", events=[soft(n)])

        return job

    delivery_events_record(channel="http", events=[soft(1)])
    answers = race(record(2), record(3))
    assert [answer["recorded"] for answer in answers] == [1, 1]
    assert DeliveryEvent.objects.count() == 3
    assert Suppression.objects.filter(lifted_at__isnull=True).count() == 1


def test_one_event_delivered_twice_at_once_is_counted_recorded_once(sent, live_clock):
    """The provider retries a request whose answer is slow while the first is still being
    recorded: both read that the event is new before either commits. One answer says
    recorded, the other duplicate, as the table keeps one row."""
    import threading

    from django.db import connection

    from reminders.services.feedback import ProviderEvent, delivery_events_record
    from tests.support.races import race

    table = connection.ops.quote_name(DeliveryEvent._meta.db_table)
    both_read = threading.Barrier(2)

    def meet_after_the_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith("SELECT") and f"FROM {table}" in sql:
            try:
                both_read.wait(3)
            except threading.BrokenBarrierError:
                pass
        return result

    bounce = ProviderEvent(
        event_id="twice", key=sent[0], kind="bounced", bounce="hard",
        occurred_at=live_clock.now(), reason="550 5.1.1 mailbox unknown",
    )  # fmt: skip

    def record():
        with connection.execute_wrapper(meet_after_the_read):
            return delivery_events_record(channel="http", events=[bounce])

    answers = race(record, record)
    assert sorted((a["recorded"], a["duplicates"]) for a in answers) == [(0, 1), (1, 0)]
    assert (DeliveryEvent.objects.count(), Suppression.objects.count()) == (1, 1)


def test_reports_older_than_the_retention_are_deleted_by_the_scan(sent, post, live_clock, settings):
    post(
        {"events": [_event(sent[0], "delivered", event_id="old", at=live_clock.now().isoformat())]}
    )
    settings.REMINDERS_EVENT_RETENTION_DAYS = 30
    live_clock.advance(29 * 86400)
    pipeline.scan(clock=live_clock)
    assert DeliveryEvent.objects.count() == 1
    live_clock.advance(2 * 86400)
    pipeline.scan(clock=live_clock)
    assert not DeliveryEvent.objects.exists()


def test_a_long_backlog_of_old_reports_is_pruned_in_short_transactions_over_scans(
    sent, live_clock, monkeypatch
):
    """A retention shortened finds months of reports: each transaction deletes PRUNE_BATCH of
    them and one scan PRUNE_PER_SCAN, the rest going to the next scans. The suppression an old
    bounce caused stays, as it would with the report deleted whole."""
    from django.db import connection

    from reminders.services import dispatch
    from reminders.services.feedback import address_key, delivery_events_prune
    from tests.support.plans import counting_deletes

    monkeypatch.setattr(dispatch, "PRUNE_BATCH", 3)
    monkeypatch.setattr(dispatch, "PRUNE_PER_SCAN", 6)
    reminder = Reminder.objects.get(key=sent[0])
    now = live_clock.now()
    old = now - timedelta(days=django_settings.REMINDERS_EVENT_RETENTION_DAYS, seconds=1)
    DeliveryEvent.objects.bulk_create(
        DeliveryEvent(reminder=reminder, channel="http", event_id=f"old-{n}", kind="bounced",
                      bounce="hard", occurred_at=old, received_at=old)
        for n in range(8)
    )  # fmt: skip
    DeliveryEvent.objects.create(
        reminder=reminder, channel="http", event_id="new", kind="delivered", occurred_at=now,
        received_at=now,
    )  # fmt: skip
    suppression = Suppression.objects.create(
        address_key=address_key("lea@example.net"), address="lea@example.net", cause="bounced",
        caused_at=old, event=DeliveryEvent.objects.get(event_id="old-0"), created_at=old,
    )  # fmt: skip
    deleted = []
    with connection.execute_wrapper(counting_deletes(deleted)):
        assert delivery_events_prune(clock=live_clock) == 6
        assert delivery_events_prune(clock=live_clock) == 2
    assert deleted == [3, 3, 2]
    assert list(DeliveryEvent.objects.values_list("event_id", flat=True)) == ["new"]
    suppression.refresh_from_db()
    assert suppression.event is None and suppression.lifted_at is None


def test_the_scans_prune_reads_old_reports_alone_not_every_report(sent, live_clock):
    """Every scan looks for reports past the retention; with no index on when they came, it
    read the whole table each time (months of a busy sender's reports, every minute)."""
    from django.db import connection

    from reminders.services.feedback import delivery_events_prune
    from tests.support.plans import explained_discards, keeping

    reminder = Reminder.objects.get(key=sent[0])
    now = live_clock.now()
    DeliveryEvent.objects.bulk_create(
        DeliveryEvent(reminder=reminder, channel="http", event_id=f"e-{n}", kind="delivered",
                      occurred_at=now, received_at=now)
        for n in range(5000)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(DeliveryEvent._meta.db_table)}")
    statements = []
    with connection.execute_wrapper(keeping(statements)):
        assert delivery_events_prune(clock=live_clock) == 0
    assert max(explained_discards(statements).values()) == 0, statements


def test_without_a_callback_secret_there_is_no_endpoint(live_server, settings):
    settings.REMINDERS_HTTP_CALLBACK_SECRET = ""
    answer = httpx.post(f"{live_server.url}/hooks/http/events", content=b"{}", timeout=10)
    assert answer.status_code == 404


def test_a_get_changes_nothing(live_server, settings):
    settings.REMINDERS_HTTP_CALLBACK_SECRET = SECRET
    assert httpx.get(f"{live_server.url}/hooks/http/events", timeout=10).status_code == 405


def test_metrics_count_the_reports_kept_by_channel_and_kind(
    sent, post, live_clock, client, settings
):
    when = live_clock.now().isoformat()
    post({"events": [
        _event(sent[0], "bounced", event_id="m1", at=when, bounce="hard"),
        _event(sent[1], "bounced", event_id="m2", at=when, bounce="soft"),
        _event(sent[2], "complained", event_id="m3", at=when),
        _event("no-such-key", "delivered", event_id="m4", at=when),
    ]})  # fmt: skip
    settings.METRICS_TOKEN = "metrics-token-0a1b2c3d4e5f6a7b8c9d0e"
    text = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_TOKEN}").content
    series = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.decode().splitlines()
        if line.startswith("reminders_delivery_events")
    }
    assert series.pop('reminders_delivery_events_dropped_total{channel="http"}') == 1
    assert series == {
        'reminders_delivery_events{channel="http",kind="delivered"}': 0,
        'reminders_delivery_events{channel="http",kind="deferred"}': 0,
        'reminders_delivery_events{channel="http",kind="bounced"}': 2,
        'reminders_delivery_events{channel="http",kind="complained"}': 1,
        'reminders_delivery_events_last_hour{channel="http",kind="delivered"}': 0,
        'reminders_delivery_events_last_hour{channel="http",kind="deferred"}': 0,
        'reminders_delivery_events_last_hour{channel="http",kind="bounced"}': 2,
        'reminders_delivery_events_last_hour{channel="http",kind="complained"}': 1,
    }


def test_a_report_dated_in_the_future_does_not_hide_later_soft_bounces(sent, live_clock, settings):
    """Runs of soft bounces are read in the order the provider dates its reports: one dated a
    year ahead (a clock or a typo) came after every later report, so its "delivered" broke
    every run at that address for a year. A report is taken as no later than its receipt."""
    from reminders.services.feedback import ProviderEvent, delivery_events_record

    settings.REMINDERS_SOFT_BOUNCES_TO_SUPPRESS = 3
    now = live_clock.now()

    def report(n: int, kind: str, at) -> ProviderEvent:
        bounce = "soft" if kind == "bounced" else ""
        return ProviderEvent(f"e-{n}", sent[0], kind, bounce, at, "")

    delivery_events_record(channel="http", events=[report(0, "delivered", now.replace(year=2062))])
    for n in (1, 2, 3):
        live_clock.advance(60)
        delivery_events_record(channel="http", events=[report(n, "bounced", live_clock.now())])
    assert Suppression.objects.filter(lifted_at__isnull=True).count() == 1
    assert DeliveryEvent.objects.get(event_id="e-0").occurred_at == now

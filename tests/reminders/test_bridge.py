"""The bridge's channels, end to end through the pipeline against a real loopback SMTP server."""

import ipaddress
import socket
from collections import Counter
from datetime import timedelta

import pytest

from clock import SystemClock
from loopback.smtp_sink import SmtpSink
from reminders.models import Reminder
from reminders.worker import pipeline
from reminders.worker.bridge import check_channel, smtp_settings
from workshops.models import Workshop
from workshops.services import attendee_get_or_create, enrollment_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sink(settings):
    with SmtpSink() as server:
        settings.EMAIL_HOST = "127.0.0.1"
        settings.EMAIL_PORT = server.port
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        yield server


@pytest.mark.parametrize("channel", ["django", "smtp"])
def test_each_mail_channel_sends_one_message_per_reminder_with_a_key_derived_id(
    live_clock, sink, settings, due_reminders, channel
):
    settings.REMINDERS_CHANNEL = channel
    ids = due_reminders(5)
    counts = pipeline.deliver(ids, clock=SystemClock())
    assert counts["sent"] == 5
    received = sink.received()
    assert len(received) == 5
    by_id = {m.message_id: m for m in received}
    for reminder in Reminder.objects.all():
        message = by_id[reminder.provider_message_id]
        assert message.rcpt_tos == (reminder.attendee.email,)
        assert message.subject.startswith(f"Reminder: {reminder.workshop.title} starts ")


@pytest.mark.parametrize("channel", ["django", "smtp"])
def test_a_refused_recipient_fails_with_the_servers_words_and_others_go_through(
    live_clock, sink, settings, due_reminders, channel
):
    """B4: a permanent refusal is `failed` with the provider's message, not unknown."""
    settings.REMINDERS_CHANNEL = channel
    ids = due_reminders(3)
    refused = Reminder.objects.get(pk=ids[0]).attendee.email
    sink.script_rcpt(refused, "550 5.1.1 No such mailbox here")
    pipeline.deliver(ids, clock=SystemClock())
    statuses = dict(Reminder.objects.values_list("attendee__email", "status"))
    assert statuses.pop(refused) == "failed"
    assert set(statuses.values()) == {"sent"}
    assert "No such mailbox here" in Reminder.objects.get(pk=ids[0]).last_error


@pytest.mark.parametrize("channel", ["django", "smtp"])
def test_line_breaks_in_a_name_or_title_cannot_inject_headers(
    live_clock, sink, settings, make_workshop, channel
):
    settings.REMINDERS_CHANNEL = channel
    workshop = make_workshop(
        starts_in=timedelta(hours=2), title="Caf\u00e9 night\r\nBcc: evil@example.com"
    )
    attendee, _ = attendee_get_or_create(
        email="ren\u00e9e@example.com".replace("\u00e9", "e"),
        name="Ren\u00e9e\nCc: evil@example.com",
    )
    enrollment_create(attendee=attendee, workshop=workshop)
    pipeline.deliver(list(Reminder.objects.values_list("id", flat=True)), clock=SystemClock())
    (message,) = sink.received()
    assert message.rcpt_tos == ("renee@example.com",)
    assert message.header("Bcc") is None and message.header("Cc") is None
    # Django folds a long encoded subject right after "Subject:"; unfolding
    # leaves that one space, which every mail client trims.
    assert message.subject.strip().startswith(
        "Reminder: Caf\u00e9 night Bcc: evil@example.com starts"
    )


def test_a_channel_that_cannot_be_built_fails_before_anything_is_claimed(
    live_clock, settings, due_reminders
):
    settings.REMINDERS_CHANNEL = "smtp"
    settings.DEFAULT_FROM_EMAIL = "not an address"
    ids = due_reminders(2)
    with pytest.raises(ValueError, match="not a usable sender address"):
        pipeline.deliver(ids, clock=SystemClock())
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"pending": 2}


def test_system_check_reports_an_unbuildable_channel(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.REMINDERS_CHANNEL = "http"
    settings.REMINDERS_HTTP_URL = ""
    with pytest.raises(SystemCheckError, match="reminders.E001"):
        call_command("check")


@pytest.mark.parametrize(
    ("tls", "ssl", "allowed", "refused"),
    [(False, False, False, True), (True, False, False, False), (False, True, False, False),
     (False, False, True, False)],
)  # fmt: skip
def test_the_django_channel_never_sends_an_smtp_login_in_clear(
    settings, tls, ssl, allowed, refused
):
    """Issue 34, item 9: the guard of the smtp channel holds for Django's backend too."""
    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD = "relay-user", "relay-password"
    settings.EMAIL_USE_TLS, settings.EMAIL_USE_SSL = tls, ssl
    settings.EMAIL_ALLOW_PLAINTEXT_AUTH = allowed
    if refused:
        with pytest.raises(ValueError, match="EMAIL_USE_TLS=1 .* EMAIL_ALLOW_PLAINTEXT_AUTH=1"):
            check_channel("django", clock=SystemClock())
    else:
        assert check_channel("django", clock=SystemClock()) >= 1


@pytest.mark.parametrize(
    ("tls", "ssl"),
    [(True, False), (False, True)],
    ids=["EMAIL_USE_TLS-but-no-STARTTLS-offered", "EMAIL_USE_SSL-to-a-plain-port"],
)
def test_the_django_channel_that_cannot_open_its_tls_session_sent_nothing_and_retries(
    live_clock, sink, settings, due_reminders, tls, ssl
):
    """Django's backend fails while opening the connection, before any command of the
    message: no STARTTLS to upgrade with, or TLS spoken to a port that speaks plain SMTP.
    Nothing can have been delivered, so each reminder waits for a retry with the reason,
    as on the smtp channel; not unknown, left for staff to decide one by one."""
    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_USE_TLS, settings.EMAIL_USE_SSL = tls, ssl
    ids = due_reminders(2)

    pipeline.deliver(ids, clock=SystemClock())

    assert sink.mail_commands == [] and sink.received() == []
    rows = Reminder.objects.filter(pk__in=ids)
    assert [(r.status, r.attempts, r.maybe_sent) for r in rows] == [("pending", 1, False)] * 2
    for reminder in rows:
        assert "before the message was sent" in reminder.last_error, reminder.last_error


@pytest.mark.parametrize("verb", ["MAIL", "RCPT"])
def test_the_django_channel_whose_server_hangs_up_before_data_retries_and_sends_once(
    live_clock, settings, due_reminders, verb
):
    """The server hangs up instead of answering MAIL FROM or RCPT TO: no DATA was sent, so
    the server cannot have the message. It is tried again on a new connection and sent once;
    not unknown, as a hang-up after DATA is."""
    from tests.delivery.test_channel_smtp import _ScriptedServer

    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    with _ScriptedServer({verb: ["CLOSE"]}, pipelining=(False,)) as server:
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
        [pk] = due_reminders(1)
        pipeline.deliver([pk], clock=SystemClock())
    reminder = Reminder.objects.get(pk=pk)
    assert reminder.status == "sent", reminder.last_error
    assert [a.provider_calls for a in reminder.attempts_log.all()] == [2]
    assert (len(server.bodies), server.connections) == (1, 2)


def test_the_django_channel_whose_server_hangs_up_after_the_message_leaves_it_unknown(
    live_clock, settings, due_reminders
):
    from tests.delivery.test_channel_smtp import _ScriptedServer

    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    with _ScriptedServer({"END": ["CLOSE"]}, pipelining=(False,)) as server:
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
        [pk] = due_reminders(1)
        pipeline.deliver([pk], clock=SystemClock())
    assert Reminder.objects.get(pk=pk).status == "unknown"
    assert (len(server.bodies), server.connections) == (1, 1)


def test_the_django_channel_with_both_tls_settings_is_refused_at_start_up(
    live_clock, sink, settings, due_reminders
):
    """Django's SMTP backend refuses EMAIL_USE_TLS with EMAIL_USE_SSL each time it is built,
    with a ValueError: at start-up, as the smtp channel does, not once per reminder."""
    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = True
    with pytest.raises(ValueError, match="EMAIL_USE_TLS and EMAIL_USE_SSL are both set"):
        check_channel("django", clock=SystemClock())
    ids = due_reminders(2)
    with pytest.raises(ValueError, match="EMAIL_USE_TLS and EMAIL_USE_SSL are both set"):
        pipeline.deliver(ids, clock=SystemClock())
    assert Counter(Reminder.objects.values_list("status", flat=True)) == {"pending": 2}


# --- Issue 34, item 10: plain SMTP only to this machine or a listed host ----------------

ADVICE = ("EMAIL_USE_TLS=1", "EMAIL_USE_SSL=1", "EMAIL_PLAINTEXT_HOSTS")


@pytest.mark.parametrize(
    ("host", "listed", "required"),
    [
        ("127.0.0.1", [], False),
        ("localhost", [], False),
        ("::1", [], False),
        ("smtp.example.org", [], True),
        ("mailpit", [], True),
        ("mailpit", ["mailpit"], False),
        ("smtp.example.org", ["mailpit"], True),
    ],
)
def test_the_smtp_channel_requires_tls_but_to_this_machine_or_a_listed_host(
    settings, host, listed, required
):
    settings.EMAIL_HOST, settings.EMAIL_PLAINTEXT_HOSTS = host, listed
    assert smtp_settings().require_tls is required
    assert smtp_settings().starttls is None  # upgraded whenever offered, in both cases


@pytest.mark.parametrize(
    ("host", "listed", "tls", "ssl", "refused"),
    [
        ("smtp.example.org", [], False, False, True),
        ("mailpit", [], False, False, True),
        ("10.0.0.7", ["mailpit"], False, False, True),
        ("smtp.example.org", [], True, False, False),
        ("smtp.example.org", [], False, True, False),
        ("mailpit", ["mailpit"], False, False, False),
        ("127.0.0.1", [], False, False, False),
        ("localhost", [], False, False, False),
    ],
)  # fmt: skip
def test_the_django_channel_refuses_plain_smtp_to_another_machine(
    settings, host, listed, tls, ssl, refused
):
    """Django's SMTP backend never upgrades on its own: no TLS setting, no channel."""
    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PLAINTEXT_HOSTS = host, listed
    settings.EMAIL_USE_TLS, settings.EMAIL_USE_SSL = tls, ssl
    if refused:
        with pytest.raises(ValueError) as refusal:
            check_channel("django", clock=SystemClock())
        message = str(refusal.value)
        assert f"EMAIL_HOST={host!r} is another machine" in message
        assert all(advice in message for advice in ADVICE), message
        assert f"list {host} in EMAIL_PLAINTEXT_HOSTS" in message
    else:
        assert check_channel("django", clock=SystemClock()) >= 1


def test_plain_smtp_to_another_machine_stops_the_django_channel_at_start_up(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.REMINDERS_CHANNEL = "django"
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PLAINTEXT_HOSTS = "smtp.example.org", []
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    with pytest.raises(SystemCheckError, match=r"reminders.E001(.|\n)*EMAIL_PLAINTEXT_HOSTS"):
        call_command("check")
    # Another backend (console, file, memory) sends nothing over the network.
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    call_command("check")


def _an_address_of_this_machine_not_loopback() -> str | None:
    """Return this machine's address on its default route, or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1; a UDP connect sends nothing
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.fixture
def remote_sink(settings):
    """The loopback sink, listening on an address of this machine that is not loopback:
    to the host rule, another machine without STARTTLS."""
    address = _an_address_of_this_machine_not_loopback()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    with SmtpSink(host=address) as server:
        settings.EMAIL_HOST, settings.EMAIL_PORT = address, server.port
        settings.EMAIL_PLAINTEXT_HOSTS = []
        settings.REMINDERS_CHANNEL = "smtp"
        yield server


def test_reminders_for_another_machine_without_starttls_are_not_sent_and_wait_for_a_retry(
    live_clock, remote_sink, settings, due_reminders
):
    """End to end: nothing crosses in clear, each reminder is pending with a retry time and
    the advice in its last error (not failed: the message itself was never refused); listed
    in EMAIL_PLAINTEXT_HOSTS, the host gets them in clear."""
    ids = due_reminders(2)

    pipeline.deliver(ids, clock=SystemClock())

    assert remote_sink.mail_commands == [] and remote_sink.received() == []
    for reminder in Reminder.objects.filter(pk__in=ids):
        assert (reminder.status, reminder.attempts) == ("pending", 1)
        assert reminder.next_attempt_at is not None
        assert f"{settings.EMAIL_HOST}:{remote_sink.port} offers no STARTTLS" in (
            reminder.last_error
        )
        assert all(advice in reminder.last_error for advice in ADVICE), reminder.last_error

    settings.EMAIL_PLAINTEXT_HOSTS = [settings.EMAIL_HOST]
    listed = due_reminders(2)
    assert pipeline.deliver(listed, clock=SystemClock())["sent"] == 2
    assert [m.tls for m in remote_sink.received()] == [False, False]


def test_channel_concurrency_is_capped_by_smtp_connections(settings):
    settings.REMINDERS_CONCURRENCY = 50
    settings.REMINDERS_SMTP_CONNECTIONS = 3
    assert check_channel("smtp", clock=SystemClock()) == 3
    assert check_channel("file", clock=SystemClock()) == 50


@pytest.mark.parametrize("channel", ["django", "smtp"])
def test_the_place_the_join_link_and_the_organiser_reach_the_message_and_its_calendar(
    live_clock, sink, settings, make_workshop, channel
):
    """Reply-To is the organiser, List-Id names the stream; staff's line breaks stay inside
    their one header or their one calendar line."""
    from workshops.models import Workshop

    settings.REMINDERS_CHANNEL = channel
    settings.DEFAULT_FROM_EMAIL = "Reminders <reminders@example.org>"
    workshop = make_workshop(starts_in=timedelta(hours=2), title="Kiln basics")
    Workshop.objects.filter(pk=workshop.pk).update(
        location="Room 4, Kiln House\nBcc: evil@example.com",
        join_url="https://meet.example.org/kiln?id=7",
        contact_name="Ada\r\nCc: evil@example.com",
        contact_email="ada@example.org",
    )
    attendee, _ = attendee_get_or_create(email="grace@example.com", name="Grace")
    enrollment_create(attendee=attendee, workshop=workshop)
    reminder = Reminder.objects.get()
    pipeline.deliver([reminder.pk], clock=SystemClock())

    (received,) = sink.received()
    assert received.header("Bcc") is None and received.header("Cc") is None
    assert received.header("Reply-To").replace('"', "") == (
        "Ada Cc: evil@example.com <ada@example.org>"
    )
    assert received.header("List-Id") == "Workshop reminders <reminders.example.org>"
    message = received.parsed()
    text = message.get_body(("plain",)).get_content().replace("\r\n", "\n")
    assert "Where: Room 4, Kiln House Bcc: evil@example.com\n" in text
    assert "Join: https://meet.example.org/kiln?id=7\n" in text
    assert "Organiser: Ada Cc: evil@example.com <ada@example.org>" in text
    html = message.get_body(("html",)).get_content()
    assert 'href="https://meet.example.org/kiln?id=7"' in html
    (ics,) = [part for part in message.iter_attachments() if part.get_filename() == "workshop.ics"]
    lines = ics.get_content().replace("\r\n ", "").split("\r\n")
    assert "LOCATION:Room 4\\, Kiln House\\nBcc: evil@example.com" in lines
    assert "URL:https://meet.example.org/kiln?id=7" in lines
    assert 'ORGANIZER;CN="Ada Cc: evil@example.com":mailto:ada@example.org' in lines
    from delivery.message import key_digest

    assert f"UID:{key_digest(reminder.key)}@workshop-reminders" in lines


@pytest.mark.parametrize(
    "change",
    [
        {"location": "Room 9"},
        {"join_url": "https://meet.example.org/other"},
        {"contact_name": "Grace"},
        {"contact_email": "grace@example.org"},
    ],
)
def test_the_claim_watch_withdraws_a_message_whose_place_link_or_organiser_changed(
    clock, due_reminders, change
):
    """A call not yet started would carry what the workshop no longer says."""
    from reminders.services import reminder_claim_batch
    from reminders.services.watch import ClaimWatch
    from workshops.services import workshop_update

    ids = due_reminders(2)
    claim = reminder_claim_batch(ids=ids, channel="http", clock=clock)
    watch = ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock)
    watch.refresh()
    assert [watch.gate.withdrawn(pk) for pk in ids] == [None, None]
    workshop_update(workshop=claim.reminders[0].workshop, **change)
    watch.refresh()
    changed = "workshop changed after the message was rendered"
    assert [watch.gate.withdrawn(pk) for pk in ids] == [changed, changed]


def test_the_claim_watch_withdraws_each_changed_row_with_its_own_reason(clock, due_reminders):
    """The reason is what a withdrawn call's attempt says to staff. A workshop changed and
    changed back before the read shows what was rendered: its call still goes."""
    from reminders.models import Reminder
    from reminders.services import reminder_claim_batch
    from reminders.services.watch import ClaimWatch
    from workshops.services import enrollment_cancel, workshop_cancel, workshop_update

    ids = due_reminders(6, per_workshop=1)
    claim = reminder_claim_batch(ids=ids, channel="http", clock=clock)
    cancelled, unenrolled, lost, deleted, restored, untouched = claim.reminders
    watch = ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock)
    workshop_cancel(workshop=cancelled.workshop, clock=clock)
    enrollment_cancel(enrollment=unenrolled.enrollment, clock=clock)
    Reminder.objects.filter(pk=lost.pk).update(
        status=Reminder.Status.PENDING, claim_token=None, lease_expires_at=None
    )
    Reminder.objects.filter(pk=deleted.pk).delete()
    title = restored.workshop.title
    workshop_update(workshop=restored.workshop, title="Moved elsewhere")
    workshop_update(workshop=restored.workshop, title=title)
    watch.refresh()
    assert {pk: watch.gate.withdrawn(pk) for pk in ids} == {
        cancelled.pk: "workshop cancelled",
        unenrolled.pk: "enrollment cancelled",
        lost.pk: "the claim was lost (lease expired)",
        deleted.pk: "the reminder no longer exists",
        restored.pk: None,
        untouched.pk: None,
    }


def test_the_django_channel_carries_every_header_and_part_the_smtp_channel_does(
    live_clock, sink, settings, due_reminders
):
    """Staff pick the channel by setting; the attendee's message must not lose its calendar,
    its reply address or its one-click unsubscribe with the choice."""
    settings.REMINDERS_PUBLIC_URL = "https://reminders.example.com"
    ids = due_reminders(2)
    # A comma in the organiser's name: unquoted, it would split the Reply-To in two.
    Workshop.objects.update(contact_email="host@example.org", contact_name="Host, Org")
    shapes = {}
    for channel, reminder_id in zip(("smtp", "django"), ids, strict=True):
        settings.REMINDERS_CHANNEL = channel
        Reminder.objects.filter(pk=reminder_id).update(next_attempt_at=None)
        assert pipeline.deliver([reminder_id], clock=SystemClock())["sent"] == 1
        message = sink.received()[-1]
        parsed = message.parsed()
        shapes[channel] = (
            {name.lower() for name in parsed.keys()} & {
                "list-id", "list-unsubscribe", "list-unsubscribe-post", "reply-to", "message-id",
            },
            sorted(part.get_content_type() for part in parsed.walk() if not part.is_multipart()),
            sorted(filter(None, (part.get_filename() for part in parsed.walk()))),
            message.header("List-Unsubscribe-Post"),
            [(a.display_name, a.addr_spec) for a in parsed["Reply-To"].addresses],
        )  # fmt: skip
    assert shapes["django"] == shapes["smtp"]
    headers, parts, files, post, reply_to = shapes["smtp"]
    assert {"list-unsubscribe", "reply-to"} <= headers and post == "List-Unsubscribe=One-Click"
    assert reply_to == [("Host, Org", "host@example.org")]
    assert {"text/plain", "text/html", "text/calendar"} <= set(parts) and files == ["workshop.ics"]


def test_without_redis_the_rate_limit_still_holds_within_the_process(
    live_clock, outbox, settings, due_reminders
):
    """The local run (no Redis) keeps REMINDERS_RATE_LIMIT with a limiter of its own: eight
    messages at 4 a second cannot all start within one second."""
    settings.REMINDERS_REDIS_URL = ""
    settings.REMINDERS_RATE_LIMIT = 4
    ids = due_reminders(8)
    assert pipeline.deliver(ids, clock=SystemClock(), channel="file")["sent"] == 8
    written = sorted(path.stat().st_mtime_ns for path in outbox.glob("*.eml"))
    assert len(written) == 8 and (written[-1] - written[0]) / 1e9 >= 1.0


def test_a_watch_read_that_meets_a_dead_connection_leaves_the_gate_stale(clock, due_reminders):
    """S5 without the database: a refresh that cannot read publishes nothing, so once the
    last snapshot is older than the window every call waits; the next read that works
    withdraws what staff changed meanwhile."""
    from django.db import connection

    from reminders.services import reminder_claim_batch
    from reminders.services.watch import REVOCATION_WINDOW, ClaimWatch
    from tests.integration.test_faults import _terminate_my_connection
    from workshops.services import workshop_cancel

    ids = due_reminders(2, per_workshop=1)
    claim = reminder_claim_batch(ids=ids, channel="http", clock=clock)
    watch = ClaimWatch(token=claim.token, reminders=claim.reminders, clock=clock)
    watch.refresh()
    assert watch.gate._fresh() == {}
    clock.advance(REVOCATION_WINDOW + 1)
    workshop_cancel(workshop=claim.reminders[0].workshop, clock=clock)
    connection.ensure_connection()
    _terminate_my_connection()
    watch.refresh()
    assert watch.gate._fresh() is None  # calls wait: no snapshot inside the window
    watch.refresh()
    assert watch.gate._fresh() == {claim.reminders[0].pk: "workshop cancelled"}

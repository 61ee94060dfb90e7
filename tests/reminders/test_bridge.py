"""The bridge's channels, end to end through the pipeline against a real loopback SMTP server."""

from collections import Counter
from datetime import timedelta

import pytest

from clock import SystemClock
from loopback.smtp_sink import SmtpSink
from reminders import pipeline
from reminders.bridge import check_channel
from reminders.models import Reminder
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


def test_channel_concurrency_is_capped_by_smtp_connections(settings):
    settings.REMINDERS_CONCURRENCY = 50
    settings.REMINDERS_SMTP_CONNECTIONS = 3
    assert check_channel("smtp", clock=SystemClock()) == 3
    assert check_channel("file", clock=SystemClock()) == 50
